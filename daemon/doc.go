// Package daemon is hvdd's node engine: it accepts local clients on a Unix
// socket, forms a job from them, matches their tensors by name, fuses what is
// ready and executes the collectives over shared memory.
//
// # The loop
//
// One goroutine, run by Serve, owns all job state. Everything else talks to it
// through events:
//
//	client reader goroutines  --hello/enqueue/closed-->  loop
//	loop  --batch of plan responses-->  executor goroutine
//	executor  --idle-->  loop
//
// A reader decodes its connection's frames, maps the client's regions and checks
// every buffer against them before the loop sees a request, so a malformed or
// hostile client costs only its own connection. The loop submits requests to the
// pure negotiation core (package plan), and whenever the executor is idle drains
// what plan reports ready (validated, grouped and fused) into one batch. While
// the executor works, newly ready tensors accumulate, so a busy daemon fuses
// more. Nothing runs on a timer while no tensor is pending: an idle daemon
// sleeps in epoll and uses no CPU.
//
// The executor reduces, copies or scatters directly between the clients'
// shared-memory buffers (in place for allreduce and broadcast; into
// daemon-owned output regions for allgather, alltoall and reducescatter), then
// answers each client with a Done frame.
//
// # Failure
//
// A client that closes its connection without Goodbye is a lost rank: the job is
// marked failed, every pending op of every rank completes with CODE_ABORTED
// naming the lost rank, and so does every later op. When every connection of
// the job has closed, the daemon forms the next job from new clients. A rank
// that said Goodbye (shutdown) makes the others' later collectives fail with
// CODE_SHUT_DOWN instead of hanging. Tensors that some ranks submitted and
// others did not are logged after the stall-check time, naming the missing
// ranks, and optionally fail the job after the stall-shutdown time.
package daemon
