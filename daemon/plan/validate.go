package plan

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/hvdd/hvdd/tensor"
)

// Validation: Horovod's ConstructResponse. Every check compares each
// submitting rank's request with the lowest submitting rank's (Horovod's
// requests[0]) and stops at the first failure, so a tensor carries one error.
// Horovod's message names the first value and the first differing one; the
// suffix added by newError groups every submitting rank by its value, so the
// user sees which ranks are on which side.
//
// The checks, in order:
//
//  1. op type (checked before dtype, unlike Horovod, because a different op
//     makes every later difference noise);
//  2. dtype (not for Barrier);
//  3. group key and size (hvdd's addition: a member in different groups on
//     different ranks would hang its groups);
//  4. per op:
//     - Allreduce: reduce op, Adasum (not supported), full shape, scale
//       factors. Joined ranks are fine: they contribute zeros.
//     - Reducescatter: joined ranks (error), reduce op, Average or Sum only,
//       full shape, scalar, scale factors.
//     - Allgather, Alltoall: joined ranks (error), scalar (judged on the
//       lowest rank's shape, as Horovod does), number of dimensions, every
//       dimension but the first; Alltoall then checks each rank's splits.
//     - Broadcast: full shape, joined ranks (error), root agreement, root
//       membership in the set.
//     - Barrier: nothing more.
//
// "Joined ranks" means members of the set that joined without submitting
// this tensor. Horovod fails an allgather when any rank at all has joined;
// hvdd fails it only when a member's data is actually missing, which makes
// the outcome depend on what was submitted and not on when the join arrived.

// subReq is a submitted request with its set index.
type subReq struct {
	idx int // set rank
	r   *Request
}

// construct validates e's requests and builds its one-tensor response.
func (t *Table) construct(e *entry) *Response {
	var reqs []subReq
	var joined []int
	for i := range e.reqs {
		if e.have[i] {
			reqs = append(reqs, subReq{i, &e.reqs[i]})
		} else {
			joined = append(joined, e.set.ranks[i])
		}
	}
	first := reqs[0].r
	resp := &Response{
		Op:         first.Op,
		ProcessSet: e.key.set,
		Tensors: []Tensor{{
			Name:  e.key.name,
			Shape: first.Shape,
			Ranks: e.submitted(),
		}},
	}
	if err := t.check(e, reqs, joined); err != nil {
		resp.Err = err
		return resp
	}

	tn := &resp.Tensors[0]
	switch first.Op {
	case tensor.Allreduce, tensor.Reducescatter:
		resp.DType = first.DType
		resp.ReduceOp = first.ReduceOp
		resp.Prescale, resp.Postscale = first.Prescale, first.Postscale
		resp.Bytes = first.Shape.NumElements() * int64(first.DType.Size())
		if first.Op == tensor.Allreduce {
			resp.JoinedRanks = joined
		}
	case tensor.Broadcast:
		resp.DType = first.DType
		resp.Root = first.Root
		resp.Bytes = first.Shape.NumElements() * int64(first.DType.Size())
	case tensor.Allgather, tensor.Alltoall:
		resp.DType = first.DType
		tn.RankShapes = make([]tensor.Shape, len(e.reqs))
		for _, q := range reqs {
			tn.RankShapes[q.idx] = q.r.Shape
			resp.Bytes += q.r.Shape.NumElements() * int64(first.DType.Size())
		}
		if first.Op == tensor.Alltoall {
			tn.Splits = make([][]int32, len(e.reqs))
			for _, q := range reqs {
				tn.Splits[q.idx] = splitsRow(q.r, len(e.reqs))
			}
		}
	case tensor.Barrier:
		resp.JoinedRanks = joined
	}
	return resp
}

