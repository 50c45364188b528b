// Package exec is the daemon's executor: the goroutine that runs the
// loop's batches of plan responses (Executor.Run), or one response inline
// for the loop (Executor.Execute), so the loop keeps negotiating while data
// moves. Each response takes one of three paths:
//
//   - host (package host): tensors in the clients' shared memory, reduced,
//     copied or scattered directly between them on one node;
//     across nodes each node's share goes through the job's engine
//     (backends.Backend) in the calls package sched makes, the large
//     fused allreduce pipelined in chunks.
//   - device (package device): tensors in the clients' GPU memory, opened
//     by CUDA IPC handle once per connection (ConnGPU) and
//     kept until released. Native paths work in device memory: allreduce
//     and broadcast on one node (each GPU's local ranks reduced into its
//     fusion buffer by the daemon's kernels, GPUs joined by NCCL), and the
//     same across nodes through the engine (hierarchical); allgather,
//     alltoall and reducescatter on one GPU (results built by device copies
//     and kernels, exported to each client as Done.device_output), over
//     several GPUs of a node (NCCL), and across nodes (through the engine).
//     What no native path covers (Adasum, responses with joined ranks or
//     empty tensors, dtypes NCCL lacks across GPUs, a node without NCCL,
//     GPUAllreduceHost) is staged: copied to host memory, run on the host
//     path, and copied back as the op is answered.
//   - NCCL across nodes (GPUAllreduceNCCL): where the coordinator's plan
//     says so for a response (plan.Response.NCCL), a communicator across
//     nodes joins the nodes' GPUs directly.
//
// Either way the executor synchronises the streams before answering, so a
// Done means the daemon is finished with the client's memory. A GPU error
// fails the ops it touched with CODE_INTERNAL (on one node; across nodes it
// fails the job, whose other nodes wait in the engine) and replaces the
// streams; an NCCL error aborts the communicator, and the next use makes a
// new one.
//
// Package exec itself is the Executor, which picks the path of each
// response. Both paths make their engine calls across nodes through
// package sched (the one schedule of engine calls, the layouts, the
// engine groups of process sets), which imports neither. The device path
// imports the host path to stage onto it (and for its host fusion buffer,
// its batched answers and the timeline names), never the reverse. The executor imports
// package job (the work rows, the ops and their connections) and none of
// the loop's or the nodes' packages; it tells the loop it is idle, or that
// a collective across nodes failed, through the poller's mailbox.
package exec
