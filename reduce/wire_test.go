package reduce

import (
	"encoding/binary"
	"fmt"
	"math"
	mrand "math/rand"
	"math/rand/v2"
	"reflect"
	"testing"
	"testing/quick"

	"github.com/hvdd/hvdd/tensor"
)

var wireFormats = []tensor.DType{tensor.Float16, tensor.BFloat16}

// wirePaths runs f with the vector kernels (when the CPU has them) and with
// the portable loops only.
func wirePaths(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	avx, f16c := haveAVX2, haveF16C
	defer func() { haveAVX2, haveF16C = avx, f16c }()
	t.Run("vector", f)
	haveAVX2, haveF16C = false, false
	t.Run("go", f)
}

// refNarrow is the scalar reference of Narrow: the per-element conversion,
// and overflow as "a finite input became an infinity".
func refNarrow(src []float32, dt tensor.DType) ([]uint16, bool) {
	out := make([]uint16, len(src))
	ovf := false
	for i, f := range src {
		var w float32
		if dt == tensor.Float16 {
			out[i] = Float32ToFloat16(f)
			w = Float16ToFloat32(out[i])
		} else {
			out[i] = Float32ToBFloat16(f)
			w = BFloat16ToFloat32(out[i])
		}
		if math.IsInf(float64(w), 0) && !math.IsInf(float64(f), 0) && !math.IsNaN(float64(f)) {
			ovf = true
		}
	}
	return out, ovf
}

