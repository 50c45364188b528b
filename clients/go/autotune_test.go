package hvdd_test

import (
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/daemon/daemontest"
)

func init() {
	scenarios["tunesteps"] = tuneSteps
}

// tuneSteps runs training-like steps while the daemon autotunes: each step
// allreduces a few named tensors of several sizes asynchronously (some
// crossing the engine's small-message threshold, its segments and its
// streams) and checks every result, so that settings applied at different
// points on different nodes would show as a wrong sum or a hang.
// HVDD_TEST_STEPS sets the number of steps.
func tuneSteps(ctx context.Context, c *hvdd.Client) error {
	steps, _ := strconv.Atoi(os.Getenv("HVDD_TEST_STEPS"))
	sizes := []int{3, 1000, 20000, 70000, 300001}
	n := c.Size()
	for s := 0; s < steps; s++ {
		bufs := make([][]float32, len(sizes))
		hs := make([]*hvdd.Handle, len(sizes))
		for i, m := range sizes {
			bufs[i] = make([]float32, m)
			for k := range bufs[i] {
				bufs[i][k] = float32(c.Rank() + k%7 + s)
			}
			h, err := hvdd.AllreduceAsync(c, bufs[i], hvdd.WithName(fmt.Sprintf("grad.%d", i)), hvdd.WithOp(hvdd.Sum))
			if err != nil {
				return err
			}
			hs[i] = h
		}
		for i, h := range hs {
			if err := h.Wait(ctx); err != nil {
				return fmt.Errorf("step %d, tensor %d: %w", s, i, err)
			}
			for k, v := range bufs[i] {
				// sum over ranks r of (r + k%7 + s)
				if want := float32(n*(n-1)/2 + n*(k%7+s)); v != want {
					return fmt.Errorf("step %d, tensor %d of %d, element %d: %v, want %v", s, i, sizes[i], k, v, want)
				}
			}
		}
	}
	return c.Barrier(ctx)
}

