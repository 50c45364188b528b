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
//  4. per op (opChecks: one checker method per op, each a list of checks
//     run in order by firstErr):
//     - Allreduce: reduce op, Adasum's rules (a power-of-two set,
//       float16/float32/float64), full shape, scale
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
	every := true
	for _, q := range reqs {
		resp.Device = resp.Device || q.r.Device
		every = every && q.r.NCCL
	}
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
	resp.NCCL = NCCLAcross(resp, every)
	return resp
}

// NCCLAcross decides whether the nodes run r on one NCCL communicator
// across nodes rather than each through its own path (hierarchical, or
// host memory): every request said its node can (every, Request.NCCL), no
// rank has joined, and NCCL runs the collective: an allreduce or
// reducescatter summing or averaging a type NCCL has, a broadcast, an
// allgather or an alltoall. The coordinator decides it once per response,
// and every node runs what its plan says.
func NCCLAcross(r *Response, every bool) bool {
	if !every || r.Err != nil || len(r.JoinedRanks) > 0 {
		return false
	}
	switch r.Op {
	case tensor.Allreduce, tensor.Reducescatter:
		return (r.ReduceOp == tensor.Sum || r.ReduceOp == tensor.Average) && NCCLReduces(r.DType)
	case tensor.Broadcast, tensor.Allgather, tensor.Alltoall:
		return true
	}
	return false
}

// NCCLReduces reports whether NCCL reduces dt: NCCL has no 16-bit integers
// or bool. The device path asks it too, for its NCCL calls over a node's
// GPUs.
func NCCLReduces(dt tensor.DType) bool {
	switch dt {
	case tensor.Int16, tensor.Uint16, tensor.Bool:
		return false
	}
	return dt.Valid()
}

// check runs the checks listed above and returns the first failure: the
// common ones (steps 1-3), then the op's own from opChecks (step 4).
func (t *Table) check(e *entry, reqs []subReq, joined []int) *Error {
	c := &checker{t: t, e: e, reqs: reqs, joined: joined, first: reqs[0].r}
	if err := c.common(); err != nil {
		return err
	}
	if opCheck := opChecks[c.first.Op]; opCheck != nil {
		return opCheck(c)
	}
	return nil
}

// opChecks holds step 4 of the checks: each op's own, run once the ranks
// agree on op, dtype and group. An op without an entry (Barrier) has none.
var opChecks = map[tensor.OpType]func(*checker) *Error{
	tensor.Allreduce:     (*checker).allreduce,
	tensor.Reducescatter: (*checker).reducescatter,
	tensor.Allgather:     (*checker).allgather,
	tensor.Alltoall:      (*checker).alltoall,
	tensor.Broadcast:     (*checker).broadcast,
}

// checker holds one tensor's requests while check validates them.
type checker struct {
	t      *Table
	e      *entry
	reqs   []subReq // the submitting ranks' requests, lowest set rank first
	joined []int    // global ranks of the members that joined instead
	first  *Request // reqs[0].r: Horovod's requests[0], the reference
}

// The values the checks compare, as the error's sides show them.
func opOf(r *Request) string     { return r.Op.String() }
func dtypeOf(r *Request) string  { return r.DType.String() }
func shapeOf(r *Request) string  { return r.Shape.String() }
func reduceOf(r *Request) string { return r.ReduceOp.String() }
func rootOf(r *Request) string   { return fmt.Sprintf("root %d", r.Root) }

func groupOf(r *Request) string {
	if r.Group == "" {
		return "none"
	}
	return strconv.Quote(r.Group) + " of " + strconv.Itoa(r.GroupSize)
}

func scalesOf(r *Request) string {
	return "factors (" + fmtFloat(r.Prescale) + ", " + fmtFloat(r.Postscale) + ")"
}

func splitsOf(r *Request) string { return fmt.Sprintf("splits %v for shape %s", r.Splits, r.Shape) }

// trailingShapeOf is the shape with dimension 0, which allgather and
// alltoall let differ, masked: "[*, 3]".
func trailingShapeOf(r *Request) string {
	if len(r.Shape) == 0 {
		return "[]"
	}
	s := r.Shape[1:].String()
	if len(r.Shape) == 1 {
		return "[*]"
	}
	return "[*, " + s[1:]
}

// disagree compares value(r) across the requests. When some differ it
// returns an Error whose Horovod text is msg(first, first differing request).
func (c *checker) disagree(attr string, value func(*Request) string, msg func(a, b *Request) string) *Error {
	v0 := value(c.first)
	var other *Request
	for _, q := range c.reqs[1:] {
		if value(q.r) != v0 {
			other = q.r
			break
		}
	}
	if other == nil {
		return nil
	}
	sides := sidesOf(c.reqs, c.e.set.ranks, value)
	return newError(c.e.key.name, attr, msg(c.first, other), othersThan(sides), sides)
}

