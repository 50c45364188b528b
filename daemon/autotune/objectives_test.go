package autotune

import (
	"math"
	"math/rand/v2"
)

// objective is a known function to maximise in a box, measured with
// Gaussian noise.
type objective struct {
	name   string
	bounds []Bounds
	f      func(x []float64) float64 // noise-free
	max    float64                   // max of f over the box
	argmax []float64
	noise  float64 // standard deviation of a measurement's noise
}

// objectives are the test functions: a bowl with its maximum inside the box
// (1-D and 2-D, the 2-D one on Horovod's fusion-threshold x cycle-time box),
// a maximum on the boundary (1-D) and in a corner (2-D), and a ridge along
// x = y in log10 coordinates: a function of log x and log y over
// [1, 1000]^2 (a fusion threshold's throughput curve looks like this),
// searched as the package doc advises, in the logarithms.
var objectives = []objective{
	{
		name:   "bowl-1d",
		bounds: []Bounds{{-2, 3}},
		f:      func(x []float64) float64 { return -sq(x[0] - 0.7) },
		argmax: []float64{0.7},
		noise:  0.02,
	},
	{
		name:   "bowl-2d",
		bounds: []Bounds{{0, 64}, {1, 100}},
		f: func(x []float64) float64 {
			return -sq((x[0]-20)/64) - sq((x[1]-35)/100)
		},
		argmax: []float64{20, 35},
		noise:  0.02,
	},
	{
		name:   "edge-1d",
		bounds: []Bounds{{0, 1}},
		f:      func(x []float64) float64 { return -sq(x[0] - 1.3) },
		max:    -0.09,
		argmax: []float64{1},
		noise:  0.01,
	},
	{
		name:   "corner-2d",
		bounds: []Bounds{{0, 1}, {0, 1}},
		f:      func(x []float64) float64 { return -sq(x[0]-1.3) - sq(x[1]+0.2) },
		max:    -0.13,
		argmax: []float64{1, 0},
		noise:  0.01,
	},
	{
		name:   "log-ridge-2d",
		bounds: []Bounds{{0, 3}, {0, 3}},
		f: func(x []float64) float64 {
			return -sq(x[0]-x[1]) - 0.1*sq(x[0]-2)
		},
		argmax: []float64{2, 2},
		noise:  0.05,
	},
}

func sq(v float64) float64 { return v * v }

// runBO maximises o with n measurements, starting from no samples, and
// returns the true value f(x) of the sampled point with the highest
// measured score (what an autotuner would keep) and the best true value of
// any sampled point.
func runBO(o objective, seed uint64, n int, gpNoise float64) (kept, best float64) {
	r := rand.New(rand.NewPCG(seed, 2))
	noise := rand.New(rand.NewPCG(seed, 3))
	bo := NewBayesianOptimization(o.bounds, gpNoise, r)
	best = math.Inf(-1)
	for range n {
		x := bo.NextSample()
		v := o.f(x)
		best = math.Max(best, v)
		bo.AddSample(x, v+o.noise*noise.NormFloat64())
	}
	xb, _, _ := bo.Best()
	return o.f(xb), best
}

// runRandom is runBO's baseline: n uniform random points.
func runRandom(o objective, seed uint64, n int) (kept, best float64) {
	r := rand.New(rand.NewPCG(seed, 4))
	noise := rand.New(rand.NewPCG(seed, 3))
	kept, best = math.Inf(-1), math.Inf(-1)
	keptScore := math.Inf(-1)
	x := make([]float64, len(o.bounds))
	for range n {
		for i, b := range o.bounds {
			x[i] = b.Lo + r.Float64()*(b.Hi-b.Lo)
		}
		v := o.f(x)
		best = math.Max(best, v)
		if s := v + o.noise*noise.NormFloat64(); s > keptScore {
			keptScore, kept = s, v
		}
	}
	return kept, best
}
