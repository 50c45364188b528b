package autotune

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// smooth is the known function of the GP tests, on [0, 1].
func smooth(x float64) float64 { return math.Sin(2*math.Pi*x) + 0.5*x }

// grid1 returns n points spread evenly over [0, 1] (ends included) as 1-D
// inputs, and smooth at each plus noise of standard deviation sd.
func grid1(n int, sd float64, r *rand.Rand) (x [][]float64, y []float64) {
	for i := range n {
		u := float64(i) / float64(n-1)
		x = append(x, []float64{u})
		v := smooth(u)
		if sd > 0 {
			v += sd * r.NormFloat64()
		}
		y = append(y, v)
	}
	return x, y
}

func TestGPInterpolatesNoiseFree(t *testing.T) {
	x, y := grid1(9, 0, nil)
	g := NewGaussianProcess(0)
	if err := g.Fit(x, y); err != nil {
		t.Fatal(err)
	}
	h := g.Hyperparameters()
	t.Logf("fitted %+v, jitter %g, lml %.3f", h, g.Jitter(), g.LogMarginalLikelihood())
	for i := range x {
		m, s := g.Predict(x[i])
		if math.Abs(m-y[i]) > 1e-4 {
			t.Errorf("mean at sample %v = %v, want %v (noise-free: interpolate)", x[i], m, y[i])
		}
		if s > 1e-3 {
			t.Errorf("std at sample %v = %v, want < 1e-3", x[i], s)
		}
	}
	// Between the samples the posterior mean follows the function.
	for _, u := range []float64{0.06, 0.31, 0.5, 0.7, 0.93} {
		m, s := g.Predict([]float64{u})
		if math.Abs(m-smooth(u)) > 0.02 {
			t.Errorf("mean at %v = %v, want %v +- 0.02", u, m, smooth(u))
		}
		if s > 0.05 {
			t.Errorf("std at %v, between samples 1/8 apart, = %v; want < 0.05", u, s)
		}
	}
	// Far from every sample the posterior is the prior: the scores' mean,
	// and the full prior standard deviation.
	_, s0 := g.Predict([]float64{0.5})
	prior := math.Sqrt(h.SignalVariance) * g.yScale
	for _, u := range []float64{-5, 10} {
		m, s := g.Predict([]float64{u})
		if math.Abs(s-prior) > 1e-6*prior || s < 100*s0 {
			t.Errorf("std at %v = %v, want the prior's %v (and far above %v inside)", u, s, prior, s0)
		}
		if math.Abs(m-g.yMean) > 1e-6 {
			t.Errorf("mean at %v = %v, want the scores' mean %v", u, m, g.yMean)
		}
	}
}

