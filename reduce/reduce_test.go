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

var allOps = []tensor.ReduceOp{tensor.Sum, tensor.Min, tensor.Max, tensor.Product}

// paths runs f once per implementation this machine has: the assembly
// loops (when the CPU has them) and the portable Go loops. f is given the
// dtypes whose code differs between the two; on the second run that is
// only float32, float64 and float16.
func paths(t *testing.T, f func(t *testing.T, dtypes []tensor.DType)) {
	t.Helper()
	saveAVX2, saveF16C := haveAVX2, haveF16C
	defer func() { haveAVX2, haveF16C = saveAVX2, saveF16C }()
	if saveAVX2 || saveF16C {
		t.Run("asm", func(t *testing.T) { f(t, tensor.DTypes()) })
	}
	haveAVX2, haveF16C = false, false
	if saveAVX2 || saveF16C {
		t.Run("go", func(t *testing.T) { f(t, []tensor.DType{tensor.Float32, tensor.Float64, tensor.Float16}) })
	} else {
		t.Run("go", func(t *testing.T) { f(t, tensor.DTypes()) })
	}
}

// randBuf returns n random elements of dt. Floats mix small integers (so
// sums are often exact), random values, and now and then ±0, ±Inf and NaN,
// which pin down the Min/Max ordering rules.
func randBuf(r *rand.Rand, dt tensor.DType, n int) []byte {
	b := make([]byte, n*dt.Size())
	for i := 0; i < n; i++ {
		var f float64
		switch r.IntN(40) {
		case 0:
			f = math.NaN()
		case 1:
			f = math.Inf(1)
		case 2:
			f = math.Inf(-1)
		case 3:
			f = math.Copysign(0, -1)
		case 4:
			f = 0
		case 5, 6, 7, 8, 9, 10, 11, 12, 13, 14:
			f = float64(r.IntN(17) - 8)
		default:
			f = math.Ldexp(r.NormFloat64(), r.IntN(20)-10)
		}
		switch dt {
		case tensor.Float32, tensor.Float16, tensor.BFloat16:
			refPutF32(b, i, dt, float32(f))
		case tensor.Float64:
			binary.LittleEndian.PutUint64(b[i*8:], math.Float64bits(f))
		case tensor.Bool:
			if r.IntN(3) == 0 {
				b[i] = byte(r.IntN(256)) // any non-zero byte is true
			}
		default:
			if r.IntN(2) == 0 {
				refPutInt(b, i, dt, int64(r.IntN(9)-4))
			} else {
				refPutInt(b, i, dt, int64(r.Uint64()))
			}
		}
	}
	return b
}

// aliasing describes how the dsts of a case relate to its srcs.
type aliasing struct {
	name string
	// build returns the srcs and dsts given k fresh source buffers and a
	// function making fresh destination buffers.
	build func(srcs [][]byte, fresh func() []byte) (s, d [][]byte)
}

var aliasings = []aliasing{
	{"separate1", func(s [][]byte, fresh func() []byte) ([][]byte, [][]byte) {
		return s, [][]byte{fresh()}
	}},
	{"separate3", func(s [][]byte, fresh func() []byte) ([][]byte, [][]byte) {
		return s, [][]byte{fresh(), fresh(), fresh()}
	}},
	{"dst=src0", func(s [][]byte, fresh func() []byte) ([][]byte, [][]byte) {
		return s, [][]byte{s[0]}
	}},
	{"dst=last", func(s [][]byte, fresh func() []byte) ([][]byte, [][]byte) {
		return s, [][]byte{s[len(s)-1], fresh()}
	}},
	{"dsts=srcs", func(s [][]byte, fresh func() []byte) ([][]byte, [][]byte) {
		return s, append([][]byte(nil), s...)
	}},
	{"dsts=reversed+fresh", func(s [][]byte, fresh func() []byte) ([][]byte, [][]byte) {
		d := []byte(nil)
		if len(s[0]) > 0 {
			d = fresh()
		}
		out := [][]byte{}
		for i := len(s) - 1; i >= 0; i-- {
			out = append(out, s[i])
		}
		return s, append(out, d)
	}},
	{"repeated-src", func(s [][]byte, fresh func() []byte) ([][]byte, [][]byte) {
		// The same buffer as several sources and as the dst.
		rep := append([][]byte{s[0]}, s...)
		rep = append(rep, s[0])
		return rep, [][]byte{s[0], s[0]}
	}},
}

