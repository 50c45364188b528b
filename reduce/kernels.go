package reduce

import (
	"math"
	"unsafe"

	"github.com/hvdd/hvdd/tensor"
)

// Portable reduction loops. They are the whole implementation for integer,
// half-precision and bool data, the float32/float64 implementation without
// AVX2, and the tail (the last < 128 bytes of a chunk) with it.
//
// A chunk is reduced in passes over an accumulator acc: pass 1 computes
// acc = op(s0, s1), pass j computes acc = op(acc, sj), then acc is scaled by
// postscale and copied to the dsts. acc is dsts[0] itself when that is safe
// (job.accDst), otherwise a pooled scratch buffer. Every pass reads element i
// of its inputs before writing element i, so acc may be the very same slice
// as either input.

type integer interface {
	~uint8 | ~int8 | ~uint16 | ~int16 | ~int32 | ~int64
}

type float interface{ ~float32 | ~float64 }

type number interface{ integer | float }

// runGeneric reduces [lo, hi) chunk by chunk and copies the result into
// every dst; flt selects floatChunk over intChunk. (Direct calls rather than
// a function value keep j and the buffers it points to off the heap.)
func runGeneric[T number](j *job, lo, hi int, flt bool) {
	var scr *scratch
	for c := lo; c < hi; c += j.chunk {
		e := min(c+j.chunk, hi)
		scr = genericChunk[T](j, c, e, flt, scr)
	}
	if scr != nil {
		scratchPool.Put(scr)
	}
}

// genericChunk reduces one chunk [c, e); scr is a scratch buffer to reuse
// (or nil), and the one in use is returned.
func genericChunk[T number](j *job, c, e int, flt bool, scr *scratch) *scratch {
	var acc []T
	if j.accDst {
		acc = view[T](j.dsts[0], c, e)
	} else {
		if scr == nil {
			var z T
			scr = getScratch(j.chunk * int(unsafe.Sizeof(z)))
		}
		acc = view[T](scr.bytes(), 0, e-c)
	}
	if flt {
		floatChunk(j, acc, c, e)
	} else {
		intChunk(j, acc, c, e)
	}
	for i, d := range j.dsts {
		if j.accDst && (i == 0 || same(d, j.dsts[0])) {
			continue
		}
		copy(view[T](d, c, e), acc)
	}
	return scr
}

// runFloat reduces float32 or float64 elements [lo, hi): the vector code
// takes each chunk's whole 128-byte blocks, the portable loop the rest.
func runFloat[T float](j *job, lo, hi int) {
	if !haveAVX2 {
		runGeneric[T](j, lo, hi, true)
		return
	}
	var scr *scratch
	for c := lo; c < hi; c += j.chunk {
		e := min(c+j.chunk, hi)
		if m := vecChunk[T](j, c, e); c+m < e {
			scr = genericChunk[T](j, c+m, e, true, scr)
		}
	}
	if scr != nil {
		scratchPool.Put(scr)
	}
}

// floatChunk reduces elements [c, e) of j's float32 or float64 sources into
// acc (len e-c), scaled by T(prescale) and
// T(postscale), never fused.
func floatChunk[T number](j *job, acc []T, c, e int) {
	s0 := view[T](j.srcs[0], c, e)
	pre := T(j.pre)
	if !j.scaled || pre == 1 {
		if len(j.srcs) == 1 {
			copy(acc, s0)
		} else {
			combine(j.op, acc, s0, view[T](j.srcs[1], c, e))
		}
		for _, s := range j.srcs[min(2, len(j.srcs)):] {
			combine(j.op, acc, acc, view[T](s, c, e))
		}
	} else {
		if len(j.srcs) == 1 {
			mulInto(acc, s0, pre)
		} else {
			combineScaled(j.op, acc, s0, view[T](j.srcs[1], c, e), pre, true)
		}
		for _, s := range j.srcs[min(2, len(j.srcs)):] {
			combineScaled(j.op, acc, acc, view[T](s, c, e), pre, false)
		}
	}
	if post := T(j.post); j.scaled && post != 1 {
		mulInto(acc, acc, post)
	}
}

