package hvdd_test

import (
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/daemon/daemontest"
	"github.com/hvdd/hvdd/reduce"
)

// TestAdasum runs the adasum scenario on one node: its reference is the
// reduce package's Adasum, which the daemon calls there.
func TestAdasum(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("np%d", n), func(t *testing.T) {
			s := daemontest.Start(t, daemon.Config{Slots: n})
			daemontest.Run(t, s.Socket, "adasum", n, 60*time.Second)
		})
	}
}

// TestMultiNodeAdasum runs the adasum scenario across nodes of the tcp
// engine: nodes of equal power-of-two sizes (one subtree each) and uneven
// ones (several subtrees on a node), where every rank must get the bits of
// the one-node tree over the global ranks.
func TestMultiNodeAdasum(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node suite is long")
	}
	for _, slots := range [][]int{{1, 1}, {2, 2}, {3, 1}, {1, 2, 1}} {
		t.Run(fmt.Sprint(slots), func(t *testing.T) {
			ss := startNodes(t, slots...)
			runNodes(t, ss, "adasum", 120*time.Second, slots...)
		})
	}
}

// adasumScenario: Adasum allreduces of one tensor, of a fused group, of
// every float type, with scale factors and with joined ranks, each checked
// bit for bit against reduce.Adasum over every rank's input in rank order
// (every rank can compute every rank's input: adasumInput).
func adasumScenario(ctx context.Context, c *hvdd.Client) error {
	size, rank := c.Size(), c.Rank()
	all := func(int) bool { return true }
	if err := adasumRound[float32](ctx, c, "ada.f32", []int{70000}, 1, 1, all); err != nil {
		return err
	}
	if err := adasumRound[float64](ctx, c, "ada.f64", []int{33}, 0.5, 3, all); err != nil {
		return err
	}
	if err := adasumRound[hvdd.Float16](ctx, c, "ada.f16", []int{257}, 2, 0.25, all); err != nil {
		return err
	}
	// A fused response of three tensors: each is combined on its own.
	if err := adasumRound[float32](ctx, c, "ada.group", []int{5, 1, 3000}, 0.5, 2, all); err != nil {
		return err
	}
	// Joined ranks are zero vectors: the upper half (a whole node when the
	// nodes are equal), then the odd ranks.
	for _, tc := range []struct {
		name string
		in   func(r int) bool
	}{
		{"ada.join.high", func(r int) bool { return r < size/2 }},
		{"ada.join.odd", func(r int) bool { return r%2 == 0 }},
	} {
		if tc.in(rank) {
			if err := adasumRound[float32](ctx, c, tc.name, []int{100, 7}, 1, 1, tc.in); err != nil {
				return err
			}
		}
		if _, err := c.Join(ctx); err != nil {
			return fmt.Errorf("%s: join: %w", tc.name, err)
		}
	}
	return nil
}

// adasumRound allreduces len(counts) tensors of T (a group when more than
// one) with Adasum and the scale factors, on the ranks for which in is true
// (the others have joined), and compares each with the reference.
func adasumRound[T hvdd.Float16 | float32 | float64](ctx context.Context, c *hvdd.Client, name string, counts []int, pre, post float64, in func(int) bool) error {
	dt := hvdd.DTypeOf[T]()
	data := make([][]T, len(counts))
	for i, n := range counts {
		data[i] = adasumInput[T](name, i, c.Rank(), n)
	}
	opts := []hvdd.Option{hvdd.WithName(name), hvdd.WithOp(hvdd.Adasum), hvdd.WithPrescale(pre), hvdd.WithPostscale(post)}
	var err error
	if len(data) == 1 {
		err = hvdd.Allreduce(ctx, c, data[0], opts...)
	} else {
		err = hvdd.GroupedAllreduce(ctx, c, data, opts...)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	for i, n := range counts {
		bufs := make([][]byte, c.Size())
		for r := range bufs {
			if in(r) {
				bufs[r] = bytesOfSlice(adasumInput[T](name, i, r, n))
			}
		}
		if err := reduce.Adasum(bufs, dt, pre, post, nil); err != nil {
			return err
		}
		want := bufs[c.Rank()]
		if got := bytesOfSlice(data[i]); !bytes.Equal(got, want) {
			k := 0
			for got[k] == want[k] {
				k++
			}
			e := k / dt.Size()
			return fmt.Errorf("%s tensor %d (%v, %d elements): element %d is %v, want %v", name, i, dt, n, e, data[i][e], sliceOf[T](want)[e])
		}
	}
	return nil
}

// adasumInput is rank r's tensor i of n elements for the named round:
// values in [-2, 2) (now and then 0) from a generator seeded with all three.
func adasumInput[T hvdd.Float16 | float32 | float64](name string, i, r, n int) []T {
	h := fnv.New64a()
	h.Write([]byte(name))
	g := rand.New(rand.NewPCG(h.Sum64(), uint64(i<<32|r)))
	out := make([]T, n)
	for k := range out {
		v := g.Float64()*4 - 2
		if g.IntN(16) == 0 {
			v = 0
		}
		switch p := any(&out[k]).(type) {
		case *hvdd.Float16:
			*p = hvdd.Float16(reduce.Float32ToFloat16(float32(v)))
		case *float32:
			*p = float32(v)
		case *float64:
			*p = v
		}
	}
	return out
}

func bytesOfSlice[T any](s []T) []byte {
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

func sliceOf[T any](b []byte) []T {
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(z)))
}
