package plan

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/quick"

	"github.com/hvdd/hvdd/tensor"
)

// workload is a fixed set of per-rank submission lists, each ending, for
// some ranks, with a join.
type workload struct {
	size      int
	threshold int64
	perRank   [][]Request // in each rank's submission order
	expected  map[string]bool
}

// genWorkload builds a random workload from seed: a few tensors of random
// op, shape and group; each rank submits a random subset in a random order
// (ranks that skip a tensor either join at the end or leave it stalled), and
// now and then one rank disagrees on the dtype.
func genWorkload(seed uint64) workload {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	w := workload{size: 1 + rng.IntN(4), threshold: int64(rng.IntN(3)) * 64}
	w.perRank = make([][]Request, w.size)
	joins := make([]bool, w.size)
	for r := range joins {
		joins[r] = rng.IntN(3) == 0
	}
	n := 1 + rng.IntN(8)
	type spec struct {
		name  string
		op    tensor.OpType
		shape tensor.Shape
		group string
		have  []bool
	}
	specs := make([]spec, n)
	groupSize := map[string]int{}
	for i := range specs {
		s := &specs[i]
		s.name = fmt.Sprintf("t%d", i)
		s.op = []tensor.OpType{tensor.Allreduce, tensor.Allreduce, tensor.Allgather, tensor.Broadcast, tensor.Barrier}[rng.IntN(5)]
		s.shape = tensor.Shape{int64(1 + rng.IntN(8))}
		if rng.IntN(3) == 0 {
			s.group = fmt.Sprintf("g%d", rng.IntN(2))
			groupSize[s.group]++
		}
		s.have = make([]bool, w.size)
		for r := range s.have {
			s.have[r] = rng.IntN(5) != 0 || !joins[r] && rng.IntN(10) == 0
		}
	}
	for i, s := range specs {
		for r := range w.size {
			if !s.have[r] {
				continue
			}
			req := Request{Rank: r, Name: s.name, Op: s.op, DType: tensor.Float32, Shape: s.shape,
				ReduceOp: tensor.Sum, Prescale: 1, Postscale: 1, Group: s.group, GroupSize: groupSize[s.group]}
			if r == w.size-1 && i%4 == 3 && rng.IntN(2) == 0 {
				req.DType = tensor.Int32
			}
			w.perRank[r] = append(w.perRank[r], req)
		}
	}
	for r := range w.perRank {
		rng.Shuffle(len(w.perRank[r]), func(i, j int) { w.perRank[r][i], w.perRank[r][j] = w.perRank[r][j], w.perRank[r][i] })
		if joins[r] {
			w.perRank[r] = append(w.perRank[r], Request{Rank: r, Op: tensor.Join})
		}
	}

	// The naive expectation: a tensor is ready when every rank submitted it
	// or joins; a group when all its members are.
	w.expected = map[string]bool{}
	groupOK := map[string]bool{}
	for g := range groupSize {
		groupOK[g] = true
	}
	readyAlone := func(s spec) bool {
		any := false
		for r, ok := range s.have {
			if !ok && !joins[r] {
				return false
			}
			any = any || ok
		}
		return any
	}
	for _, s := range specs {
		if s.group != "" && !readyAlone(s) {
			groupOK[s.group] = false
		}
	}
	for _, s := range specs {
		if readyAlone(s) && (s.group == "" || groupOK[s.group]) {
			w.expected[s.name] = true
		}
	}
	return w
}

// outcome is what a tensor's fate looks like regardless of fusion.
type outcome struct {
	attr   string
	joined string
	ranks  string
}

// play submits w in an interleaving chosen by seed, calling Ready at random
// points, and returns each tensor's outcome and the number of JOIN responses.
func play(t *testing.T, w workload, seed uint64) (map[string]outcome, int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	tbl, err := New(Config{Size: w.size, FusionThreshold: w.threshold})
	if err != nil {
		t.Fatal(err)
	}
	next := make([]int, w.size)
	got := map[string]outcome{}
	joins := 0
	drain := func() {
		for _, resp := range tbl.Ready() {
			if resp.Op == tensor.Join && resp.Err == nil {
				joins++
				continue
			}
			checkResponse(t, resp, w.threshold)
			for _, tn := range resp.Tensors {
				if _, dup := got[tn.Name]; dup {
					t.Fatalf("tensor %s ready twice", tn.Name)
				}
				o := outcome{joined: fmt.Sprint(resp.JoinedRanks), ranks: fmt.Sprint(tn.Ranks)}
				if resp.Err != nil {
					o = outcome{attr: resp.Err.Attr}
				}
				got[tn.Name] = o
			}
		}
	}
	for step := 0; ; step++ {
		var live []int
		for r := range w.size {
			if next[r] < len(w.perRank[r]) {
				live = append(live, r)
			}
		}
		if len(live) == 0 {
			break
		}
		r := live[rng.IntN(len(live))]
		if err := tbl.Submit(w.perRank[r][next[r]], int64(step)); err != nil {
			t.Fatalf("Submit(%+v): %v", w.perRank[r][next[r]], err)
		}
		next[r]++
		if rng.IntN(3) == 0 {
			drain()
		}
		_ = tbl.Stalls(int64(step), 0)
	}
	drain()
	return got, joins
}

