// Package backendtest is the conformance suite every hvdd Backend runs: N
// ranks as goroutines in one test process, a matrix of world sizes x counts x
// dtypes x ops for every collective, results checked against references the
// suite computes itself, many collectives back to back on one group (so a
// broken ordering shows), and a lost-peer case that must end in a
// *backends.PeerError naming the lost rank rather than a hang.
//
// An engine's test calls
//
//	backendtest.Run(t, func(t *testing.T, size int) []backends.Backend { ... })
//
// with a factory that builds a connected group of size ranks (rank i at
// index i). Engines that bootstrap through a key-value store can build the
// group with NewGroup and an in-memory store shared by the ranks
// (rendezvous.NewMemory).
//
// The suite does not test an engine's transport details (handshakes,
// heartbeat timings, socket options); those belong to the engine's own tests.
//
// The input data is chosen so that every reduction is exact whatever the
// order of combination: small integers for float Sum, powers of two for float
// Product, full-range values for integer types (whose wrap-around arithmetic
// is associative) and 0/1 for bool. Results must therefore match the
// references bit for bit, and every rank must hold identical bytes. NaN and
// -0 ordering is the reduce package's business and is not probed here.
package backendtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/tensor"
)

// opTimeout bounds every collective the suite issues, so an engine bug shows
// as a failed test rather than a hung one.
const opTimeout = 60 * time.Second

// lossTimeout is how long the survivors of a closed rank may take to report
// it. Engines detect a closed peer from its sockets, far quicker than this.
const lossTimeout = 10 * time.Second

var allOps = []tensor.ReduceOp{tensor.Sum, tensor.Min, tensor.Max, tensor.Product}

// light reports whether the suite runs trimmed.
func light() bool { return testing.Short() || raceEnabled }

// Run runs the conformance suite. newGroup returns size connected backends,
// the one for rank i at index i; it may call t.Fatal. Run closes the backends
// when the subtest that made them ends (engines' Close must therefore
// tolerate being called twice if the factory also registers a cleanup).
//
// With testing.Short(), or under the race detector, the matrix is trimmed:
// fewer world sizes, and the multi-MiB cases only for float32 Sum (the
// pipelined algorithms are still exercised when the engine is configured
// with small segments and a low small-message threshold).
func Run(t *testing.T, newGroup func(t *testing.T, size int) []backends.Backend) {
	sizes := []int{1, 2, 3, 4, 5, 7, 8}
	if light() {
		sizes = []int{1, 2, 3, 5, 8}
	}
	for _, size := range sizes {
		t.Run(fmt.Sprintf("n=%d", size), func(t *testing.T) {
			g := group(t, newGroup, size)
			for i, b := range g {
				if b.Rank() != i || b.Size() != size {
					t.Fatalf("backend %d reports rank %d of %d, want %d of %d", i, b.Rank(), b.Size(), i, size)
				}
				if b.Name() == "" {
					t.Errorf("backend %d has an empty Name", i)
				}
			}
			// The collectives run one after another on the same group,
			// so each also checks that the previous ones left the
			// connections aligned.
			t.Run("Allreduce", func(t *testing.T) { testAllreduce(t, g) })
			t.Run("Allgatherv", func(t *testing.T) { testAllgatherv(t, g) })
			t.Run("Broadcast", func(t *testing.T) { testBroadcast(t, g) })
			t.Run("Alltoallv", func(t *testing.T) { testAlltoallv(t, g) })
			t.Run("ReduceScatter", func(t *testing.T) { testReduceScatter(t, g) })
			t.Run("Barrier", func(t *testing.T) { testBarrier(t, g) })
			t.Run("BackToBack", func(t *testing.T) { testBackToBack(t, g) })
			t.Run("Stats", func(t *testing.T) { testStats(t, g) })
		})
	}
	t.Run("PeerLoss", func(t *testing.T) {
		for _, size := range []int{2, 3, 5} {
			t.Run(fmt.Sprintf("n=%d", size), func(t *testing.T) { testPeerLoss(t, newGroup, size) })
		}
	})
	t.Run("Cancel", func(t *testing.T) { testCancel(t, newGroup) })
	t.Run("Groups", func(t *testing.T) {
		for _, size := range []int{3, 4, 5} {
			t.Run(fmt.Sprintf("n=%d", size), func(t *testing.T) { testGroups(t, newGroup, size) })
		}
	})
}

