// Package autotune is the pure core of hvdd's autotuner (HOROVOD_AUTOTUNE):
// the Manager, which turns the batches a job runs into samples and scores
// as Horovod's ParameterManager does and walks through configurations of
// the knobs it is given (the defaults, seeds, then the optimiser's
// proposals) to the best; and the optimiser it uses, Bayesian optimisation
// with a Gaussian-process surrogate and expected improvement, which proposes
// the next values to try from the scores measured so far. The daemon
// (daemon/autotune.go) chooses the knobs, passes the time and applies the
// values.
//
// It is Horovod's horovod/common/optim (bayesian_optimization.cc,
// gaussian_process.cc) rewritten, with cheap improvements: inputs are scaled
// to the unit cube before the GP sees them, the kernel's length scale and
// signal variance are fitted by a bounded search of the log marginal
// likelihood, and expected improvement is maximised over many random and
// local candidates with a compass-search refinement that never leaves the
// box. The math is in the block comments of gp.go, bayes.go and linalg.go.
//
// # Using BayesianOptimization
//
// One goroutine (the daemon's loop) owns an optimiser:
//
//	rng := rand.New(rand.NewPCG(seed, 0))
//	bo := autotune.NewBayesianOptimization([]autotune.Bounds{{0, 64}, {1, 100}}, 0.8, rng)
//	x := bo.NextSample() // no samples yet: a random point of the box
//	for i := 0; i < maxSamples; i++ {
//		score := measure(x) // the caller runs the job with x for a while
//		bo.AddSample(x, score)
//		x = bo.NextSample()
//	}
//	best, _, _ := bo.Best()
//
// The caller may add samples it chose itself (Horovod's autotuner starts from
// fixed test points) and may call NextSample any number of times; each call
// refits the model to every sample so far. NextSample takes about a
// millisecond at 20 samples and a few at 40 (see the benchmarks).
//
// # What the package does not do
//
// Neither performs I/O, starts goroutines, reads a clock (the Manager is
// given the time), no environment
// and no global state, and logs nothing. Its only randomness is the
// *rand.Rand the caller passes in, so a run is reproducible from the seed
// and the scores. The caller owns everything around the optimiser: which
// knobs to tune and in which coordinates (a knob that spans decades, like a
// byte threshold, is better searched as its logarithm), when a measurement
// window starts and ends, how a score is computed, warm-up, the number of
// samples, broadcasting the chosen values to other ranks, and what to do
// with the best point once tuning ends. Categorical knobs (hierarchical
// allreduce on or off) are not its business either: Horovod tries each value
// in turn, outside the optimiser.
package autotune