// intChunk is floatChunk for integers: wrap-around arithmetic, scale factors
// applied through float64 with truncation (scaleInt).
func intChunk[T number](j *job, acc []T, c, e int) {
	s0 := view[T](j.srcs[0], c, e)
	if !j.scaled || j.pre == 1 {
		if len(j.srcs) == 1 {
			copy(acc, s0)
		} else {
			combine(j.op, acc, s0, view[T](j.srcs[1], c, e))
		}
		for _, s := range j.srcs[min(2, len(j.srcs)):] {
			combine(j.op, acc, acc, view[T](s, c, e))
		}
	} else {
		// Pass 1 must read s0 and s1 together: acc may be s1.
		f := j.pre
		s0 = s0[:len(acc)]
		if len(j.srcs) == 1 {
			for i := range acc {
				acc[i] = scaleInt(s0[i], f)
			}
		} else {
			s1 := view[T](j.srcs[1], c, e)
			for i := range acc {
				acc[i] = op1(j.op, scaleInt(s0[i], f), scaleInt(s1[i], f))
			}
		}
		for _, s := range j.srcs[min(2, len(j.srcs)):] {
			b := view[T](s, c, e)
			for i := range acc {
				acc[i] = op1(j.op, acc[i], scaleInt(b[i], f))
			}
		}
	}
	if j.scaled && j.post != 1 {
		for i := range acc {
			acc[i] = scaleInt(acc[i], j.post)
		}
	}
}

// scaleInt returns x*f the Horovod way for integers: computed in float64,
// truncated toward zero, saturated to int64 (NaN gives 0) and wrapped to T.
func scaleInt[T number](x T, f float64) T {
	v := float64(x) * f
	var i int64
	switch {
	case v != v:
		i = 0
	case v >= 0x1p63:
		i = math.MaxInt64
	case v <= -0x1p63:
		i = math.MinInt64
	default:
		i = int64(v)
	}
	return T(i)
}

// op1 applies op to one pair; the loops below inline the same expressions.
func op1[T number](op tensor.ReduceOp, a, b T) T {
	switch op {
	case tensor.Sum:
		return a + b
	case tensor.Product:
		return a * b
	case tensor.Min:
		if b < a {
			return b
		}
	case tensor.Max:
		if b > a {
			return b
		}
	}
	return a
}

// combine sets acc[i] = op(a[i], b[i]); acc may be a or b.
func combine[T number](op tensor.ReduceOp, acc, a, b []T) {
	a, b = a[:len(acc)], b[:len(acc)]
	switch op {
	case tensor.Sum:
		for i := range acc {
			acc[i] = a[i] + b[i]
		}
	case tensor.Product:
		for i := range acc {
			acc[i] = a[i] * b[i]
		}
	case tensor.Min:
		for i := range acc {
			x, y := a[i], b[i]
			if y < x {
				x = y
			}
			acc[i] = x
		}
	case tensor.Max:
		for i := range acc {
			x, y := a[i], b[i]
			if y > x {
				x = y
			}
			acc[i] = x
		}
	}
}

// combineScaled sets acc[i] = op(a[i], b[i]*f), or op(a[i]*f, b[i]*f) when
// scaleA. The explicit conversions stop the compiler from fusing a multiply
// and an add into one FMA (which rounds once and would differ from the
// vector code).
func combineScaled[T number](op tensor.ReduceOp, acc, a, b []T, f T, scaleA bool) {
	a, b = a[:len(acc)], b[:len(acc)]
	fa := T(1)
	if scaleA {
		fa = f
	}
	switch op {
	case tensor.Sum:
		for i := range acc {
			acc[i] = T(a[i]*fa) + T(b[i]*f)
		}
	case tensor.Product:
		for i := range acc {
			acc[i] = T(a[i]*fa) * T(b[i]*f)
		}
	case tensor.Min:
		for i := range acc {
			x, y := T(a[i]*fa), T(b[i]*f)
			if y < x {
				x = y
			}
			acc[i] = x
		}
	case tensor.Max:
		for i := range acc {
			x, y := T(a[i]*fa), T(b[i]*f)
			if y > x {
				x = y
			}
			acc[i] = x
		}
	}
}

