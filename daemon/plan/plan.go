package plan

import (
	"fmt"
	"slices"

	"github.com/hvdd/hvdd/tensor"
)

// DefaultLookAhead is the look-ahead used when Config.LookAhead is 0: the
// most non-fusable responses an allreduce fusion may skip over.
const DefaultLookAhead = 16

// Config configures a Table. The zero value is not valid: Size must be set.
type Config struct {
	// Size is the number of global ranks, at least 1. Process set 0 holds
	// ranks 0..Size-1.
	Size int
	// FusionThreshold is the most bytes one fused response may carry. 0
	// disables fusion: every response carries one tensor. A single tensor
	// larger than the threshold is its own response.
	FusionThreshold int64
	// LookAhead bounds how many non-fusable responses an allreduce fusion may
	// skip to reach later fusable ones (Horovod bounds only by bytes; both
	// bounds apply here). 0 means DefaultLookAhead; negative disables
	// look-ahead.
	LookAhead int
}

func (c Config) validate() error {
	if c.Size < 1 {
		return fmt.Errorf("%w: config: size %d, want at least 1", ErrInvalidArgument, c.Size)
	}
	if c.FusionThreshold < 0 {
		return fmt.Errorf("%w: config: negative fusion threshold %d", ErrInvalidArgument, c.FusionThreshold)
	}
	return nil
}

// Request is one rank's request for one collective on one tensor.
type Request struct {
	// Rank is the submitting global rank.
	Rank int
	// ProcessSet is the set the collective runs over; 0 is every rank.
	// Ignored for Join, which is always global.
	ProcessSet int32
	// Name identifies the tensor across ranks; required except for Join.
	Name string
	// Op is the collective. Join marks the rank joined (see Table.Submit).
	Op tensor.OpType
	// DType is the element type; ignored for Barrier and Join.
	DType tensor.DType
	// Shape is this rank's input shape; nil is a scalar.
	Shape tensor.Shape
	// ReduceOp is the reduction for Allreduce and Reducescatter.
	ReduceOp tensor.ReduceOp
	// Prescale and Postscale are the allreduce/reducescatter scale factors;
	// 1 means none. The zero value 0 is a real factor, so callers must set 1.
	Prescale, Postscale float64
	// Root is the broadcast root, a global rank.
	Root int
	// Splits is this rank's alltoall send counts in rows of the first
	// dimension, one per member of the set in set order; empty means an equal
	// split.
	Splits []int32
	// Group is a key, identical on every rank, that makes this tensor part of
	// a grouped collective; "" means not grouped.
	Group string
	// GroupSize is the number of tensors in Group; required when Group is set.
	GroupSize int
	// Device says the tensor is in GPU memory (a CUDA IPC buffer): device
	// and host tensors run on different paths and are never fused together.
	Device bool
	// GPU is the node's index of the GPU that holds a Device tensor (0 is
	// its first); it stays on the node (the NCCL flag below carries what
	// the others need of it).
	GPU int
	// NCCL is the forwarding node's word that its ranks' tensors of this
	// name can join one NCCL communicator across the nodes (a daemon
	// configured for it, with NCCL, whose ranks' tensors are non-empty and
	// on its GPUs, the first among them): set on every request the node
	// forwards for the name, or on none.
	NCCL bool
}

// Response is one unit of work for the executor: a fused collective, an
// error, a barrier or the completion of a join. Every rank receives the same
// responses in the same order.
type Response struct {
	// Op is the collective. For an error response it is the op the lowest
	// submitting rank asked for.
	Op tensor.OpType
	// Err, when non-nil, fails every tensor in Tensors on every rank with it;
	// no data moves.
	Err *Error
	// ProcessSet is the set every tensor belongs to.
	ProcessSet int32
	// DType is the element type (unset for Barrier and Join).
	DType tensor.DType
	// ReduceOp is the reduction (Allreduce, Reducescatter).
	ReduceOp tensor.ReduceOp
	// Prescale and Postscale are the agreed factors (Allreduce,
	// Reducescatter); 1 means none.
	Prescale, Postscale float64
	// Root is the broadcast root, a global rank.
	Root int
	// Tensors are the tensors of the response in fused order (empty for Join).
	Tensors []Tensor
	// JoinedRanks, for an Allreduce or Barrier, are the set's members that
	// joined without submitting these tensors: they contribute zeros (the
	// neutral element) and the Average divisor stays the full set size.
	JoinedRanks []int
	// LastJoinedRank, for a Join response, is the rank whose join came last;
	// every rank's join returns it.
	LastJoinedRank int
	// Device is set when a submitting rank's tensor is in GPU memory
	// (Request.Device): fusion keeps such responses apart from host ones.
	Device bool
	// NCCL says that the nodes join this response on one NCCL communicator
	// across nodes (NCCLAcross decides it); fusion keeps such responses
	// apart from the others.
	NCCL bool
	// Bytes is the payload: the input size of one rank's tensors for
	// Allreduce, Broadcast and Reducescatter; the sum over the submitting
	// ranks' inputs (the allgather output size) for Allgather and Alltoall;
	// 0 for errors, Barrier and Join.
	Bytes int64
}