// readTuneLog reads the autotune CSV log: its header and rows.
func readTuneLog(t *testing.T, path string) ([]string, [][]float64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("autotune log: %v", err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil || len(recs) == 0 {
		t.Fatalf("autotune log %s: %v (%d records)", path, err, len(recs))
	}
	var rows [][]float64
	for _, r := range recs[1:] {
		if len(r) != len(recs[0]) {
			t.Fatalf("row %v has %d fields, the header %d", r, len(r), len(recs[0]))
		}
		var row []float64
		for _, f := range r {
			v, err := strconv.ParseFloat(f, 64)
			if err != nil {
				t.Fatalf("row %v: %v", r, err)
			}
			row = append(row, v)
		}
		rows = append(rows, row)
	}
	return recs[0], rows
}

// checkTuneLog checks an autotune log of maxSamples configurations: the
// header, every value in its knob's range, the last row the best of the
// others.
func checkTuneLog(t *testing.T, path string, wantHeader []string, maxSamples int) (best []float64) {
	t.Helper()
	header, rows := readTuneLog(t, path)
	if !slices.Equal(header, wantHeader) {
		t.Fatalf("header %v, want %v", header, wantHeader)
	}
	if len(rows) != maxSamples+1 {
		t.Fatalf("%d rows, want %d scored configurations and the best", len(rows), maxSamples)
	}
	ranges := map[string][2]float64{
		daemon.KnobFusion: {1.0 / 16, 256}, daemon.KnobCycle: {0, 20}, daemon.KnobSpin: {0, 500},
		daemon.KnobStreams: {1, 8}, daemon.KnobChunk: {16, 16 << 10}, daemon.KnobSmall: {1, 4 << 10},
	}
	bestAt := 0
	for i, r := range rows {
		for k, name := range header[:len(header)-1] {
			if rg := ranges[name]; r[k] < rg[0] || r[k] > rg[1] {
				t.Errorf("row %d: %s = %v outside %v", i, name, r[k], rg)
			}
		}
		if score := r[len(r)-1]; !(score > 0) {
			t.Errorf("row %d: score %v, want a positive bytes/µs", i, score)
		}
		if i < maxSamples && r[len(r)-1] > rows[bestAt][len(r)-1] {
			bestAt = i
		}
	}
	if last := rows[maxSamples]; !slices.Equal(last, rows[bestAt]) {
		t.Errorf("last row %v is not the best scored configuration %v", last, rows[bestAt])
	}
	return rows[maxSamples]
}

// TestAutotuneOneNode tunes a job of 2 ranks on one node: the log names
// the one-node knobs (no engine), scores each configuration, and ends with
// the best; the daemon says it is done; every step's results are right
// throughout.
func TestAutotuneOneNode(t *testing.T) {
	log := filepath.Join(t.TempDir(), "autotune.csv")
	const samples = 6
	s := daemontest.Start(t, daemon.Config{Slots: 2, Autotune: daemon.AutotuneConfig{
		Enabled: true, LogFile: log, WarmupSamples: 1, StepsPerSample: 1, MaxSamples: samples,
	}})
	// 6 warm-up steps, 6 configurations of ~5 steps, then steps at the best.
	for _, w := range daemontest.Spawn(t, s.Socket, "tunesteps", 2, "HVDD_TEST_SIZE=2", "HVDD_TEST_STEPS=60") {
		if err := w.Wait(120 * time.Second); err != nil {
			t.Fatalf("rank %d: %v\n%s", w.Rank, err, w.Output())
		}
	}
	s.WaitLog(t, "autotune: done", 10*time.Second)
	checkTuneLog(t, log, []string{daemon.KnobFusion, daemon.KnobCycle, daemon.KnobSpin, "score"}, samples)
}

// TestAutotuneFixedKnobs holds the knobs the user set: they are not in the
// log, and the daemon keeps their values.
func TestAutotuneFixedKnobs(t *testing.T) {
	log := filepath.Join(t.TempDir(), "autotune.csv")
	cfg := daemon.Config{Slots: 2, CycleTime: time.Millisecond, Autotune: daemon.AutotuneConfig{
		Enabled: true, LogFile: log, WarmupSamples: -1, StepsPerSample: 1, MaxSamples: 3,
	}}
	if err := cfg.ApplyHorovodEnv(func(k string) string {
		return map[string]string{"HOROVOD_FUSION_THRESHOLD": "1048576", "HOROVOD_CYCLE_TIME": "1"}[k]
	}); err != nil {
		t.Fatal(err)
	}
	s := daemontest.Start(t, cfg)
	for _, w := range daemontest.Spawn(t, s.Socket, "tunesteps", 2, "HVDD_TEST_SIZE=2", "HVDD_TEST_STEPS=30") {
		if err := w.Wait(120 * time.Second); err != nil {
			t.Fatalf("rank %d: %v\n%s", w.Rank, err, w.Output())
		}
	}
	s.WaitLog(t, "autotune: done", 10*time.Second)
	checkTuneLog(t, log, []string{daemon.KnobSpin, "score"}, 3)
	if !strings.Contains(s.Logs(), "fusion_threshold=1048576 cycle_time=1ms") {
		t.Errorf("the done line does not keep the fixed fusion threshold and cycle time:\n%s", s.Logs())
	}
}

// TestAutotuneMultiNode tunes a job of 2 nodes x 1 rank over the tcp
// engine: the engine's streams, segment and threshold are tuned too, the
// coordinator's plans carry each configuration to node 1, which applies it
// between the same collectives (the checked sums stay right), and node 1
// logs the best settings it applied.
func TestAutotuneMultiNode(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node")
	}
	log := filepath.Join(t.TempDir(), "autotune.csv")
	const samples = 6
	ss := startNodesCfg(t, func(n int, c *daemon.Config) {
		c.Autotune = daemon.AutotuneConfig{Enabled: true, LogFile: log, WarmupSamples: -1, StepsPerSample: 1, MaxSamples: samples}
	}, 1, 1)
	for _, node := range spawnNodesEnv(t, ss, "tunesteps", []string{"HVDD_TEST_STEPS=50"}, 1, 1) {
		for _, w := range node {
			if err := w.Wait(120 * time.Second); err != nil {
				t.Fatalf("rank %d: %v\n%s", w.Rank, err, w.Output())
			}
		}
	}
	ss[0].WaitLog(t, "autotune: done", 10*time.Second)
	ss[1].WaitLog(t, "autotune: the coordinator's best settings applied", 10*time.Second)
	header := []string{daemon.KnobFusion, daemon.KnobCycle, daemon.KnobSpin, daemon.KnobStreams, daemon.KnobChunk, daemon.KnobSmall, "score"}
	best := checkTuneLog(t, log, header, samples)
	want := fmt.Sprintf("streams=%d chunk_bytes=%d small_bytes=%d", int(best[3]), int(best[4])<<10, int(best[5])<<10)
	if !strings.Contains(ss[1].Logs(), want) {
		t.Errorf("node 1 did not apply the best engine settings %q:\n%s", want, ss[1].Logs())
	}
	if strings.Contains(ss[1].Logs(), "autotune: tuning") {
		t.Errorf("node 1 tuned too; only the coordinator tunes:\n%s", ss[1].Logs())
	}
}

// TestAutotuneFromRankZero: a daemon started without --autotune tunes a
// job whose rank 0 has HOROVOD_AUTOTUNE=1 in its environment (as under
// mpirun with a node's service daemon), with its HOROVOD_AUTOTUNE_*
// details; the next job, without the variables, is not tuned.
func TestAutotuneFromRankZero(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "tune.csv")
	s := daemontest.Start(t, daemon.Config{Slots: 2})
	env := []string{"HVDD_TEST_SIZE=2", "HVDD_TEST_STEPS=30", "HOROVOD_AUTOTUNE=1", "HOROVOD_AUTOTUNE_LOG=" + log,
		"HOROVOD_AUTOTUNE_WARMUP_SAMPLES=0", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE=1", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=3"}
	for _, w := range daemontest.Spawn(t, s.Socket, "tunesteps", 2, env...) {
		if err := w.Wait(120 * time.Second); err != nil {
			t.Fatalf("rank %d: %v\n%s", w.Rank, err, w.Output())
		}
	}
	s.WaitLog(t, "autotune: done", 10*time.Second)
	checkTuneLog(t, log, []string{daemon.KnobFusion, daemon.KnobCycle, daemon.KnobSpin, "score"}, 3)
	for _, w := range daemontest.Spawn(t, s.Socket, "tunesteps", 2, "HVDD_TEST_SIZE=2", "HVDD_TEST_STEPS=3") {
		if err := w.Wait(120 * time.Second); err != nil {
			t.Fatalf("second job, rank %d: %v\n%s", w.Rank, err, w.Output())
		}
	}
	s.WaitLog(t, "job=2", 10*time.Second)
	if n := strings.Count(s.Logs(), "autotune: tuning"); n != 1 {
		t.Errorf("%d jobs tuned, want only the first:\n%s", n, s.Logs())
	}
}
