package plan

import (
	"fmt"
	"slices"

	"github.com/hvdd/hvdd/tensor"
)

// Negotiation: Horovod's controller, steps a-e of ComputeResponseList, run
// one request at a time instead of once per cycle.
//
// a. Matching. Requests are keyed by (process set, name). The first request
//    for a key creates an entry stamped with a sequence number (the
//    submission order) and the caller's logical time (for the stall
//    inspector). Each later request fills its rank's slot.
//
// b. Readiness. An entry is ready when every member of its set has either
//    submitted it or joined. Horovod counts requests against size -
//    joined_size; counting per member is the same rule, and it also holds
//    when a rank submits a tensor and then joins (its data is real and it is
//    not counted twice). Readiness is checked for the entry a request fills
//    and, when a rank joins, for every waiting entry of every set containing
//    that rank, in submission order. So tensors leave in the order they
//    became ready, ties (several made ready by one join) in submission order.
//    The order depends only on the sequence of calls, never on map order.
//
// c. Validation. When an entry becomes ready its requests are checked
//    against each other at once (validate.go, Horovod's ConstructResponse)
//    and turned into a one-tensor response, possibly an error response. The
//    joined ranks are captured at this moment: a join that happens later
//    does not change a tensor that was already ready.
//
// d. Groups. A ready member of a group waits until GroupSize members of the
//    group are ready; then all of them are queued together, adjacent, in the
//    order they became ready. If any member failed validation, the whole
//    group becomes one error response carrying one member's failure (the
//    failing member whose name sorts first), so every member fails on every
//    rank.
//
// e. Join. When every rank has joined, a JOIN response carrying the last
//    joiner is queued after everything the final join made ready, and the
//    joined set is cleared.
//
// Ready then fuses the queue (fuse.go) and forgets the entries it returns.

// Submit records one rank's request at logical time now.
//
// A Join request (only Rank matters) marks the rank joined: every waiting
// tensor of a set containing the rank stops waiting for it, and once every
// rank has joined Ready returns a Join response. Until then the joined rank
// may submit nothing.
//
// Submit returns an error, and records nothing, when the request can never be
// matched: it wraps ErrInvalidArgument (bad rank, process set, membership,
// op, dtype, shape, name or group size), ErrDuplicateName (the rank already
// has this name in flight in this set) or ErrJoined. Disagreements between
// ranks are not Submit's errors: they become error responses from Ready,
// delivered to every rank.
func (t *Table) Submit(r Request, now int64) error {
	if r.Rank < 0 || r.Rank >= t.cfg.Size {
		return errRankRange(r.Rank, t.cfg.Size)
	}
	if !r.Op.Valid() {
		return fmt.Errorf("%w: rank %d: invalid op %s for tensor %q", ErrInvalidArgument, r.Rank, r.Op, r.Name)
	}
	if t.joined[r.Rank] {
		return errJoined(r.Rank, r.Op, r.Name)
	}
	if r.Op == tensor.Join {
		t.join(r.Rank)
		return nil
	}
	ps, ok := t.sets[r.ProcessSet]
	if !ok {
		ps, ok = t.pairSet(r.ProcessSet, r.Op)
	}
	if !ok {
		return errUnknownSet(r.Op, r.ProcessSet)
	}
	si := ps.index[r.Rank]
	if si < 0 {
		return errNotMember(r.Op, r.Rank, r.ProcessSet)
	}
	if err := checkRequest(&r); err != nil {
		return err
	}
	k := key{r.ProcessSet, r.Name}
	e := t.entries[k]
	if e == nil {
		t.seq++
		e = &entry{
			key:   k,
			set:   ps,
			reqs:  make([]Request, len(ps.ranks)),
			have:  make([]bool, len(ps.ranks)),
			seq:   t.seq,
			first: now,
		}
		t.entries[k] = e
	} else if e.have[si] || e.ready {
		// A ready entry that Ready has not returned yet is still in flight
		// for every rank, including one that never submitted it (a joined
		// rank that has since been released by a JOIN response).
		return errDuplicate(r.Rank, r.ProcessSet, r.Name)
	}
	// Own the slices: the caller may reuse its buffers.
	r.Shape = slices.Clone(r.Shape)
	r.Splits = slices.Clone(r.Splits)
	e.reqs[si] = r
	e.have[si] = true
	e.count++
	if t.isReady(e) {
		t.markReady(e)
	}
	return nil
}

