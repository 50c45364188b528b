package autotune

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Bayesian optimisation with expected improvement (Jones, Schonlau & Welch,
// Efficient Global Optimization of Expensive Black-Box Functions, 1998;
// Brochu, Cora & de Freitas, A Tutorial on Bayesian Optimization of
// Expensive Cost Functions, arXiv:1012.2599, 2010), as in Horovod's
// bayesian_optimization.cc, maximising.
//
// Each NextSample:
//
//  1. maps every sample into the unit cube, u = (x - Lo) / (Hi - Lo) per
//     dimension (Horovod works in raw units, where one isotropic length
//     scale suits only dimensions of similar range, and where the
//     hyperparameter search has no natural bounds);
//  2. fits the GP (gp.go) to (u_i, y_i): standardised scores, RBF kernel,
//     noise alpha^2 on the diagonal, (l, sf2) by maximum likelihood with a
//     weak prior on l;
//  3. takes as the incumbent the best posterior mean at the samples,
//     best = max_i mean(u_i), rather than max_i y_i: with noisy scores the
//     largest measurement is biased upwards (Brochu et al. sec. 2.4; Horovod
//     does the same);
//  4. returns the point of the box that maximises the expected improvement
//     over best, mapped back to the caller's units.
//
// Expected improvement. With f(u) ~ N(mu, sd^2) under the posterior, the
// improvement over best by more than a margin xi >= 0 is
// I = max(f - best - xi, 0), and
//
//	EI = E[I] = (mu - best - xi) Phi(z) + sd phi(z),  z = (mu - best - xi) / sd
//
// (integrate (f - best - xi) against the normal density from best + xi up),
// where phi and Phi are the standard normal density and distribution. The
// first term rewards a high mean (exploitation), the second uncertainty
// (exploration); xi shifts the balance towards exploration. Both partial
// derivatives are positive: dEI/dmu = Phi(z), dEI/dsd = phi(z). As sd -> 0,
// EI -> max(mu - best - xi, 0), which is what ExpectedImprovement returns at
// sd = 0 (Horovod returns 0 there, which is the same unless the mean already
// beats the incumbent). EI is computed as sd * (z Phi(z) + phi(z)), with
// Phi(z) = erfc(-z / sqrt 2) / 2, which is accurate in relative terms for
// negative z; for z below about -38, phi(z) underflows and EI is 0. Scores
// are standardised, so xi is in units of the scores' standard deviation
// (Horovod's default, 0.01, is kept).
//
// Maximising EI. EI is smooth but multimodal (a bump near every promising
// sample and a plateau in unexplored corners), and flat where it underflows.
// Horovod runs L-BFGS with finite-difference gradients from 25 random
// starts, fencing the bounds with an infinite objective. Here, in the unit
// cube:
//
//   - candidates: 64 (d + 2) uniform random points, plus 8 d Gaussian
//     perturbations (sd 0.05, clipped to the cube) of each of the three
//     samples with the highest posterior mean, so the region of the
//     incumbent is always searched finely, plus the cube's centre;
//   - refinement: a compass search (step 1/16 along each free axis either
//     way, moving on any improvement, halving the step when none helps,
//     down to 1/2048) from the three best candidates, clipped to the cube;
//   - ties: candidates are ordered by EI, then by the upper confidence bound
//     mu + 2 sd, so that where EI has underflowed everywhere (a dense,
//     confident model) the search still moves towards promising points.
//
// In 5 dimensions that is about 600 candidates and a few hundred
// refinement steps, each one posterior evaluation (O(n d) kernel values and
// an O(n^2 / 2) forward substitution); with the GP fit, a NextSample at
// n = 40 costs ~3 ms of CPU (BenchmarkNextSample). Every point the search
// evaluates lies in [0, 1]^d, and the result is mapped back with
// Lo + u (Hi - Lo) and then clipped to [Lo, Hi], so rounding cannot leave the
// box either.
//
// Where this falls short. The noise alpha is fixed relative to the scores'
// spread (as in Horovod), not fitted: with Horovod's default 0.8 the model
// treats most of the spread between samples as noise, which makes it a
// robust smoother on bowl-shaped scores but blind to a narrow ridge or
// peak whose height is below alpha standard deviations. And one isotropic
// length scale in the unit cube suits knobs whose effect is roughly even
// over their range; a knob that matters in decades (bytes) should be passed
// as its logarithm. On the ridge of the tests (objectives_test.go, 10
// seeds, 20 samples, noise 0.2) the mean regret was 0.004 searched in log10
// units against random search's 0.034, and 0.036 searched in linear units
// over [1, 1000]^2, no better than random search; with noise 0.8 it was
// 0.062 even in log units.

// Bounds is one dimension's closed interval [Lo, Hi].
type Bounds struct{ Lo, Hi float64 }

// DefaultXi is Horovod's default exploration margin for expected
// improvement, in units of the scores' standard deviation.
const DefaultXi = 0.01

// BayesianOptimization proposes the next point at which to sample a noisy
// function to maximise it, in a box. Not safe for concurrent use.
//
// It does no I/O and keeps no clock: the caller measures a score for each
// point (AddSample) and asks where to measure next (NextSample). All
// randomness comes from the *rand.Rand given to NewBayesianOptimization, so a
// run is reproducible from its seed and its scores.
type BayesianOptimization struct {
	// Xi is the expected improvement's exploration margin, in units of the
	// scores' standard deviation. NewBayesianOptimization sets DefaultXi;
	// larger values explore more, 0 is plain EI. Must not be negative.
	Xi float64

	bounds []Bounds
	rng    *rand.Rand
	xs     [][]float64 // samples in the caller's units
	ys     []float64
	gp     GaussianProcess

	// Scratch, reused across NextSample calls.
	us   [][]float64 // samples in the unit cube
	mus  []float64   // posterior means at the samples
	free []int       // dimensions with Hi > Lo
}

// NewBayesianOptimization returns an optimiser over the box bounds with no
// samples. noise is the GP's alpha (Horovod's
// HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE, default 0.8): the measurement
// noise's standard deviation on standardised scores, whose square is added to
// the kernel's diagonal as in Horovod. rng is the caller's seeded source; nil
// means a PCG source seeded with (0, 0), so a nil rng is still reproducible.
//
// It panics on a bound that is not finite, has Lo > Hi, or whose width
// Hi - Lo overflows, and on a negative or non-finite noise: these are
// programming errors. A dimension with Lo == Hi is allowed and always
// proposed at Lo.
func NewBayesianOptimization(bounds []Bounds, noise float64, rng *rand.Rand) *BayesianOptimization {
	for i, b := range bounds {
		w := b.Hi - b.Lo
		if math.IsNaN(w) || math.IsInf(w, 0) || math.IsInf(b.Lo, 0) || math.IsInf(b.Hi, 0) || w < 0 {
			panic(fmt.Sprintf("autotune: bounds %d = [%v, %v] are not a finite interval", i, b.Lo, b.Hi))
		}
	}
	if rng == nil {
		rng = rand.New(rand.NewPCG(0, 0))
	}
	b := &BayesianOptimization{
		Xi:     DefaultXi,
		bounds: slices.Clone(bounds),
		rng:    rng,
		gp:     *NewGaussianProcess(noise),
	}
	for i, bd := range bounds {
		if bd.Hi > bd.Lo {
			b.free = append(b.free, i)
		}
	}
	return b
}

// Dim returns the number of dimensions, len(bounds).
func (b *BayesianOptimization) Dim() int { return len(b.bounds) }

// Len returns the number of samples recorded since creation or the last
// Clear.
func (b *BayesianOptimization) Len() int { return len(b.xs) }

// AddSample records the score y measured at x (len(x) == len(bounds)); it
// copies x. A sample whose x or y is NaN or infinite is ignored (Len does
// not grow): a score of 0/0 from an empty measurement window must not poison
// the model. x may lie outside the bounds; the model uses it as it is. It
// panics if len(x) != Dim().
func (b *BayesianOptimization) AddSample(x []float64, y float64) {
	if len(x) != len(b.bounds) {
		panic(fmt.Sprintf("autotune: AddSample with a point of dimension %d, bounds have %d", len(x), len(b.bounds)))
	}
	if !finite(y) {
		return
	}
	for _, v := range x {
		if !finite(v) {
			return
		}
	}
	b.xs = append(b.xs, slices.Clone(x))
	b.ys = append(b.ys, y)
}

// Best returns a copy of the sample with the highest score and that score;
// ok is false with no samples. Equal scores go to the earliest sample.
func (b *BayesianOptimization) Best() (x []float64, y float64, ok bool) {
	if len(b.xs) == 0 {
		return nil, 0, false
	}
	bi := 0
	for i, v := range b.ys {
		if v > b.ys[bi] {
			bi = i
		}
	}
	return slices.Clone(b.xs[bi]), b.ys[bi], true
}

// Clear forgets every sample. The rng, bounds, noise and Xi stay.
func (b *BayesianOptimization) Clear() {
	b.xs, b.ys = b.xs[:0], b.ys[:0]
}

// NextSample returns the point that maximises expected improvement over the
// best score so far, inside the bounds; with no samples, a random point
// (uniform in the box). The result is a new slice, every coordinate in
// [Lo, Hi].
func (b *BayesianOptimization) NextSample() []float64 {
	if len(b.xs) == 0 {
		u := make([]float64, len(b.bounds))
		b.randomUnit(u)
		return b.fromUnit(u)
	}
	n := len(b.xs)
	for len(b.us) < n {
		b.us = append(b.us, make([]float64, len(b.bounds)))
	}
	b.us = b.us[:n]
	for i, x := range b.xs {
		b.toUnit(x, b.us[i])
	}
	if err := b.gp.Fit(b.us, b.ys); err != nil {
		// Unreachable: AddSample admits only finite samples of the right
		// dimension, and the jitter ladder factors any finite kernel
		// matrix. Fall back to exploring rather than panicking in the
		// daemon's loop.
		u := make([]float64, len(b.bounds))
		b.randomUnit(u)
		return b.fromUnit(u)
	}
	b.mus = grow(b.mus, n)
	b.gp.trainingMeans(b.mus)
	best := slices.Max(b.mus)
	return b.fromUnit(b.maximiseEI(best))
}

// acq is the acquisition value of one point: its EI and, for ties, its upper
// confidence bound.
type acq struct{ ei, ucb float64 }

// better reports whether a beats c: higher EI, or equal EI and higher UCB.
func (a acq) better(c acq) bool {
	return a.ei > c.ei || (a.ei == c.ei && a.ucb > c.ucb)
}

// eval returns the acquisition value at u (unit cube, standardised scores).
func (b *BayesianOptimization) eval(u []float64, best float64) acq {
	mu, sd := b.gp.predictStd(u)
	return acq{ei: ExpectedImprovement(mu, sd, best, b.Xi), ucb: mu + 2*sd}
}

// candidate is a point of the unit cube and its acquisition value.
type candidate struct {
	u []float64
	v acq
}

// Search sizes (see the block comment).
const (
	randomPerDim   = 64 // random candidates: randomPerDim * (d + 2)
	perturbPerDim  = 8  // perturbations per top sample: perturbPerDim * d
	perturbSamples = 3  // samples perturbed
	perturbSD      = 0.05
	refineStarts   = 3
	refineStep     = 1.0 / 16
	refineMinStep  = 1.0 / 2048
)

// maximiseEI returns the point of the unit cube with the highest
// acquisition value it finds: random and local candidates, then a compass
// search from the best few.
func (b *BayesianOptimization) maximiseEI(best float64) []float64 {
	d := len(b.bounds)
	top := make([]candidate, 0, refineStarts+1)
	// offer keeps top as the refineStarts best candidates, best first.
	offer := func(u []float64) {
		v := b.eval(u, best)
		if len(top) == refineStarts && !v.better(top[len(top)-1].v) {
			return
		}
		c := candidate{u: slices.Clone(u), v: v}
		i := len(top)
		for i > 0 && v.better(top[i-1].v) {
			i--
		}
		top = slices.Insert(top, i, c)
		if len(top) > refineStarts {
			top = top[:refineStarts]
		}
	}

	u := make([]float64, d)
	for i := range u {
		u[i] = 0.5
	}
	b.zeroFixed(u)
	offer(u)
	for range randomPerDim * (d + 2) {
		b.randomUnit(u)
		offer(u)
	}
	// Perturb the samples with the highest posterior means.
	order := make([]int, len(b.us))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(i, j int) int {
		switch {
		case b.mus[i] > b.mus[j]:
			return -1
		case b.mus[i] < b.mus[j]:
			return 1
		}
		return 0
	})
	for _, i := range order[:min(perturbSamples, len(order))] {
		for range perturbPerDim * d {
			for _, j := range b.free {
				u[j] = clamp01(b.us[i][j] + perturbSD*b.rng.NormFloat64())
			}
			b.zeroFixed(u)
			offer(u)
		}
	}

	res := top[0]
	for _, c := range top {
		if r := b.refine(c, best); r.v.better(res.v) {
			res = r
		}
	}
	return res.u
}

