package reduce

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/hvdd/hvdd/tensor"
)

var adasumDTypes = []tensor.DType{tensor.Float16, tensor.Float32, tensor.Float64}

// refAdasum is the reference, written from the formula rather than from
// adasum.go: every vector decoded element by element into float64 (a nil
// buffer is zeros), prescaled, combined over the tree of ranks
// ((x0,x1),(x2,x3)),... with a' = (1 - a·b/(2‖a‖²))a + (1 - a·b/(2‖b‖²))b
// summed naively in float64, a coefficient left at 1 when its squared norm
// is below √DBL_MIN, each level rounded to dt (Horovod keeps every level in
// the tensor's dtype), then postscaled.
func refAdasum(bufs [][]byte, dt tensor.DType, n int, pre, post float64) []float64 {
	vecs := make([][]float64, len(bufs))
	for r, b := range bufs {
		vecs[r] = make([]float64, n)
		for i := range vecs[r] {
			if b != nil {
				vecs[r][i] = refScaleFloat(dt, refGet(b, i, dt), pre)
			}
		}
	}
	for level := 1; level < len(vecs); level *= 2 {
		for i := 0; i < len(vecs); i += 2 * level {
			a, b := vecs[i], vecs[i+level]
			var dot, na, nb float64
			for k := range a {
				dot += a[k] * b[k]
				na += a[k] * a[k]
				nb += b[k] * b[k]
			}
			ca, cb := 1.0, 1.0
			if na >= math.Sqrt(2.2250738585072014e-308) {
				ca = 1 - dot/(2*na)
			}
			if nb >= math.Sqrt(2.2250738585072014e-308) {
				cb = 1 - dot/(2*nb)
			}
			for k := range a {
				a[k] = refRound(dt, ca*a[k]+cb*b[k])
			}
		}
	}
	out := vecs[0]
	for i := range out {
		out[i] = refScaleFloat(dt, out[i], post)
	}
	return out
}

// refGet decodes element i of a float buffer.
func refGet(b []byte, i int, dt tensor.DType) float64 {
	switch dt {
	case tensor.Float64:
		return math.Float64frombits(binary.LittleEndian.Uint64(b[i*8:]))
	case tensor.Float32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[i*4:])))
	}
	return float64(Float16ToFloat32(binary.LittleEndian.Uint16(b[i*2:])))
}

// refPut encodes v (already representable in dt) as element i.
func refPut(b []byte, i int, dt tensor.DType, v float64) {
	switch dt {
	case tensor.Float64:
		binary.LittleEndian.PutUint64(b[i*8:], math.Float64bits(v))
	case tensor.Float32:
		binary.LittleEndian.PutUint32(b[i*4:], math.Float32bits(float32(v)))
	default:
		binary.LittleEndian.PutUint16(b[i*2:], Float32ToFloat16(float32(v)))
	}
}

// refRound rounds v to the nearest value of dt.
func refRound(dt tensor.DType, v float64) float64 {
	switch dt {
	case tensor.Float32:
		return float64(float32(v))
	case tensor.Float16:
		return float64(Float16ToFloat32(Float32ToFloat16(float32(v))))
	}
	return v
}

// refScaleFloat is Scale's rule for floats: the factor in the dtype's
// precision (float32 for the halves).
func refScaleFloat(dt tensor.DType, v, f float64) float64 {
	if f == 1 {
		return v
	}
	if dt == tensor.Float64 {
		return v * f
	}
	return refRound(dt, float64(float32(v)*float32(f)))
}

func floatBuf(dt tensor.DType, vals ...float64) []byte {
	b := make([]byte, len(vals)*dt.Size())
	for i, v := range vals {
		refPut(b, i, dt, v)
	}
	return b
}

func floats(b []byte, dt tensor.DType) []float64 {
	out := make([]float64, len(b)/dt.Size())
	for i := range out {
		out[i] = refGet(b, i, dt)
	}
	return out
}

// randFloats returns n values of dt in [-2, 2), with now and then a zero.
func randFloats(r *rand.Rand, dt tensor.DType, n int) []byte {
	b := make([]byte, n*dt.Size())
	for i := 0; i < n; i++ {
		v := r.Float64()*4 - 2
		if r.IntN(16) == 0 {
			v = 0
		}
		refPut(b, i, dt, refRound(dt, v))
	}
	return b
}

