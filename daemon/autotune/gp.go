package autotune

import (
	"errors"
	"fmt"
	"math"
)

// Gaussian-process regression (Rasmussen & Williams, Gaussian Processes for
// Machine Learning, 2006, ch. 2 and 5; Algorithm 2.1), the surrogate model
// of the Bayesian optimiser.
//
// Model. Scores are standardised first (see standardise): with m = mean(y)
// and s = std(y), the GP models t_i = (y_i - m) / s, so a noise level and a
// signal variance mean the same thing whatever the score's units are
// (bytes/us, samples/s). On standardised scores the model is
//
//	t_i = f(x_i) + e_i,   f ~ GP(0, k),   e_i ~ N(0, alpha^2) i.i.d.
//
// with the isotropic squared-exponential (RBF) kernel
//
//	k(x, x') = sf2 * exp(-|x - x'|^2 / (2 l^2))
//
// where l is the length scale (how far apart two inputs must be before their
// scores decorrelate) and sf2 the signal variance (how far f strays from the
// mean). alpha is the noise: Horovod's HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE,
// the standard deviation of a measurement's noise in units of the scores'
// standard deviation. Horovod's header calls alpha "the value added to the
// diagonal", but its code (gaussian_process.cc: a2 = alpha_*alpha_, and
// sy2 = sigma_y*sigma_y in PosteriorPrediction) adds alpha^2; hvdd adds
// alpha^2 too, so a given setting of the variable behaves the same here.
//
// Posterior (Algorithm 2.1). With K[i][j] = k(x_i, x_j) + (alpha^2 + g)[i=j]
// (g a jitter, normally 0), L = chol(K), a = K^-1 t = L^-T (L^-1 t), and for
// a query x the vector k*[i] = k(x, x_i):
//
//	mean(x) = k*^T a
//	var(x)  = k(x, x) - k*^T K^-1 k* = sf2 - |v|^2,   v = L^-1 k*
//
// var is the variance of f(x), the noise-free function, not of a new noisy
// measurement: the optimiser wants to know how much f itself is uncertain.
// Rounding can make sf2 - |v|^2 slightly negative near a sample when the
// noise is zero; it is clamped at zero. Costs: O(n^3/6) to factor K once per
// fit, O(n d) for k* and O(n^2/2) for v per query.
//
// At the samples the posterior mean has a closed form that needs no solve:
// K a = t gives (K - (alpha^2 + g) I) a = t - (alpha^2 + g) a, so
//
//	mean(x_i) = t_i - (alpha^2 + g) a_i.
//
// Log marginal likelihood (eq. 2.30), the evidence for a choice of (l, sf2):
//
//	log p(t | X, l, sf2) = -1/2 t^T a - sum_i log L[i][i] - n/2 log(2 pi)
//
// The first term rewards fitting the data, the second (half of log det K)
// penalises a model flexible enough to fit anything, the third is constant.
//
// Choosing (l, sf2). Horovod maximises the log marginal likelihood with
// L-BFGS from (1, 1), finite-difference gradients and no bounds, on raw
// inputs. Two changes here:
//
//   - The inputs are in the unit cube (BayesianOptimization scales them),
//     which bounds the plausible length scales: the search is over log l in
//     [lMin, lMax] and log sf2 in [sfMin, sfMax], a 13 x 7 grid and then a
//     compass search in the same log coordinates (step half the grid's
//     spacing, moving on any improvement, halving when none helps, down to
//     an eighth). It never leaves the box and costs about a hundred
//     factorisations, ~2 ms of CPU at n = 40. For each grid length scale the
//     unit kernel matrix exp(-|x_i - x_j|^2 / (2 l^2)) is computed once and
//     scaled for every sf2.
//   - The objective is the log posterior, not the likelihood alone: it adds
//     the log density of a Gamma(3, 6) prior on l (mode 1/3 of the box,
//     BoTorch's default for the same purpose), 2 log l - 6 l. With a handful
//     of samples the likelihood is nearly flat in l below the samples'
//     spacing, and maximum likelihood then picks the shortest length scale,
//     a model that calls every sample unrelated to its neighbours; EI
//     proposes points next to the samples forever after and the search
//     stalls (without the prior, on the 2-D bowl of the tests, some seeds
//     were still 0.3 to 0.4 below the maximum after 20 samples, worse than
//     random search). The prior breaks those ties towards a smooth model,
//     and n samples outweigh it: it is worth about 3.7 nats between l = 1/3
//     and l = 0.02. The grid is also walked from the longest
//     length scale down, so that exact ties go to the smoother model.
//
// With fewer than minFitSamples samples nothing is searched: one sample fits
// any (l, sf2) equally well. The defaults (l = 0.3, sf2 = 1) stand.
//
// Jitter. K is positive definite in exact arithmetic whenever alpha > 0, and
// positive semi-definite always. With alpha = 0 it is singular when two
// samples share an input, and numerically singular when the length scale is
// long compared with the samples' spacing. Cholesky then fails
// (ErrNotPositiveDefinite); the fit adds a jitter g to the diagonal,
// starting at 1e-10 * sf2 and growing a hundredfold up to sf2, and retries.
// The jitter is a little extra noise: the posterior still interpolates to
// within about g, and prediction always works. Only non-finite inputs can
// exhaust the ladder, and Fit rejects those before it factors anything.