func refWiden(h uint16, dt tensor.DType) float32 {
	if dt == tensor.Float16 {
		return Float16ToFloat32(h)
	}
	return BFloat16ToFloat32(h)
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.NativeEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

func u16Bytes(v []uint16) []byte {
	b := make([]byte, 2*len(v))
	for i, h := range v {
		binary.NativeEndian.PutUint16(b[2*i:], h)
	}
	return b
}

// checkNarrow compares Narrow on src with the reference, byte for byte and
// in its overflow report. off shifts the buffers off their alignment.
func checkNarrow(t *testing.T, src []float32, dt tensor.DType, off int) {
	t.Helper()
	want, wantOvf := refNarrow(src, dt)
	in := append(make([]byte, off), f32Bytes(src)...)[off:]
	out := make([]byte, off+2*len(src))[off:]
	ovf, err := Narrow(out, in, dt)
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range want {
		if got := binary.NativeEndian.Uint16(out[2*i:]); got != h {
			t.Fatalf("%v: Narrow(%v = %#08x) at %d of %d = %#04x, want %#04x", dt, src[i], math.Float32bits(src[i]), i, len(src), got, h)
		}
	}
	if ovf != wantOvf {
		t.Fatalf("%v: Narrow of %d elements reports overflow %v, want %v", dt, len(src), ovf, wantOvf)
	}
}

// edgeValues are the float32s where the 16-bit formats round interestingly:
// their range ends, ties, subnormals, infinities and NaNs.
var edgeValues = []float32{
	0, 1, 65504, 65505, 65519.996, 65520, 65536, 1e6, math.MaxFloat32, 0x1p-24, 0x1p-25, 0x1.8p-25, 1e-8, 0x1p-14,
	1 + 0x1p-11, 1 + 0x3p-11, 1 + 0x1p-8, 1 + 0x3p-8,
	math.Float32frombits(0x7f7f0000), math.Float32frombits(0x7f7f7fff), math.Float32frombits(0x7f7f8000), math.Float32frombits(0x7f7fffff),
	float32(math.Inf(1)), math.Float32frombits(0x7f800001), math.Float32frombits(0x7fc00000), math.Float32frombits(0x7fbfffff),
	math.Float32frombits(1), math.Float32frombits(0x007fffff),
}

func withSigns(v []float32) []float32 {
	var out []float32
	for _, f := range v {
		out = append(out, f, math.Float32frombits(math.Float32bits(f)^0x80000000))
	}
	return out
}

// TestNarrowEdges puts every edge value at every position of buffers of
// lengths 1 to 40, among values that are harmless, so that each lane of the
// vector loops and each element of the tails has to round it and report
// (or not report) its overflow.
func TestNarrowEdges(t *testing.T) {
	edges := withSigns(edgeValues)
	wirePaths(t, func(t *testing.T) {
		for _, dt := range wireFormats {
			for n := 1; n <= 40; n++ {
				buf := make([]float32, n)
				for i := range buf {
					buf[i] = float32(i) * 0.25
				}
				for _, e := range edges {
					for i := range n {
						old := buf[i]
						buf[i] = e
						checkNarrow(t, buf, dt, i%3)
						buf[i] = old
					}
				}
			}
		}
	})
}

// TestWireQuick checks Narrow, Widen and AddWidened against the scalar
// functions on random bit patterns (testing/quick), on both paths.
func TestWireQuick(t *testing.T) {
	cfg := &quick.Config{MaxCount: 300}
	if raceEnabled {
		cfg.MaxCount = 50
	}
	// Values drawn from every bit pattern, and half of them rescaled into
	// the float16 range, where most rounding happens.
	gen := func(vals []reflect.Value, r *rand.Rand) {
		n := r.IntN(300)
		v := make([]uint32, n)
		for i := range v {
			v[i] = r.Uint32()
			if r.IntN(2) == 0 {
				v[i] = 0x33000000 + r.Uint32N(0x47800000-0x33000000) | r.Uint32N(2)<<31
			}
		}
		vals[0] = reflect.ValueOf(v)
		vals[1] = reflect.ValueOf(r.IntN(4))
	}
	wirePaths(t, func(t *testing.T) {
		for _, dt := range wireFormats {
			r := rand.New(rand.NewPCG(21, uint64(dt)))
			c := *cfg
			c.Values = func(vals []reflect.Value, _ *mrand.Rand) { gen(vals, r) }
			err := quick.Check(func(bits []uint32, off int) bool {
				src := make([]float32, len(bits))
				halves := make([]uint16, len(bits))
				for i, b := range bits {
					src[i] = math.Float32frombits(b)
					halves[i] = uint16(b)
				}
				checkNarrow(t, src, dt, off)
				checkWiden(t, halves, src, dt, off)
				return !t.Failed()
			}, &c)
			if err != nil {
				t.Fatal(err)
			}
		}
	})
}

// checkWiden compares Widen of halves, and AddWidened of halves and add
// (in a separate dst and in place), with the scalar reference.
func checkWiden(t *testing.T, halves []uint16, add []float32, dt tensor.DType, off int) {
	t.Helper()
	n := len(halves)
	src := append(make([]byte, off), u16Bytes(halves)...)[off:]
	dst := make([]byte, off+4*n)[off:]
	if err := Widen(dst, src, dt); err != nil {
		t.Fatal(err)
	}
	for i, h := range halves {
		if got, want := binary.NativeEndian.Uint32(dst[4*i:]), math.Float32bits(refWiden(h, dt)); got != want {
			t.Fatalf("%v: Widen(%#04x) = %#08x, want %#08x", dt, h, got, want)
		}
	}
	ab := f32Bytes(add)
	sum := make([]byte, 4*n)
	if err := AddWidened(sum, src, ab, dt); err != nil {
		t.Fatal(err)
	}
	if err := AddWidened(ab, src, ab, dt); err != nil { // in place
		t.Fatal(err)
	}
	for i, h := range halves {
		want := math.Float32bits(refWiden(h, dt) + add[i])
		if got := binary.NativeEndian.Uint32(sum[4*i:]); got != want {
			t.Fatalf("%v: AddWidened(%#04x, %v) = %#08x, want %#08x", dt, h, add[i], got, want)
		}
		if got := binary.NativeEndian.Uint32(ab[4*i:]); got != want {
			t.Fatalf("%v: AddWidened in place (%#04x, %v) = %#08x, want %#08x", dt, h, add[i], got, want)
		}
	}
}

// TestWidenAll widens every 16-bit pattern, as one buffer, on both paths,
// and adds each to a value with and without a NaN of its own.
func TestWidenAll(t *testing.T) {
	all := make([]uint16, 1<<16)
	add := make([]float32, len(all))
	for i := range all {
		all[i] = uint16(i)
		add[i] = []float32{0, 1, -65504, float32(math.Inf(-1)), math.Float32frombits(0x7fc01234)}[i%5]
	}
	wirePaths(t, func(t *testing.T) {
		for _, dt := range wireFormats {
			checkWiden(t, all, add, dt, 0)
		}
	})
}

// TestWireRoundTrip checks what a compressed collective relies on: a value
// narrowed once narrows again to the same bits after widening (so a
// forwarded block is sent exactly as its owner sent it), without overflow.
func TestWireRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	src := make([]float32, 1<<12)
	for i := range src {
		src[i] = math.Float32frombits(r.Uint32())
	}
	src = append(src, withSigns(edgeValues)...)
	wirePaths(t, func(t *testing.T) {
		for _, dt := range wireFormats {
			h1 := make([]byte, 2*len(src))
			if _, err := Narrow(h1, f32Bytes(src), dt); err != nil {
				t.Fatal(err)
			}
			w := make([]byte, 4*len(src))
			if err := Widen(w, h1, dt); err != nil {
				t.Fatal(err)
			}
			h2 := make([]byte, len(h1))
			ovf, err := Narrow(h2, w, dt)
			if err != nil {
				t.Fatal(err)
			}
			if ovf {
				t.Errorf("%v: narrowing widened values reports overflow", dt)
			}
			for i := 0; i < len(h1); i += 2 {
				if h1[i] != h2[i] || h1[i+1] != h2[i+1] {
					t.Fatalf("%v: element %d (%v): narrowed %x, again %x", dt, i/2, src[i/2], h1[i:i+2], h2[i:i+2])
				}
			}
		}
	})
}

