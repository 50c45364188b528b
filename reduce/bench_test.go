package reduce

import (
	"fmt"
	"testing"

	"github.com/hvdd/hvdd/tensor"
)

// BenchmarkReduce measures the daemon's fused case, dsts = srcs = {a, b}
// (read a and b once, write the result to both), with SetBytes set to one
// buffer so MB/s reads as tensor bytes reduced per second. Memory traffic is
// four times that figure.
func BenchmarkReduce(b *testing.B) {
	type bench struct {
		dt   tensor.DType
		op   tensor.ReduceOp
		k    int
		post float64
	}
	cases := []bench{
		{tensor.Float32, tensor.Sum, 2, 1},
		{tensor.Float32, tensor.Sum, 2, 0.5}, // Average of two ranks
		{tensor.Float32, tensor.Max, 2, 1},
		{tensor.Float32, tensor.Sum, 4, 1},
		{tensor.Float64, tensor.Sum, 2, 1},
		{tensor.Float16, tensor.Sum, 2, 1},
		{tensor.BFloat16, tensor.Sum, 2, 1},
		{tensor.Int64, tensor.Sum, 2, 1},
	}
	for _, c := range cases {
		for _, size := range []int{4 << 10, 1 << 20, 64 << 20} {
			for _, workers := range []int{1, 2} {
				if size < defaultParallelMin && workers > 1 {
					continue // below ParallelMin a second worker is never used
				}
				name := fmt.Sprintf("%v/%v/k=%d/%s/w=%d", c.dt, c.op, c.k, sizeName(size), workers)
				if c.post != 1 {
					name = fmt.Sprintf("%v/Average/k=%d/%s/w=%d", c.dt, c.k, sizeName(size), workers)
				}
				b.Run(name, func(b *testing.B) {
					bufs := make([][]byte, c.k)
					for i := range bufs {
						// Write every page first: untouched pages would read
						// as the shared zero page and fault on first write.
						bufs[i] = make([]byte, size)
						if err := Fill(bufs[i], c.dt, tensor.Product); err != nil {
							b.Fatal(err)
						}
					}
					opts := &Options{Workers: workers}
					b.SetBytes(int64(size))
					b.ReportAllocs()
					for b.Loop() {
						if err := Reduce(bufs, bufs, c.dt, c.op, 1, c.post, opts); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}

// BenchmarkCopy is the yardstick: copy of one buffer into another (read 1,
// write 1; the fused reduction moves twice that).
func BenchmarkCopy(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20, 64 << 20} {
		b.Run(sizeName(size), func(b *testing.B) {
			src, dst := make([]byte, size), make([]byte, size)
			for i := range src {
				src[i], dst[i] = 1, 2
			}
			b.SetBytes(int64(size))
			for b.Loop() {
				copy(dst, src)
			}
		})
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// BenchmarkAdasum: Horovod's Adasum tree over k rank buffers of float32,
// beside BenchmarkReduce's Sum of the same buffers (the bytes are one
// buffer's, as there).
func BenchmarkAdasum(b *testing.B) {
	for _, k := range []int{2, 4} {
		for _, size := range []int{1 << 20, 16 << 20} {
			for _, workers := range []int{1, 2} {
				b.Run(fmt.Sprintf("Float32/k=%d/%s/w=%d", k, sizeName(size), workers), func(b *testing.B) {
					bufs := make([][]byte, k)
					for i := range bufs {
						bufs[i] = make([]byte, size)
						if err := Fill(bufs[i], tensor.Float32, tensor.Product); err != nil {
							b.Fatal(err)
						}
					}
					opts := &Options{Workers: workers}
					b.SetBytes(int64(size))
					b.ReportAllocs()
					for b.Loop() {
						if err := Adasum(bufs, tensor.Float32, 1, 1, opts); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