// Hyperparameters are the RBF kernel's parameters.
type Hyperparameters struct {
	// LengthScale is l, in the units of the inputs (for BayesianOptimization,
	// fractions of each dimension's range). Must be positive.
	LengthScale float64
	// SignalVariance is sf2, the prior variance of f on standardised scores.
	// Must be positive.
	SignalVariance float64
}

// Search box and defaults for the hyperparameters, on inputs in the unit
// cube and standardised scores. Lengths below lMin see every sample as
// unrelated to its neighbours; above lMax (more than twice the diagonal of
// the 5-cube) f is a plane over the box. Standardised scores have variance 1,
// so a signal variance outside [sfMin, sfMax] is implausible.
const (
	lMin, lMax    = 0.02, 5.0
	sfMin, sfMax  = 0.05, 20.0
	lGrid, sfGrid = 13, 7
	// minFitSamples is the fewest samples with which Fit searches the
	// hyperparameters rather than using the defaults.
	minFitSamples = 3
)

// defaultLength and defaultSignal are the hyperparameters used before there
// are enough samples to fit them: a length scale of 0.3 of the box and unit
// signal variance.
const defaultLength, defaultSignal = 0.3, 1.0

// defaultHyperparameters returns the defaults as Hyperparameters.
func defaultHyperparameters() Hyperparameters {
	return Hyperparameters{LengthScale: defaultLength, SignalVariance: defaultSignal}
}

// ErrBadSamples is returned (wrapped, with the reason) by GaussianProcess.Fit
// and FitWith when the samples are unusable: x and y of different lengths,
// points of different dimensions, a non-finite coordinate or score, or
// non-positive hyperparameters.
var ErrBadSamples = errors.New("autotune: bad samples")

// jitterStart and jitterGrowth define the ladder of diagonal jitters the fit
// tries after a failed factorisation, relative to the signal variance:
// 1e-10, 1e-8, ..., 1.
const (
	jitterStart  = 1e-10
	jitterGrowth = 100.0
)

// GaussianProcess is a GP regressor with an RBF kernel, a fixed noise level
// and hyperparameters fitted by maximising the marginal likelihood (with a
// weak prior on the length scale; see the block comment). Fit or FitWith
// conditions it on samples; Predict then returns the posterior at any point.
//
// The zero value is a noise-free GP with no samples: Predict returns the
// prior (mean 0, standard deviation 1). A GaussianProcess keeps scratch
// buffers and is not safe for concurrent use.
type GaussianProcess struct {
	noise float64 // alpha; alpha^2 is added to K's diagonal

	n, d   int
	x      []float64 // n x d inputs, row-major
	t      []float64 // standardised scores
	yMean  float64   // y = yMean + yScale * t
	yScale float64
	d2     []float64 // n x n squared distances between inputs

	h      Hyperparameters
	jitter float64   // extra diagonal of the last factorisation
	l      []float64 // Cholesky factor of K
	a      []float64 // K^-1 t
	lml    float64

	// Scratch: k* and v for a query, the unit kernel matrix, K.
	k, v, kb, km []float64
}

// NewGaussianProcess returns a GP with no samples whose observations carry
// noise of standard deviation noise (alpha, on standardised scores; alpha^2
// is added to the kernel's diagonal, as in Horovod). It panics if noise is
// negative or not finite.
func NewGaussianProcess(noise float64) *GaussianProcess {
	if !(noise >= 0) || math.IsInf(noise, 0) {
		panic(fmt.Sprintf("autotune: GP noise %v is not a finite non-negative number", noise))
	}
	return &GaussianProcess{noise: noise}
}

