package autotune

import (
	"fmt"
	"math"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"
)

// cpuTime returns the process's user + system CPU time. The benchmarks
// report it per op (cpu-ns/op) next to ns/op, which is wall time and grows
// when the machine is shared.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchCPU runs f b.N times (b.Loop) and reports CPU time per op.
func benchCPU(b *testing.B, f func()) {
	b.ReportAllocs()
	c0, n := cpuTime(b), 0
	for b.Loop() {
		f()
		n++
	}
	b.ReportMetric(float64(cpuTime(b)-c0)/float64(n), "cpu-ns/op")
}

// BenchmarkNextSample measures one NextSample (a GP fit with the
// hyperparameter search, then the EI search) with n samples of a smooth
// function in d dimensions: the cost the daemon's loop pays once per
// autotuning sample.
func BenchmarkNextSample(b *testing.B) {
	for _, d := range []int{2, 5} {
		for _, n := range []int{5, 20, 40} {
			b.Run(fmt.Sprintf("d=%d/n=%d", d, n), func(b *testing.B) {
				bounds := make([]Bounds, d)
				for i := range bounds {
					bounds[i] = Bounds{0, 100}
				}
				r := rand.New(rand.NewPCG(1, 1))
				bo := NewBayesianOptimization(bounds, 0.8, r)
				for range n {
					x := make([]float64, d)
					s := 0.0
					for i := range x {
						x[i] = 100 * r.Float64()
						s -= math.Abs(x[i]-30) / 100
					}
					bo.AddSample(x, s+0.05*r.NormFloat64())
				}
				benchCPU(b, func() { bo.NextSample() })
			})
		}
	}
}

// BenchmarkGPFit measures the GP fit alone (hyperparameter search and the
// final factorisation) at n samples in 5 dimensions.
func BenchmarkGPFit(b *testing.B) {
	for _, n := range []int{5, 20, 40} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(2, 2))
			x := make([][]float64, n)
			y := make([]float64, n)
			for i := range x {
				x[i] = make([]float64, 5)
				for j := range x[i] {
					x[i][j] = r.Float64()
					y[i] += math.Sin(3 * x[i][j])
				}
			}
			g := NewGaussianProcess(0.8)
			benchCPU(b, func() {
				if err := g.Fit(x, y); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}
