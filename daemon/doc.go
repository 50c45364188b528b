// Package daemon is hvdd's node engine: it accepts local clients on a Unix
// socket, forms a job from them, matches their tensors by name, fuses what is
// ready and executes the collectives over shared memory.
//
// # The loop
//
// One goroutine, run by Serve, owns all job state and reads every client:
//
//	accept goroutine  --new connection-->  loop
//	clients  --frames on the socket or the shared-memory ring-->  loop
//	loop  --batch of plan responses-->  executor goroutine
//	executor  --idle-->  loop
//
// The loop waits in one epoll set for the clients' sockets, its own event
// descriptor (messages other goroutines post) and, across nodes, the job's
// control links; after activity it keeps polling the clients' shared-memory
// rings for a short spin before it sleeps again. It decodes a client's
// frames, maps the client's regions and checks every buffer against them
// before a request goes further, so a malformed or hostile client costs only
// its own connection. Whenever the executor is idle it drains what is ready
// (validated, grouped and fused) into one batch; small batches run in the
// loop itself. While the executor works, newly ready tensors accumulate, so a
// busy daemon fuses more. Nothing runs on a timer while no tensor is pending:
// an idle daemon sleeps in epoll and uses no CPU.
//
// # The packages
//
// Package daemon is the Server (Serve, Shutdown, Close, Probe) and its
// Config; the engine lives in internal packages, each taking its own
// config from the Server, which wires them:
//
//	internal/poll   the loop's epoll set and eventfd mailbox
//	internal/job    the vocabulary (op, job, membership, process-set views,
//	                work rows) and the seams the others meet at
//	internal/loop   the local engine: clients, lanes, local coordination,
//	                elastic re-forming, status, metrics, timeline, autotune
//	internal/nodes  coordination across nodes: formation, the multi-node
//	                job's plans, elastic epochs, election, removal
//	internal/exec   the executor: the host path, the path across nodes,
//	                the device path
//
// loop and nodes do not import each other, exec imports neither, job
// imports no sibling (deptest checks).
//
// # Two seams
//
// What differs between one node and several sits behind two interfaces of
// package job. A formation forms a job once its local clients are there:
// the loop's oneNode at once, package nodes' with the other nodes' daemons
// through the coordinator (node 0, or the node an elastic job's
// coordination moved to). A coordination negotiates a formed job's
// tensors: the loop's localCoord submits them to a plan.Table; the nodes'
// multiCoord forwards them to the coordinator's table and runs the plans it
// sends, in order, on every node. Both share the job's membership (every
// node's slot count, this node, an epoch) and reach the loop only through
// job.LoopHooks. Process set rounds are decided where the table is and,
// across nodes, travel in the plans.
//
// The executor reduces, copies or scatters directly between the clients'
// shared-memory buffers (in place for allreduce and broadcast; into
// daemon-owned output regions for allgather, alltoall and reducescatter),
// with the job's cross-node engine in between on several nodes, then
// answers each client with a Done frame.
//
// # Failure
//
// A client that closes its connection without Goodbye is a lost rank: the
// job is marked failed, every pending op of every rank completes with
// CODE_ABORTED naming the lost rank, and so does every later op. When every
// connection of the job has closed, the daemon forms the next job from new
// clients; for an elastic job (Hello.elastic) that is the same job's next
// epoch, formed from the ranks that survived and the workers waiting to
// join, on one node or across nodes (a host that hvdd run removes leaves at
// the ranks' next reset). The timeline (package timeline) records what the
// job does when asked. A rank that said Goodbye (shutdown) makes the
// others' later collectives fail with CODE_SHUT_DOWN instead of hanging; in
// an elastic job, a Goodbye that says the process exits (Goodbye.exiting,
// the Python client's atexit) ends the epoch as a lost rank does
// (CODE_ABORTED), so the others re-form without it. Tensors that some ranks
// submitted and others did not are logged after the stall-check time,
// naming the missing ranks, and optionally fail the job after the
// stall-shutdown time.
//
// # GPUs
//
// The daemon owns the node's GPUs, so it reports them as a node service
// does (gpusample.go): a goroutine of the Server's, never the loop's,
// samples them through NVML (Config.OpenGPUSampler, every
// Config.GPUSampleInterval) and feeds each round to the hvdd_gpu_* metrics
// and to hvdd status, which the loop answers from the Server's copy of the
// last round (Server.GPUStatus) without calling NVML. A GPU a round reports
// lost (ERROR_GPU_IS_LOST, or XID 79) is logged once and marked in the
// device path (internal/exec/device, lost.go): a new device tensor on it
// is refused, and a response with a tensor on it fails before it runs,
// both with CODE_INTERNAL naming the GPU's index, UUID and PCI bus id;
// host tensors and the other GPUs go on. A rank whose tensor was refused
// leaves its peers waiting as any refused request does, until it gives up
// (its process exits: CODE_ABORTED) or the stall shutdown.
package daemon