// Noise returns alpha, the noise's standard deviation on standardised scores.
func (g *GaussianProcess) Noise() float64 { return g.noise }

// Len returns the number of samples the GP is conditioned on.
func (g *GaussianProcess) Len() int { return g.n }

// Hyperparameters returns the kernel parameters of the last fit (the
// defaults before any fit or with fewer than three samples).
func (g *GaussianProcess) Hyperparameters() Hyperparameters {
	if g.h == (Hyperparameters{}) {
		return defaultHyperparameters()
	}
	return g.h
}

// Jitter returns the extra value g the last fit had to add to the kernel's
// diagonal, beyond alpha^2, to factor it: 0 unless the samples made the
// kernel matrix singular to working precision.
func (g *GaussianProcess) Jitter() float64 { return g.jitter }

// LogMarginalLikelihood returns log p(t | X) of the last fit, where t are the
// standardised scores (Fit maximises this plus the length scale's log
// prior). It is 0 with no samples.
func (g *GaussianProcess) LogMarginalLikelihood() float64 { return g.lml }

// Fit conditions the GP on the samples (x[i], y[i]), replacing any earlier
// ones, and chooses the hyperparameters that maximise the log marginal
// likelihood plus the length scale's log prior, within the search box (with
// three or more samples; with fewer it keeps the defaults). The search box
// assumes inputs scaled to about the unit cube.
//
// Fit copies x and y. On error (wrapping ErrBadSamples) the GP is left with
// no samples, predicting the prior.
func (g *GaussianProcess) Fit(x [][]float64, y []float64) error {
	if err := g.load(x, y); err != nil {
		return err
	}
	h := defaultHyperparameters()
	if g.n >= minFitSamples {
		h = g.search()
	}
	return g.condition(h)
}

// FitWith conditions the GP on the samples with the given hyperparameters,
// without searching. Otherwise it behaves as Fit.
func (g *GaussianProcess) FitWith(x [][]float64, y []float64, h Hyperparameters) error {
	if !(h.LengthScale > 0) || !(h.SignalVariance > 0) || math.IsInf(h.LengthScale, 0) || math.IsInf(h.SignalVariance, 0) {
		g.reset()
		return fmt.Errorf("%w: hyperparameters %+v must be positive and finite", ErrBadSamples, h)
	}
	if err := g.load(x, y); err != nil {
		return err
	}
	return g.condition(h)
}

// Predict returns the posterior mean and standard deviation of the
// (noise-free) function at x, in the units of the scores. With no samples it
// returns the prior: mean 0 and standard deviation 1 (with one sample, or
// samples whose scores are all equal, the mean is that score and the
// standard deviation is in units of its magnitude). It panics if the GP has
// samples and len(x) differs from their dimension.
func (g *GaussianProcess) Predict(x []float64) (mean, std float64) {
	m, s := g.predictStd(x)
	if g.n == 0 {
		return m, s
	}
	return g.yMean + g.yScale*m, g.yScale * s
}

// predictStd is Predict on standardised scores: mean(x) = k*^T a and
// sd(x) = sqrt(max(0, sf2 - |L^-1 k*|^2)).
func (g *GaussianProcess) predictStd(x []float64) (mean, std float64) {
	h := g.Hyperparameters()
	if g.n == 0 {
		return 0, math.Sqrt(h.SignalVariance)
	}
	if len(x) != g.d {
		panic(fmt.Sprintf("autotune: Predict at a point of dimension %d, GP has dimension %d", len(x), g.d))
	}
	k, v := g.k[:g.n], g.v[:g.n]
	c := -0.5 / (h.LengthScale * h.LengthScale)
	for i := range k {
		xi := g.x[i*g.d : i*g.d+g.d]
		r := 0.0
		for j, u := range x {
			e := u - xi[j]
			r += e * e
		}
		k[i] = h.SignalVariance * math.Exp(c*r)
		mean += k[i] * g.a[i]
	}
	solveLower(g.l, g.n, k, v)
	q := dot(v, v)
	return mean, math.Sqrt(math.Max(0, h.SignalVariance-q))
}

