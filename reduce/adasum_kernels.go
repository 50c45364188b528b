package reduce

// Adasum's two passes over a pair of vectors, with a summation order that
// SIMD can follow: the dot product and squared norms of a block are
// accumulated in adasumLanes lanes, element lo+i going to lane i mod
// adasumLanes in element order, and the lanes are then added in lane
// order. The assembly (amd64, AVX2) and the Go loops below keep exactly
// that order, so they give the same bits (TestAdasumKernelsMatchGo), and so
// does any split of a tensor into blocks across goroutines or nodes.

// adasumLanes is the number of partial sums per quantity in a block.
const adasumLanes = 8

// adasumAcc holds the lanes: dot product, then ‖a‖², then ‖b‖².
type adasumAcc [3 * adasumLanes]float64

// sums adds each quantity's lanes in lane order.
func (acc *adasumAcc) sums() (s [3]float64) {
	for q := range 3 {
		v := acc[q*adasumLanes]
		for l := 1; l < adasumLanes; l++ {
			v += acc[q*adasumLanes+l]
		}
		s[q] = v
	}
	return s
}

// dotLanesGo accumulates av·bv, ‖av‖² and ‖bv‖² into acc, element i into
// lane i mod adasumLanes (av and bv of equal length, widened to float64;
// each product rounded to float64 before it is added).
func dotLanesGo[T float32 | float64](av, bv []T, acc *adasumAcc) {
	for i := range av {
		x, y := float64(av[i]), float64(bv[i])
		l := i % adasumLanes
		acc[l] += float64(x * y)
		acc[adasumLanes+l] += float64(x * x)
		acc[2*adasumLanes+l] += float64(y * y)
	}
}

// axpbyGo sets av[i] = ca·av[i] + cb·bv[i], computed in float64 with each
// product rounded, and the sum rounded once to T.
func axpbyGo[T float32 | float64](av, bv []T, ca, cb float64) {
	for i, x := range av {
		av[i] = T(float64(ca*float64(x)) + float64(cb*float64(bv[i])))
	}
}

// dotLanesF32 is dotLanesGo for float32, with AVX2 on the whole groups of
// adasumLanes elements.
func dotLanesF32(av, bv []float32, acc *adasumAcc) {
	m := 0
	if haveAVX2 {
		if m = len(av) &^ (adasumLanes - 1); m > 0 {
			adasumDotF32(&av[0], &bv[:m][0], m, acc)
		}
	}
	// The rest continues the lane pattern: m is a multiple of the lanes.
	dotLanesGo(av[m:], bv[m:len(av)], acc)
}

// dotLanesF64 is dotLanesGo for float64, with AVX2.
func dotLanesF64(av, bv []float64, acc *adasumAcc) {
	m := 0
	if haveAVX2 {
		if m = len(av) &^ (adasumLanes - 1); m > 0 {
			adasumDotF64(&av[0], &bv[:m][0], m, acc)
		}
	}
	dotLanesGo(av[m:], bv[m:len(av)], acc)
}

// axpbyF32 is axpbyGo for float32, with AVX2.
func axpbyF32(av, bv []float32, ca, cb float64) {
	m := 0
	if haveAVX2 {
		if m = len(av) &^ (adasumLanes - 1); m > 0 {
			adasumAxpbyF32(&av[0], &bv[:m][0], m, ca, cb)
		}
	}
	axpbyGo(av[m:], bv[m:len(av)], ca, cb)
}

// axpbyF64 is axpbyGo for float64, with AVX2.
func axpbyF64(av, bv []float64, ca, cb float64) {
	m := 0
	if haveAVX2 {
		if m = len(av) &^ (adasumLanes - 1); m > 0 {
			adasumAxpbyF64(&av[0], &bv[:m][0], m, ca, cb)
		}
	}
	axpbyGo(av[m:], bv[m:len(av)], ca, cb)
}
