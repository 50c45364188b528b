// Package auth is how hvdd daemons prove to each other that they belong to
// the same job: they share a secret (LoadSecret, NewSecret) and show they
// hold it with HMAC-SHA256 (Sign, Verify) over fresh nonces (NewNonce).
//
// Three protocols build on it. The rendezvous package signs every HTTP
// request and response and refuses replayed nonces (ReplayCache). The
// cluster control links and the tcp engine's connections open with the same
// challenge-response handshake (Initiate, Respond), each with its own Labels
// and its own framing of the messages (Transport):
//
//	initiator                                 responder
//	open{nonceI, whatever the responder checks} ->
//	                    <- nonceR, MAC(secret, responder label, open, nonceR, extra...)
//	MAC(secret, initiator label, open, nonceR, extra...) ->
//
// The opening message is the caller's (it carries the protocol's own
// fields, and the initiator's nonce somewhere in them); Initiate and Respond
// exchange the two proofs that follow. Each side answers a nonce the other
// chose, so no proof can be replayed into another connection, and the
// labels differ by role and by protocol, so no proof can be reflected back or
// carried into another protocol. The responder proves itself first; the
// initiator proves itself only to a responder that has.
//
// The package authenticates; it does not encrypt, frame messages on the
// wire, read flags or the environment, or know which protocols use it. It
// imports nothing from hvdd.
package auth