// adasumTol is the largest difference allowed between Adasum and the
// reference, relative to the largest magnitude in the result: a few units
// in the last place of dt for each level (the dot products are summed in
// another order, which can move a coefficient by an ulp of float64 and so
// a rounding to dt by one ulp).
func adasumTol(dt tensor.DType) float64 {
	switch dt {
	case tensor.Float16:
		return 4e-3
	case tensor.Float32:
		return 1e-6
	}
	return 1e-13
}

// checkAgainstRef runs Adasum on copies of inputs and compares every
// non-nil buffer with the reference.
func checkAgainstRef(t *testing.T, inputs [][]byte, dt tensor.DType, n int, pre, post float64, opts *Options) {
	t.Helper()
	want := refAdasum(inputs, dt, n, pre, post)
	bufs := make([][]byte, len(inputs))
	for i, b := range inputs {
		if b != nil {
			bufs[i] = bytes.Clone(b)
		}
	}
	if err := Adasum(bufs, dt, pre, post, opts); err != nil {
		t.Fatal(err)
	}
	var scale float64
	for _, w := range want {
		scale = max(scale, math.Abs(w))
	}
	tol := adasumTol(dt) * max(scale, 1e-300)
	for r, b := range bufs {
		if b == nil {
			continue
		}
		got := floats(b, dt)
		for i := range got {
			if d := math.Abs(got[i] - want[i]); !(d <= tol) {
				t.Fatalf("rank %d element %d: got %v, want %v (diff %g > %g)", r, i, got[i], want[i], d, tol)
			}
		}
		if r > 0 && !bytes.Equal(b, firstNonNil(bufs)) {
			t.Fatalf("rank %d's result differs from the first rank's", r)
		}
	}
}

func firstNonNil(bufs [][]byte) []byte {
	for _, b := range bufs {
		if b != nil {
			return b
		}
	}
	return nil
}

// TestAdasumMatrix compares Adasum with the reference over rank counts,
// dtypes, sizes (around the block size too) and scale factors.
func TestAdasumMatrix(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, ranks := range []int{1, 2, 4, 8} {
		for _, dt := range adasumDTypes {
			for _, n := range []int{0, 1, 7, 100, adasumBlock + 3} {
				for _, sc := range [][2]float64{{1, 1}, {0.5, 3}} {
					name := fmt.Sprintf("ranks%d/%v/n%d/pre%v_post%v", ranks, dt, n, sc[0], sc[1])
					t.Run(name, func(t *testing.T) {
						inputs := make([][]byte, ranks)
						for i := range inputs {
							inputs[i] = randFloats(r, dt, n)
						}
						checkAgainstRef(t, inputs, dt, n, sc[0], sc[1], &Options{Workers: 1})
						checkAgainstRef(t, inputs, dt, n, sc[0], sc[1], &Options{Workers: 4, ParallelMin: 1})
					})
				}
			}
		}
	}
}

