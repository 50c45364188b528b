package reduce

import (
	"fmt"
	"math"

	"github.com/hvdd/hvdd/tensor"
)

// Batch conversions between float32 and the 16-bit formats, for engines
// that send float32 data across nodes in 16 bits (backends/tcp's wire
// compression) while they reduce in float32.
//
// Narrow rounds to nearest, ties to even, exactly as Float32ToFloat16 and
// Float32ToBFloat16 do element by element; Widen and AddWidened widen
// exactly, as Float16ToFloat32 and BFloat16ToFloat32 do. On amd64 the loops
// use F16C (VCVTPS2PH with rounding control 0, VCVTPH2PS) for float16 and
// AVX2 integer code for bfloat16 (a 16-bit shift, and for narrowing the
// rounding add of Float32ToBFloat16 with NaNs blended back in); the Go
// loops do the rest and are the whole implementation elsewhere. Both give
// the same bits for every input: the tests compare them with the scalar
// functions on random and fuzzed bit patterns.
//
// Overflow. A 16-bit format cannot hold every finite float32: float16 ends
// at 65504 and rounds |x| >= 65520 to ±Inf, bfloat16 ends at 0x1.fep127 and
// rounds |x| >= 0x1.ffp127 to ±Inf. Narrow reports whether it did that to a
// finite value, so that a caller can keep such data in float32 instead of
// turning a large finite value into an infinity. Infinities and NaNs in the
// input are not overflow: they narrow to themselves (NaNs quieted).

// Narrow rounds the float32 elements of src (host byte order, no alignment
// needed) to dt, tensor.Float16 or tensor.BFloat16, writing 2 bytes per
// element to dst; len(dst) must be len(src)/2. It reports whether some
// finite element became ±Inf (see Overflow above); the output is written in
// full either way.
func Narrow(dst, src []byte, dt tensor.DType) (overflow bool, err error) {
	n, err := checkWire("Narrow", dst, 2, src, 4, dt)
	if err != nil || n == 0 {
		return false, err
	}
	d, s := view[uint16](dst, 0, n), view[float32](src, 0, n)
	if dt == tensor.Float16 {
		return toF16(d, s), nil
	}
	return toBF16(d, s), nil
}

// Widen widens the dt elements of src (tensor.Float16 or tensor.BFloat16,
// 2 bytes each) exactly to float32 in dst; len(dst) must be 2*len(src).
// Float16 NaNs come back quiet, as VCVTPH2PS makes them.
func Widen(dst, src []byte, dt tensor.DType) error {
	n, err := checkWire("Widen", dst, 4, src, 2, dt)
	if err != nil || n == 0 {
		return err
	}
	d, s := view[float32](dst, 0, n), view[uint16](src, 0, n)
	if dt == tensor.Float16 {
		f16ToF32(d, s)
	} else {
		bf16ToF32(d, s)
	}
	return nil
}

// AddWidened sets dst[i] = widen(src[i]) + add[i] in float32, where src
// holds dt elements (tensor.Float16 or tensor.BFloat16) and dst and add
// float32 ones: the step of a ring reduce-scatter that receives a partial
// sum in 16 bits and accumulates in float32. dst may be the very same
// slice as add; no other overlap is allowed. Of two NaN operands the
// widened one's payload wins, on every path.
func AddWidened(dst, src, add []byte, dt tensor.DType) error {
	n, err := checkWire("AddWidened", dst, 4, src, 2, dt)
	if err != nil {
		return err
	}
	if len(add) != len(dst) {
		return fmt.Errorf("reduce: AddWidened: add has %d bytes, dst %d", len(add), len(dst))
	}
	if overlap(dst, src) || overlap(add, src) || overlap(dst, add) && !same(dst, add) {
		return fmt.Errorf("reduce: AddWidened: buffers overlap")
	}
	if n == 0 {
		return nil
	}
	d, s, a := view[float32](dst, 0, n), view[uint16](src, 0, n), view[float32](add, 0, n)
	if dt == tensor.Float16 {
		addF16(d, s, a)
	} else {
		addBF16(d, s, a)
	}
	return nil
}

// checkWire validates a conversion: dt is a 16-bit float format, dst holds
// dsz bytes per element and src ssz, for the same element count, which it
// returns.
func checkWire(fn string, dst []byte, dsz int, src []byte, ssz int, dt tensor.DType) (int, error) {
	if dt != tensor.Float16 && dt != tensor.BFloat16 {
		return 0, fmt.Errorf("reduce: %s: %v is not a 16-bit float format (want float16 or bfloat16)", fn, dt)
	}
	if len(src)%ssz != 0 {
		return 0, fmt.Errorf("reduce: %s: src has %d bytes, not a whole number of %d-byte elements", fn, len(src), ssz)
	}
	n := len(src) / ssz
	if len(dst) != n*dsz {
		return 0, fmt.Errorf("reduce: %s: dst has %d bytes for %d elements, want %d", fn, len(dst), n, n*dsz)
	}
	return n, nil
}

// The portable loops, and the tails of the vector ones.

// toF16Go narrows with Float32ToFloat16 and reports overflow: a finite
// input whose result is ±Inf (0x7c00 with the sign cleared).
func toF16Go(dst []uint16, src []float32) bool {
	src = src[:len(dst)]
	ovf := false
	for i, f := range src {
		h := Float32ToFloat16(f)
		dst[i] = h
		if h&0x7fff == 0x7c00 && math.Float32bits(f)&0x7f800000 != 0x7f800000 {
			ovf = true
		}
	}
	return ovf
}

// toBF16Go is toF16Go for bfloat16 (Inf is 0x7f80).
func toBF16Go(dst []uint16, src []float32) bool {
	src = src[:len(dst)]
	ovf := false
	for i, f := range src {
		h := Float32ToBFloat16(f)
		dst[i] = h
		if h&0x7fff == 0x7f80 && math.Float32bits(f)&0x7f800000 != 0x7f800000 {
			ovf = true
		}
	}
	return ovf
}

func addF16Go(dst []float32, src []uint16, add []float32) {
	src, add = src[:len(dst)], add[:len(dst)]
	for i := range dst {
		dst[i] = Float16ToFloat32(src[i]) + add[i]
	}
}

func addBF16Go(dst []float32, src []uint16, add []float32) {
	src, add = src[:len(dst)], add[:len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits(uint32(src[i])<<16) + add[i]
	}
}
