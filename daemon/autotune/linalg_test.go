package autotune

import (
	"errors"
	"math"
	mrand "math/rand"
	"math/rand/v2"
	"testing"
	"testing/quick"
)

// randomSPD returns B B^T + c I for a random n x n B with entries in
// [-1, 1): symmetric positive definite, with condition number bounded by
// about (n + c) / c.
func randomSPD(r *rand.Rand, n int, c float64) []float64 {
	b := make([]float64, n*n)
	for i := range b {
		b[i] = 2*r.Float64() - 1
	}
	a := make([]float64, n*n)
	for i := range n {
		for j := range n {
			s := 0.0
			for k := range n {
				s += b[i*n+k] * b[j*n+k]
			}
			a[i*n+j] = s
		}
		a[i*n+i] += c
	}
	return a
}

// naiveSolve solves a x = b by Gaussian elimination with partial pivoting on
// copies: the reference for cholSolve.
func naiveSolve(a []float64, n int, b []float64) []float64 {
	m := append([]float64(nil), a...)
	x := append([]float64(nil), b...)
	for c := range n {
		p := c
		for r := c + 1; r < n; r++ {
			if math.Abs(m[r*n+c]) > math.Abs(m[p*n+c]) {
				p = r
			}
		}
		for k := range n {
			m[c*n+k], m[p*n+k] = m[p*n+k], m[c*n+k]
		}
		x[c], x[p] = x[p], x[c]
		for r := c + 1; r < n; r++ {
			f := m[r*n+c] / m[c*n+c]
			for k := c; k < n; k++ {
				m[r*n+k] -= f * m[c*n+k]
			}
			x[r] -= f * x[c]
		}
	}
	for r := n - 1; r >= 0; r-- {
		s := x[r]
		for k := r + 1; k < n; k++ {
			s -= m[r*n+k] * x[k]
		}
		x[r] = s / m[r*n+r]
	}
	return x
}

// maxAbsDiff returns max_i |a[i] - b[i]| and max_i |b[i]|.
func maxAbsDiff(a, b []float64) (diff, scale float64) {
	for i := range a {
		diff = math.Max(diff, math.Abs(a[i]-b[i]))
		scale = math.Max(scale, math.Abs(b[i]))
	}
	return diff, scale
}

// TestCholeskyQuick checks, on random SPD matrices of size 1..40, that the
// factor is lower triangular with a positive diagonal, that L L^T
// reproduces A, and that cholSolve agrees with Gaussian elimination.
func TestCholeskyQuick(t *testing.T) {
	f := func(seed uint64, size uint8) bool {
		r := rand.New(rand.NewPCG(seed, 1))
		n := 1 + int(size)%40
		a := randomSPD(r, n, 0.1)
		l := make([]float64, n*n)
		if err := cholesky(a, n, l); err != nil {
			t.Logf("n=%d: %v", n, err)
			return false
		}
		llt := make([]float64, n*n)
		for i := range n {
			if !(l[i*n+i] > 0) {
				t.Logf("n=%d: L[%d][%d] = %v", n, i, i, l[i*n+i])
				return false
			}
			for j := range n {
				if j > i && l[i*n+j] != 0 {
					t.Logf("n=%d: L[%d][%d] = %v above the diagonal", n, i, j, l[i*n+j])
					return false
				}
				s := 0.0
				for k := range n {
					s += l[i*n+k] * l[j*n+k]
				}
				llt[i*n+j] = s
			}
		}
		if d, s := maxAbsDiff(llt, a); d > 1e-12*s*float64(n) {
			t.Logf("n=%d: |L L^T - A| = %g", n, d)
			return false
		}
		b := make([]float64, n)
		for i := range b {
			b[i] = 2*r.Float64() - 1
		}
		x := make([]float64, n)
		cholSolve(l, n, b, x)
		want := naiveSolve(a, n, b)
		// cond(A) <= (n + 0.1) / 0.1 here, so ~1e-16 * cond * n.
		if d, s := maxAbsDiff(x, want); d > 1e-10*s*float64(n) {
			t.Logf("n=%d: |x - x_naive| = %g (|x| %g)", n, d, s)
			return false
		}
		// x may alias b.
		cholSolve(l, n, b, b)
		if d, _ := maxAbsDiff(b, x); d != 0 {
			t.Logf("n=%d: aliased solve differs by %g", n, d)
			return false
		}
		return true
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 300, Rand: mrand.New(mrand.NewSource(1))}); err != nil {
		t.Fatal(err)
	}
}

func TestCholeskyNotPositiveDefinite(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name string
		n    int
		a    []float64
	}{
		{"indefinite", 2, []float64{1, 2, 2, 1}},
		{"negative diagonal", 1, []float64{-1}},
		{"zero", 2, []float64{0, 0, 0, 0}},
		{"singular rank one", 3, []float64{1, 1, 1, 1, 1, 1, 1, 1, 1}},
		// Positive semi-definite with a rounding-size last pivot: treated
		// as singular rather than factored into a uselessly tiny L[2][2].
		{"numerically singular", 2, []float64{1, 1, 1, 1 + 1e-17}},
		{"NaN", 2, []float64{1, 0, 0, nan}},
		{"NaN off the diagonal", 2, []float64{1, nan, nan, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := make([]float64, tc.n*tc.n)
			err := cholesky(tc.a, tc.n, l)
			if !errors.Is(err, ErrNotPositiveDefinite) {
				t.Fatalf("cholesky(%v) = %v, want ErrNotPositiveDefinite", tc.a, err)
			}
		})
	}
}

func TestCholeskyByHand(t *testing.T) {
	// [4 2; 2 3] = [2 0; 1 sqrt2] [2 1; 0 sqrt2]
	a := []float64{4, 2, 2, 3}
	l := make([]float64, 4)
	if err := cholesky(a, 2, l); err != nil {
		t.Fatal(err)
	}
	want := []float64{2, 0, 1, math.Sqrt2}
	if d, _ := maxAbsDiff(l, want); d > 1e-15 {
		t.Fatalf("L = %v, want %v", l, want)
	}
	// A x = [8, 7] has x = [1.25, 1.5].
	x := make([]float64, 2)
	cholSolve(l, 2, []float64{8, 7}, x)
	if d, _ := maxAbsDiff(x, []float64{1.25, 1.5}); d > 1e-15 {
		t.Fatalf("x = %v, want [1.25 1.5]", x)
	}
}