func TestWireErrors(t *testing.T) {
	b := make([]byte, 64)
	tests := []struct {
		name string
		err  error
	}{
		{"Narrow float32", func() error { _, err := Narrow(b[:8], b[16:32], tensor.Float32); return err }()},
		{"Narrow short dst", func() error { _, err := Narrow(b[:6], b[16:32], tensor.Float16); return err }()},
		{"Narrow odd src", func() error { _, err := Narrow(b[:8], b[16:31], tensor.Float16); return err }()},
		{"Widen int8", Widen(b[:16], b[32:40], tensor.Int8)},
		{"Widen long dst", Widen(b[:20], b[32:40], tensor.BFloat16)},
		{"AddWidened add", AddWidened(b[:16], b[32:40], b[40:52], tensor.Float16)},
		{"AddWidened overlap", AddWidened(b[:16], b[8:16], b[16:32], tensor.Float16)},
	}
	for _, tc := range tests {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

// FuzzWire checks the conversions against the scalar functions on
// fuzzer-chosen bytes: data is read as float32s to narrow and as 16-bit
// values to widen; sel picks the format, the path and the misalignment.
func FuzzWire(f *testing.F) {
	f.Add(f32Bytes(withSigns(edgeValues)), uint8(0))
	f.Add(f32Bytes(withSigns(edgeValues)), uint8(1))
	f.Add([]byte("\x00\xf0\x7f\x47\x00\x80\x7f\x7f0123456789abcdef0123456789abcdef0123456789abcdef"), uint8(6))
	f.Fuzz(func(t *testing.T, data []byte, sel uint8) {
		dt := wireFormats[sel&1]
		if sel&2 != 0 {
			avx, f16c := haveAVX2, haveF16C
			haveAVX2, haveF16C = false, false
			defer func() { haveAVX2, haveF16C = avx, f16c }()
		}
		off := int(sel>>2) % 4
		src := make([]float32, len(data)/4)
		for i := range src {
			src[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		checkNarrow(t, src, dt, off)
		halves := make([]uint16, len(data)/2)
		for i := range halves {
			halves[i] = binary.LittleEndian.Uint16(data[2*i:])
		}
		add := make([]float32, len(halves))
		for i := range add {
			if len(src) > 0 {
				add[i] = src[i%len(src)]
			}
		}
		checkWiden(t, halves, add, dt, off)
	})
}

// BenchmarkWire measures the conversions on float32 data, with SetBytes
// the float32 bytes (so MB/s reads as float32 data converted per second):
// the vector kernels and, for comparison, the portable loops.
func BenchmarkWire(b *testing.B) {
	for _, path := range []string{"vector", "go"} {
		for _, dt := range wireFormats {
			for _, size := range []int{64 << 10, 1 << 20, 16 << 20} {
				n := size / 4
				r := rand.New(rand.NewPCG(1, 2))
				f := make([]float32, n)
				for i := range f {
					f[i] = float32(r.NormFloat64())
				}
				src := f32Bytes(f)
				half := make([]byte, 2*n)
				dst := make([]byte, 4*n)
				Narrow(half, src, dt)
				name := fmt.Sprintf("%s/%v/%s", path, dt, sizeName(size))
				run := func(b *testing.B, fn func()) {
					if path == "go" {
						avx, f16c := haveAVX2, haveF16C
						haveAVX2, haveF16C = false, false
						defer func() { haveAVX2, haveF16C = avx, f16c }()
					}
					b.SetBytes(int64(size))
					b.ReportAllocs()
					for b.Loop() {
						fn()
					}
				}
				b.Run("Narrow/"+name, func(b *testing.B) { run(b, func() { Narrow(half, src, dt) }) })
				b.Run("Widen/"+name, func(b *testing.B) { run(b, func() { Widen(dst, half, dt) }) })
				b.Run("AddWidened/"+name, func(b *testing.B) { run(b, func() { AddWidened(dst, half, src, dt) }) })
			}
		}
	}
}