// check runs the checks listed above and returns the first failure.
func (t *Table) check(e *entry, reqs []subReq, joined []int) *Error {
	name := e.key.name
	ranks := e.set.ranks
	first := reqs[0].r

	// disagree compares value(r) across reqs. When some differ it returns
	// an Error whose Horovod text is msg(first, first differing request).
	disagree := func(attr string, value func(*Request) string, msg func(a, b *Request) string) *Error {
		v0 := value(first)
		var other *Request
		for _, q := range reqs[1:] {
			if value(q.r) != v0 {
				other = q.r
				break
			}
		}
		if other == nil {
			return nil
		}
		sides := sidesOf(reqs, ranks, value)
		return newError(name, attr, msg(first, other), othersThan(sides), sides)
	}
	// invalid reports a problem with the requests themselves: bad(r)
	// returns the Horovod text for a bad request, or "".
	invalid := func(attr string, value func(*Request) string, bad func(*Request) string) *Error {
		var msg string
		var badReqs []subReq
		for _, q := range reqs {
			if m := bad(q.r); m != "" {
				if msg == "" {
					msg = m
				}
				badReqs = append(badReqs, q)
			}
		}
		if msg == "" {
			return nil
		}
		sides := sidesOf(badReqs, ranks, value)
		var bad2 []int
		for _, q := range badReqs {
			bad2 = append(bad2, ranks[q.idx])
		}
		return newError(name, attr, msg, bad2, sides)
	}
	joinErr := func() *Error {
		if len(joined) == 0 {
			return nil
		}
		return newError(name, "join", msgJoinUnsupported(first.Op), joined, []Side{{Value: "join", Ranks: joined}})
	}

	if err := disagree("op",
		func(r *Request) string { return r.Op.String() },
		func(a, b *Request) string { return msgMismatchedOps(a.Op, b.Op) }); err != nil {
		return err
	}
	op := first.Op
	if op != tensor.Barrier {
		if err := disagree("dtype",
			func(r *Request) string { return r.DType.String() },
			func(a, b *Request) string { return msgMismatchedDTypes(a.DType, b.DType) }); err != nil {
			return err
		}
	}
	groupOf := func(r *Request) string {
		if r.Group == "" {
			return "none"
		}
		return strconv.Quote(r.Group) + " of " + strconv.Itoa(r.GroupSize)
	}
	if err := disagree("group", groupOf,
		func(a, b *Request) string { return msgMismatchedGroups(groupOf(a), groupOf(b)) }); err != nil {
		return err
	}

	shapeOf := func(r *Request) string { return r.Shape.String() }
	fullShape := func() *Error {
		return disagree("shape", shapeOf,
			func(a, b *Request) string { return msgMismatchedShapes(op, a.Shape, b.Shape) })
	}
	reduceOf := func(r *Request) string { return r.ReduceOp.String() }
	reduceOp := func() *Error {
		return disagree("reduce_op", reduceOf,
			func(a, b *Request) string { return msgMismatchedReduceOps(a.ReduceOp, b.ReduceOp) })
	}
	scalesOf := func(r *Request) string {
		return "factors (" + fmtFloat(r.Prescale) + ", " + fmtFloat(r.Postscale) + ")"
	}
	scales := func() *Error {
		return disagree("scale", scalesOf,
			func(a, b *Request) string {
				return msgMismatchedScales(a.Prescale, a.Postscale, b.Prescale, b.Postscale)
			})
	}

	switch op {
	case tensor.Allreduce:
		return firstErr(
			reduceOp,
			func() *Error {
				return invalid("reduce_op", reduceOf, func(r *Request) string {
					if r.ReduceOp == tensor.Adasum {
						return msgAdasum
					}
					return ""
				})
			},
			fullShape,
			scales,
		)

	case tensor.Reducescatter:
		return firstErr(
			joinErr,
			reduceOp,
			func() *Error {
				return invalid("reduce_op", reduceOf, func(r *Request) string {
					if r.ReduceOp != tensor.Average && r.ReduceOp != tensor.Sum {
						return msgReducescatterOp
					}
					return ""
				})
			},
			fullShape,
			func() *Error {
				if len(first.Shape) == 0 {
					return newError(name, "shape", msgScalar(op), []int{ranks[reqs[0].idx]},
						[]Side{{Value: first.Shape.String(), Ranks: []int{ranks[reqs[0].idx]}}})
				}
				return nil
			},
			scales,
		)

	case tensor.Allgather, tensor.Alltoall:
		// Dimension 0 may differ: compare shapes with it masked.
		trailing := func(r *Request) string {
			if len(r.Shape) == 0 {
				return "[]"
			}
			s := r.Shape[1:].String()
			if len(r.Shape) == 1 {
				return "[*]"
			}
			return "[*, " + s[1:]
		}
		errs := []func() *Error{
			joinErr,
			func() *Error {
				if len(first.Shape) == 0 {
					return newError(name, "shape", msgScalar(op), []int{ranks[reqs[0].idx]},
						[]Side{{Value: first.Shape.String(), Ranks: []int{ranks[reqs[0].idx]}}})
				}
				return nil
			},
			func() *Error {
				return disagree("shape", trailing, func(a, b *Request) string {
					if len(a.Shape) != len(b.Shape) {
						return msgMismatchedNDims(op, len(a.Shape), len(b.Shape))
					}
					for d := 1; d < len(a.Shape); d++ {
						if a.Shape[d] != b.Shape[d] {
							return msgMismatchedDim(op, d, a.Shape[d], b.Shape[d])
						}
					}
					return "" // unreachable: the masked shapes differ
				})
			},
		}
		if op == tensor.Alltoall {
			errs = append(errs, func() *Error {
				return invalid("splits",
					func(r *Request) string { return fmt.Sprintf("splits %v for shape %s", r.Splits, r.Shape) },
					func(r *Request) string { return splitsProblem(r, len(ranks)) })
			})
		}
		return firstErr(errs...)

	case tensor.Broadcast:
		return firstErr(
			fullShape,
			joinErr,
			func() *Error {
				return disagree("root",
					func(r *Request) string { return fmt.Sprintf("root %d", r.Root) },
					func(a, b *Request) string { return msgMismatchedRoots(op, a.Root, b.Root) })
			},
			func() *Error {
				if first.Root < 0 || first.Root >= t.cfg.Size || e.set.index[first.Root] < 0 {
					return invalid("root",
						func(r *Request) string { return fmt.Sprintf("root %d", r.Root) },
						func(r *Request) string { return msgInvalidRoot(r.Root) })
				}
				return nil
			},
		)
	}
	return nil
}