// group builds a group and registers its Close.
func group(t *testing.T, newGroup func(t *testing.T, size int) []backends.Backend, size int) []backends.Backend {
	t.Helper()
	g := newGroup(t, size)
	if len(g) != size {
		t.Fatalf("factory returned %d backends, want %d", len(g), size)
	}
	t.Cleanup(func() {
		for _, b := range g {
			b.Close()
		}
	})
	return g
}

// onAll runs f for every rank concurrently (as the ranks of a real job would
// call a collective) and fails t with every rank's error.
func onAll(t *testing.T, g []backends.Backend, what string, f func(ctx context.Context, rank int, b backends.Backend) error) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	errs := make([]error, len(g))
	var wg sync.WaitGroup
	for i, b := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(ctx, i, b)
		}()
	}
	wg.Wait()
	ok := true
	for i, err := range errs {
		if err != nil {
			t.Errorf("%s: rank %d: %v", what, i, err)
			ok = false
		}
	}
	return ok
}

// counts lists the element counts of the matrix for a world of n ranks: the
// edge cases, sizes around the usual segment boundaries, a count that no
// world size divides evenly and a couple of MiB.
func counts(n int, dt tensor.DType) []int {
	c := []int{0, 1, 4, 100, 1000, 10000, 7*n + 3, 1<<13 + 1}
	return append(c, (2<<20+12345)/dt.Size())
}

// large reports whether a count is one of the multi-MiB ones, which run for
// a subset of dtypes and ops to keep the suite fast.
func large(count int, dt tensor.DType) bool { return count*dt.Size() > 1<<20 }

// largeCase picks the (dtype, op) pairs that run at large counts: a float
// and an integer type, and every op on float32 unless testing.Short().
func largeCase(dt tensor.DType, op tensor.ReduceOp) bool {
	switch dt {
	case tensor.Float32:
		return !light() || op == tensor.Sum
	case tensor.Int8, tensor.BFloat16:
		return op == tensor.Sum && !light()
	}
	return false
}

func testAllreduce(t *testing.T, g []backends.Backend) {
	n := len(g)
	seed := uint64(1)
	for _, dt := range tensor.DTypes() {
		for _, op := range allOps {
			for _, count := range counts(n, dt) {
				if large(count, dt) && !largeCase(dt, op) {
					continue
				}
				seed++
				in := make([][]byte, n)
				for r := range in {
					in[r] = Fill(Rand(seed, r), dt, op, count)
				}
				want := Reduce(in, dt, op)
				bufs := make([][]byte, n)
				for r := range bufs {
					bufs[r] = bytes.Clone(in[r])
				}
				what := fmt.Sprintf("Allreduce(%v, %v, count=%d)", dt, op, count)
				if !onAll(t, g, what, func(ctx context.Context, r int, b backends.Backend) error {
					return b.Allreduce(ctx, bufs[r], dt, op)
				}) {
					t.FailNow()
				}
				for r := range bufs {
					if i := diff(bufs[r], want, dt); i >= 0 {
						t.Fatalf("%s: rank %d element %d = %x, want %x (inputs %s)", what, r, i,
							elem(bufs[r], dt, i), elem(want, dt, i), column(in, dt, i))
					}
				}
			}
		}
	}
}

// unevenCounts returns per-rank byte counts for the v-collectives: uneven,
// with zeros, scaled by base, in multiples of unit.
func unevenCounts(r *rand.Rand, n, base, unit int) []int {
	c := make([]int, n)
	for i := range c {
		switch {
		case i%3 == 1:
			c[i] = 0
		default:
			c[i] = (base + r.IntN(base+1)) / unit * unit
		}
	}
	return c
}

// vBases are the per-rank sizes in bytes the v-collectives run with; the
// last is large enough to need the pipelined algorithms.
var vBases = []int{0, 1, 5, 100, 4096, 100003, 1 << 20}

