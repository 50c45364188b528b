package reduce

import "math"

// IEEE 754 binary16 ("float16") and bfloat16 conversions.
//
// Both half formats are reduced in float32: every element is widened exactly,
// combined in float32 and narrowed once at the end with round-to-nearest-even,
// as the hardware instructions (F16C VCVTPS2PH with imm8 0, AVX512_BF16
// VCVTNEPS2BF16) and PyTorch do. NaNs stay NaN: narrowing keeps the top payload
// bits and sets the quiet bit, so a signalling NaN comes back quiet. Widening
// a float16 NaN also quiets it (as VCVTPH2PS does); widening a bfloat16 is a
// plain 16-bit shift and keeps every bit.

// Float32ToFloat16 rounds f to the nearest float16 (ties to even). Values past
// the float16 range become ±Inf; values below half the smallest subnormal
// become ±0.
func Float32ToFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00 | uint16(man>>13) // quiet NaN, top payload bits
		}
		return sign | 0x7c00
	}
	// e is the float16 biased exponent the value would have.
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Subnormal (or zero) result: the float16 value is q * 2^-24 with
		// q = round(M * 2^(exp-150) / 2^-24) = round(M >> s), M the full
		// 24-bit significand. float32 subnormals (exp == 0) are far below
		// 2^-25 and round to zero.
		if exp == 0 {
			return sign
		}
		s := uint(126 - exp)
		if s > 31 {
			return sign
		}
		m := man | 0x800000
		q := m >> s
		rem := m & (1<<s - 1)
		half := uint32(1) << (s - 1)
		if rem > half || (rem == half && q&1 == 1) {
			q++
		}
		return sign | uint16(q) // q == 0x400 is the smallest normal: still right
	}
	h := sign | uint16(e)<<10 | uint16(man>>13)
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // a carry into the exponent is correct, up to and including Inf
	}
	return h
}

// Float16ToFloat32 widens a float16 to float32 exactly (NaNs come back quiet).
func Float16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		if man != 0 {
			return math.Float32frombits(sign | 0x7fc00000 | man<<13)
		}
		return math.Float32frombits(sign | 0x7f800000)
	case exp == 0:
		// Subnormal or zero: man * 2^-24, exact in float32.
		f := float32(man) * (1.0 / (1 << 24))
		return math.Float32frombits(sign | math.Float32bits(f))
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
}

// Float32ToBFloat16 rounds f to the nearest bfloat16 (ties to even); NaNs stay
// NaN with the quiet bit set.
func Float32ToBFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// BFloat16ToFloat32 widens a bfloat16 to float32 exactly (a 16-bit shift).
func BFloat16ToFloat32(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}

// Batch conversions used by the reduction loops. The amd64 build replaces
// them with F16C or AVX2 code when the CPU has it (see kernels_amd64.go);
// the narrowing to bfloat16 is toBF16Go in wire.go.

func bf16ToF32Go(dst []float32, src []uint16) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits(uint32(src[i]) << 16)
	}
}

func f16ToF32Go(dst []float32, src []uint16) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = Float16ToFloat32(src[i])
	}
}

func f32ToF16Go(dst []uint16, src []float32) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = Float32ToFloat16(src[i])
	}
}
