package plan

import "github.com/hvdd/hvdd/tensor"

// Point-to-point transfers across nodes (torch's send and recv between
// ranks on different nodes) are negotiated as a broadcast from the sender
// in the process set of the two ranks alone: a pair set. Pair sets are not
// registered: their ids are negative and name the two ranks, so that every
// node and the coordinator's table know a pair's ranks from its id alone.

// MaxPairRanks is the largest job whose pairs have ids (their encoding
// must fit an int32).
const MaxPairRanks = 46340

// PairSet returns the id of the pair set of global ranks a and b (a != b)
// in a job of size ranks (at most MaxPairRanks).
func PairSet(a, b, size int) int32 {
	lo, hi := min(a, b), max(a, b)
	return -int32(1 + lo*size + hi)
}

// PairRanks returns the two ranks, ascending, of the pair set id in a job of
// size ranks, or false when id is not a pair set's.
func PairRanks(id int32, size int) ([]int, bool) {
	if id >= 0 || size < 2 || size > MaxPairRanks {
		return nil, false
	}
	v := int(-int64(id)) - 1
	lo, hi := v/size, v%size
	if lo >= hi {
		return nil, false
	}
	return []int{lo, hi}, true
}

// pairSet returns the set of a pair set's request (made on its first use),
// or false. Only broadcasts run in pair sets.
func (t *Table) pairSet(id int32, op tensor.OpType) (*procSet, bool) {
	if op != tensor.Broadcast {
		return nil, false
	}
	rs, ok := PairRanks(id, t.cfg.Size)
	if !ok {
		return nil, false
	}
	ps := t.newSet(id, rs)
	t.sets[id] = ps
	return ps, true
}