// refine runs a compass search from c inside the unit cube and returns the
// best point it reaches (c itself if nothing beats it).
func (b *BayesianOptimization) refine(c candidate, best float64) candidate {
	cur := candidate{u: slices.Clone(c.u), v: c.v}
	q := make([]float64, len(cur.u))
	for step := refineStep; step >= refineMinStep; {
		moved := false
		for _, j := range b.free {
			for _, s := range [2]float64{step, -step} {
				copy(q, cur.u)
				q[j] = clamp01(cur.u[j] + s)
				if q[j] == cur.u[j] {
					continue
				}
				if v := b.eval(q, best); v.better(cur.v) {
					cur.u, q = q, cur.u
					cur.v = v
					moved = true
					break
				}
			}
		}
		if !moved {
			step /= 2
		}
	}
	return cur
}

// randomUnit fills u with a uniform point of the unit cube (0 in the fixed
// dimensions). It draws one number per dimension, fixed or not, so the
// stream of draws depends only on the dimension.
func (b *BayesianOptimization) randomUnit(u []float64) {
	for i := range u {
		u[i] = b.rng.Float64()
	}
	b.zeroFixed(u)
}

// zeroFixed sets u to 0 in every dimension with Lo == Hi.
func (b *BayesianOptimization) zeroFixed(u []float64) {
	if len(b.free) == len(u) {
		return
	}
	for i, bd := range b.bounds {
		if !(bd.Hi > bd.Lo) {
			u[i] = 0
		}
	}
}

