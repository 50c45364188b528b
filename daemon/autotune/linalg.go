package autotune

import (
	"errors"
	"fmt"
	"math"
)

// Dense linear algebra for the Gaussian process: a Cholesky factorisation
// and the two triangular solves that use it. The matrices are small (one row
// per autotuning sample, so n <= ~100) and symmetric positive definite, so a
// plain O(n^3/6) factorisation in row-major []float64 is both simple and fast
// enough; no blocking, no pivoting.
//
// Storage. An n x n matrix A is a []float64 of length n*n with A[i][j] at
// a[i*n+j]. A factor L is lower triangular and stored the same way; its
// strict upper triangle is zero.
//
// Cholesky (the Cholesky-Banachiewicz order, row by row). For a symmetric
// positive definite A there is exactly one lower triangular L with a positive
// diagonal and A = L L^T. Equating entries (i >= j):
//
//	A[i][j] = sum_{k<=j} L[i][k] L[j][k]
//
// so, with the rows above i and the columns left of j already known,
//
//	L[i][j] = (A[i][j] - sum_{k<j} L[i][k] L[j][k]) / L[j][j]    (j < i)
//	L[i][i] = sqrt(A[i][i] - sum_{k<i} L[i][k]^2)
//
// The quantity under the square root (the pivot) is the Schur complement of
// the leading block, positive exactly when A is positive definite. Rounding
// makes a matrix that is only positive semi-definite in exact arithmetic (two
// equal rows, as from two samples at the same point with no noise) produce a
// pivot of zero, a tiny negative number, or a tiny positive one whose square
// root then divides everything below it and blows the solution up. So the
// factorisation treats any pivot <= n * eps * max_i A[i][i] (eps = 2^-52,
// machEps) as zero and fails with ErrNotPositiveDefinite; a NaN pivot fails
// the same test. The tolerance is of the size of Cholesky's backward error
// (Higham, Accuracy and Stability of Numerical Algorithms, thm 10.3: the
// computed L is the exact factor of A + dA with |dA| <= ~(n+1) u |L||L^T|,
// u = eps/2), so a pivot below it is noise. The caller (the GP) reacts by
// adding jitter to the diagonal and retrying; see GaussianProcess.
//
// Solves. A x = b is L (L^T x) = b: forward substitution for z in L z = b,
//
//	z[i] = (b[i] - sum_{k<i} L[i][k] z[k]) / L[i][i]
//
// then back substitution for x in L^T x = z, reading L by columns,
//
//	x[i] = (z[i] - sum_{k>i} L[k][i] x[k]) / L[i][i].
//
// log det A = 2 sum_i log L[i][i], which the log marginal likelihood needs.

// ErrNotPositiveDefinite is returned (wrapped) by the Cholesky factorisation
// when a pivot is not positive to working precision (see the tolerance in
// the block comment): the matrix is not positive definite, is singular, or
// holds a NaN.
var ErrNotPositiveDefinite = errors.New("autotune: matrix is not positive definite")

// cholesky factors the n x n symmetric matrix a (only its lower triangle is
// read) into l, lower triangular with a = l l^T. l must have length n*n and
// must not alias a. On error l holds garbage.
func cholesky(a []float64, n int, l []float64) error {
	maxDiag := 0.0
	for i := 0; i < n; i++ {
		if d := a[i*n+i]; d > maxDiag {
			maxDiag = d
		}
	}
	tol := float64(n) * machEps * maxDiag
	for i := 0; i < n; i++ {
		li := l[i*n : i*n+n]
		for j := 0; j <= i; j++ {
			s := a[i*n+j] - dot(li[:j], l[j*n:j*n+j])
			if j < i {
				li[j] = s / l[j*n+j]
				continue
			}
			if !(s > tol) { // also catches NaN
				return fmt.Errorf("%w: pivot %d is %g (tolerance %g)", ErrNotPositiveDefinite, i, s, tol)
			}
			li[i] = math.Sqrt(s)
		}
		clear(li[i+1:])
	}
	return nil
}

// machEps is the float64 machine epsilon, 2^-52 (twice the unit roundoff).
const machEps = 0x1p-52

// dot returns sum_k a[k] b[k] over len(a) <= len(b) terms, four at a time
// (independent partial sums let the multiplies overlap; the reslice lets the
// compiler drop the bounds checks). It is the inner loop of both the
// factorisation and the forward substitution.
func dot(a, b []float64) float64 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float64
	k := 0
	for ; k+4 <= len(a); k += 4 {
		s0 += a[k] * b[k]
		s1 += a[k+1] * b[k+1]
		s2 += a[k+2] * b[k+2]
		s3 += a[k+3] * b[k+3]
	}
	for ; k < len(a); k++ {
		s0 += a[k] * b[k]
	}
	return (s0 + s1) + (s2 + s3)
}

// solveLower solves l z = b for z by forward substitution; z may alias b.
func solveLower(l []float64, n int, b, z []float64) {
	for i := 0; i < n; i++ {
		z[i] = (b[i] - dot(l[i*n:i*n+i], z[:i])) / l[i*n+i]
	}
}

// solveUpperT solves l^T x = z for x by back substitution, where l is lower
// triangular (so l^T is upper); x may alias z.
func solveUpperT(l []float64, n int, z, x []float64) {
	for i := n - 1; i >= 0; i-- {
		s := z[i]
		for k := i + 1; k < n; k++ {
			s -= l[k*n+i] * x[k]
		}
		x[i] = s / l[i*n+i]
	}
}

// cholSolve solves (l l^T) x = b for x; x may alias b.
func cholSolve(l []float64, n int, b, x []float64) {
	solveLower(l, n, b, x)
	solveUpperT(l, n, x, x)
}
