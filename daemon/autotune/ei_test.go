package autotune

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestExpectedImprovementByHand checks the closed form at points worked out
// by hand from tabulated values of the normal distribution:
// Phi(1) = 0.841344746, phi(1) = 0.241970725, Phi(-0.5) = 0.308537539,
// phi(0.5) = 0.352065327, Phi(0.38) = 0.648027292, phi(0.38) = 0.371153879.
func TestExpectedImprovementByHand(t *testing.T) {
	tests := []struct {
		name                string
		mean, std, best, xi float64
		want                float64
	}{
		// imp = 1, z = 1: 1 * Phi(1) + 1 * phi(1).
		{"z=1", 1, 1, 0, 0, 0.841344746 + 0.241970725},
		// imp = 0: only the exploration term, std * phi(0) = 1/sqrt(2 pi).
		{"z=0", 0, 1, 0, 0, 0.398942280},
		// xi moves the threshold: imp = 1 - 0.5 - 0.5 = 0.
		{"xi", 1, 1, 0.5, 0.5, 0.398942280},
		// imp = -1, z = -0.5: -Phi(-0.5) + 2 phi(0.5).
		{"mean below best", -1, 2, 0, 0, -0.308537539 + 2*0.352065327},
		// imp = 0.19, z = 0.38: 0.19 Phi(0.38) + 0.5 phi(0.38).
		{"Horovod xi", 0.3, 0.5, 0.1, 0.01, 0.19*0.648027292 + 0.5*0.371153879},
		// std = 0: the improvement itself, or nothing.
		{"certain gain", 1, 0, 0.5, 0.1, 0.4},
		{"certain loss", 0.2, 0, 0.5, 0, 0},
		{"certain tie", 0.5, 0, 0.5, 0, 0},
		// z = -200: phi underflows, EI is 0, not NaN or negative.
		{"far below", -100, 0.5, 0, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ExpectedImprovement(tc.mean, tc.std, tc.best, tc.xi)
			if math.Abs(got-tc.want) > 2e-9 {
				t.Errorf("ExpectedImprovement(%v, %v, %v, %v) = %.10f, want %.10f", tc.mean, tc.std, tc.best, tc.xi, got, tc.want)
			}
		})
	}
}

// naiveEI integrates max(f - best - xi, 0) against the N(mean, std^2)
// density with Simpson's rule over mean +- 12 std: the reference for the
// closed form.
func naiveEI(mean, std, best, xi float64) float64 {
	const n = 20000 // even
	lo, hi := math.Max(mean-12*std, best+xi), mean+12*std
	if hi <= lo {
		return 0
	}
	h := (hi - lo) / n
	g := func(f float64) float64 {
		z := (f - mean) / std
		return (f - best - xi) * math.Exp(-0.5*z*z) / (std * math.Sqrt(2*math.Pi))
	}
	s := g(lo) + g(hi)
	for i := 1; i < n; i++ {
		w := 2.0
		if i%2 == 1 {
			w = 4
		}
		s += w * g(lo+float64(i)*h)
	}
	return s * h / 3
}

// TestExpectedImprovementQuick checks EI against numerical integration,
// and its shape, at random points: never negative, non-decreasing in the
// mean and in the std (up to rounding where the derivative is below it),
// strictly increasing where z is moderate.
func TestExpectedImprovementQuick(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for range 2000 {
		mean := 4 * r.NormFloat64()
		std := math.Exp(2 * r.NormFloat64())
		best := 4 * r.NormFloat64()
		xi := 0.1 * r.Float64()
		ei := ExpectedImprovement(mean, std, best, xi)
		if !(ei >= 0) {
			t.Fatalf("EI(%v, %v, %v, %v) = %v", mean, std, best, xi, ei)
		}
		if want := naiveEI(mean, std, best, xi); math.Abs(ei-want) > 1e-9*(1+want) {
			t.Fatalf("EI(%v, %v, %v, %v) = %v, numerical integral %v", mean, std, best, xi, ei, want)
		}
		z := (mean - best - xi) / std
		strict := z > -6 && z < 6
		for _, d := range []float64{1e-3, 0.1, 1} {
			up := ExpectedImprovement(mean+d*std, std, best, xi)
			if up < ei*(1-1e-14) || (strict && !(up > ei)) {
				t.Fatalf("EI not increasing in the mean: EI(%v) = %v, EI(%v) = %v (std %v best %v)", mean, ei, mean+d*std, up, std, best)
			}
			wide := ExpectedImprovement(mean, std*(1+d), best, xi)
			if wide < ei*(1-1e-14) || (strict && !(wide > ei)) {
				t.Fatalf("EI not increasing in the std: EI(std %v) = %v, EI(std %v) = %v (mean %v best %v)", std, ei, std*(1+d), wide, mean, best)
			}
		}
	}
}

func TestExpectedImprovementZeroStd(t *testing.T) {
	for _, mean := range []float64{-1e300, -5, 0, 0.99, 1} {
		if ei := ExpectedImprovement(mean, 0, 1, 0); ei != 0 {
			t.Errorf("EI(mean %v, std 0, best 1) = %v, want 0", mean, ei)
		}
	}
	for _, huge := range []float64{1e300, -1e300} {
		for _, std := range []float64{0, 1e-300, 1, 1e300} {
			if ei := ExpectedImprovement(huge, std, -huge, 0.01); math.IsNaN(ei) || ei < 0 {
				t.Errorf("EI(%v, %v, %v) = %v", huge, std, -huge, ei)
			}
		}
	}
}
