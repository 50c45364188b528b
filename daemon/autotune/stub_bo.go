package autotune

import "math/rand/v2"

// Temporary stand-in until the Bayesian optimiser lands (branch autotune-bo).

// Bounds is one dimension's closed interval [Lo, Hi].
type Bounds struct{ Lo, Hi float64 }

// BayesianOptimization is a stand-in.
type BayesianOptimization struct {
	b   []Bounds
	rng *rand.Rand
}

// NewBayesianOptimization is a stand-in.
func NewBayesianOptimization(bounds []Bounds, noise float64, rng *rand.Rand) *BayesianOptimization {
	return &BayesianOptimization{b: bounds, rng: rng}
}

// AddSample is a stand-in.
func (b *BayesianOptimization) AddSample(x []float64, y float64) {}

// NextSample is a stand-in.
func (b *BayesianOptimization) NextSample() []float64 {
	x := make([]float64, len(b.b))
	for i, d := range b.b {
		x[i] = d.Lo + b.rng.Float64()*(d.Hi-d.Lo)
	}
	return x
}