// mulInto sets dst[i] = src[i] * f.
func mulInto[T number](dst, src []T, f T) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = src[i] * f
	}
}

// runHalf reduces float16 or bfloat16 elements [lo, hi): each chunk of each
// source is widened into float32 scratch, folded there, and narrowed once
// into dsts[0], from which the other dsts are copied.
func runHalf(j *job, lo, hi int) {
	bf16 := j.dt == tensor.BFloat16
	scr := getScratch(2 * j.chunk * 4)
	all := view[float32](scr.bytes(), 0, 2*j.chunk)
	pre, post := float32(j.pre), float32(j.post)
	for c := lo; c < hi; c += j.chunk {
		e := min(c+j.chunk, hi)
		acc, tmp := all[:e-c], all[j.chunk:j.chunk+e-c]
		widen(bf16, acc, view[uint16](j.srcs[0], c, e))
		if j.scaled && pre != 1 {
			mulInto(acc, acc, pre)
		}
		for _, s := range j.srcs[1:] {
			widen(bf16, tmp, view[uint16](s, c, e))
			if j.scaled && pre != 1 {
				mulInto(tmp, tmp, pre)
			}
			combineF32(j.op, acc, acc, tmp)
		}
		if j.scaled && post != 1 {
			mulInto(acc, acc, post)
		}
		// All sources of the chunk are consumed; dsts may now be written.
		d0 := view[uint16](j.dsts[0], c, e)
		if bf16 {
			toBF16(d0, acc) // overflow to Inf is the rounding's result here
		} else {
			f32ToF16(d0, acc)
		}
		for _, d := range j.dsts[1:] {
			if !same(d, j.dsts[0]) {
				copy(view[uint16](d, c, e), d0)
			}
		}
	}
	scratchPool.Put(scr)
}

func widen(bf16 bool, dst []float32, src []uint16) {
	if bf16 {
		bf16ToF32(dst, src)
	} else {
		f16ToF32(dst, src)
	}
}

// runBool reduces bool elements [lo, hi): OR for Sum and Max, AND for Min
// and Product, results normalised to 0 or 1.
func runBool(j *job, lo, hi int) {
	var scr *scratch
	or := j.op == tensor.Sum || j.op == tensor.Max
	for c := lo; c < hi; c += j.chunk {
		e := min(c+j.chunk, hi)
		var acc []uint8
		if j.accDst {
			acc = j.dsts[0][c:e]
		} else {
			if scr == nil {
				scr = getScratch(j.chunk)
			}
			acc = scr.bytes()[:e-c]
		}
		s0 := j.srcs[0][c:e]
		if len(j.srcs) == 1 {
			for i := range acc {
				acc[i] = b2u(s0[i] != 0)
			}
		} else {
			boolCombine(or, acc, s0, j.srcs[1][c:e])
		}
		for _, s := range j.srcs[min(2, len(j.srcs)):] {
			boolCombine(or, acc, acc, s[c:e])
		}
		for i, d := range j.dsts {
			if j.accDst && (i == 0 || same(d, j.dsts[0])) {
				continue
			}
			copy(d[c:e], acc)
		}
	}
	if scr != nil {
		scratchPool.Put(scr)
	}
}

func boolCombine(or bool, acc, a, b []uint8) {
	a, b = a[:len(acc)], b[:len(acc)]
	if or {
		for i := range acc {
			acc[i] = b2u(a[i]|b[i] != 0)
		}
		return
	}
	for i := range acc {
		acc[i] = b2u(a[i] != 0) & b2u(b[i] != 0)
	}
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
