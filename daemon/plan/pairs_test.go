package plan

import (
	"errors"
	"slices"
	"testing"

	"github.com/hvdd/hvdd/tensor"
)

func TestPairSetIDs(t *testing.T) {
	for _, size := range []int{2, 3, 7, 100, MaxPairRanks} {
		seen := map[int32]bool{}
		for _, p := range [][2]int{{0, 1}, {1, 0}, {0, size - 1}, {size - 2, size - 1}, {size / 2, size - 1}} {
			if p[0] == p[1] {
				continue
			}
			id := PairSet(p[0], p[1], size)
			if id >= 0 {
				t.Fatalf("size %d: PairSet(%d, %d) = %d, want a negative id", size, p[0], p[1], id)
			}
			rs, ok := PairRanks(id, size)
			want := []int{min(p[0], p[1]), max(p[0], p[1])}
			if !ok || !slices.Equal(rs, want) {
				t.Fatalf("size %d: PairRanks(PairSet(%d, %d)) = %v, %v; want %v", size, p[0], p[1], rs, ok, want)
			}
			seen[id] = true
		}
	}
	for _, bad := range []struct {
		id   int32
		size int
	}{{0, 4}, {3, 4}, {-1, 4} /* 0 with 0 */, {-6, 4} /* 1 with 1 */, {-17, 4} /* 4 with 0 */, {-2, 1}} {
		if rs, ok := PairRanks(bad.id, bad.size); ok {
			t.Errorf("PairRanks(%d, %d) = %v, want no pair", bad.id, bad.size, rs)
		}
	}
}

func TestPairSetBroadcast(t *testing.T) {
	bc := func(rank int, set int32, name string, dt tensor.DType, n int64) Request {
		return Request{Rank: rank, Name: name, Op: tensor.Broadcast, DType: dt, Shape: []int64{n}, Root: 1, ProcessSet: set, Prescale: 1, Postscale: 1}
	}
	tbl := mustNew(t, Config{Size: 4})
	set := PairSet(3, 1, 4)
	// A rank outside the pair is refused; so is a collective other than a
	// broadcast.
	if err := tbl.Submit(bc(0, set, "x", tensor.Float32, 2), 0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("rank 0 in the pair of 1 and 3: %v, want ErrInvalidArgument", err)
	}
	other := ar(1, "y", 2)
	other.ProcessSet = PairSet(1, 2, 4)
	if err := tbl.Submit(other, 0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("allreduce in a pair set: %v, want ErrInvalidArgument", err)
	}
	// Ready once both ranks of the pair are in; the other ranks never are.
	for _, r := range []Request{bc(1, set, "a", tensor.Float32, 2), bc(3, set, "a", tensor.Float32, 2)} {
		if got := tbl.Ready(); len(got) != 0 {
			t.Fatalf("ready before both ranks: %+v", got)
		}
		if err := tbl.Submit(r, 0); err != nil {
			t.Fatal(err)
		}
	}
	got := tbl.Ready()
	if len(got) != 1 || got[0].Err != nil || got[0].Op != tensor.Broadcast || got[0].ProcessSet != set || got[0].Root != 1 {
		t.Fatalf("ready: %+v, want the pair's broadcast from rank 1", got)
	}
	// Sides that disagree get an error response.
	for _, r := range []Request{bc(1, set, "b", tensor.Float32, 2), bc(3, set, "b", tensor.Float32, 4), bc(1, set, "c", tensor.Float32, 2), bc(3, set, "c", tensor.Int32, 2)} {
		if err := tbl.Submit(r, 0); err != nil {
			t.Fatal(err)
		}
	}
	got = tbl.Ready()
	if len(got) != 2 || got[0].Err == nil || got[1].Err == nil {
		t.Fatalf("mismatched sides: %+v, want two error responses", got)
	}
}