// trainingMeans sets out[i] to the posterior mean at sample i on
// standardised scores, t_i - (alpha^2 + g) a_i (see the block comment).
func (g *GaussianProcess) trainingMeans(out []float64) {
	nv := g.noise*g.noise + g.jitter
	for i := range g.n {
		out[i] = g.t[i] - nv*g.a[i]
	}
}

// reset forgets every sample.
func (g *GaussianProcess) reset() {
	g.n, g.d = 0, 0
	g.x, g.t, g.d2 = g.x[:0], g.t[:0], g.d2[:0]
	g.yMean, g.yScale = 0, 1
	g.h, g.jitter, g.lml = Hyperparameters{}, 0, 0
}

// load validates and copies the samples, standardises the scores and
// precomputes the squared distances.
func (g *GaussianProcess) load(x [][]float64, y []float64) error {
	g.reset()
	if len(x) != len(y) {
		return fmt.Errorf("%w: %d points but %d scores", ErrBadSamples, len(x), len(y))
	}
	n := len(x)
	if n == 0 {
		return nil
	}
	d := len(x[0])
	for i, xi := range x {
		if len(xi) != d {
			return fmt.Errorf("%w: point %d has dimension %d, point 0 has %d", ErrBadSamples, i, len(xi), d)
		}
		for j, u := range xi {
			if math.IsNaN(u) || math.IsInf(u, 0) {
				return fmt.Errorf("%w: coordinate %d of point %d is %v", ErrBadSamples, j, i, u)
			}
		}
		if math.IsNaN(y[i]) || math.IsInf(y[i], 0) {
			return fmt.Errorf("%w: score %d is %v", ErrBadSamples, i, y[i])
		}
	}
	g.x = grow(g.x, n*d)
	for i, xi := range x {
		copy(g.x[i*d:], xi)
	}
	g.t = grow(g.t, n)
	g.yMean, g.yScale = standardise(y, g.t)
	g.d2 = grow(g.d2, n*n)
	for i := range n {
		xi := g.x[i*d : i*d+d]
		g.d2[i*n+i] = 0
		for j := range i {
			xj := g.x[j*d : j*d+d]
			r := 0.0
			for c := range xi {
				e := xi[c] - xj[c]
				r += e * e
			}
			if math.IsInf(r, 0) { // coordinates finite but ~1e154 apart
				r = math.MaxFloat64
			}
			g.d2[i*n+j], g.d2[j*n+i] = r, r
		}
	}
	g.l, g.a = grow(g.l, n*n), grow(g.a, n)
	g.k, g.v, g.kb, g.km = grow(g.k, n), grow(g.v, n), grow(g.kb, n*n), grow(g.km, n*n)
	g.n, g.d = n, d
	return nil
}

// standardise writes (y - mean) / scale into t and returns mean and scale.
//
// scale is the population standard deviation of y (as Horovod's
// GetSufficientStats), computed on y / max|y| so that scores near the
// float64 range neither overflow the sum of squares nor lose the mean. When
// the scores do not vary to working precision (one sample, or all equal),
// t is all zero and scale falls back to max|y|, or to 1 if every score is 0:
// the GP's prior standard deviation is then the scores' magnitude, which is
// at least in their units.
func standardise(y, t []float64) (mean, scale float64) {
	m := 0.0
	for _, v := range y {
		m = math.Max(m, math.Abs(v))
	}
	if m == 0 {
		clear(t)
		return 0, 1
	}
	mu := 0.0
	for _, v := range y {
		mu += v / m
	}
	mu /= float64(len(y))
	ss := 0.0
	for _, v := range y {
		e := v/m - mu
		ss += e * e
	}
	sd := math.Sqrt(ss / float64(len(y)))
	if sd <= 1e-12 {
		clear(t)
		return mu * m, m
	}
	for i, v := range y {
		t[i] = (v/m - mu) / sd
	}
	return mu * m, sd * m
}

// grow returns s resliced to length n, reallocated if its capacity is short.
func grow(s []float64, n int) []float64 {
	if cap(s) < n {
		return make([]float64, n)
	}
	return s[:n]
}

// kernelBase fills g.kb with exp(-d2 / (2 l^2)): the kernel matrix for unit
// signal variance and no noise.
func (g *GaussianProcess) kernelBase(l float64) {
	c := -0.5 / (l * l)
	n := g.n
	for i := range n {
		g.kb[i*n+i] = 1
		for j := range i {
			e := math.Exp(c * g.d2[i*n+j])
			g.kb[i*n+j], g.kb[j*n+i] = e, e
		}
	}
}