// TestGPNoiseSmooths fits noisy samples with growing noise levels: the
// noise-free GP interpolates them, and the noisier the model the further
// its mean keeps from the measurements and the closer (here) it stays to
// the function that was measured.
func TestGPNoiseSmooths(t *testing.T) {
	const sd = 0.3
	x, y := grid1(30, sd, rand.New(rand.NewPCG(1, 1)))
	rmsNoise := 0.0
	for i := range x {
		rmsNoise += sq(y[i] - smooth(x[i][0]))
	}
	rmsNoise = math.Sqrt(rmsNoise / float64(len(x)))

	tests := []struct {
		noise float64
		// bounds on the rms of mean - y and of mean - f at the samples
		maxResid, minResid, maxErr float64
	}{
		{noise: 0, maxResid: 1e-3, maxErr: 1.1 * rmsNoise},
		{noise: 0.1, minResid: 0.005, maxErr: rmsNoise},
		{noise: 0.4, minResid: 0.5 * rmsNoise, maxErr: 0.6 * rmsNoise},
		{noise: 0.8, minResid: 0.7 * rmsNoise, maxErr: 0.6 * rmsNoise},
	}
	prevResid := -1.0
	for _, tc := range tests {
		g := NewGaussianProcess(tc.noise)
		if err := g.Fit(x, y); err != nil {
			t.Fatal(err)
		}
		resid, errf := 0.0, 0.0
		for i := range x {
			m, _ := g.Predict(x[i])
			resid += sq(m - y[i])
			errf += sq(m - smooth(x[i][0]))
		}
		resid = math.Sqrt(resid / float64(len(x)))
		errf = math.Sqrt(errf / float64(len(x)))
		t.Logf("noise %.1f: %+v, rms(mean-y) %.4f, rms(mean-f) %.4f, rms(y-f) %.4f", tc.noise, g.Hyperparameters(), resid, errf, rmsNoise)
		if tc.maxResid > 0 && resid > tc.maxResid {
			t.Errorf("noise %v: rms(mean - y) = %v, want <= %v", tc.noise, resid, tc.maxResid)
		}
		if resid < tc.minResid {
			t.Errorf("noise %v: rms(mean - y) = %v, want >= %v: the model interpolates noise", tc.noise, resid, tc.minResid)
		}
		if errf > tc.maxErr {
			t.Errorf("noise %v: rms(mean - f) = %v, want <= %v", tc.noise, errf, tc.maxErr)
		}
		if resid <= prevResid {
			t.Errorf("noise %v: rms(mean - y) = %v, not above the previous noise level's %v", tc.noise, resid, prevResid)
		}
		prevResid = resid
	}
}

func TestGPPrior(t *testing.T) {
	tests := []struct {
		name      string
		g         *GaussianProcess
		x         [][]float64
		y         []float64
		at        []float64
		wantMean  float64
		wantStd   float64 // far from any sample
		sampleStd float64 // upper bound at the sample, if any
	}{
		{name: "zero value", g: &GaussianProcess{}, at: []float64{1, 2, 3}, wantMean: 0, wantStd: 1},
		{name: "no samples", g: NewGaussianProcess(0.8), x: [][]float64{}, y: []float64{}, at: []float64{0.5}, wantMean: 0, wantStd: 1},
		// One sample: the mean is its score everywhere, the scale its
		// magnitude.
		{name: "one sample", g: NewGaussianProcess(0.8), x: [][]float64{{0.5, 0.5}}, y: []float64{-5},
			at: []float64{9, 9}, wantMean: -5, wantStd: 5, sampleStd: 5 * 0.8},
		{name: "one zero sample", g: NewGaussianProcess(0), x: [][]float64{{0.5}}, y: []float64{0},
			at: []float64{9}, wantMean: 0, wantStd: 1, sampleStd: 1e-4},
		{name: "equal scores", g: NewGaussianProcess(0.5), x: [][]float64{{0}, {0.5}, {1}}, y: []float64{2, 2, 2},
			at: []float64{9}, wantMean: 2, wantStd: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.x != nil {
				if err := tc.g.FitWith(tc.x, tc.y, defaultHyperparameters()); err != nil {
					t.Fatal(err)
				}
			}
			m, s := tc.g.Predict(tc.at)
			if math.Abs(m-tc.wantMean) > 1e-12 || math.Abs(s-tc.wantStd) > 1e-12 {
				t.Errorf("Predict(%v) = %v, %v; want %v, %v", tc.at, m, s, tc.wantMean, tc.wantStd)
			}
			for i := range tc.x {
				m, s := tc.g.Predict(tc.x[i])
				if math.Abs(m-tc.wantMean) > 1e-12 {
					t.Errorf("mean at sample %v = %v, want %v", tc.x[i], m, tc.wantMean)
				}
				if tc.sampleStd > 0 && !(s < tc.sampleStd) {
					t.Errorf("std at sample %v = %v, want < %v", tc.x[i], s, tc.sampleStd)
				}
			}
		})
	}
}