// invalid reports a problem with the requests themselves: bad(r) returns
// the Horovod text for a bad request, or "".
func (c *checker) invalid(attr string, value func(*Request) string, bad func(*Request) string) *Error {
	var msg string
	var badReqs []subReq
	for _, q := range c.reqs {
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
	ranks := c.e.set.ranks
	sides := sidesOf(badReqs, ranks, value)
	var badRanks []int
	for _, q := range badReqs {
		badRanks = append(badRanks, ranks[q.idx])
	}
	return newError(c.e.key.name, attr, msg, badRanks, sides)
}

// common runs steps 1-3: op, dtype (not for Barrier), group.
func (c *checker) common() *Error {
	if err := c.disagree("op", opOf,
		func(a, b *Request) string { return msgMismatchedOps(a.Op, b.Op) }); err != nil {
		return err
	}
	if c.first.Op != tensor.Barrier {
		if err := c.disagree("dtype", dtypeOf,
			func(a, b *Request) string { return msgMismatchedDTypes(a.DType, b.DType) }); err != nil {
			return err
		}
	}
	return c.disagree("group", groupOf,
		func(a, b *Request) string { return msgMismatchedGroups(groupOf(a), groupOf(b)) })
}

// allreduce: reduce op, Adasum's rules, full shape, scale factors. Joined
// ranks are fine: they contribute zeros.
func (c *checker) allreduce() *Error {
	return firstErr(c.reduceOp, c.adasum, c.fullShape, c.scales)
}

// reducescatter: joined ranks, reduce op, Average or Sum only, full shape,
// scalar, scale factors.
func (c *checker) reducescatter() *Error {
	return firstErr(c.noJoined, c.reduceOp, c.averageOrSum, c.fullShape, c.notScalar, c.scales)
}

// allgather: joined ranks, scalar, every dimension but the first.
func (c *checker) allgather() *Error {
	return firstErr(c.noJoined, c.notScalar, c.trailingShape)
}

// alltoall: allgather's checks, then each rank's splits.
func (c *checker) alltoall() *Error {
	return firstErr(c.noJoined, c.notScalar, c.trailingShape, c.splits)
}

// broadcast: full shape, joined ranks, root agreement, root membership.
func (c *checker) broadcast() *Error {
	return firstErr(c.fullShape, c.noJoined, c.sameRoot, c.rootInSet)
}

// noJoined fails an op that needs every member's data when some joined.
func (c *checker) noJoined() *Error {
	if len(c.joined) == 0 {
		return nil
	}
	return newError(c.e.key.name, "join", msgJoinUnsupported(c.first.Op), c.joined, []Side{{Value: "join", Ranks: c.joined}})
}

// reduceOp: the ranks agree on the reduction.
func (c *checker) reduceOp() *Error {
	return c.disagree("reduce_op", reduceOf,
		func(a, b *Request) string { return msgMismatchedReduceOps(a.ReduceOp, b.ReduceOp) })
}

// adasum: an Adasum allreduce (the ranks agree on the op by now) runs over
// a power-of-two number of ranks (Horovod's vector halving needs it), on float16, float32 or float64 (Horovod's
// Adasum has no other types). Every rank hears the error, as in Horovod,
// where the core refuses the execution on every rank.
func (c *checker) adasum() *Error {
	if c.first.ReduceOp != tensor.Adasum {
		return nil
	}
	if n := len(c.e.set.ranks); n&(n-1) != 0 {
		return c.invalid("reduce_op", reduceOf, func(*Request) string { return msgAdasumRanks })
	}
	return c.invalid("dtype", dtypeOf, func(r *Request) string {
		if r.DType != tensor.Float16 && r.DType != tensor.Float32 && r.DType != tensor.Float64 {
			return msgAdasumDType
		}
		return ""
	})
}

// averageOrSum: the only reductions reducescatter has.
func (c *checker) averageOrSum() *Error {
	return c.invalid("reduce_op", reduceOf, func(r *Request) string {
		if r.ReduceOp != tensor.Average && r.ReduceOp != tensor.Sum {
			return msgReducescatterOp
		}
		return ""
	})
}

// fullShape: the ranks agree on every dimension.
func (c *checker) fullShape() *Error {
	return c.disagree("shape", shapeOf,
		func(a, b *Request) string { return msgMismatchedShapes(c.first.Op, a.Shape, b.Shape) })
}

// notScalar fails a rank-zero tensor, judged on the lowest rank's shape as
// Horovod does (a scalar elsewhere is a shape mismatch).
func (c *checker) notScalar() *Error {
	if len(c.first.Shape) != 0 {
		return nil
	}
	rank := c.e.set.ranks[c.reqs[0].idx]
	return newError(c.e.key.name, "shape", msgScalar(c.first.Op), []int{rank},
		[]Side{{Value: c.first.Shape.String(), Ranks: []int{rank}}})
}

// trailingShape: the ranks agree on the number of dimensions and on every
// dimension but the first.
func (c *checker) trailingShape() *Error {
	op := c.first.Op
	return c.disagree("shape", trailingShapeOf, func(a, b *Request) string {
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
}

// scales: the ranks agree on the prescale and postscale factors.
func (c *checker) scales() *Error {
	return c.disagree("scale", scalesOf, func(a, b *Request) string {
		return msgMismatchedScales(a.Prescale, a.Postscale, b.Prescale, b.Postscale)
	})
}

// splits: each rank's alltoall splits fit its shape and the set.
func (c *checker) splits() *Error {
	n := len(c.e.set.ranks)
	return c.invalid("splits", splitsOf, func(r *Request) string { return splitsProblem(r, n) })
}

// sameRoot: the ranks agree on the broadcast's root.
func (c *checker) sameRoot() *Error {
	return c.disagree("root", rootOf,
		func(a, b *Request) string { return msgMismatchedRoots(c.first.Op, a.Root, b.Root) })
}

// rootInSet: the (agreed) root is a member of the process set.
func (c *checker) rootInSet() *Error {
	root := c.first.Root
	if root >= 0 && root < c.t.cfg.Size && c.e.set.index[root] >= 0 {
		return nil
	}
	return c.invalid("root", rootOf, func(r *Request) string { return msgInvalidRoot(r.Root) })
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