type scaling struct{ pre, post float64 }

var scalings = []scaling{{1, 1}, {0.5, 1}, {1, 1.0 / 3}, {-3, 0.25}}

// checkCase runs one Reduce and compares every dst with refReduce, and every
// source that is not a dst with its original contents.
func checkCase(t *testing.T, r *rand.Rand, dt tensor.DType, op tensor.ReduceOp, k, n int, al aliasing, sc scaling, opts *Options) {
	t.Helper()
	orig := make([][]byte, k)
	for i := range orig {
		orig[i] = randBuf(r, dt, n)
	}
	bufs := make([][]byte, k)
	for i := range bufs {
		bufs[i] = bytes.Clone(orig[i])
	}
	srcs, dsts := al.build(bufs, func() []byte { return randBuf(r, dt, n) })
	// The reference sees the sources as they were before the call.
	refSrcs := make([][]byte, len(srcs))
	for i, s := range srcs {
		refSrcs[i] = bytes.Clone(s)
	}
	want := refReduce(refSrcs, dt, op, sc.pre, sc.post)
	if err := Reduce(dsts, srcs, dt, op, sc.pre, sc.post, opts); err != nil {
		t.Fatalf("%v %v k=%d n=%d %s %v: %v", dt, op, k, n, al.name, sc, err)
	}
	for i, d := range dsts {
		if at := sameBits(d, want, dt); at >= 0 {
			sz := dt.Size()
			t.Fatalf("%v %v k=%d n=%d %s pre=%v post=%v opts=%+v: dsts[%d] element %d = %x, want %x (srcs %x)",
				dt, op, k, n, al.name, sc.pre, sc.post, opts, i, at, d[at*sz:(at+1)*sz], want[at*sz:(at+1)*sz], column(refSrcs, at, sz))
		}
	}
	for i, s := range bufs {
		isDst := false
		for _, d := range dsts {
			isDst = isDst || same(s, d)
		}
		if !isDst && !bytes.Equal(s, orig[i]) {
			t.Fatalf("%v %v k=%d n=%d %s: source %d was modified", dt, op, k, n, al.name, i)
		}
	}
}

func column(srcs [][]byte, at, sz int) []string {
	var out []string
	for _, s := range srcs {
		out = append(out, fmt.Sprintf("%x", s[at*sz:(at+1)*sz]))
	}
	return out
}

// TestReduceMatrix covers every dtype x op x k x scaling x aliasing on small
// lengths, and then 1000 elements with default options and with options
// that force several workers and 256-byte chunks (so chunk tails, vector
// tails and worker splits are all exercised).
func TestReduceMatrix(t *testing.T) {
	tiny := &Options{Workers: 3, ParallelMin: 1, ChunkBytes: 1}
	paths(t, func(t *testing.T, dtypes []tensor.DType) {
		r := rand.New(rand.NewPCG(1, 2))
		for _, dt := range dtypes {
			for _, op := range allOps {
				t.Run(dt.String()+"/"+op.String(), func(t *testing.T) {
					for _, k := range []int{1, 2, 3, 4, 8} {
						for _, n := range []int{0, 1, 7, 63} {
							for _, al := range aliasings {
								for _, sc := range scalings {
									checkCase(t, r, dt, op, k, n, al, sc, nil)
								}
							}
						}
						for i, al := range aliasings {
							opts := tiny
							if i%2 == 0 {
								opts = nil
							}
							checkCase(t, r, dt, op, k, 1000, al, scalings[(i+k)%len(scalings)], opts)
						}
					}
				})
			}
		}
	})
}