// TestGPJitter conditions a noise-free GP on two different scores at the
// same point: its kernel matrix is singular, so Cholesky fails, and the fit
// must add jitter and still predict, here the average of the two.
func TestGPJitter(t *testing.T) {
	x := [][]float64{{0.1}, {0.5}, {0.5}, {0.9}}
	y := []float64{0, 1, 2, 0}
	h := Hyperparameters{LengthScale: 0.2, SignalVariance: 1}

	// The matrix the GP starts from is not positive definite.
	n := len(x)
	k := make([]float64, n*n)
	for i := range n {
		for j := range n {
			k[i*n+j] = h.SignalVariance * math.Exp(-sq(x[i][0]-x[j][0])/(2*sq(h.LengthScale)))
		}
	}
	if err := cholesky(k, n, make([]float64, n*n)); !errors.Is(err, ErrNotPositiveDefinite) {
		t.Fatalf("cholesky of the duplicate-point kernel = %v, want ErrNotPositiveDefinite", err)
	}

	g := NewGaussianProcess(0)
	if err := g.FitWith(x, y, h); err != nil {
		t.Fatal(err)
	}
	if !(g.Jitter() > 0) || g.Jitter() > 1e-6 {
		t.Errorf("Jitter() = %v, want a small positive jitter", g.Jitter())
	}
	m, s := g.Predict([]float64{0.5})
	if math.Abs(m-1.5) > 1e-3 || math.IsNaN(s) || s < 0 {
		t.Errorf("Predict at the duplicate = %v, %v; want mean 1.5 (the average), a finite std", m, s)
	}
	for _, u := range []float64{0, 0.3, 0.7, 1, 3} {
		m, s := g.Predict([]float64{u})
		if !finite(m) || !finite(s) || s < 0 {
			t.Errorf("Predict(%v) = %v, %v", u, m, s)
		}
	}
	// Fit (searching the hyperparameters) copes too.
	if err := g.Fit(x, y); err != nil {
		t.Fatal(err)
	}
	if m, _ := g.Predict([]float64{0.5}); math.Abs(m-1.5) > 1e-3 {
		t.Errorf("after Fit, mean at the duplicate = %v, want 1.5", m)
	}
}

func TestGPFitErrors(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	ok := Hyperparameters{LengthScale: 0.3, SignalVariance: 1}
	tests := []struct {
		name string
		x    [][]float64
		y    []float64
		h    Hyperparameters
	}{
		{"lengths differ", [][]float64{{0}, {1}}, []float64{1}, ok},
		{"ragged", [][]float64{{0, 0}, {1}}, []float64{1, 2}, ok},
		{"NaN coordinate", [][]float64{{0}, {nan}}, []float64{1, 2}, ok},
		{"infinite coordinate", [][]float64{{inf}}, []float64{1}, ok},
		{"NaN score", [][]float64{{0}}, []float64{nan}, ok},
		{"infinite score", [][]float64{{0}, {1}}, []float64{1, -inf}, ok},
		{"zero length scale", [][]float64{{0}}, []float64{1}, Hyperparameters{0, 1}},
		{"negative signal", [][]float64{{0}}, []float64{1}, Hyperparameters{1, -1}},
		{"NaN length scale", [][]float64{{0}}, []float64{1}, Hyperparameters{nan, 1}},
		{"infinite signal", [][]float64{{0}}, []float64{1}, Hyperparameters{1, inf}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := NewGaussianProcess(0.5)
			if err := g.FitWith([][]float64{{0.2}, {0.4}}, []float64{3, 4}, ok); err != nil {
				t.Fatal(err)
			}
			err := g.FitWith(tc.x, tc.y, tc.h)
			if !errors.Is(err, ErrBadSamples) {
				t.Fatalf("FitWith = %v, want ErrBadSamples", err)
			}
			if g.Len() != 0 {
				t.Errorf("after a failed fit Len() = %d, want 0", g.Len())
			}
			if m, s := g.Predict([]float64{7}); m != 0 || s != 1 {
				t.Errorf("after a failed fit Predict = %v, %v; want the prior 0, 1", m, s)
			}
			if tc.h == ok {
				if err := g.Fit(tc.x, tc.y); !errors.Is(err, ErrBadSamples) {
					t.Errorf("Fit = %v, want ErrBadSamples", err)
				}
			}
		})
	}
}