func testAllgatherv(t *testing.T, g []backends.Backend) {
	n := len(g)
	for i, base := range vBases {
		if base >= 1<<20 && light() {
			continue
		}
		r := Rand(uint64(100+i), 0)
		cnt := unevenCounts(r, n, base, 1)
		if base == 0 {
			cnt = make([]int, n)
		}
		in := make([][]byte, n)
		var want []byte
		for k := range in {
			in[k] = RandBytes(r, cnt[k])
			want = append(want, in[k]...)
		}
		out := make([][]byte, n)
		for k := range out {
			out[k] = make([]byte, len(want))
		}
		what := fmt.Sprintf("Allgatherv(counts=%v)", cnt)
		if !onAll(t, g, what, func(ctx context.Context, k int, b backends.Backend) error {
			return b.Allgatherv(ctx, in[k], out[k], cnt)
		}) {
			t.FailNow()
		}
		for k := range out {
			if !bytes.Equal(out[k], want) {
				t.Fatalf("%s: rank %d result differs from the concatenation at byte %d", what, k, FirstDiff(out[k], want))
			}
		}
	}
}

func testBroadcast(t *testing.T, g []backends.Backend) {
	n := len(g)
	for i, size := range []int{0, 1, 100, 65536, 3<<20 + 7} {
		for root := range n {
			if size > 1<<20 && root > 0 && light() {
				continue
			}
			r := Rand(uint64(200+i), root)
			want := RandBytes(r, size)
			bufs := make([][]byte, n)
			for k := range bufs {
				if k == root {
					bufs[k] = bytes.Clone(want)
				} else {
					bufs[k] = RandBytes(r, size) // garbage to be overwritten
				}
			}
			what := fmt.Sprintf("Broadcast(%d bytes, root=%d)", size, root)
			if !onAll(t, g, what, func(ctx context.Context, k int, b backends.Backend) error {
				return b.Broadcast(ctx, bufs[k], root)
			}) {
				t.FailNow()
			}
			for k := range bufs {
				if !bytes.Equal(bufs[k], want) {
					t.Fatalf("%s: rank %d differs from the root at byte %d", what, k, FirstDiff(bufs[k], want))
				}
			}
		}
	}
}

func testAlltoallv(t *testing.T, g []backends.Backend) {
	n := len(g)
	for i, base := range vBases {
		if base >= 1<<20 && light() {
			continue
		}
		r := Rand(uint64(300+i), 0)
		// send[k][q] is the number of bytes rank k sends to rank q.
		send := make([][]int, n)
		for k := range send {
			send[k] = unevenCounts(r, n, base, 1)
			if k%2 == 1 && n > 1 {
				send[k][(k+1)%n] = 0
			}
		}
		in := make([][]byte, n)
		for k := range in {
			in[k] = RandBytes(r, sum(send[k]))
		}
		recv := make([][]int, n)
		out := make([][]byte, n)
		for k := range recv {
			recv[k] = make([]int, n)
			for q := range n {
				recv[k][q] = send[q][k]
			}
			out[k] = make([]byte, sum(recv[k]))
		}
		what := fmt.Sprintf("Alltoallv(base=%d)", base)
		if !onAll(t, g, what, func(ctx context.Context, k int, b backends.Backend) error {
			return b.Alltoallv(ctx, in[k], send[k], out[k], recv[k])
		}) {
			t.FailNow()
		}
		for k := range out {
			off := 0
			for q := range n {
				// Rank q's piece for k starts at the running sum of
				// q's send counts before k.
				src := in[q][sum(send[q][:k]):][:send[q][k]]
				if got := out[k][off : off+recv[k][q]]; !bytes.Equal(got, src) {
					t.Fatalf("%s: rank %d's piece from rank %d differs at byte %d", what, k, q, FirstDiff(got, src))
				}
				off += recv[k][q]
			}
		}
	}
}

func testReduceScatter(t *testing.T, g []backends.Backend) {
	n := len(g)
	seed := uint64(400)
	for _, dt := range tensor.DTypes() {
		for _, op := range allOps {
			for i, base := range []int{0, 1, 3, 100, 5000, 1 << 16} {
				if base == 1<<16 && !largeCase(dt, op) {
					continue // a multi-MiB result; see largeCase
				}
				seed++
				r := Rand(seed, 0)
				cnt := unevenCounts(r, n, base*dt.Size(), dt.Size())
				if i == 1 && n > 1 {
					cnt[n-1] = 0 // a trailing empty block
				}
				total := sum(cnt) / dt.Size()
				in := make([][]byte, n)
				for k := range in {
					in[k] = Fill(Rand(seed, k+1), dt, op, total)
				}
				want := Reduce(in, dt, op)
				out := make([][]byte, n)
				for k := range out {
					out[k] = make([]byte, cnt[k])
				}
				orig := make([][]byte, n)
				for k := range in {
					orig[k] = bytes.Clone(in[k])
				}
				what := fmt.Sprintf("ReduceScatter(%v, %v, counts=%v)", dt, op, cnt)
				if !onAll(t, g, what, func(ctx context.Context, k int, b backends.Backend) error {
					return b.ReduceScatter(ctx, in[k], out[k], cnt, dt, op)
				}) {
					t.FailNow()
				}
				for k := range out {
					block := want[sum(cnt[:k]):][:cnt[k]]
					if j := diff(out[k], block, dt); j >= 0 {
						t.Fatalf("%s: rank %d element %d = %x, want %x", what, k, j, elem(out[k], dt, j), elem(block, dt, j))
					}
					if !bytes.Equal(in[k], orig[k]) {
						t.Fatalf("%s: rank %d's input was modified", what, k)
					}
				}
			}
		}
	}
}

