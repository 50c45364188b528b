// Package host is the executor's host path: responses whose tensors are in
// the clients' shared memory (or were staged there from GPUs by package
// device). On one node it reduces, copies or scatters directly between the
// clients' buffers, in place for allreduce and broadcast and into
// daemon-owned output regions for allgather, alltoall and reducescatter
// (host.go). Across nodes each node's share goes through the job's engine
// (backends.Backend) in the engine calls package sched makes for each
// collective (in its layouts), the large fused allreduce pipelined in
// chunks; the device path makes the same calls when its tensors cross
// nodes, so that nodes on either path meet in them. trace.go writes the
// phases on the timeline.
package host
