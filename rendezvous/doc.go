// Package rendezvous is how hvdd daemons of a multi-node job find each
// other: a key-value store with blocking reads (Store), in the manner of
// Gloo's rendezvous store. Daemons register their host, data port and slots
// under agreed keys and Wait for everyone else's; backends bootstrap their
// connections the same way, each under its own Prefix.
//
// Three implementations share the Store interface and one conformance suite:
//
//   - Memory: in-process, for tests and single-process use, and the store a
//     Server serves.
//   - Server + Client: node 0's daemon serves its Memory over HTTP with
//     fasthttp, or, for daemons started with --rendezvous-external, another
//     process does (hvdd run's elastic driver, hvdd rendezvous); the daemons
//     that do not serve it use a Client. A serving daemon uses Server.Store
//     directly.
//   - Prefix: a namespaced view of any Store (per job id, per generation).
//
// The package does not choose keys, elect node 0, or read flags or the
// environment; the shared secret comes from its caller (see the auth
// package, whose Sign, nonces and replay cache it builds on).
//
// # Protocol
//
// Every request and response body is raw bytes unless stated; keys are
// path-escaped in paths and query-escaped in queries.
//
//	GET    /kv/<key>                     200 value | 404
//	PUT    /kv/<key>     body: value     204
//	DELETE /kv/<key>                     204 (also when absent)
//	POST   /add/<key>    body: decimal   200 new value, decimal
//	GET    /wait?key=a&key=b&timeout_ms=N
//	                                     200 {"a":"<base64>",...} once all exist
//	                                     408 ["a",...] (still missing) after N ms
//	GET    /healthz                      200 "ok"
//
// /wait is a long poll: the server parks the request on a broadcast channel
// that every change closes, and answers when the keys exist or timeout_ms
// (default 30 s, at most 60 s) passes; on 408 the Client polls again until
// its ctx is done. The server never polls.
//
// Errors map one-to-one onto statuses, with the server's message as the
// body: 400 ErrInvalidArgument, 404 ErrNotFound, 409 ErrFull, 413
// ErrTooLarge, 401 ErrAuth, 503 ErrClosed (server closing); 405 for a wrong
// method, 429 when the replay cache is full (the Client retries).
//
// # Authentication
//
// Requests carry three headers:
//
//	X-Hvdd-Time:  unix milliseconds
//	X-Hvdd-Nonce: random, 16 to 128 characters (the Client sends 64 hex digits)
//	X-Hvdd-Mac:   hex HMAC-SHA256(secret, "hvdd-rendezvous-req-v1", method,
//	              request-URI (path and query as sent), time, nonce, sha256(body))
//
// with the parts framed as auth.Sign describes. The server refuses with
// 401, and logs the remote address and the reason, a request with a missing
// header, a MAC that does not verify (wrong secret or tampered request), a
// time more than MaxClockSkew (60 s) from its clock, or a nonce it has
// accepted in the last 2*MaxClockSkew (a replay, found by an
// auth.ReplayCache). Nonces are remembered only for requests whose MAC
// verified, so outsiders cannot fill the cache.
//
// Responses carry
//
//	X-Hvdd-Mac: hex HMAC-SHA256(secret, "hvdd-rendezvous-resp-v1",
//	            decimal status, request nonce, sha256(body))
//
// and the Client refuses any response without a valid one, so a rogue or
// misconfigured server is detected (ErrAuth) rather than believed. The
// server signs refusals only for requests whose MAC verified (clock skew,
// replay), so a Client can tell "the secrets differ" (unsigned 401) from a
// signed reason. Bodies are authenticated, not encrypted: values (host
// names, ports) are visible on the network.
//
// # Limits
//
// Keys are 1 to MaxKeyLen (512) bytes of UTF-8; values at most MaxValueLen
// (16 MiB); a store holds at most ServerConfig.MaxKeys keys (default
// DefaultMaxKeys, 100k). One /wait answers with at most 192 MiB of values.
package rendezvous
