package plan

import (
	"slices"

	"github.com/hvdd/hvdd/tensor"
)

// Fusion: Horovod's FuseResponses, applied to the ready queue in ready order.
//
// The queue holds one-tensor responses (and the multi-tensor error response
// of a failed group). Take the head; if it can absorb others, absorb them;
// emit it; repeat with what is left. Nothing is fused when the threshold is 0.
//
// ALLREDUCE. A later allreduce is fusable with the head when they share the
// process set, dtype, device (GPU or host memory), reduce op, prescale and postscale factors and joined
// ranks (all ranks run one collective over one buffer with one scaling, and
// the ranks that contribute zeros must be the same). Scanning forward from the
// head:
//   - a fusable response that keeps the total within the threshold is
//     absorbed;
//   - any other response is skipped (look-ahead), as long as the bytes
//     absorbed plus the bytes skipped so far stay within the threshold and
//     fewer than LookAhead responses have been skipped; otherwise the scan
//     stops.
// Horovod allows the look-ahead because mixed-precision training interleaves
// float16 and float32 gradients and would otherwise break every fusion; the
// byte bound keeps a fusion from reaching so far that the skipped tensors
// wait long. Skipped responses go back to the front of the queue in their
// order, so the output is a pure function of the input.
//
// ALLGATHER. Consecutive allgathers of the same set, dtype and device fuse while the
// sum of their output sizes (Bytes) stays within the threshold; there is no
// look-ahead (Horovod's rule: anything else in between ends the fusion).
//
// Everything else (errors, broadcast, alltoall, reducescatter, barrier,
// join) is one response each. A head larger than the threshold is emitted
// alone.

// fuse fuses queue (whose elements it may modify) and returns the responses.
func fuse(queue []*Response, threshold int64, lookAhead int) []*Response {
	out := make([]*Response, 0, len(queue))
	for len(queue) > 0 {
		head := queue[0]
		queue = queue[1:]
		if threshold > 0 && head.Err == nil {
			switch head.Op {
			case tensor.Allreduce:
				queue = fuseAllreduce(head, queue, threshold, lookAhead)
			case tensor.Allgather:
				queue = fuseAllgather(head, queue, threshold)
			}
		}
		out = append(out, head)
	}
	return out
}

// fuseAllreduce absorbs into head what the allreduce rule allows and returns
// the remaining queue.
func fuseAllreduce(head *Response, queue []*Response, threshold int64, lookAhead int) []*Response {
	var skipped []*Response
	var skippedBytes int64
	i := 0
	for ; i < len(queue); i++ {
		c := queue[i]
		if allreduceFusable(head, c) && head.Bytes+c.Bytes <= threshold {
			absorb(head, c)
			continue
		}
		skippedBytes += c.Bytes
		if head.Bytes+skippedBytes > threshold || len(skipped) >= lookAhead {
			break
		}
		skipped = append(skipped, c)
	}
	if len(skipped) == 0 {
		return queue[i:]
	}
	return append(skipped, queue[i:]...)
}

// fuseAllgather absorbs into head the consecutive allgathers the rule allows
// and returns the remaining queue.
func fuseAllgather(head *Response, queue []*Response, threshold int64) []*Response {
	i := 0
	for ; i < len(queue); i++ {
		c := queue[i]
		if c.Err != nil || c.Op != tensor.Allgather || c.ProcessSet != head.ProcessSet ||
			c.DType != head.DType || c.Device != head.Device || c.NCCL != head.NCCL || head.Bytes+c.Bytes > threshold {
			break
		}
		absorb(head, c)
	}
	return queue[i:]
}

// allreduceFusable reports whether c may be fused into the allreduce head.
func allreduceFusable(head, c *Response) bool {
	return c.Err == nil && c.Op == tensor.Allreduce &&
		c.ProcessSet == head.ProcessSet &&
		c.DType == head.DType &&
		c.Device == head.Device &&
		c.NCCL == head.NCCL &&
		c.ReduceOp == head.ReduceOp &&
		c.Prescale == head.Prescale &&
		c.Postscale == head.Postscale &&
		slices.Equal(c.JoinedRanks, head.JoinedRanks)
}

func absorb(head, c *Response) {
	head.Tensors = append(head.Tensors, c.Tensors...)
	head.Bytes += c.Bytes
}