// toUnit maps x into unit-cube coordinates u (0 in fixed dimensions).
func (b *BayesianOptimization) toUnit(x, u []float64) {
	for i, bd := range b.bounds {
		if w := bd.Hi - bd.Lo; w > 0 {
			u[i] = (x[i] - bd.Lo) / w
		} else {
			u[i] = 0
		}
	}
}

// fromUnit maps u back to the caller's units, clipped to the bounds.
func (b *BayesianOptimization) fromUnit(u []float64) []float64 {
	x := make([]float64, len(u))
	for i, bd := range b.bounds {
		x[i] = math.Min(bd.Hi, math.Max(bd.Lo, bd.Lo+u[i]*(bd.Hi-bd.Lo)))
	}
	return x
}

// ExpectedImprovement returns E[max(f - best - xi, 0)] for f ~ N(mean, std^2):
// (mean - best - xi) Phi(z) + std phi(z) with z = (mean - best - xi) / std,
// and max(mean - best - xi, 0) when std is 0. The result is never negative
// or NaN for finite arguments with std >= 0. It is non-decreasing in mean
// and in std. Horovod passes xi = 0.01 on standardised scores (DefaultXi).
func ExpectedImprovement(mean, std, best, xi float64) float64 {
	imp := mean - best - xi
	if !(std > 0) {
		return math.Max(imp, 0)
	}
	z := imp / std
	ei := std * (z*normCDF(z) + normPDF(z))
	if !(ei > 0) { // rounding for z << 0, or NaN from overflowing inputs
		return 0
	}
	return ei
}

// normPDF is the standard normal density.
func normPDF(z float64) float64 { return math.Exp(-0.5*z*z) / math.Sqrt(2*math.Pi) }

// normCDF is the standard normal distribution function, via erfc so that it
// keeps its relative accuracy in the lower tail.
func normCDF(z float64) float64 { return 0.5 * math.Erfc(-z/math.Sqrt2) }

// clamp01 clips v to [0, 1].
func clamp01(v float64) float64 { return math.Min(1, math.Max(0, v)) }

// finite reports whether v is neither NaN nor infinite.
func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