// firstErr runs the checks in order and returns the first failure.
func firstErr(checks ...func() *Error) *Error {
	for _, c := range checks {
		if err := c(); err != nil {
			return err
		}
	}
	return nil
}

// sidesOf groups reqs by value, in order of each value's lowest rank.
func sidesOf(reqs []subReq, ranks []int, value func(*Request) string) []Side {
	var sides []Side
	for _, q := range reqs {
		v := value(q.r)
		i := slices.IndexFunc(sides, func(s Side) bool { return s.Value == v })
		if i < 0 {
			sides = append(sides, Side{Value: v})
			i = len(sides) - 1
		}
		sides[i].Ranks = append(sides[i].Ranks, ranks[q.idx])
	}
	return sides
}

// othersThan returns the ranks outside sides[0], ascending.
func othersThan(sides []Side) []int {
	var out []int
	for _, s := range sides[1:] {
		out = append(out, s.Ranks...)
	}
	slices.Sort(out)
	return out
}

// splitsProblem returns Horovod's text for what is wrong with r's alltoall
// splits over a set of n ranks, or "".
func splitsProblem(r *Request, n int) string {
	dim0 := r.Shape[0] // callers checked the rank is at least 1
	if len(r.Splits) == 0 {
		if dim0%int64(n) != 0 {
			return msgSplitsUneven
		}
		return ""
	}
	if len(r.Splits) != n {
		return msgSplitsCount
	}
	var sum int64
	for _, s := range r.Splits {
		if s < 0 {
			return msgSplitsNegative
		}
		sum += int64(s)
	}
	if sum > dim0 {
		return msgSplitsSum
	}
	return ""
}

// splitsRow returns r's alltoall splits made explicit: its own, or dim0/n
// rows to every rank.
func splitsRow(r *Request, n int) []int32 {
	if len(r.Splits) != 0 {
		return slices.Clone(r.Splits)
	}
	row := make([]int32, n)
	for i := range row {
		row[i] = int32(r.Shape[0] / int64(n))
	}
	return row
}