// Tensor is one tensor of a Response.
type Tensor struct {
	// Name is the tensor's name.
	Name string
	// Shape is the agreed shape; for Allgather and Alltoall the lowest
	// submitting rank's (the first dimension may differ per rank).
	Shape tensor.Shape
	// RankShapes, for Allgather and Alltoall, are the input shapes indexed by
	// set rank.
	RankShapes []tensor.Shape
	// Splits, for Alltoall, is the send matrix indexed by set rank:
	// Splits[src][dst] rows of the first dimension go from src to dst. It is
	// explicit even where a rank sent no splits (an equal split).
	Splits [][]int32
	// Ranks are the global ranks that submitted the tensor, ascending.
	Ranks []int
}

// Aborted is a tensor that AbortAll or RemoveProcessSet removed before it
// ran, or the pending join of some ranks (Op Join, no name).
type Aborted struct {
	// ProcessSet is the tensor's set (0 for a join).
	ProcessSet int32
	// Name is the tensor's name ("" for a join).
	Name string
	// Op is the lowest submitting rank's op, or Join.
	Op tensor.OpType
	// Ranks are the global ranks that had submitted it (or joined),
	// ascending. The other ranks of the set had not.
	Ranks []int
}

// key identifies a tensor: names are scoped by process set.
type key struct {
	set  int32
	name string
}

// procSet is a process set: ranks ascending, and for every global rank its
// index in ranks or -1.
type procSet struct {
	id    int32
	ranks []int
	index []int
}

// entry collects the requests for one key until it is drained by Ready.
type entry struct {
	key   key
	set   *procSet
	reqs  []Request // by set rank; valid where have is true
	have  []bool
	count int    // number of true in have
	seq   uint64 // order of the first submission, for ties and output order
	first int64  // logical time of the first submission
	ready bool   // validated; waiting in a group or in t.out
}

// group gathers the ready members of one grouped collective.
type group struct {
	size    int
	members []*Response
}

// Table matches requests into responses. Create it with New; it is not safe
// for concurrent use.
type Table struct {
	cfg       Config
	lookAhead int

	sets    map[int32]*procSet
	entries map[key]*entry // submitted and not yet returned by Ready
	groups  map[key]*group // key.name is the group key
	out     []*Response    // ready responses, in ready order, not yet fused
	seq     uint64

	joined     []bool // by global rank
	numJoined  int
	lastJoined int
}

// New returns an empty Table for cfg.
func New(cfg Config) (*Table, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	t := &Table{
		cfg:       cfg,
		lookAhead: cfg.LookAhead,
		sets:      make(map[int32]*procSet),
		entries:   make(map[key]*entry),
		groups:    make(map[key]*group),
		joined:    make([]bool, cfg.Size),
	}
	if t.lookAhead == 0 {
		t.lookAhead = DefaultLookAhead
	} else if t.lookAhead < 0 {
		t.lookAhead = 0
	}
	all := make([]int, cfg.Size)
	for i := range all {
		all[i] = i
	}
	t.sets[0] = t.newSet(0, all)
	return t, nil
}

// SetFusionThreshold changes the fusion threshold of the responses that
// Ready returns from now on (the autotuner's); 0 disables fusion. A negative
// threshold is refused.
func (t *Table) SetFusionThreshold(bytes int64) error {
	if bytes < 0 {
		return fmt.Errorf("%w: negative fusion threshold %d", ErrInvalidArgument, bytes)
	}
	t.cfg.FusionThreshold = bytes
	return nil
}

// FusionThreshold returns the fusion threshold in force.
func (t *Table) FusionThreshold() int64 { return t.cfg.FusionThreshold }

func (t *Table) newSet(id int32, ranks []int) *procSet {
	ps := &procSet{id: id, ranks: ranks, index: make([]int, t.cfg.Size)}
	for i := range ps.index {
		ps.index[i] = -1
	}
	for i, r := range ranks {
		ps.index[r] = i
	}
	return ps
}

// Size returns the number of global ranks.
func (t *Table) Size() int { return t.cfg.Size }