// naivePosterior computes the posterior of a GP with hyperparameters h and
// noise alpha at q by forming K and solving with Gaussian elimination: the
// reference for Predict and LogMarginalLikelihood.
func naivePosterior(x [][]float64, y []float64, h Hyperparameters, alpha float64, q []float64) (mean, std, lml float64) {
	n := len(x)
	mu, sd := 0.0, 0.0
	for _, v := range y {
		mu += v
	}
	mu /= float64(n)
	for _, v := range y {
		sd += sq(v - mu)
	}
	sd = math.Sqrt(sd / float64(n))
	t := make([]float64, n)
	for i, v := range y {
		t[i] = (v - mu) / sd
	}
	kern := func(a, b []float64) float64 {
		r := 0.0
		for i := range a {
			r += sq(a[i] - b[i])
		}
		return h.SignalVariance * math.Exp(-r/(2*sq(h.LengthScale)))
	}
	k := make([]float64, n*n)
	ks := make([]float64, n)
	for i := range n {
		for j := range n {
			k[i*n+j] = kern(x[i], x[j])
		}
		k[i*n+i] += alpha * alpha
		ks[i] = kern(q, x[i])
	}
	a := naiveSolve(k, n, t)
	w := naiveSolve(k, n, ks)
	m, v, fit := 0.0, h.SignalVariance, 0.0
	for i := range n {
		m += ks[i] * a[i]
		v -= ks[i] * w[i]
		fit += t[i] * a[i]
	}
	// log det K from the pivots of an elimination (K is SPD: no pivoting
	// needed, every pivot positive).
	u := append([]float64(nil), k...)
	logdet := 0.0
	for c := range n {
		logdet += math.Log(u[c*n+c])
		for r := c + 1; r < n; r++ {
			f := u[r*n+c] / u[c*n+c]
			for j := c; j < n; j++ {
				u[r*n+j] -= f * u[c*n+j]
			}
		}
	}
	lml = -0.5*fit - 0.5*logdet - 0.5*float64(n)*math.Log(2*math.Pi)
	return mu + sd*m, sd * math.Sqrt(math.Max(0, v)), lml
}

// TestGPAgainstNaive compares Predict and LogMarginalLikelihood with the
// naive posterior on random data in 1 to 5 dimensions.
func TestGPAgainstNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for trial := range 200 {
		d := 1 + r.IntN(5)
		n := 1 + r.IntN(25)
		x := make([][]float64, n)
		y := make([]float64, n)
		for i := range x {
			x[i] = make([]float64, d)
			for j := range x[i] {
				x[i][j] = r.Float64()
			}
			y[i] = 100 + 10*r.NormFloat64()
		}
		if n == 1 {
			y[0] = 100
		}
		h := Hyperparameters{LengthScale: 0.05 + r.Float64(), SignalVariance: 0.2 + 3*r.Float64()}
		alpha := 0.1 + r.Float64()
		g := NewGaussianProcess(alpha)
		if err := g.FitWith(x, y, h); err != nil {
			t.Fatal(err)
		}
		if g.Jitter() != 0 {
			t.Fatalf("trial %d: jitter %g with noise %g", trial, g.Jitter(), alpha)
		}
		q := make([]float64, d)
		for j := range q {
			q[j] = 1.4*r.Float64() - 0.2
		}
		m, s := g.Predict(q)
		if n == 1 { // the naive reference divides by a zero std
			continue
		}
		wm, ws, wl := naivePosterior(x, y, h, alpha, q)
		if math.Abs(m-wm) > 1e-9*math.Abs(wm) || math.Abs(s-ws) > 1e-9*(1+ws) {
			t.Fatalf("trial %d (n=%d d=%d %+v alpha %.2f): Predict = %v, %v; naive %v, %v", trial, n, d, h, alpha, m, s, wm, ws)
		}
		if l := g.LogMarginalLikelihood(); math.Abs(l-wl) > 1e-9*math.Abs(wl) {
			t.Fatalf("trial %d: LogMarginalLikelihood = %v, naive %v", trial, l, wl)
		}
	}
}