func testBarrier(t *testing.T, g []backends.Backend) {
	n := len(g)
	// No rank may leave a barrier before the last one has entered it.
	var mu sync.Mutex
	entered := 0
	for round := range 5 {
		if !onAll(t, g, "Barrier", func(ctx context.Context, k int, b backends.Backend) error {
			if k == round%n {
				time.Sleep(20 * time.Millisecond) // a late rank
			}
			mu.Lock()
			entered++
			mu.Unlock()
			if err := b.Barrier(ctx); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			if entered < (round+1)*n {
				return fmt.Errorf("left barrier %d with %d of %d ranks entered", round, entered-round*n, n)
			}
			return nil
		}) {
			t.FailNow()
		}
	}
}

// testBackToBack issues a long mixed sequence of collectives without any
// synchronisation between ranks beyond the collectives themselves, so fast
// ranks run ahead and an engine must keep each op's bytes apart.
func testBackToBack(t *testing.T, g []backends.Backend) {
	n := len(g)
	const rounds = 40
	type step struct {
		kind  int
		count int
		root  int
	}
	r := Rand(500, 0)
	steps := make([]step, rounds)
	for i := range steps {
		steps[i] = step{kind: r.IntN(4), count: []int{1, 17, 3000, 70000}[r.IntN(4)], root: r.IntN(n)}
	}
	inputs := make([][][]byte, rounds) // [step][rank]
	for i, s := range steps {
		inputs[i] = make([][]byte, n)
		for k := range n {
			inputs[i][k] = Fill(Rand(uint64(600+i), k), tensor.Int32, tensor.Sum, s.count)
		}
	}
	results := make([][][]byte, rounds)
	for i := range results {
		results[i] = make([][]byte, n)
	}
	onAll(t, g, "back-to-back", func(ctx context.Context, k int, b backends.Backend) error {
		for i, s := range steps {
			buf := bytes.Clone(inputs[i][k])
			var err error
			switch s.kind {
			case 0:
				err = b.Allreduce(ctx, buf, tensor.Int32, tensor.Sum)
			case 1:
				err = b.Broadcast(ctx, buf, s.root)
			case 2:
				out := make([]byte, len(buf)*n)
				err = b.Allgatherv(ctx, buf, out, repeat(len(buf), n))
				buf = out
			case 3:
				err = b.Barrier(ctx)
			}
			if err != nil {
				return fmt.Errorf("step %d: %w", i, err)
			}
			results[i][k] = buf
		}
		return nil
	})
	if t.Failed() {
		t.FailNow()
	}
	for i, s := range steps {
		var want []byte
		switch s.kind {
		case 0:
			want = Reduce(inputs[i], tensor.Int32, tensor.Sum)
		case 1:
			want = inputs[i][s.root]
		case 2:
			want = bytes.Join(inputs[i], nil)
		}
		for k := range n {
			got := results[i][k]
			if s.kind == 3 {
				continue
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("step %d (kind %d, count %d): rank %d differs at byte %d", i, s.kind, s.count, k, FirstDiff(got, want))
			}
		}
	}
}