// AddProcessSet registers process set id over ranks (global ranks, any order,
// no duplicates). id 0 is built in; ids must be new.
func (t *Table) AddProcessSet(id int32, ranks []int) error {
	if _, ok := t.sets[id]; ok {
		return fmt.Errorf("%w: process set %d already exists", ErrInvalidArgument, id)
	}
	if len(ranks) == 0 {
		return fmt.Errorf("%w: process set %d has no ranks", ErrInvalidArgument, id)
	}
	rs := slices.Clone(ranks)
	slices.Sort(rs)
	for i, r := range rs {
		if r < 0 || r >= t.cfg.Size {
			return fmt.Errorf("%w: process set %d: rank %d out of range [0, %d)", ErrInvalidArgument, id, r, t.cfg.Size)
		}
		if i > 0 && rs[i-1] == r {
			return fmt.Errorf("%w: process set %d: rank %d listed twice", ErrInvalidArgument, id, r)
		}
	}
	t.sets[id] = t.newSet(id, rs)
	return nil
}

// RemoveProcessSet unregisters process set id (not 0) and returns the
// tensors it still had pending, in submission order, so the caller can fail
// them. Responses of the set that are ready but not yet returned by Ready are
// dropped too and included.
func (t *Table) RemoveProcessSet(id int32) ([]Aborted, error) {
	if id == 0 {
		return nil, fmt.Errorf("%w: process set 0 cannot be removed", ErrInvalidArgument)
	}
	if _, ok := t.sets[id]; !ok {
		return nil, fmt.Errorf("%w: process set %d does not exist", ErrInvalidArgument, id)
	}
	aborted := t.abort(func(e *entry) bool { return e.key.set == id })
	delete(t.sets, id)
	return aborted, nil
}

// ProcessSet returns the ranks of set id, ascending, or false if it is not
// registered.
func (t *Table) ProcessSet(id int32) ([]int, bool) {
	ps, ok := t.sets[id]
	if !ok {
		return nil, false
	}
	return slices.Clone(ps.ranks), true
}

// Joined returns the ranks that have joined and are waiting for the others,
// ascending.
func (t *Table) Joined() []int {
	var out []int
	for r, j := range t.joined {
		if j {
			out = append(out, r)
		}
	}
	return out
}

// Len returns the number of tensors submitted and not yet returned by Ready.
func (t *Table) Len() int { return len(t.entries) }

// AbortAll removes every pending tensor (submitted by some ranks, or ready and
// not yet returned by Ready) and the pending join, and returns them in
// submission order, the join last. The Table is then empty, as if new, with
// its process sets kept.
func (t *Table) AbortAll() []Aborted {
	joined := t.Joined()
	for _, r := range t.out {
		if r.Op == tensor.Join && r.Err == nil {
			// A completed join not yet returned by Ready: every rank
			// is still waiting for it.
			joined = make([]int, t.cfg.Size)
			for i := range joined {
				joined[i] = i
			}
		}
	}
	out := t.abort(func(*entry) bool { return true })
	if len(joined) > 0 {
		out = append(out, Aborted{Op: tensor.Join, Ranks: joined})
	}
	t.out = nil
	clear(t.groups)
	t.resetJoin()
	return out
}

// abort removes the entries that match and returns them in submission order.
// Ready responses and group members of removed entries go too.
func (t *Table) abort(match func(*entry) bool) []Aborted {
	var es []*entry
	for _, e := range t.entries {
		if match(e) {
			es = append(es, e)
		}
	}
	slices.SortFunc(es, func(a, b *entry) int { return cmpSeq(a.seq, b.seq) })
	out := make([]Aborted, 0, len(es))
	for _, e := range es {
		a := Aborted{ProcessSet: e.key.set, Name: e.key.name, Ranks: e.submitted()}
		for i := range e.reqs {
			if e.have[i] {
				a.Op = e.reqs[i].Op
				break
			}
		}
		out = append(out, a)
		delete(t.entries, e.key)
	}
	// Drop ready responses and group members whose entries are gone.
	gone := func(r *Response) bool {
		for _, tn := range r.Tensors {
			if _, ok := t.entries[key{r.ProcessSet, tn.Name}]; !ok {
				return true
			}
		}
		return false
	}
	t.out = slices.DeleteFunc(t.out, gone)
	for k, g := range t.groups {
		g.members = slices.DeleteFunc(g.members, gone)
		if len(g.members) == 0 {
			delete(t.groups, k)
		}
	}
	return out
}

func cmpSeq(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// submitted returns the global ranks that submitted e, ascending.
func (e *entry) submitted() []int {
	out := make([]int, 0, e.count)
	for i, ok := range e.have {
		if ok {
			out = append(out, e.set.ranks[i])
		}
	}
	return out
}