// TestAdasumExact checks the cases whose result the formula gives exactly.
func TestAdasumExact(t *testing.T) {
	e := func(dt tensor.DType, i, n int, v float64) []byte {
		vals := make([]float64, n)
		vals[i] = v
		return floatBuf(dt, vals...)
	}
	for _, dt := range adasumDTypes {
		tests := []struct {
			name string
			in   [][]byte
			want []float64
		}{
			{"orthogonal pair sums", [][]byte{e(dt, 0, 2, 3), e(dt, 1, 2, -5)}, []float64{3, -5}},
			{"orthogonal four sum", [][]byte{e(dt, 0, 4, 1), e(dt, 1, 4, 2), e(dt, 2, 4, 3), e(dt, 3, 4, 4)}, []float64{1, 2, 3, 4}},
			{"identical pair averages", [][]byte{floatBuf(dt, 1, -2, 3), floatBuf(dt, 1, -2, 3)}, []float64{1, -2, 3}},
			{"identical four", [][]byte{floatBuf(dt, 1, -2), floatBuf(dt, 1, -2), floatBuf(dt, 1, -2), floatBuf(dt, 1, -2)}, []float64{1, -2}},
			{"opposite pair", [][]byte{floatBuf(dt, 1, 2), floatBuf(dt, -1, -2)}, []float64{0, 0}},
			// Tree order ((x0, x1), (x2, x3)): adasum(e0+e1, e0) = 0.75(e0+e1) + 0.5e0.
			// Folding left to right would give about (1.257, 0.529).
			{"tree order", [][]byte{e(dt, 0, 2, 1), e(dt, 1, 2, 1), e(dt, 0, 2, 1), e(dt, 0, 2, 1)}, []float64{1.25, 0.75}},
			{"zero vector leaves the other", [][]byte{floatBuf(dt, 0, 0, 0), floatBuf(dt, 1, 2, 3)}, []float64{1, 2, 3}},
			{"other zero vector", [][]byte{floatBuf(dt, 1, 2, 3), floatBuf(dt, 0, 0, 0)}, []float64{1, 2, 3}},
			{"all zero", [][]byte{floatBuf(dt, 0, 0), floatBuf(dt, 0, 0)}, []float64{0, 0}},
			{"nil is a zero vector", [][]byte{nil, floatBuf(dt, 1, 2), nil, nil}, []float64{1, 2}},
			{"nil beside orthogonal", [][]byte{e(dt, 0, 2, 1), nil, e(dt, 1, 2, 1), nil}, []float64{1, 1}},
		}
		for _, tc := range tests {
			t.Run(fmt.Sprintf("%v/%s", dt, tc.name), func(t *testing.T) {
				if err := Adasum(tc.in, dt, 1, 1, nil); err != nil {
					t.Fatal(err)
				}
				for r, b := range tc.in {
					if b == nil {
						continue
					}
					if got := floats(b, dt); fmt.Sprint(got) != fmt.Sprint(tc.want) {
						t.Errorf("rank %d: got %v, want %v", r, got, tc.want)
					}
				}
			})
		}
	}
}

