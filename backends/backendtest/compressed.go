package backendtest

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/reduce"
	"github.com/hvdd/hvdd/tensor"
)

// RunCompressed checks an engine that sends float32 Sum data in 16 bits
// (backends.Compression c): newGroup must build groups whose engines
// compress with c. Run's matrix, whose float Sum inputs are small integers
// and so exact in 16 bits, covers the rest of the engine's behaviour; this
// suite feeds float32 data of mixed magnitudes (1e-9 to 1e4, signs mixed,
// zeros, values that cancel across ranks) to Allreduce and ReduceScatter
// over 2 to 5 ranks and counts that take the latency and the bandwidth
// algorithms, and checks against sums computed in float64:
//
//   - every element lies within c.ErrorBound(n, Σ|x_i|) of the exact sum
//     (plus the float64 reference's own rounding, 2^-50 Σ|x_i|);
//   - every rank holds the same Allreduce bits, and they are 16-bit values
//     (the result travels in 16 bits: its owner keeps what it sent);
//   - NaN and ±Inf inputs give NaN and ±Inf there, and the neighbouring
//     elements are unaffected;
//   - values whose sums exceed the 16-bit range come back finite and
//     within the bound (the engine must not send them as ±Inf);
//   - an engine that reports Stats sends at most 60% of the bytes an
//     uncompressed ring would (2(n-1)/n of the buffer per rank), so the
//     data really travelled in 16 bits.
func RunCompressed(t *testing.T, c backends.Compression, newGroup func(t *testing.T, size int) []backends.Backend) {
	if c.Format() == tensor.Invalid {
		t.Fatalf("RunCompressed with %v: nothing to check", c)
	}
	for n := 2; n <= 5; n++ {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			g := group(t, newGroup, n)
			counts := []int{1, 17, 1000, 7*n + 3, 1<<13 + 1, 300007}
			if light() {
				counts = []int{17, 1<<13 + 1, 100003}
			}
			for _, count := range counts {
				seed := uint64(1000*n + count)
				in := mixedInputs(seed, n, count)
				checkCompressedAllreduce(t, g, c, in, true)
				checkCompressedReduceScatter(t, g, c, in)
			}
			t.Run("Overflow", func(t *testing.T) {
				count := 1<<13 + 1
				if !light() {
					count = 200003
				}
				checkCompressedAllreduce(t, g, c, overflowInputs(c, n, count), false)
			})
			t.Run("NaNInf", func(t *testing.T) { checkNaNInf(t, g, 5000) })
			t.Run("Bytes", func(t *testing.T) { checkCompressedBytes(t, g, 1<<20) })
		})
	}
}

// mixedInputs returns n float32 buffers of count elements: magnitudes
// m·10^e, m in [1, 10) and e uniform in [-9, 3], random signs, a few zeros, and pairs that
// cancel across ranks (rank r's value negated on rank r+1).
func mixedInputs(seed uint64, n, count int) [][]float32 {
	r := Rand(seed, 0)
	in := make([][]float32, n)
	for k := range in {
		in[k] = make([]float32, count)
	}
	for i := range count {
		for k := range n {
			switch x := r.IntN(20); {
			case x == 0:
				in[k][i] = 0
			case x == 1 && k > 0:
				in[k][i] = -in[k-1][i]
			default:
				v := float32((1 + 9*r.Float64()) * math.Pow(10, float64(r.IntN(13)-9)))
				if r.IntN(2) == 0 {
					v = -v
				}
				in[k][i] = v
			}
		}
	}
	return in
}

// overflowInputs returns inputs whose partial sums leave c's range while
// float32 holds them: every 7th element is large (40000 for float16, whose
// largest value is 65504; 3.39e38/n for bfloat16, near float32's largest),
// the others as mixedInputs.
func overflowInputs(c backends.Compression, n, count int) [][]float32 {
	in := mixedInputs(77, n, count)
	big := float32(40000)
	if c == backends.CompressBF16 {
		big = 3.39e38 / float32(n)
	}
	for i := 0; i < count; i += 7 {
		for k := range n {
			in[k][i] = big
		}
	}
	return in
}

