// Package tcp is hvdd's embedded cross-node engine: the backends.Backend
// collectives in pure Go over TCP, with no dependency beyond the standard
// library and hvdd's reduce kernels.
//
// # Connecting
//
// New bootstraps a group through a key-value Store (see the rendezvous
// package): every rank listens on Config.ListenAddr (an explicit interface
// address; all interfaces only with Config.AllowAll), publishes its address
// under Prefix+"/tcp/addr/<rank>", dials every higher rank and accepts every
// lower one. Each pair of ranks shares one control connection and
// Config.Streams data connections, all opened by an authenticated
// handshake: a nonce challenge in each direction answered with an
// HMAC-SHA256 under the shared Secret, binding the job Prefix, the size, both
// ranks, the stream and the settings that must agree (the compression
// among them). A daemon of another
// job, of another size, with another secret or speaking something else is
// refused, the refusal logged on the refusing side and returned as an error
// wrapping ErrHandshake on the other. Stray connections to the listener do
// not stop a group from forming; the listener closes once it has.
//
// # Algorithms
//
// Small buffers (at most Config.SmallBytes) take latency-oriented
// algorithms: recursive doubling for allreduce and reduce-scatter, direct
// sends for allgather and broadcast, a dissemination barrier. Large ones take
// bandwidth-optimal pipelined rings (allreduce = reduce-scatter + allgather,
// allgatherv, reduce-scatter with uneven blocks), a pipelined chain for
// broadcast and pairwise exchange for alltoallv, each split into
// Config.Streams independent channels with one connection each. The wire
// carries bare bytes: every rank derives the same cuts of every buffer from
// the call's arguments (layout.go), so no headers are needed. Reductions run
// through reduce.Reduce and every rank ends with bit-identical results.
//
// # Wire compression
//
// With Config.Compression (fp16 or bf16) the float32 data of Sum
// reductions, Allreduce and ReduceScatter, crosses the network in 16 bits
// while every addition stays in float32: each segment travels as one
// message with an 8-byte header, in 16 bits or, when its values would
// overflow the format, in float32. Results stay identical on every rank and
// lie within backends.Compression.ErrorBound of the exact sums; other
// dtypes, Min/Max/Product, Broadcast and Allgatherv travel as they are.
// compress.go has the format, the rules that keep ranks in agreement, and
// why.
//
// # Groups
//
// Group gives a Backend over a subset of the ranks (backends.Grouper), for
// the daemon's process sets whose members live on some nodes only. It uses
// the engine's connections to its members and costs no communication; the
// algorithms above run over the group's ranks. Every pair of ranks meets
// the collectives it shares (of the whole group and of every subset holding
// both) in the same order on both sides, which keeps the byte streams in
// step, and counts them per pair for the orderly close below.
//
// # Failures
//
// Each rank heartbeats every peer on the control connections. A peer that
// closes a connection, exits, sends a bye, or stays silent for
// Config.PeerTimeout fails the backend with a *backends.PeerError naming it;
// a rank that fails tells every peer which rank it lost, so survivors blame
// the rank that really failed; a rank that a peer declared lost tells every
// other peer who declared it, so that they blame it for the same reason
// ("reported lost by rank N") whichever bye reaches them first. A failed backend fails every later call with
// the same error, and so does a cancelled call (its peers see it as lost):
// after a collective stops half way the byte streams are out of step, and
// the daemon re-forms the group rather than resynchronise it. An orderly
// Close is different: its bye carries how many collectives the rank
// finished, so a peer still in the last of them completes it, a peer
// between collectives fails nothing (and so reports nobody lost), and only a
// later collective, which the closed rank will never join, fails.
//
// The package does not negotiate: callers (the daemon) guarantee that every
// rank issues the same collectives in the same order with matching
// arguments.
package tcp