// TestGPFitMaximises checks that the hyperparameters Fit chooses score at
// least as well (log marginal likelihood plus the length scale's log prior)
// as random hyperparameters from the search box, and that they lie in it.
func TestGPFitMaximises(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	for trial := range 20 {
		d := 1 + r.IntN(3)
		n := 3 + r.IntN(15)
		x := make([][]float64, n)
		y := make([]float64, n)
		for i := range x {
			x[i] = make([]float64, d)
			s := 0.0
			for j := range x[i] {
				x[i][j] = r.Float64()
				s += math.Sin(3 * x[i][j])
			}
			y[i] = s + 0.1*r.NormFloat64()
		}
		alpha := 0.05 + 0.8*r.Float64()
		g := NewGaussianProcess(alpha)
		if err := g.Fit(x, y); err != nil {
			t.Fatal(err)
		}
		h := g.Hyperparameters()
		if h.LengthScale < lMin*(1-1e-12) || h.LengthScale > lMax*(1+1e-12) || h.SignalVariance < sfMin*(1-1e-12) || h.SignalVariance > sfMax*(1+1e-12) {
			t.Fatalf("trial %d: %+v outside the search box", trial, h)
		}
		best := g.LogMarginalLikelihood() + logPriorLength(h.LengthScale)
		other := NewGaussianProcess(alpha)
		for range 30 {
			o := Hyperparameters{
				LengthScale:    math.Exp(math.Log(lMin) + r.Float64()*math.Log(lMax/lMin)),
				SignalVariance: math.Exp(math.Log(sfMin) + r.Float64()*math.Log(sfMax/sfMin)),
			}
			if err := other.FitWith(x, y, o); err != nil {
				t.Fatal(err)
			}
			if v := other.LogMarginalLikelihood() + logPriorLength(o.LengthScale); v > best+1e-9 {
				t.Errorf("trial %d: %+v scores %v, above Fit's %+v at %v", trial, o, v, h, best)
			}
		}
	}
}

func TestStandardise(t *testing.T) {
	tests := []struct {
		y           []float64
		mean, scale float64
		t           []float64
	}{
		{nil, 0, 1, nil},
		{[]float64{0, 0}, 0, 1, []float64{0, 0}},
		{[]float64{3}, 3, 3, []float64{0}},
		{[]float64{-4, -4, -4}, -4, 4, []float64{0, 0, 0}},
		{[]float64{1, 3}, 2, 1, []float64{-1, 1}},
		{[]float64{0, 0, 3}, 1, math.Sqrt(2), []float64{-1 / math.Sqrt(2), -1 / math.Sqrt(2), 2 / math.Sqrt(2)}},
		// Near the top of the float64 range: no overflow.
		{[]float64{1e308, -1e308}, 0, 1e308, []float64{1, -1}},
	}
	for _, tc := range tests {
		got := make([]float64, len(tc.y))
		m, s := standardise(tc.y, got)
		if math.Abs(m-tc.mean) > 1e-12*math.Max(1, math.Abs(tc.mean)) || math.Abs(s-tc.scale) > 1e-12*tc.scale {
			t.Errorf("standardise(%v) = mean %v, scale %v; want %v, %v", tc.y, m, s, tc.mean, tc.scale)
		}
		if d, _ := maxAbsDiff(got, tc.t); d > 1e-12 {
			t.Errorf("standardise(%v) t = %v, want %v", tc.y, got, tc.t)
		}
	}
}
