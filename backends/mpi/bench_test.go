//go:build mpi

package mpi

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/hvdd/hvdd/tensor"
)

// benchEnv marks the ranks that BenchmarkAllreduce starts.
const benchEnv = "HVDD_MPI_BENCH"

// benchBytes is the fused buffer BenchmarkAllreduce reduces: 64 MiB of float32.
const benchBytes = 64 << 20

// TestMPIBenchChild is the per-rank half of BenchmarkAllreduce; it only
// runs under mpirun with HVDD_MPI_BENCH set. The timing matches
// testdata/allreduce_raw.c: 2 warm-up calls, then 5 timed loops of 5
// in-place allreduces, each loop's time the maximum over ranks, the
// median reported.
func TestMPIBenchChild(t *testing.T) {
	if !underMPI() || os.Getenv(benchEnv) == "" {
		t.Skip("run by BenchmarkAllreduce under mpirun")
	}
	b, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	buf := make([]byte, benchBytes)
	for i := 0; i < len(buf); i += 4 {
		le.PutUint32(buf[i:], math.Float32bits(0.5))
	}
	const warm, reps, iters = 2, 5, 5
	for range warm {
		if err := b.Allreduce(ctx, buf, tensor.Float32, tensor.Sum); err != nil {
			t.Fatal(err)
		}
	}
	times := make([]float64, reps)
	for r := range times {
		if err := b.Barrier(ctx); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for range iters {
			if err := b.Allreduce(ctx, buf, tensor.Float32, tensor.Sum); err != nil {
				t.Fatal(err)
			}
		}
		dt := make([]byte, 8)
		le.PutUint64(dt, math.Float64bits(time.Since(start).Seconds()/iters))
		if err := b.Allreduce(ctx, dt, tensor.Float64, tensor.Max); err != nil {
			t.Fatal(err)
		}
		times[r] = math.Float64frombits(le.Uint64(dt))
	}
	slices.Sort(times)
	med := times[reps/2]
	alg := benchBytes / med / 1e9
	n := b.Size()
	if b.Rank() == 0 {
		fmt.Printf("hvdd-mpi-bench impl=hvdd bytes=%d us=%.1f algbw=%.3f busbw=%.3f\n", benchBytes, med*1e6, alg, alg*2*float64(n-1)/float64(n))
	}
	b.Close()
	Finalize()
}

var benchLine = regexp.MustCompile(`hvdd-mpi-bench impl=(\w+) bytes=\d+ us=([\d.]+) algbw=[\d.]+ busbw=([\d.]+)`)

// BenchmarkAllreduce reduces a 64 MiB float32 buffer on 2 ranks under
// mpirun, over Open MPI's shared-memory transport and over TCP, with the
// mpi backend and with raw MPI_Allreduce (testdata/allreduce_raw.c, built
// with mpicc), and reports the bus bandwidth (nccl-tests' busbw: algbw *
// 2(n-1)/n) of each. One mpirun per sub-benchmark: its ns/op is the whole
// launch; read the GB/s metrics.
func BenchmarkAllreduce(b *testing.B) {
	if underMPI() {
		b.Skip("the ranks run TestMPIBenchChild")
	}
	raw := ""
	if mpicc, err := exec.LookPath("mpicc"); err == nil {
		raw = filepath.Join(b.TempDir(), "allreduce_raw")
		if out, err := exec.Command(mpicc, "-O2", "-o", raw, "testdata/allreduce_raw.c").CombinedOutput(); err != nil {
			b.Logf("mpicc failed, no raw comparison: %v\n%s", err, out)
			raw = ""
		}
	}
	transports := []struct {
		name string
		args []string
	}{
		{"shm", nil},
		{"tcp", []string{"--mca", "btl", "tcp,self"}},
	}
	for _, tr := range transports {
		for _, impl := range []string{"hvdd", "raw"} {
			b.Run(tr.name+"/"+impl, func(b *testing.B) {
				j := job{np: 2, mpiArgs: tr.args, env: []string{benchEnv + "=1"}, run: "TestMPIBenchChild", timeout: 120 * time.Second}
				if impl == "raw" {
					if raw == "" {
						b.Skip("no mpicc")
					}
					j.program = []string{raw, strconv.Itoa(benchBytes)}
				}
				for b.Loop() {
					out := mpirun(b, j)
					m := benchLine.FindStringSubmatch(out)
					if m == nil {
						b.Fatalf("no result line in:\n%s", out)
					}
					us, _ := strconv.ParseFloat(m[2], 64)
					bus, _ := strconv.ParseFloat(m[3], 64)
					b.ReportMetric(bus, "busbw_GB/s")
					b.ReportMetric(us, "us/allreduce")
					b.Logf("%s", m[0])
				}
			})
		}
	}
}