// testStats checks the byte counters of engines that keep them: an allreduce
// of a buffer moves data in both directions, and each link's sent count on
// one side equals the received count on the other.
func testStats(t *testing.T, g []backends.Backend) {
	n := len(g)
	if _, ok := g[0].(backends.StatsReporter); !ok || n == 1 {
		t.Skip("engine keeps no statistics, or nothing to exchange")
	}
	onAll(t, g, "Allreduce", func(ctx context.Context, k int, b backends.Backend) error {
		return b.Allreduce(ctx, make([]byte, 1<<16), tensor.Float32, tensor.Sum)
	})
	// Counters are updated after the bytes move; the barrier makes sure
	// every rank finished counting before they are compared.
	onAll(t, g, "Barrier", func(ctx context.Context, k int, b backends.Backend) error { return b.Barrier(ctx) })
	stats := make([]backends.Stats, n)
	for k, b := range g {
		stats[k] = b.(backends.StatsReporter).Stats()
		if len(stats[k].SentBytes) != n || len(stats[k].RecvBytes) != n {
			t.Fatalf("rank %d: stats have %d/%d entries, want %d", k, len(stats[k].SentBytes), len(stats[k].RecvBytes), n)
		}
	}
	var total int64
	for k := range n {
		for q := range n {
			if stats[k].SentBytes[q] != stats[q].RecvBytes[k] {
				t.Errorf("rank %d sent %d bytes to rank %d, which received %d", k, stats[k].SentBytes[q], q, stats[q].RecvBytes[k])
			}
			total += stats[k].SentBytes[q]
		}
	}
	if total == 0 {
		t.Errorf("no bytes counted")
	}
}

// testPeerLoss closes one rank while every rank is issuing allreduces in a
// loop: every survivor must fail with a *backends.PeerError naming the closed
// rank, within lossTimeout.
func testPeerLoss(t *testing.T, newGroup func(t *testing.T, size int) []backends.Backend, n int) {
	g := group(t, newGroup, n)
	victim := n / 2
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	errs := make([]error, n)
	when := make([]time.Time, n)
	var wg sync.WaitGroup
	closed := make(chan time.Time, 1)
	for k, b := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1<<20)
			for i := 0; ; i++ {
				if err := b.Allreduce(ctx, buf, tensor.Float32, tensor.Sum); err != nil {
					errs[k], when[k] = err, time.Now()
					return
				}
				if k == victim && i == 3 {
					go func() {
						time.Sleep(5 * time.Millisecond) // mid-op, most likely
						closed <- time.Now()
						b.Close()
					}()
				}
			}
		}()
	}
	wg.Wait()
	at := <-closed
	for k := range n {
		if k == victim {
			if errs[k] == nil {
				t.Errorf("rank %d (closed) returned no error", k)
			}
			continue
		}
		lost, ok := backends.LostRank(errs[k])
		switch {
		case !ok:
			t.Errorf("rank %d: got %v, want a *backends.PeerError naming rank %d", k, errs[k], victim)
		case lost != victim:
			t.Errorf("rank %d: error names rank %d, want %d: %v", k, lost, victim, errs[k])
		case when[k].Sub(at) > lossTimeout:
			t.Errorf("rank %d: took %v to notice", k, when[k].Sub(at))
		}
		// The backend stays failed.
		err := g[k].Barrier(ctx)
		if err == nil {
			t.Errorf("rank %d: Barrier after the loss succeeded", k)
		}
	}
}

// testCancel checks that a call blocked on peers that never arrive returns
// an error wrapping ctx.Err() when its context is cancelled.
func testCancel(t *testing.T, newGroup func(t *testing.T, size int) []backends.Backend) {
	g := group(t, newGroup, 2)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	// Rank 1 never joins, so rank 0 can only return through ctx.
	err := g[0].Allreduce(ctx, make([]byte, 4096), tensor.Float32, tensor.Sum)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Allreduce with a cancelled context returned %v, want an error wrapping context.Canceled", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("cancellation took %v", d)
	}
	// An already cancelled context fails at once too.
	if err := g[1].Barrier(ctx); !errors.Is(err, context.Canceled) && err == nil {
		t.Errorf("Barrier with a cancelled context returned nil")
	}
}

func sum(c []int) int {
	s := 0
	for _, x := range c {
		s += x
	}
	return s
}

func repeat(x, n int) []int {
	c := make([]int, n)
	for i := range c {
		c[i] = x
	}
	return c
}

// Rand is rank's random source for a run seeded with seed.
func Rand(seed uint64, rank int) *rand.Rand {
	return rand.New(rand.NewPCG(seed, uint64(rank)+0x9e3779b97f4a7c15))
}

// RandBytes is n random bytes from r.
func RandBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// FirstDiff is the first index where a and b differ (the shorter's length
// when one is a prefix of the other).
func FirstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