// factor builds K = sf2 * kb + (alpha^2 + g) I in g.km and factors it,
// climbing the jitter ladder until Cholesky succeeds. It leaves the factor
// in g.l, a = K^-1 t in g.a, and returns the jitter g used and the
// log marginal likelihood.
func (g *GaussianProcess) factor(sf2 float64) (jitter, lml float64, err error) {
	n := g.n
	base := g.noise * g.noise
	// K goes into its own buffer: cholesky must not alias its input, and kb
	// must survive for the next sf2.
	k := g.km[:n*n]
	for try := 0; ; try++ {
		switch {
		case try == 0:
			jitter = 0
		case try == 1:
			jitter = jitterStart * sf2
		default:
			jitter *= jitterGrowth
		}
		if jitter > sf2*1.0000001 {
			return 0, 0, err
		}
		for i := range n {
			for j := 0; j <= i; j++ {
				k[i*n+j] = sf2 * g.kb[i*n+j]
			}
			k[i*n+i] += base + jitter
		}
		if err = cholesky(k, n, g.l); err == nil {
			break
		}
	}
	cholSolve(g.l, n, g.t, g.a)
	fit, logdet := 0.0, 0.0
	for i := range n {
		fit += g.t[i] * g.a[i]
		logdet += math.Log(g.l[i*n+i])
	}
	lml = -0.5*fit - logdet - 0.5*float64(n)*math.Log(2*math.Pi)
	return jitter, lml, nil
}

// condition factors K for h and records the posterior.
func (g *GaussianProcess) condition(h Hyperparameters) error {
	if g.n == 0 {
		g.h = h
		return nil
	}
	g.kernelBase(h.LengthScale)
	j, lml, err := g.factor(h.SignalVariance)
	if err != nil {
		g.reset()
		return fmt.Errorf("autotune: GP fit with %+v: %w", h, err)
	}
	g.h, g.jitter, g.lml = h, j, lml
	return nil
}

// logPriorLength is the log density, up to a constant, of the length
// scale's prior Gamma(3, 6): 2 log l - 6 l.
func logPriorLength(l float64) float64 { return 2*math.Log(l) - 6*l }

// search maximises the log marginal likelihood over (log l, log sf2) in the
// box [lMin, lMax] x [sfMin, sfMax]: a grid, then a compass search from the
// grid's best point.
func (g *GaussianProcess) search() Hyperparameters {
	ll0, ll1 := math.Log(lMin), math.Log(lMax)
	ls0, ls1 := math.Log(sfMin), math.Log(sfMax)
	dl := (ll1 - ll0) / (lGrid - 1)
	ds := (ls1 - ls0) / (sfGrid - 1)

	best := math.Inf(-1)
	bl, bs := math.Log(defaultLength), 0.0
	eval := func(ll, ls float64) float64 {
		_, lml, err := g.factor(math.Exp(ls))
		if err != nil || math.IsNaN(lml) {
			return math.Inf(-1)
		}
		return lml + logPriorLength(math.Exp(ll))
	}
	// Longest length scales first, so that a tie goes to the smoother model.
	for i := lGrid - 1; i >= 0; i-- {
		ll := ll0 + float64(i)*dl
		g.kernelBase(math.Exp(ll))
		for j := range sfGrid {
			ls := ls0 + float64(j)*ds
			if v := eval(ll, ls); v > best {
				best, bl, bs = v, ll, ls
			}
		}
	}

	// Compass search: try a step either way along each axis, move on any
	// improvement, halve the steps when none helps.
	sl, ss := dl/2, ds/2
	for sl > dl/8 {
		moved := false
		for _, c := range [4][2]float64{{sl, 0}, {-sl, 0}, {0, ss}, {0, -ss}} {
			ll := math.Min(ll1, math.Max(ll0, bl+c[0]))
			ls := math.Min(ls1, math.Max(ls0, bs+c[1]))
			if ll == bl && ls == bs {
				continue
			}
			g.kernelBase(math.Exp(ll))
			if v := eval(ll, ls); v > best {
				best, bl, bs, moved = v, ll, ls, true
				break
			}
		}
		if !moved {
			sl, ss = sl/2, ss/2
		}
	}
	return Hyperparameters{LengthScale: math.Exp(bl), SignalVariance: math.Exp(bs)}
}
