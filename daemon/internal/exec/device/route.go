package device

import (
	"strings"

	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/tensor"
)

// The route of a response with GPU tensors: decided once, by decide, a pure
// function of the response and of what the node and its ops are
// (topology); Path.Execute switches on it once, and what is logged and
// written on the timeline is the route's (label, phase).

// way is how a response's tensors move on this node.
type way uint8

const (
	// staged: copied to host memory, run on the host path, copied back as
	// each op is answered. What no native way covers: Adasum, joined
	// ranks, empty tensors, dtypes NCCL lacks over several GPUs, a node
	// without NCCL over several GPUs, or staging asked for
	// (GPUAllreduceHost).
	staged way = iota
	// oneGPU: the node's ranks all on one GPU, by the daemon's kernels
	// and device copies.
	oneGPU
	// inPlace: an allreduce of one rank on each of several GPUs, by NCCL
	// in place on the ranks' tensors (no fusion buffer, no copies).
	inPlace
	// overGPUs: on the node's GPUs, joined by NCCL over the node-local
	// engines (an allreduce through the GPUs' fusion buffers).
	overGPUs
	// hierarchical: across nodes through the job's engine and host memory
	// (the calls of package sched), the node's share gathered on its GPUs.
	hierarchical
	// ncclAcross: across nodes on one NCCL communicator, as the
	// coordinator's plan says (plan.Response.NCCL).
	ncclAcross
)

// route is the way a response takes, and its collective.
type route struct {
	way way
	op  tensor.OpType
}

// label names the route in the log ("GPU path taken"); tests look for
// these names, which the paths had before the route was one decision.
func (rt route) label() string {
	op := strings.ToLower(rt.op.String())
	switch rt.way {
	case oneGPU:
		return "device " + op
	case inPlace:
		return "device " + op + " in place over GPUs"
	case overGPUs:
		if rt.op == tensor.Allreduce || rt.op == tensor.Broadcast {
			// The one-GPU and many-GPU native allreduce and broadcast
			// have always shared their name.
			return "device " + op
		}
		return "device " + op + " over GPUs"
	case hierarchical:
		return "hierarchical " + op
	case ncclAcross:
		return "nccl " + op
	}
	return "staged " + op
}

// phase is the name of the route's phase on the timeline, GPU_SHM_<OP> for
// every native route (docs/ARCHITECTURE.md); "" for staged, where the host
// path writes its own.
func (rt route) phase() string {
	if rt.way == staged {
		return ""
	}
	return "GPU_SHM_" + rt.op.String()
}

// topology is what decide needs of the node and of the response's ops here.
type topology struct {
	// native: the node has GPUs and does not stage every device tensor,
	// and its ops are all non-empty device tensors, at the same positions
	// in every row (nativeOK). The fields below count only then.
	native bool
	// gpus is how many GPUs the ops are on.
	gpus int
	// nccl: the node has NCCL (needed to join several GPUs).
	nccl bool
	// crossNodes: the response's set spans several nodes (crossNodes).
	crossNodes bool
	// noJoined: every rank of the set has its op here (one node only:
	// across nodes the other nodes' ranks have none).
	noJoined bool
	// oneRankPerGPU: each GPU holds one of the node's ranks.
	oneRankPerGPU bool
}

// decide is the route of r on a node of topology t.
func decide(r *plan.Response, t topology) route {
	op := r.Op
	if r.NCCL {
		// The coordinator decided, for every node alike; a node that
		// cannot after all fails the response (ncclAcrossOK).
		return route{ncclAcross, op}
	}
	if !t.native {
		return route{staged, op}
	}
	multi := t.gpus > 1
	joins := !multi || t.nccl                      // NCCL where several GPUs need it
	reduces := !multi || plan.NCCLReduces(r.DType) // NCCL's types where several GPUs need it
	switch op {
	case tensor.Allreduce:
		switch {
		case r.ReduceOp == tensor.Adasum || !joins || !reduces:
		case t.crossNodes:
			return route{hierarchical, op}
		case !multi:
			return route{oneGPU, op}
		case r.Prescale == 1 && t.oneRankPerGPU:
			return route{inPlace, op}
		default:
			return route{overGPUs, op}
		}
	case tensor.Broadcast:
		switch {
		case t.crossNodes:
			// Through the engine and host memory, each GPU fed from
			// there: no NCCL needed.
			return route{hierarchical, op}
		case !joins:
		case !multi:
			return route{oneGPU, op}
		default:
			return route{overGPUs, op}
		}
	case tensor.Allgather, tensor.Alltoall, tensor.Reducescatter:
		rs := op == tensor.Reducescatter
		switch {
		case !t.crossNodes && !multi && t.noJoined:
			return route{oneGPU, op}
		case t.crossNodes && len(r.JoinedRanks) == 0 && (!rs || joins && reduces):
			return route{hierarchical, op}
		case !t.crossNodes && multi && t.nccl && t.noJoined && (!rs || plan.NCCLReduces(r.DType)):
			return route{overGPUs, op}
		}
	}
	return route{staged, op}
}
