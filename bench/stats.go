package bench

import (
	"math"
	"slices"
	"time"

	"github.com/hvdd/hvdd/tensor"
)

// Stats summarises a set of per-iteration times.
type Stats struct {
	Median, Min, Max time.Duration
	N                int
}

// Summarize returns the median (the mean of the two middle values for an
// even count), minimum and maximum of ts. It does not modify ts.
func Summarize(ts []time.Duration) Stats {
	if len(ts) == 0 {
		return Stats{}
	}
	s := slices.Clone(ts)
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Stats{Median: med, Min: s[0], Max: s[n-1], N: n}
}

// BusFactor is nccl-tests' ratio busbw/algbw for op on n ranks: 2(n-1)/n for
// allreduce, (n-1)/n for allgather, reducescatter and alltoall, 1 for
// broadcast (and for anything on one rank's worth of definitions).
func BusFactor(op tensor.OpType, n int) float64 {
	if n < 1 {
		return 0
	}
	f := float64(n-1) / float64(n)
	switch op {
	case tensor.Allreduce:
		return 2 * f
	case tensor.Allgather, tensor.Reducescatter, tensor.Alltoall:
		return f
	}
	return 1
}

// AlgBW is bytes/t in GB/s (1e9 bytes per second); 0 for a zero time.
func AlgBW(bytes int64, t time.Duration) float64 {
	if t <= 0 {
		return 0
	}
	return float64(bytes) / t.Seconds() / 1e9
}

// Divisor is the element count every size of op must be a multiple of on n
// ranks: n for the ops that split the buffer across ranks, else 1.
func Divisor(op tensor.OpType, n int) int64 {
	switch op {
	case tensor.Allgather, tensor.Alltoall, tensor.Reducescatter:
		return int64(max(n, 1))
	}
	return 1
}

// Sizes lists the sizes in bytes of a sweep from minB to maxB, multiplying by
// factor each step as nccl-tests -f does. Each size is rounded down to whole
// elements of elemSize bytes, a multiple of div elements (at least div);
// repeated sizes after rounding are dropped.
func Sizes(minB, maxB int64, factor float64, elemSize int, div int64) []int64 {
	unit := int64(elemSize) * max(div, 1)
	var out []int64
	for s := float64(minB); s <= float64(maxB)*(1+1e-12); s *= factor {
		b := int64(math.Round(s)) / unit * unit
		b = max(b, unit)
		if len(out) == 0 || out[len(out)-1] != b {
			out = append(out, b)
		}
		if factor <= 1 {
			break
		}
	}
	return out
}

// IterationsFor returns how many timed iterations to run for a size of bytes:
// iters, raised for sizes <= SmallBytes to at least small and to as many as
// fit minTime at est per iteration, capped at 1,000,000.
func IterationsFor(bytes int64, iters, small int, minTime, est time.Duration) int {
	if bytes > SmallBytes {
		return iters
	}
	n := max(iters, small)
	if est > 0 && minTime > 0 {
		n = max(n, int(math.Ceil(float64(minTime)/float64(est))))
	}
	return min(n, 1_000_000)
}
