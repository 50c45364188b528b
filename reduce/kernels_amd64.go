//go:build amd64 && !purego

package reduce

import (
	"unsafe"

	"github.com/hvdd/hvdd/tensor"
	"golang.org/x/sys/cpu"
)

// haveAVX2 selects the assembly float32/float64 loops; haveF16C the
// assembly float16 conversions. Tests flip them to cover both paths.
var (
	haveAVX2 = cpu.X86.HasAVX2
	haveF16C = cpu.X86.HasAVX && cpu.X86.HasF16C
)

// The assembly loops (kernels_amd64.s). Each reads srcs[0..ns) and writes
// d0 and, unless it is nil, d1, over the byte range [off, end), which must be
// a whole number of 128-byte blocks. For each block it loads all sources
// before it stores, so d0 and d1 may be the same buffers as sources. With
// scaled it multiplies every source by pre and the result by post.
//
//go:noescape
func sumF32(d0, d1 unsafe.Pointer, srcs *unsafe.Pointer, ns, off, end int, scaled bool, pre, post float32)

//go:noescape
func prodF32(d0, d1 unsafe.Pointer, srcs *unsafe.Pointer, ns, off, end int, scaled bool, pre, post float32)

//go:noescape
func minF32(d0, d1 unsafe.Pointer, srcs *unsafe.Pointer, ns, off, end int, scaled bool, pre, post float32)

//go:noescape
func maxF32(d0, d1 unsafe.Pointer, srcs *unsafe.Pointer, ns, off, end int, scaled bool, pre, post float32)

//go:noescape
func sumF64(d0, d1 unsafe.Pointer, srcs *unsafe.Pointer, ns, off, end int, scaled bool, pre, post float64)

//go:noescape
func prodF64(d0, d1 unsafe.Pointer, srcs *unsafe.Pointer, ns, off, end int, scaled bool, pre, post float64)

//go:noescape
func minF64(d0, d1 unsafe.Pointer, srcs *unsafe.Pointer, ns, off, end int, scaled bool, pre, post float64)

//go:noescape
func maxF64(d0, d1 unsafe.Pointer, srcs *unsafe.Pointer, ns, off, end int, scaled bool, pre, post float64)

// cvtF16ToF32 widens n float16 values (n a multiple of 8) with VCVTPH2PS.
//
//go:noescape
func cvtF16ToF32(dst *float32, src *uint16, n int)

// cvtF32ToF16 narrows n float32 values (n a multiple of 8) with VCVTPS2PH,
// rounding to nearest even.
//
//go:noescape
func cvtF32ToF16(dst *uint16, src *float32, n int)

// vecChunk runs the assembly loop over the longest prefix of [c, e) that is
// a whole number of 128-byte blocks, fills dsts[2:] from dsts[0], and returns
// how many elements it did.
func vecChunk[T float](j *job, c, e int) int {
	var z T
	sz := int(unsafe.Sizeof(z))
	m := (e - c) &^ (128/sz - 1)
	if m == 0 {
		return 0
	}
	d0 := unsafe.Pointer(unsafe.SliceData(j.dsts[0]))
	var d1 unsafe.Pointer
	if len(j.dsts) > 1 && !same(j.dsts[1], j.dsts[0]) {
		d1 = unsafe.Pointer(unsafe.SliceData(j.dsts[1]))
	}
	off, end := c*sz, (c+m)*sz
	srcs, ns := j.srcBase(), len(j.srcs)
	if sz == 4 {
		pre, post := float32(j.pre), float32(j.post)
		switch j.op {
		case tensor.Sum:
			sumF32(d0, d1, srcs, ns, off, end, j.scaled, pre, post)
		case tensor.Product:
			prodF32(d0, d1, srcs, ns, off, end, j.scaled, pre, post)
		case tensor.Min:
			minF32(d0, d1, srcs, ns, off, end, j.scaled, pre, post)
		case tensor.Max:
			maxF32(d0, d1, srcs, ns, off, end, j.scaled, pre, post)
		}
	} else {
		switch j.op {
		case tensor.Sum:
			sumF64(d0, d1, srcs, ns, off, end, j.scaled, j.pre, j.post)
		case tensor.Product:
			prodF64(d0, d1, srcs, ns, off, end, j.scaled, j.pre, j.post)
		case tensor.Min:
			minF64(d0, d1, srcs, ns, off, end, j.scaled, j.pre, j.post)
		case tensor.Max:
			maxF64(d0, d1, srcs, ns, off, end, j.scaled, j.pre, j.post)
		}
	}
	// Later dsts are filled from dsts[0] while the chunk is still in cache.
	// The loop above has consumed every source of [off, end), so these
	// writes cannot clobber unread input.
	for _, d := range j.dsts[min(2, len(j.dsts)):] {
		if !same(d, j.dsts[0]) {
			copy(d[off:end], j.dsts[0][off:end])
		}
	}
	return m
}

// f16ToF32 widens float16 values, with F16C when available.
func f16ToF32(dst []float32, src []uint16) {
	n := 0
	if haveF16C {
		if n = len(dst) &^ 7; n > 0 {
			cvtF16ToF32(&dst[0], &src[:n][0], n)
		}
	}
	f16ToF32Go(dst[n:], src[n:])
}