// checkResponse checks the fusion invariants of one response.
func checkResponse(t *testing.T, r Response, threshold int64) {
	t.Helper()
	if len(r.Tensors) > 1 && r.Err == nil {
		if r.Op != tensor.Allreduce && r.Op != tensor.Allgather {
			t.Fatalf("fused %s: %s", r.Op, r.String())
		}
		if r.Bytes > threshold {
			t.Fatalf("fused response over the threshold %d: %s", threshold, r.String())
		}
	}
}

// checkInterleavings is the property: any two interleavings of the same
// per-rank submissions make the same tensors ready, each exactly once, with
// the same outcome, and exactly the tensors the naive rule expects.
func checkInterleavings(t *testing.T, seed, s1, s2 uint64) {
	w := genWorkload(seed)
	a, ja := play(t, w, s1)
	b, jb := play(t, w, s2)
	if ja != jb {
		t.Fatalf("JOIN responses: %d vs %d", ja, jb)
	}
	if len(a) != len(b) {
		t.Fatalf("ready sets differ: %v vs %v", a, b)
	}
	for name, o := range a {
		if b[name] != o {
			t.Fatalf("tensor %s: %+v vs %+v", name, o, b[name])
		}
		if !w.expected[name] {
			t.Fatalf("tensor %s ready but not expected (workload %+v)", name, w.perRank)
		}
	}
	for name := range w.expected {
		if _, ok := a[name]; !ok {
			t.Fatalf("tensor %s expected ready but never was (workload %+v)", name, w.perRank)
		}
	}
}

func FuzzTable(f *testing.F) {
	for i := range uint64(16) {
		f.Add(i, i*31+1, i*17+2)
	}
	f.Fuzz(checkInterleavings)
}

func TestInterleavingsQuick(t *testing.T) {
	prop := func(seed, s1, s2 uint64) bool {
		checkInterleavings(t, seed, s1, s2)
		return !t.Failed()
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 500}); err != nil {
		t.Fatal(err)
	}
}

// fuseRef is the deliberately naive fusion: mark responses used and scan the
// unused ones in index order. fuse works on a queue with skipped responses
// pushed back; the two must agree.
func fuseRef(in []*Response, threshold int64, lookAhead int) [][]string {
	used := make([]bool, len(in))
	var out [][]string
	for i, head := range in {
		if used[i] {
			continue
		}
		used[i] = true
		names := []string{head.Tensors[0].Name}
		bytes := head.Bytes
		if threshold > 0 && head.Err == nil && head.Op == tensor.Allreduce {
			var skippedBytes int64
			skipped := 0
			for j := i + 1; j < len(in); j++ {
				if used[j] {
					continue
				}
				c := in[j]
				if allreduceFusable(head, c) && bytes+c.Bytes <= threshold {
					used[j] = true
					names = append(names, c.Tensors[0].Name)
					bytes += c.Bytes
					continue
				}
				skippedBytes += c.Bytes
				if bytes+skippedBytes > threshold || skipped >= lookAhead {
					break
				}
				skipped++
			}
		} else if threshold > 0 && head.Err == nil && head.Op == tensor.Allgather {
			for j := i + 1; j < len(in); j++ {
				if used[j] {
					continue
				}
				c := in[j]
				if c.Err != nil || c.Op != tensor.Allgather || c.ProcessSet != head.ProcessSet || c.DType != head.DType || bytes+c.Bytes > threshold {
					break
				}
				used[j] = true
				names = append(names, c.Tensors[0].Name)
				bytes += c.Bytes
			}
		}
		out = append(out, names)
	}
	return out
}

func TestFuseMatchesReference(t *testing.T) {
	prop := func(seed uint64) bool {
		rng := rand.New(rand.NewPCG(seed, 3))
		n := rng.IntN(20)
		threshold := int64(rng.IntN(4)) * 40
		lookAhead := rng.IntN(4)
		mk := func() []*Response {
			rng := rand.New(rand.NewPCG(seed, 4)) // same inputs twice: fuse modifies them
			in := make([]*Response, n)
			for i := range in {
				r := &Response{
					Op:         []tensor.OpType{tensor.Allreduce, tensor.Allreduce, tensor.Allgather, tensor.Broadcast}[rng.IntN(4)],
					ProcessSet: int32(rng.IntN(2)),
					DType:      []tensor.DType{tensor.Float32, tensor.Float16}[rng.IntN(2)],
					ReduceOp:   []tensor.ReduceOp{tensor.Sum, tensor.Max}[rng.IntN(2)],
					Prescale:   1, Postscale: 1,
					Bytes:   int64(rng.IntN(60)),
					Tensors: []Tensor{{Name: fmt.Sprint(i)}},
				}
				if rng.IntN(8) == 0 {
					r.Err = &Error{Msg: "x"}
				}
				if rng.IntN(4) == 0 {
					r.JoinedRanks = []int{1}
				}
				in[i] = r
			}
			return in
		}
		want := fuseRef(mk(), threshold, lookAhead)
		var got [][]string
		for _, r := range fuse(mk(), threshold, lookAhead) {
			got = append(got, names2(r.Tensors))
		}
		if !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("seed %d threshold %d lookAhead %d:\n got %v\nwant %v", seed, threshold, lookAhead, got, want)
			return false
		}
		return true
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 2000}); err != nil {
		t.Fatal(err)
	}
}

func names2(ts []Tensor) []string {
	out := make([]string, len(ts))
	for i, tn := range ts {
		out[i] = tn.Name
	}
	return out
}