// TestReduceLarge runs bigger buffers through the worker split: 100003
// elements for every type and op, and a few MiB for the hot types.
func TestReduceLarge(t *testing.T) {
	split := &Options{Workers: 4, ParallelMin: 1, ChunkBytes: 4 << 10}
	paths(t, func(t *testing.T, dtypes []tensor.DType) {
		r := rand.New(rand.NewPCG(3, 4))
		for _, dt := range dtypes {
			for i, op := range allOps {
				t.Run(dt.String()+"/"+op.String(), func(t *testing.T) {
					if raceEnabled && i >= 2 {
						t.Skip("-race: Sum and Min cover both variants")
					}
					if i%2 == 0 {
						checkCase(t, r, dt, op, 2, 100003, aliasings[4], scalings[0], nil)
					} else {
						checkCase(t, r, dt, op, 3, 100003, aliasings[3], scalings[3], split)
					}
				})
			}
		}
		// A few MiB, for the hot types; under -race (slow) only float32 and
		// with -short none.
		big := []struct {
			dt tensor.DType
			op tensor.ReduceOp
		}{{tensor.Float32, tensor.Sum}, {tensor.Float64, tensor.Max}, {tensor.Float16, tensor.Sum}}
		if raceEnabled {
			big = big[:1]
		}
		if testing.Short() {
			big = nil
		}
		for _, c := range big {
			n := (3<<20)/c.dt.Size() + 5
			t.Run(fmt.Sprintf("%v/%v/%d", c.dt, c.op, n), func(t *testing.T) {
				checkCase(t, r, c.dt, c.op, 2, n, aliasings[4], scalings[2], nil)
			})
		}
	})
}

// TestReduceMisaligned uses buffers that start at odd addresses.
func TestReduceMisaligned(t *testing.T) {
	paths(t, func(t *testing.T, _ []tensor.DType) {
		r := rand.New(rand.NewPCG(5, 6))
		for _, dt := range []tensor.DType{tensor.Float32, tensor.Float64, tensor.Float16, tensor.Int64} {
			n := 1000
			a := randBuf(r, dt, n+1)[1:]
			b := randBuf(r, dt, n+2)[3:]
			b = b[:n*dt.Size()]
			a = a[:n*dt.Size()]
			want := refReduce([][]byte{bytes.Clone(a), bytes.Clone(b)}, dt, tensor.Sum, 1, 1)
			if err := Reduce([][]byte{a, b}, [][]byte{a, b}, dt, tensor.Sum, 1, 1, nil); err != nil {
				t.Fatal(err)
			}
			if at := sameBits(a, want, dt); at >= 0 {
				t.Fatalf("%v: element %d differs", dt, at)
			}
			if at := sameBits(b, want, dt); at >= 0 {
				t.Fatalf("%v: element %d differs", dt, at)
			}
		}
	})
}

// TestMinMaxNaN pins down the documented NaN order: a NaN in the first
// source sticks, a NaN in a later source is skipped.
func TestMinMaxNaN(t *testing.T) {
	paths(t, func(t *testing.T, _ []tensor.DType) {
		nan := float32(math.NaN())
		const n = 40 // covers a vector block and a scalar tail
		for _, op := range []tensor.ReduceOp{tensor.Min, tensor.Max} {
			a, b := make([]float32, n), make([]float32, n)
			for i := range a {
				a[i], b[i] = nan, 1
				if i%2 == 1 {
					a[i], b[i] = 1, nan
				}
			}
			ab, bb := f32bytes(a), f32bytes(b)
			out := make([]byte, len(ab))
			if err := Reduce([][]byte{out}, [][]byte{ab, bb}, tensor.Float32, op, 1, 1, nil); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < n; i++ {
				got := math.Float32frombits(binary.LittleEndian.Uint32(out[i*4:]))
				if i%2 == 0 && !math.IsNaN(float64(got)) || i%2 == 1 && got != 1 {
					t.Errorf("%v element %d = %v", op, i, got)
				}
			}
		}
	})
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[i*4:], math.Float32bits(x))
	}
	return b
}