// f32ToF16 narrows float32 values to float16, with F16C when available.
func f32ToF16(dst []uint16, src []float32) {
	n := 0
	if haveF16C {
		if n = len(dst) &^ 7; n > 0 {
			cvtF32ToF16(&dst[0], &src[:n][0], n)
		}
	}
	f32ToF16Go(dst[n:], src[n:])
}

// combineF32 is combine for the float32 scratch of the half-precision path,
// with the assembly loop on the whole 32-element blocks.
func combineF32(op tensor.ReduceOp, acc, a, b []float32) {
	m := 0
	if haveAVX2 {
		m = len(acc) &^ 31
	}
	if m > 0 {
		ptrs := [2]unsafe.Pointer{unsafe.Pointer(&a[0]), unsafe.Pointer(&b[:m][0])}
		d0 := unsafe.Pointer(&acc[0])
		switch op {
		case tensor.Sum:
			sumF32(d0, nil, &ptrs[0], 2, 0, 4*m, false, 1, 1)
		case tensor.Product:
			prodF32(d0, nil, &ptrs[0], 2, 0, 4*m, false, 1, 1)
		case tensor.Min:
			minF32(d0, nil, &ptrs[0], 2, 0, 4*m, false, 1, 1)
		case tensor.Max:
			maxF32(d0, nil, &ptrs[0], 2, 0, 4*m, false, 1, 1)
		}
	}
	combine(op, acc[m:], a[m:], b[m:])
}

// Adasum's kernels (adasum_kernels.go has the lane order they keep); n is a
// multiple of adasumLanes.

// adasumDotF32 accumulates a·b, ‖a‖², ‖b‖² over n float32 values into acc.
//
//go:noescape
func adasumDotF32(a, b *float32, n int, acc *adasumAcc)

// adasumDotF64 is adasumDotF32 for float64 values.
//
//go:noescape
func adasumDotF64(a, b *float64, n int, acc *adasumAcc)

// adasumAxpbyF32 sets a[i] = float32(ca·a[i] + cb·b[i]) for n values.
//
//go:noescape
func adasumAxpbyF32(a, b *float32, n int, ca, cb float64)

// adasumAxpbyF64 sets a[i] = ca·a[i] + cb·b[i] for n values.
//
//go:noescape
func adasumAxpbyF64(a, b *float64, n int, ca, cb float64)

// The wire conversions' kernels (wire.go); n is a multiple of 16.

// narrowF16 rounds n float32 values to float16 with VCVTPS2PH (nearest
// even) and reports whether a finite one became ±Inf. Needs F16C and AVX2.
//
//go:noescape
func narrowF16(dst *uint16, src *float32, n int) bool

// narrowBF16 rounds n float32 values to bfloat16 (nearest even, NaNs
// quieted) and reports whether a finite one became ±Inf. Needs AVX2.
//
//go:noescape
func narrowBF16(dst *uint16, src *float32, n int) bool

// widenBF16 widens n bfloat16 values to float32 (a 16-bit shift). Needs
// AVX2.
//
//go:noescape
func widenBF16(dst *float32, src *uint16, n int)

// addWidenF16 sets dst[i] = widen(src[i]) + add[i]. Needs F16C and AVX.
//
//go:noescape
func addWidenF16(dst *float32, src *uint16, add *float32, n int)

// addWidenBF16 sets dst[i] = widen(src[i]) + add[i]. Needs AVX2.
//
//go:noescape
func addWidenBF16(dst *float32, src *uint16, add *float32, n int)

// vecLen is the prefix of n elements the wire kernels take: whole blocks of
// 16, when the CPU has what they need.
func vecLen(n int, ok bool) int {
	if !ok {
		return 0
	}
	return n &^ 15
}

func toF16(dst []uint16, src []float32) bool {
	m := vecLen(len(dst), haveAVX2 && haveF16C)
	ovf := false
	if m > 0 {
		ovf = narrowF16(&dst[0], &src[:m][0], m)
	}
	return toF16Go(dst[m:], src[m:]) || ovf
}

func toBF16(dst []uint16, src []float32) bool {
	m := vecLen(len(dst), haveAVX2)
	ovf := false
	if m > 0 {
		ovf = narrowBF16(&dst[0], &src[:m][0], m)
	}
	return toBF16Go(dst[m:], src[m:]) || ovf
}

func bf16ToF32(dst []float32, src []uint16) {
	m := vecLen(len(dst), haveAVX2)
	if m > 0 {
		widenBF16(&dst[0], &src[:m][0], m)
	}
	bf16ToF32Go(dst[m:], src[m:])
}

func addF16(dst []float32, src []uint16, add []float32) {
	m := vecLen(len(dst), haveAVX2 && haveF16C)
	if m > 0 {
		addWidenF16(&dst[0], &src[:m][0], &add[:m][0], m)
	}
	addF16Go(dst[m:], src[m:], add[m:])
}

func addBF16(dst []float32, src []uint16, add []float32) {
	m := vecLen(len(dst), haveAVX2)
	if m > 0 {
		addWidenBF16(&dst[0], &src[:m][0], &add[:m][0], m)
	}
	addBF16Go(dst[m:], src[m:], add[m:])
}
