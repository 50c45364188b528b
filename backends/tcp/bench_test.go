package tcp

import (
	"context"
	"fmt"
	"testing"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/tensor"
)

// BenchmarkAllreduce measures float32 allreduce over loopback with every
// rank in this process. SetBytes makes the MB/s column the algorithm
// bandwidth; busbw (nccl-tests' bus bandwidth, algbw*2(n-1)/n) is reported
// beside it in GB/s.
func BenchmarkAllreduce(b *testing.B) {
	for _, n := range []int{2} {
		for _, size := range []int{4, 64 << 10, 1 << 20, 64 << 20} {
			b.Run(fmt.Sprintf("n=%d/%s", n, sizeName(size)), func(b *testing.B) {
				benchAllreduce(b, n, size, nil)
			})
		}
	}
}

func benchAllreduce(b *testing.B, n, size int, tweak func(*Config)) {
	g := group(b, n, tweak)
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	ctx := context.Background()
	b.SetBytes(int64(size))
	b.ReportAllocs()
	errc := make(chan error, n)
	b.ResetTimer()
	for r := 1; r < n; r++ {
		go func() {
			for range b.N {
				if err := g[r].Allreduce(ctx, bufs[r], tensor.Float32, tensor.Sum); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	for range b.N {
		if err := g[0].Allreduce(ctx, bufs[0], tensor.Float32, tensor.Sum); err != nil {
			b.Fatal(err)
		}
	}
	for r := 1; r < n; r++ {
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	sec := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(float64(size)/sec*2*float64(n-1)/float64(n)/1e9, "busbw-GB/s")
	b.ReportMetric(sec*1e6, "µs/op")
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

// BenchmarkAllreduceSettings sweeps the channel count and the pipeline
// segment at a memory-bound size (2 ranks, 64 MiB), for choosing defaults.
func BenchmarkAllreduceSettings(b *testing.B) {
	for _, streams := range []int{1, 2, 4} {
		for _, chunk := range []int{256 << 10, 1 << 20} {
			b.Run(fmt.Sprintf("64MiB/streams=%d/chunk=%s", streams, sizeName(chunk)), func(b *testing.B) {
				benchAllreduce(b, 2, 64<<20, func(c *Config) { c.Streams, c.ChunkBytes = streams, chunk })
			})
		}
	}
}

// BenchmarkAllreduceCompressed measures float32 allreduce over loopback with
// each wire compression (2 ranks, this process). Loopback is no bottleneck,
// so this shows the CPU cost of converting, not the gain on a slow link
// (bench/wirecomp.sh measures that across namespaces).
func BenchmarkAllreduceCompressed(b *testing.B) {
	for _, c := range []backends.Compression{backends.CompressNone, backends.CompressFP16, backends.CompressBF16} {
		for _, size := range []int{64 << 10, 64 << 20} {
			b.Run(fmt.Sprintf("%v/%s", c, sizeName(size)), func(b *testing.B) {
				benchAllreduce(b, 2, size, func(cfg *Config) { cfg.Compression = c })
			})
		}
	}
}