// TestIntegerRules pins the integer conventions with literal values.
func TestIntegerRules(t *testing.T) {
	tests := []struct {
		name      string
		dt        tensor.DType
		op        tensor.ReduceOp
		a, b      int64
		pre, post float64
		want      int64
	}{
		{"int8 sum wraps", tensor.Int8, tensor.Sum, 100, 100, 1, 1, -56},
		{"uint8 product wraps", tensor.Uint8, tensor.Product, 16, 17, 1, 1, 16},
		{"int32 truncates toward zero", tensor.Int32, tensor.Sum, -7, 0, 0.5, 1, -3},
		{"int64 average", tensor.Int64, tensor.Sum, 3, 4, 1, 0.5, 3},
		{"int16 post negative", tensor.Int16, tensor.Sum, 5, 6, 1, -0.5, -5},
		{"int64 saturates", tensor.Int64, tensor.Sum, math.MaxInt64, 0, 4, 1, math.MaxInt64},
		{"uint16 min", tensor.Uint16, tensor.Min, 65535, 3, 1, 1, 3},
		{"int8 max", tensor.Int8, tensor.Max, -128, -1, 1, 1, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b, out := make([]byte, tt.dt.Size()), make([]byte, tt.dt.Size()), make([]byte, tt.dt.Size())
			refPutInt(a, 0, tt.dt, tt.a)
			refPutInt(b, 0, tt.dt, tt.b)
			if err := Reduce([][]byte{out}, [][]byte{a, b}, tt.dt, tt.op, tt.pre, tt.post, nil); err != nil {
				t.Fatal(err)
			}
			if got := refGetInt(out, 0, tt.dt); got != tt.want {
				t.Errorf("got %d, want %d", got, tt.want)
			}
		})
	}
}

func TestReduceErrors(t *testing.T) {
	buf := make([]byte, 64)
	other := make([]byte, 64)
	tests := []struct {
		name       string
		dsts, srcs [][]byte
		dt         tensor.DType
		op         tensor.ReduceOp
		want       string
	}{
		{"invalid dtype", [][]byte{buf}, [][]byte{buf}, tensor.Invalid, tensor.Sum, "invalid dtype"},
		{"dtype out of range", [][]byte{buf}, [][]byte{buf}, tensor.DType(200), tensor.Sum, "invalid dtype"},
		{"average", [][]byte{buf}, [][]byte{buf}, tensor.Float32, tensor.Average, "Average"},
		{"adasum", [][]byte{buf}, [][]byte{buf}, tensor.Float32, tensor.Adasum, "Adasum"},
		{"bad op", [][]byte{buf}, [][]byte{buf}, tensor.Float32, tensor.ReduceOp(77), "invalid op"},
		{"no srcs", [][]byte{buf}, nil, tensor.Float32, tensor.Sum, "no source"},
		{"no dsts", nil, [][]byte{buf}, tensor.Float32, tensor.Sum, "no destination"},
		{"ragged element", [][]byte{buf[:6]}, [][]byte{buf[:6]}, tensor.Float32, tensor.Sum, "whole number"},
		{"src length", [][]byte{buf}, [][]byte{buf, other[:32]}, tensor.Float32, tensor.Sum, "srcs[1] has 32 bytes"},
		{"dst length", [][]byte{other[:60]}, [][]byte{buf}, tensor.Float32, tensor.Sum, "dsts[0] has 60 bytes"},
		{"dst overlaps src", [][]byte{buf[4:36]}, [][]byte{buf[:32]}, tensor.Float32, tensor.Sum, "partly overlaps srcs[0]"},
		{"dst overlaps dst", [][]byte{other[:32], other[8:40]}, [][]byte{buf[:32]}, tensor.Float32, tensor.Sum, "partly overlaps dsts[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Reduce(tt.dsts, tt.srcs, tt.dt, tt.op, 1, 1, nil)
			if err == nil || !strings.HasPrefix(err.Error(), "reduce: ") || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want reduce: ...%s...", err, tt.want)
			}
		})
	}
	if err := Scale(buf[:3], tensor.Float32, 2); err == nil {
		t.Error("Scale accepted a ragged buffer")
	}
	if err := Scale(buf, tensor.Invalid, 2); err == nil {
		t.Error("Scale accepted an invalid dtype")
	}
	if err := Fill(buf[:3], tensor.Int16, tensor.Sum); err == nil {
		t.Error("Fill accepted a ragged buffer")
	}
	if err := Fill(buf, tensor.Int16, tensor.Adasum); err == nil {
		t.Error("Fill accepted Adasum")
	}
	if err := Fill(buf, tensor.DType(99), tensor.Sum); err == nil {
		t.Error("Fill accepted an invalid dtype")
	}
}