func f32Buf(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		le.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

func f32At(b []byte, i int) float32 { return math.Float32frombits(le.Uint32(b[4*i:])) }

// within checks element i of got against the float64 sum of column i.
func within(c backends.Compression, in [][]float32, i int, got float32) (exact, bound float64, ok bool) {
	var sumAbs float64
	for _, x := range in {
		exact += float64(x[i])
		sumAbs += math.Abs(float64(x[i]))
	}
	bound = c.ErrorBound(len(in), sumAbs) + 0x1p-50*sumAbs
	return exact, bound, math.Abs(float64(got)-exact) <= bound
}

// representable reports whether f is exactly a value of the 16-bit format.
func representable(c backends.Compression, f float32) bool {
	if c == backends.CompressFP16 {
		return reduce.Float16ToFloat32(reduce.Float32ToFloat16(f)) == f
	}
	return reduce.BFloat16ToFloat32(reduce.Float32ToBFloat16(f)) == f
}

func checkCompressedAllreduce(t *testing.T, g []backends.Backend, c backends.Compression, in [][]float32, all16 bool) {
	t.Helper()
	n, count := len(g), len(in[0])
	bufs := make([][]byte, n)
	for k := range bufs {
		bufs[k] = f32Buf(in[k])
	}
	what := fmt.Sprintf("compressed Allreduce(float32, Sum, count=%d)", count)
	if !onAll(t, g, what, func(ctx context.Context, k int, b backends.Backend) error {
		return b.Allreduce(ctx, bufs[k], tensor.Float32, tensor.Sum)
	}) {
		t.FailNow()
	}
	worst := 0.0 // the largest error as a fraction of its bound
	for i := range count {
		got := f32At(bufs[0], i)
		exact, bound, ok := within(c, in, i, got)
		if !ok || math.IsInf(float64(got), 0) || math.IsNaN(float64(got)) {
			t.Fatalf("%s: element %d = %v, exact %v: error %g exceeds the bound %g (inputs %v)", what, i, got, exact, math.Abs(float64(got)-exact), bound, column32(in, i))
		}
		if bound > 0 {
			worst = max(worst, math.Abs(float64(got)-exact)/bound)
		}
		if all16 && !representable(c, got) {
			t.Fatalf("%s: element %d = %v (%#08x) is not a %v value", what, i, got, math.Float32bits(got), c)
		}
	}
	for k := 1; k < n; k++ {
		if !bytes.Equal(bufs[k], bufs[0]) {
			t.Fatalf("%s: rank %d differs from rank 0 at element %d", what, k, FirstDiff(bufs[k], bufs[0])/4)
		}
	}
	t.Logf("%s over %d ranks: largest error %.3f of the bound", what, n, worst)
}

func checkCompressedReduceScatter(t *testing.T, g []backends.Backend, c backends.Compression, in [][]float32) {
	t.Helper()
	n, count := len(g), len(in[0])
	// Uneven blocks, one of them empty when there are enough ranks.
	cnt := make([]int, n)
	for k := range cnt {
		cnt[k] = count / n
	}
	cnt[0] += count % n
	if n > 2 {
		cnt[1] += cnt[2]
		cnt[2] = 0
	}
	off := offsets(cnt)
	bytesCnt := make([]int, n)
	for k := range cnt {
		bytesCnt[k] = 4 * cnt[k]
	}
	ins := make([][]byte, n)
	outs := make([][]byte, n)
	for k := range ins {
		ins[k] = f32Buf(in[k])
		outs[k] = make([]byte, bytesCnt[k])
	}
	what := fmt.Sprintf("compressed ReduceScatter(float32, Sum, counts=%v)", cnt)
	if !onAll(t, g, what, func(ctx context.Context, k int, b backends.Backend) error {
		return b.ReduceScatter(ctx, ins[k], outs[k], bytesCnt, tensor.Float32, tensor.Sum)
	}) {
		t.FailNow()
	}
	for k := range n {
		for j := range cnt[k] {
			i := off[k] + j
			got := f32At(outs[k], j)
			if exact, bound, ok := within(c, in, i, got); !ok {
				t.Fatalf("%s: rank %d element %d = %v, exact %v: error %g exceeds the bound %g", what, k, j, got, exact, math.Abs(float64(got)-exact), bound)
			}
		}
	}
}

// checkNaNInf puts a NaN, +Inf and -Inf on different ranks at a few
// elements and checks they come out so on every rank, with the elements
// around them still finite.
func checkNaNInf(t *testing.T, g []backends.Backend, count int) {
	n := len(g)
	in := make([][]float32, n)
	for k := range in {
		in[k] = make([]float32, count)
		for i := range in[k] {
			in[k][i] = float32(i%9) - 4
		}
	}
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	in[0][10] = nan
	in[n-1][3000] = inf
	in[n/2][4000] = -inf
	in[0][4500], in[1][4500] = inf, -inf // Inf - Inf is NaN, as in float32
	bufs := make([][]byte, n)
	for k := range bufs {
		bufs[k] = f32Buf(in[k])
	}
	if !onAll(t, g, "Allreduce with NaN and Inf", func(ctx context.Context, k int, b backends.Backend) error {
		return b.Allreduce(ctx, bufs[k], tensor.Float32, tensor.Sum)
	}) {
		t.FailNow()
	}
	for k := range n {
		at := func(i int) float64 { return float64(f32At(bufs[k], i)) }
		if !math.IsNaN(at(10)) || !math.IsInf(at(3000), 1) || !math.IsInf(at(4000), -1) || !math.IsNaN(at(4500)) {
			t.Errorf("rank %d: elements 10, 3000, 4000, 4500 = %v %v %v %v, want NaN +Inf -Inf NaN", k, at(10), at(3000), at(4000), at(4500))
		}
		for _, i := range []int{9, 11, 2999, 3001, 3999, 4001} {
			if want := float64(n) * float64(float32(i%9)-4); at(i) != want {
				t.Errorf("rank %d: element %d = %v, want %v", k, i, at(i), want)
			}
		}
	}
}

// checkCompressedBytes compares the payload bytes an allreduce of size
// bytes sends (Stats) with an uncompressed ring's 2(n-1)/n of the buffer
// per rank.
func checkCompressedBytes(t *testing.T, g []backends.Backend, size int) {
	n := len(g)
	if _, ok := g[0].(backends.StatsReporter); !ok {
		t.Skip("engine keeps no statistics")
	}
	sent := func() int64 {
		var s int64
		for _, b := range g {
			for _, v := range b.(backends.StatsReporter).Stats().SentBytes {
				s += v
			}
		}
		return s
	}
	before := sent()
	in := mixedInputs(9, n, size/4)
	onAll(t, g, "Allreduce", func(ctx context.Context, k int, b backends.Backend) error {
		return b.Allreduce(ctx, f32Buf(in[k]), tensor.Float32, tensor.Sum)
	})
	// The counters move after the bytes; a barrier orders them.
	onAll(t, g, "Barrier", func(ctx context.Context, k int, b backends.Backend) error { return b.Barrier(ctx) })
	if t.Failed() {
		t.FailNow()
	}
	got := sent() - before
	plain := int64(2 * (n - 1) * size)
	if got > plain*6/10 {
		t.Errorf("a compressed allreduce of %d bytes over %d ranks sent %d bytes, %.2f of an uncompressed ring's %d", size, n, got, float64(got)/float64(plain), plain)
	}
	t.Logf("sent %d bytes, %.3f of an uncompressed ring's", got, float64(got)/float64(plain))
}

func offsets(c []int) []int {
	off := make([]int, len(c)+1)
	for i, x := range c {
		off[i+1] = off[i] + x
	}
	return off
}

func column32(in [][]float32, i int) []float32 {
	var c []float32
	for _, x := range in {
		c = append(c, x[i])
	}
	return c
}