// checkRequest validates what one request can get wrong on its own and that
// would stop it from ever matching. Things a rank can get wrong that the
// other ranks must hear about (bad splits, a root outside the set, Adasum)
// are checked at ready time instead, so that every rank gets the error.
func checkRequest(r *Request) error {
	if r.Name == "" {
		return fmt.Errorf("%w: rank %d: %s request without a tensor name", ErrInvalidArgument, r.Rank, r.Op)
	}
	if r.Op != tensor.Barrier && !r.DType.Valid() {
		return fmt.Errorf("%w: rank %d: invalid dtype %s for tensor %q", ErrInvalidArgument, r.Rank, r.DType, r.Name)
	}
	if r.Op != tensor.Barrier && !r.ReduceOp.Valid() {
		return fmt.Errorf("%w: rank %d: invalid reduce op %s for tensor %q", ErrInvalidArgument, r.Rank, r.ReduceOp, r.Name)
	}
	for _, d := range r.Shape {
		if d < 0 {
			return fmt.Errorf("%w: rank %d: negative dimension in shape %s of tensor %q", ErrInvalidArgument, r.Rank, r.Shape, r.Name)
		}
	}
	if r.Group != "" && r.GroupSize < 1 {
		return fmt.Errorf("%w: rank %d: tensor %q in group %q with group size %d", ErrInvalidArgument, r.Rank, r.Name, r.Group, r.GroupSize)
	}
	return nil
}

// isReady reports whether every member of e's set has submitted e or joined.
func (t *Table) isReady(e *entry) bool {
	if e.ready {
		return false
	}
	if e.count == len(e.have) {
		return true
	}
	if t.numJoined == 0 {
		return false
	}
	for i, ok := range e.have {
		if !ok && !t.joined[e.set.ranks[i]] {
			return false
		}
	}
	return true
}

// markReady validates e and queues its response, directly or through its
// group.
func (t *Table) markReady(e *entry) {
	e.ready = true
	resp := t.construct(e)
	first := e.reqs[firstIndex(e)]
	if first.Group == "" {
		t.out = append(t.out, resp)
		return
	}
	gk := key{e.key.set, first.Group}
	g := t.groups[gk]
	if g == nil {
		g = &group{size: first.GroupSize}
		t.groups[gk] = g
	}
	g.members = append(g.members, resp)
	if len(g.members) < g.size {
		return
	}
	delete(t.groups, gk)
	t.out = append(t.out, groupResponses(g.members)...)
}

// groupResponses returns a complete group's responses as they are queued:
// unchanged if every member is valid, else one error response holding every
// member, failed with the error of the failing member whose name sorts
// first. (Not the first to fail: which member became ready first depends on
// how the ranks' submissions interleaved, and the error should not.)
func groupResponses(members []*Response) []*Response {
	var failed *Response
	for _, m := range members {
		if m.Err != nil && (failed == nil || m.Tensors[0].Name < failed.Tensors[0].Name) {
			failed = m
		}
	}
	if failed == nil {
		return members
	}
	r := &Response{Op: failed.Op, Err: failed.Err, ProcessSet: failed.ProcessSet}
	for _, m := range members {
		r.Tensors = append(r.Tensors, m.Tensors...)
	}
	return []*Response{r}
}

// firstIndex is the set index of the lowest rank that submitted e.
func firstIndex(e *entry) int {
	for i, ok := range e.have {
		if ok {
			return i
		}
	}
	return -1
}

// join marks rank joined, releases what no longer waits for it, and
// completes the join when every rank has joined.
func (t *Table) join(rank int) {
	t.joined[rank] = true
	t.numJoined++
	t.lastJoined = rank

	var waiting []*entry
	for _, e := range t.entries {
		if !e.ready && e.set.index[rank] >= 0 {
			waiting = append(waiting, e)
		}
	}
	slices.SortFunc(waiting, func(a, b *entry) int { return cmpSeq(a.seq, b.seq) })
	for _, e := range waiting {
		if t.isReady(e) {
			t.markReady(e)
		}
	}

	if t.numJoined == t.cfg.Size {
		t.out = append(t.out, &Response{Op: tensor.Join, LastJoinedRank: rank})
		t.resetJoin()
	}
}

func (t *Table) resetJoin() {
	clear(t.joined)
	t.numJoined = 0
	t.lastJoined = 0
}

// Ready returns, and forgets, every response that is ready: validated,
// grouped and fused (see fuse.go), in the order the tensors became ready. It
// returns nil when nothing is ready. The caller owns the returned values.
func (t *Table) Ready() []Response {
	if len(t.out) == 0 {
		return nil
	}
	fused := fuse(t.out, t.cfg.FusionThreshold, t.lookAhead)
	t.out = nil
	out := make([]Response, len(fused))
	for i, r := range fused {
		for _, tn := range r.Tensors {
			delete(t.entries, key{r.ProcessSet, tn.Name})
		}
		out[i] = *r
	}
	return out
}