func TestScale(t *testing.T) {
	paths(t, func(t *testing.T, dtypes []tensor.DType) {
		r := rand.New(rand.NewPCG(7, 8))
		for _, dt := range dtypes {
			for _, n := range []int{0, 1, 33, 5000} {
				for _, f := range []float64{1, 0.125, -3.5} {
					buf := randBuf(r, dt, n)
					want := refReduce([][]byte{bytes.Clone(buf)}, dt, tensor.Sum, f, 1)
					if dt == tensor.Bool {
						want = bytes.Clone(buf) // Scale leaves bool alone entirely
					}
					if err := Scale(buf, dt, f); err != nil {
						t.Fatal(err)
					}
					if at := sameBits(buf, want, dt); at >= 0 {
						t.Fatalf("%v n=%d f=%v: element %d differs", dt, n, f, at)
					}
				}
			}
		}
	})
}

// TestFill checks that Fill writes op's identity: reducing any buffer with a
// filled one gives the buffer back.
func TestFill(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, dt := range tensor.DTypes() {
		for _, op := range allOps {
			x := randBuf(r, dt, 300)
			id := make([]byte, len(x))
			if err := Fill(id, dt, op); err != nil {
				t.Fatal(err)
			}
			out := make([]byte, len(x))
			if err := Reduce([][]byte{out}, [][]byte{id, x}, dt, op, 1, 1, nil); err != nil {
				t.Fatal(err)
			}
			want := refReduce([][]byte{x}, dt, tensor.Sum, 1, 1) // x normalised
			for i := 0; i < 300; i++ {
				sz := dt.Size()
				if dt.IsFloat() && isNaNAt(x[i*sz:(i+1)*sz], dt) {
					continue // op(identity, NaN) keeps the identity under "if b < a"
				}
				if dt.IsFloat() && op == tensor.Sum && isNegZero(x[i*sz:(i+1)*sz]) {
					continue // +0 + -0 = +0: Fill writes zero, not -0
				}
				if !bytes.Equal(out[i*sz:(i+1)*sz], want[i*sz:(i+1)*sz]) {
					t.Fatalf("%v %v: element %d: op(identity, %x) = %x", dt, op, i, x[i*sz:(i+1)*sz], out[i*sz:(i+1)*sz])
				}
			}
		}
	}
	// Average shares Sum's identity.
	buf := []byte{1, 2, 3, 4}
	if err := Fill(buf, tensor.Float32, tensor.Average); err != nil || !bytes.Equal(buf, make([]byte, 4)) {
		t.Errorf("Fill(Average) = %x, %v", buf, err)
	}
}

// TestReduceAllocs pins the allocation count of the daemon's hot call: a
// 1 MiB float32 two-source Sum written to both sources, default options.
// A second worker costs the go statement's closure; one worker costs
// nothing.
func TestReduceAllocs(t *testing.T) {
	if testing.Short() && raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	a, b := make([]byte, 1<<20), make([]byte, 1<<20)
	bufs := [][]byte{a, b}
	for _, c := range []struct {
		opts *Options
		max  float64
	}{{nil, 1}, {&Options{Workers: 1}, 0}, {&Options{Workers: 2}, 1}, {&Options{Workers: 4, ParallelMin: 1}, 3}} {
		got := testing.AllocsPerRun(50, func() {
			if err := Reduce(bufs, bufs, tensor.Float32, tensor.Sum, 1, 1, c.opts); err != nil {
				t.Fatal(err)
			}
		})
		if got > c.max {
			t.Errorf("opts %+v: %v allocations per call, want <= %v", c.opts, got, c.max)
		}
		t.Logf("opts %+v: %v allocations per call", c.opts, got)
	}
	// Scale and the half-precision path are allocation-free too.
	if got := testing.AllocsPerRun(50, func() { _ = Scale(a, tensor.Float32, 0.5) }); got > 0 {
		t.Errorf("Scale: %v allocations per call", got)
	}
	h := [][]byte{a[:64<<10], b[:64<<10]}
	if got := testing.AllocsPerRun(50, func() { _ = Reduce(h, h, tensor.Float16, tensor.Sum, 1, 1, nil) }); got > 0 {
		t.Errorf("float16 Reduce: %v allocations per call", got)
	}
}

// isNegZero reports whether a little-endian float of any width is -0.
func isNegZero(x []byte) bool {
	for _, c := range x[:len(x)-1] {
		if c != 0 {
			return false
		}
	}
	return x[len(x)-1] == 0x80
}
