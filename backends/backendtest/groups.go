package backendtest

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/tensor"
)

// Groups: collectives over subsets of the ranks (backends.Grouper), as the
// daemon runs a process set whose members live on some nodes only. Every
// rank walks one global sequence of collectives, each over a subset, and
// runs the ones of the subsets it belongs to, concurrently with the other
// ranks doing the same; a rank outside a subset calls nothing for it. So a
// group collective overlaps the other groups' collectives, as on real nodes
// that are never in step, and every engine connection carries the
// collectives of several groups in turn. The sizes include pipelined ones,
// and the whole sequence runs twice, so that a group used again finds its
// connections aligned.

// groupStep is one collective of the sequence: kind over the ranks in set.
type groupStep struct {
	set  []int
	kind string
	n    int // bytes per rank (per piece for Alltoallv)
}

// groupSteps is the sequence for a world of n ranks (n >= 3).
func groupSteps(n int) []groupStep {
	evens, odds, tail := []int{}, []int{}, []int{}
	for r := range n {
		if r%2 == 0 {
			evens = append(evens, r)
		} else {
			odds = append(odds, r)
		}
		if r > 0 {
			tail = append(tail, r)
		}
	}
	all := make([]int, n)
	for r := range all {
		all[r] = r
	}
	var steps []groupStep
	for _, size := range []int{4, 100, 3 << 20} {
		steps = append(steps,
			groupStep{evens, "Allreduce", size},
			groupStep{odds, "Allgatherv", size},
			groupStep{tail, "Broadcast", size},
			groupStep{all, "Allreduce", size},
			groupStep{evens, "Alltoallv", size},
			groupStep{tail, "ReduceScatter", size * len(tail)},
			groupStep{[]int{n - 1}, "Allreduce", size},
			groupStep{odds, "Barrier", 0},
			groupStep{[]int{0, n - 1}, "Allgatherv", size},
		)
	}
	return steps
}

// testGroups runs the sequence on a group of n ranks whose backends are
// Groupers; it is skipped for engines that are not.
func testGroups(t *testing.T, newGroup func(t *testing.T, size int) []backends.Backend, n int) {
	g := group(t, newGroup, n)
	if _, ok := g[0].(backends.Grouper); !ok {
		t.Skipf("%s is not a backends.Grouper", g[0].Name())
	}
	steps := groupSteps(n)
	if light() {
		steps = slices.DeleteFunc(steps, func(s groupStep) bool { return s.n > 1<<20 && s.kind != "Allreduce" })
	}
	// Inputs and references, computed before the ranks start.
	type io struct{ in, out, want []byte }
	data := make([][]io, len(steps)) // by step, by rank in the set
	for i, s := range steps {
		k := len(s.set)
		data[i] = make([]io, k)
		seed := uint64(1000 + i)
		switch s.kind {
		case "Allreduce", "ReduceScatter":
			count := s.n / 4
			if s.kind == "ReduceScatter" {
				count = count / k * k // k equal blocks
			}
			ins := make([][]byte, k)
			for m := range ins {
				ins[m] = Fill(Rand(seed, m), tensor.Float32, tensor.Sum, count)
			}
			sum := Reduce(ins, tensor.Float32, tensor.Sum)
			for m := range k {
				d := io{in: bytes.Clone(ins[m]), want: sum}
				if s.kind == "ReduceScatter" {
					blk := count / k * 4
					d.want = sum[m*blk : (m+1)*blk]
					d.out = make([]byte, blk)
				}
				data[i][m] = d
			}
		case "Allgatherv":
			var cat []byte
			for m := range k {
				in := RandBytes(Rand(seed, m), s.n+m)
				data[i][m].in = in
				cat = append(cat, in...)
			}
			for m := range k {
				data[i][m].out = make([]byte, len(cat))
				data[i][m].want = cat
			}
		case "Broadcast":
			src := RandBytes(Rand(seed, 0), s.n)
			for m := range k {
				data[i][m].in = make([]byte, s.n)
				if m == k-1 {
					copy(data[i][m].in, src)
				}
				data[i][m].want = src
			}
		case "Alltoallv":
			// Member m sends s.n+d bytes to member d.
			pieces := make([][][]byte, k)
			for m := range k {
				pieces[m] = make([][]byte, k)
				for d := range k {
					pieces[m][d] = RandBytes(Rand(seed, m*k+d), s.n+d)
					data[i][m].in = append(data[i][m].in, pieces[m][d]...)
				}
			}
			for d := range k {
				for m := range k {
					data[i][d].want = append(data[i][d].want, pieces[m][d]...)
				}
				data[i][d].out = make([]byte, len(data[i][d].want))
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = runGroupSteps(ctx, g[r].(backends.Grouper), r, steps, func(i, m int) (in, out []byte) {
				return data[i][m].in, data[i][m].out
			})
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	for i, s := range steps {
		for m := range s.set {
			d := data[i][m]
			got := d.out
			if s.kind == "Allreduce" || s.kind == "Broadcast" {
				got = d.in
			}
			if s.kind != "Barrier" && !bytes.Equal(got, d.want) {
				t.Errorf("step %d (%s over %v, %d bytes): rank %d's result differs at byte %d", i, s.kind, s.set, s.n, s.set[m], FirstDiff(got, d.want))
			}
		}
	}
}

// runGroupSteps runs rank r's share of steps, twice (the second pass on
// the same groups, with the same inputs re-run where they are in place).
func runGroupSteps(ctx context.Context, gr backends.Grouper, r int, steps []groupStep, bufs func(i, m int) (in, out []byte)) error {
	for pass := range 2 {
		for i, s := range steps {
			m := slices.Index(s.set, r)
			if m < 0 {
				continue
			}
			b, err := gr.Group(s.set)
			if err != nil {
				return fmt.Errorf("Group(%v): %w", s.set, err)
			}
			if b.Rank() != m || b.Size() != len(s.set) {
				return fmt.Errorf("Group(%v) is rank %d of %d, want %d of %d", s.set, b.Rank(), b.Size(), m, len(s.set))
			}
			in, out := bufs(i, m)
			if pass == 1 && (s.kind == "Allreduce" || s.kind == "Broadcast") {
				// In place: run on a copy, the result is already checked
				// by the first pass's buffer.
				in = bytes.Clone(in)
			}
			k := len(s.set)
			switch s.kind {
			case "Allreduce":
				err = b.Allreduce(ctx, in, tensor.Float32, tensor.Sum)
			case "Allgatherv":
				counts := make([]int, k)
				for j := range counts {
					counts[j] = s.n + j
				}
				err = b.Allgatherv(ctx, in, out, counts)
			case "Broadcast":
				err = b.Broadcast(ctx, in, k-1)
			case "Alltoallv":
				send, recv := make([]int, k), make([]int, k)
				for d := range k {
					send[d] = s.n + d
					recv[d] = s.n + m
				}
				err = b.Alltoallv(ctx, in, send, out, recv)
			case "ReduceScatter":
				counts := repeat(len(out), k)
				err = b.ReduceScatter(ctx, in, out, counts, tensor.Float32, tensor.Sum)
			case "Barrier":
				err = b.Barrier(ctx)
			}
			if err != nil {
				return fmt.Errorf("pass %d, step %d (%s over %v): %w", pass, i, s.kind, s.set, err)
			}
		}
	}
	return nil
}
