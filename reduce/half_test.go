package reduce

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestFloat16Widen checks all 65536 float16 values: round trips, known
// values, and (with F16C) agreement with VCVTPH2PS.
func TestFloat16Widen(t *testing.T) {
	all := make([]uint16, 1<<16)
	for i := range all {
		all[i] = uint16(i)
	}
	hw := make([]float32, len(all))
	if haveF16C {
		f16ToF32(hw, all)
	}
	for _, h := range all {
		f := Float16ToFloat32(h)
		nan := h&0x7c00 == 0x7c00 && h&0x3ff != 0
		if nan != math.IsNaN(float64(f)) {
			t.Fatalf("%#04x -> %v: NaN-ness changed", h, f)
		}
		back := Float32ToFloat16(f)
		if !nan && back != h || nan && back != h|0x200 {
			t.Fatalf("%#04x -> %v -> %#04x", h, f, back)
		}
		if haveF16C && math.Float32bits(hw[h]) != math.Float32bits(f) {
			t.Fatalf("%#04x: Go %#08x, VCVTPH2PS %#08x", h, math.Float32bits(f), math.Float32bits(hw[h]))
		}
	}
	for _, c := range []struct {
		h uint16
		f float32
	}{{0x3c00, 1}, {0xc000, -2}, {0x7bff, 65504}, {0x0001, 0x1p-24}, {0x0400, 0x1p-14}, {0x3555, 0.333251953125}, {0x7c00, float32(math.Inf(1))}} {
		if got := Float16ToFloat32(c.h); got != c.f {
			t.Errorf("Float16ToFloat32(%#04x) = %v, want %v", c.h, got, c.f)
		}
	}
}

// TestFloat16Narrow checks Float32ToFloat16 against two independent
// references on edge cases and a wide sample of float32 bit patterns: the
// nearest-even definition (checked through exact float64 distances) and,
// with F16C, VCVTPS2PH.
func TestFloat16Narrow(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	var in []float32
	for _, f := range []float32{0, 65504, 65519.99, 65520, 65536, 1e-8, 0x1p-25, 0x1.0p-25 * 1.0000001, 0x1p-24, 0x1.8p-24, 0x1.8p-25, 0x1p-14, 0x1.ffcp-15, 1 + 0x1p-11, 1 + 0x3p-11} {
		in = append(in, f, -f)
	}
	in = append(in, float32(math.Inf(1)), float32(math.Inf(-1)), math.Float32frombits(0x7f800001), math.Float32frombits(0xffc12345))
	n := 1 << 20
	if raceEnabled {
		n = 1 << 16
	}
	for i := 0; i < n; i++ {
		in = append(in, math.Float32frombits(r.Uint32()))
		// Values near the float16 range, where rounding is interesting.
		in = append(in, math.Float32frombits(0x33000000+r.Uint32N(0x47800000-0x33000000)|r.Uint32N(2)<<31))
	}
	in = in[:len(in)&^7]
	hw := make([]uint16, len(in))
	if haveF16C {
		f32ToF16(hw, in)
	}
	for i, f := range in {
		h := Float32ToFloat16(f)
		if haveF16C && hw[i] != h {
			t.Fatalf("%v (%#08x): Go %#04x, VCVTPS2PH %#04x", f, math.Float32bits(f), h, hw[i])
		}
		if math.IsNaN(float64(f)) {
			if h&0x7e00 != 0x7e00 {
				t.Fatalf("%v -> %#04x: not a quiet NaN", f, h)
			}
			continue
		}
		checkNearest(t, float64(f), h, Float16ToFloat32, 0x7c00)
	}
}

// checkNearest verifies that h is the nearest half-format value to f with
// ties to even, by comparing exact float64 distances to h's neighbours.
// inf is the format's +Inf pattern; overflow is judged against the value
// one step past the largest finite number, as IEEE rounding does.
func checkNearest(t *testing.T, f float64, h uint16, widen func(uint16) float32, inf uint16) {
	t.Helper()
	sign := h & 0x8000
	mag := h &^ 0x8000
	if f < 0 || f == 0 && math.Signbit(f) {
		if sign == 0 {
			t.Fatalf("%v -> %#04x: sign lost", f, h)
		}
		f = -f
	} else if sign != 0 {
		t.Fatalf("%v -> %#04x: sign invented", f, h)
	}
	val := func(m uint16) float64 {
		if m == inf { // the value Inf stands for when rounding: one more step
			return 2*float64(widen(m-1)) - float64(widen(m-2))
		}
		return float64(widen(m))
	}
	if mag > inf {
		t.Fatalf("%v -> %#04x: NaN from a number", f, h)
	}
	d := math.Abs(f - val(mag))
	for _, nb := range []uint16{mag - 1, mag + 1} {
		if nb > inf || (mag == 0 && nb == 0xffff) {
			continue
		}
		dn := math.Abs(f - val(nb))
		if dn < d || dn == d && mag&1 == 1 {
			t.Fatalf("%v -> %#04x (%v), but %#04x (%v) is nearer or even", f, h, val(mag), nb, val(nb))
		}
	}
}

// TestBFloat16 checks the bfloat16 conversions exhaustively on the 16-bit
// side and by the nearest-even definition on a sample of float32s.
func TestBFloat16(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		f := BFloat16ToFloat32(h)
		if math.Float32bits(f) != uint32(h)<<16 {
			t.Fatalf("%#04x -> %#08x", h, math.Float32bits(f))
		}
		back := Float32ToBFloat16(f)
		nan := math.IsNaN(float64(f))
		if !nan && back != h || nan && back != h|0x40 {
			t.Fatalf("%#04x -> %v -> %#04x", h, f, back)
		}
	}
	r := rand.New(rand.NewPCG(13, 14))
	n := 1 << 20
	if raceEnabled {
		n = 1 << 16
	}
	for i := 0; i < n; i++ {
		f := math.Float32frombits(r.Uint32())
		h := Float32ToBFloat16(f)
		if math.IsNaN(float64(f)) {
			if h&0x7fc0 != 0x7fc0 {
				t.Fatalf("%v -> %#04x: not a quiet NaN", f, h)
			}
			continue
		}
		checkNearest(t, float64(f), h, BFloat16ToFloat32, 0x7f80)
	}
}
