// Package sched is the core that the executor's host and device paths
// share across nodes: the one schedule of engine calls per collective
// (schedule.go), the layouts and byte counts those calls carry
// (layout.go: the pipelined allreduce's chunks, the alltoall plan, the
// allgather and reducescatter counts per node, the scale factors), the rule
// that sends a fused allreduce to the engine whole (Whole), and the engine
// groups of process sets that lie on some of the nodes only (Engines).
//
// Across nodes every node must make the same engine calls for a response,
// in the same order and with the same sizes, whichever path its own
// tensors take, or the engine mixes one call's bytes with another's. So
// everything here is a function of what every node knows alike (the
// response, the set's layout over the nodes), never of this node's
// buffers; the paths supply only what they do around each call.
//
// It does not touch memory of its own (no staging, no device buffers, no
// answers to clients): it computes layouts and makes the engine's calls on
// the buffers the paths hand it. It imports neither path.
package sched