// TestAdasumTinyNorm: a squared norm below √DBL_MIN leaves its coefficient
// at 1 (Horovod's rule), instead of blowing it up by dividing by it.
func TestAdasumTinyNorm(t *testing.T) {
	a := floatBuf(tensor.Float64, 1e-160, 0) // ‖a‖² = 1e-320 < 2^-511
	b := floatBuf(tensor.Float64, 1, 0)
	if err := Adasum([][]byte{a, b}, tensor.Float64, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	// ca = 1, cb = 1 - 1e-160/2: the sum, 1. Dividing by ‖a‖² would make
	// ca = 1 - 1e-160/1e-320/2 = -5e159 and the result about 0.5.
	if got := floats(a, tensor.Float64); got[0] != 1 || got[1] != 0 {
		t.Errorf("got %v, want [1 0]", got)
	}
}

// TestAdasumDeterministic: the result is the same bits for any number of
// goroutines (partial dot products are added in block order).
func TestAdasumDeterministic(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, dt := range adasumDTypes {
		n := 5*adasumBlock + 17
		inputs := make([][]byte, 4)
		for i := range inputs {
			inputs[i] = randFloats(r, dt, n)
		}
		var first []byte
		for _, w := range []int{1, 2, 3, 8} {
			bufs := make([][]byte, len(inputs))
			for i := range inputs {
				bufs[i] = bytes.Clone(inputs[i])
			}
			if err := Adasum(bufs, dt, 1, 1, &Options{Workers: w, ParallelMin: 1}); err != nil {
				t.Fatal(err)
			}
			if first == nil {
				first = bufs[0]
			} else if !bytes.Equal(first, bufs[0]) {
				t.Errorf("%v: %d workers give other bits than 1", dt, w)
			}
		}
	}
}

func TestAdasumErrors(t *testing.T) {
	f32 := func(n int) []byte { return make([]byte, 4*n) }
	shared := f32(8)
	tests := []struct {
		name string
		bufs [][]byte
		dt   tensor.DType
		want string
	}{
		{"int32", [][]byte{f32(2), f32(2)}, tensor.Int32, "float16, float32 and float64, not int32"},
		{"bfloat16", [][]byte{f32(2), f32(2)}, tensor.BFloat16, "not bfloat16"},
		{"bool", [][]byte{f32(2), f32(2)}, tensor.Bool, "not bool"},
		{"no ranks", nil, tensor.Float32, "power-of-two number of buffers, got 0"},
		{"three ranks", [][]byte{f32(2), f32(2), f32(2)}, tensor.Float32, "power-of-two number of buffers, got 3"},
		{"six ranks", [][]byte{f32(2), f32(2), f32(2), f32(2), f32(2), f32(2)}, tensor.Float32, "got 6"},
		{"ragged", [][]byte{f32(2), f32(3)}, tensor.Float32, "bufs[1] has 12 bytes"},
		{"partial element", [][]byte{make([]byte, 6), make([]byte, 6)}, tensor.Float32, "whole number"},
		{"overlap", [][]byte{shared[:16], shared[8:24]}, tensor.Float32, "overlaps"},
		{"same buffer twice", [][]byte{shared[:16], shared[:16]}, tensor.Float32, "overlaps"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Adasum(tc.bufs, tc.dt, 1, 1, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	// Every buffer nil or empty: nothing to do.
	if err := Adasum([][]byte{nil, nil}, tensor.Float32, 2, 2, nil); err != nil {
		t.Errorf("all nil: %v", err)
	}
}

func TestAdasumSpans(t *testing.T) {
	tests := []struct {
		lo, hi int
		want   string
	}{
		{0, 0, "[]"},
		{0, 1, "[{0 1}]"},
		{0, 4, "[{0 4}]"},
		{4, 8, "[{4 4}]"},
		{0, 3, "[{0 2} {2 1}]"},
		{3, 4, "[{3 1}]"},
		{1, 4, "[{1 1} {2 2}]"},
		{1, 8, "[{1 1} {2 2} {4 4}]"},
		{3, 13, "[{3 1} {4 4} {8 4} {12 1}]"},
		{6, 8, "[{6 2}]"},
	}
	for _, tc := range tests {
		if got := fmt.Sprint(AdasumSpans(tc.lo, tc.hi)); got != tc.want {
			t.Errorf("AdasumSpans(%d, %d) = %s, want %s", tc.lo, tc.hi, got, tc.want)
		}
	}
	// Every run: the spans tile it with aligned power-of-two runs, and no
	// two neighbours could merge into one (the cut is the fewest).
	for lo := 0; lo < 40; lo++ {
		for hi := lo; hi < 40; hi++ {
			spans, at := AdasumSpans(lo, hi), lo
			for k, s := range spans {
				if s.Start != at || s.Len < 1 || s.Len&(s.Len-1) != 0 || s.Start%s.Len != 0 {
					t.Fatalf("AdasumSpans(%d, %d) = %v: span %d is not an aligned run from %d", lo, hi, spans, k, at)
				}
				if k > 0 {
					p := spans[k-1]
					if p.Len == s.Len && p.Start%(2*p.Len) == 0 {
						t.Fatalf("AdasumSpans(%d, %d) = %v: spans %d and %d make one", lo, hi, spans, k-1, k)
					}
				}
				at += s.Len
			}
			if at != hi {
				t.Fatalf("AdasumSpans(%d, %d) = %v ends at %d", lo, hi, spans, at)
			}
		}
	}
}

// TestAdasumAcrossNodes splits the ranks into nodes of every layout, runs
// AdasumPartial on each node's spans, moves the values into fresh buffers
// (the exchange) and AdasumFinish: the bits must be Adasum's on one node,
// joined ranks (nil), whole joined spans and scale factors included.
func TestAdasumAcrossNodes(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	layouts := [][]int{{1}, {1, 1}, {2, 2}, {3, 1}, {1, 3}, {1, 2, 1}, {2, 1, 1}, {1, 1, 1, 1}, {4, 4}, {5, 3}, {3, 3, 2}, {1, 6, 1}, {7, 1}}
	for _, layout := range layouts {
		size := 0
		for _, l := range layout {
			size += l
		}
		for _, dt := range adasumDTypes {
			for _, n := range []int{1, 33, adasumBlock + 5} {
				for _, joined := range []string{"none", "odd", "high half", "all but one"} {
					name := fmt.Sprintf("%v/%v/n%d/joined_%s", layout, dt, n, joined)
					t.Run(name, func(t *testing.T) {
						inputs := make([][]byte, size)
						for i := range inputs {
							gone := joined == "odd" && i%2 == 1 || joined == "high half" && i >= size/2 ||
								joined == "all but one" && i != size-1
							if !gone || size == 1 {
								inputs[i] = randFloats(r, dt, n)
							}
						}
						clone := func() [][]byte {
							out := make([][]byte, size)
							for i, b := range inputs {
								if b != nil {
									out[i] = bytes.Clone(b)
								}
							}
							return out
						}
						want := clone()
						opts := &Options{Workers: 3, ParallelMin: 1}
						if err := Adasum(want, dt, 0.5, 3, opts); err != nil {
							t.Fatal(err)
						}
						bufs := clone()
						var spans []AdasumSpan
						var vals [][]byte
						lo := 0
						for _, l := range layout {
							for _, s := range AdasumSpans(lo, lo+l) {
								v, err := AdasumPartial(bufs[s.Start:s.Start+s.Len], dt, 0.5, opts)
								if err != nil {
									t.Fatal(err)
								}
								spans = append(spans, s)
								vals = append(vals, bytes.Clone(v)) // nil stays nil
							}
							lo += l
						}
						got, err := AdasumFinish(spans, vals, dt, 3, opts)
						if err != nil {
							t.Fatal(err)
						}
						if w := firstNonNil(want); !bytes.Equal(got, w) {
							t.Fatalf("across nodes %v, on one node %v", floats(got, dt)[:1], floats(w, dt)[:1])
						}
					})
				}
			}
		}
	}
}

func TestAdasumFinishErrors(t *testing.T) {
	b := func() []byte { return make([]byte, 8) }
	tests := []struct {
		name  string
		spans []AdasumSpan
		vals  [][]byte
		want  string
	}{
		{"count", []AdasumSpan{{0, 2}}, nil, "0 values for 1 spans"},
		{"gap", []AdasumSpan{{0, 1}, {2, 2}}, [][]byte{b(), b()}, "span 1 is [2, 4)"},
		{"unaligned", []AdasumSpan{{0, 1}, {1, 2}, {3, 1}}, [][]byte{b(), b(), b()}, "span 1 is [1, 3)"},
		{"not a power of two", []AdasumSpan{{0, 3}, {3, 1}}, [][]byte{b(), b()}, "span 0 is [0, 3)"},
		{"three ranks", []AdasumSpan{{0, 2}, {2, 1}}, [][]byte{b(), b()}, "power-of-two number of buffers, got 3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := AdasumFinish(tc.spans, tc.vals, tensor.Float32, 1, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestAdasumKernelsMatchGo: the AVX2 kernels give the Go loops' bits (the
// same lane order, the same roundings), on lengths around the lane groups.
func TestAdasumKernelsMatchGo(t *testing.T) {
	if !haveAVX2 {
		t.Log("no AVX2 here: the Go loops are the only path")
	}
	r := rand.New(rand.NewPCG(7, 7))
	spread := func() float64 { return (r.Float64()*2 - 1) * math.Ldexp(1, r.IntN(40)-20) }
	for _, n := range []int{0, 1, 7, 8, 9, 63, 64, 1000, adasumBlock + 5} {
		a32, b32 := make([]float32, n), make([]float32, n)
		a64, b64 := make([]float64, n), make([]float64, n)
		for i := range n {
			a32[i], b32[i] = float32(spread()), float32(spread())
			a64[i], b64[i] = spread(), spread()
		}
		run := func(avx bool) (s32, s64 [3]float64, x32 []float32, x64 []float64) {
			saved := haveAVX2
			haveAVX2 = avx && saved
			defer func() { haveAVX2 = saved }()
			var acc32, acc64 adasumAcc
			dotLanesF32(a32, b32, &acc32)
			dotLanesF64(a64, b64, &acc64)
			x32, x64 = append([]float32(nil), a32...), append([]float64(nil), a64...)
			axpbyF32(x32, b32, 0.75, -1.3)
			axpbyF64(x64, b64, 0.75, -1.3)
			return acc32.sums(), acc64.sums(), x32, x64
		}
		g32, g64, gx32, gx64 := run(false)
		v32, v64, vx32, vx64 := run(true)
		for q := range 3 {
			if math.Float64bits(g32[q]) != math.Float64bits(v32[q]) || math.Float64bits(g64[q]) != math.Float64bits(v64[q]) {
				t.Errorf("n=%d sum %d: Go %v %v, AVX2 %v %v", n, q, g32[q], g64[q], v32[q], v64[q])
			}
		}
		for i := range n {
			if math.Float32bits(gx32[i]) != math.Float32bits(vx32[i]) || math.Float64bits(gx64[i]) != math.Float64bits(vx64[i]) {
				t.Fatalf("n=%d axpby[%d]: Go %v %v, AVX2 %v %v", n, i, gx32[i], gx64[i], vx32[i], vx64[i])
			}
		}
	}
}
