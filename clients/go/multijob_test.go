package hvdd_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/daemon/daemontest"
)

func init() {
	scenarios["steady"] = steadyWork
	scenarios["mismatchstall"] = mismatchAndStall
	scenarios["dies"] = dieMidJob
}

// steadyWork is a checked workload that runs until the file
// $HVDD_TEST_STOP exists (rank 0 looks, and tells the others in each
// step's broadcast), at least $HVDD_TEST_STEPS steps: allreduce, allgather
// and broadcast, every result checked. It prints the steps it ran.
func steadyWork(ctx context.Context, c *hvdd.Client) error {
	minSteps, _ := strconv.Atoi(os.Getenv("HVDD_TEST_STEPS"))
	stop := os.Getenv("HVDD_TEST_STOP")
	n, r := c.Size(), c.Rank()
	step := 0
	for ; ; step++ {
		x := make([]float32, 5000)
		for i := range x {
			x[i] = float32(r + i%11 + step)
		}
		if err := hvdd.Allreduce(ctx, c, x, hvdd.WithName("w"), hvdd.WithOp(hvdd.Sum)); err != nil {
			return fmt.Errorf("step %d: allreduce: %w", step, err)
		}
		for i, v := range x {
			if want := float32(n*(n-1)/2 + n*(i%11+step)); v != want {
				return fmt.Errorf("step %d: allreduce[%d] = %v, want %v", step, i, v, want)
			}
		}
		g, err := hvdd.Allgather(ctx, c, []int32{int32(r), int32(step)}, hvdd.WithName("g"))
		if err != nil {
			return fmt.Errorf("step %d: allgather: %w", step, err)
		}
		for k := 0; k < n; k++ {
			if g[2*k] != int32(k) || g[2*k+1] != int32(step) {
				return fmt.Errorf("step %d: allgather = %v", step, g)
			}
		}
		done := []int32{0}
		if r == 0 && step+1 >= minSteps {
			if _, err := os.Stat(stop); err == nil {
				done[0] = 1
			}
		}
		if err := hvdd.Broadcast(ctx, c, done, 0, hvdd.WithName("stop")); err != nil {
			return fmt.Errorf("step %d: broadcast: %w", step, err)
		}
		if done[0] == 1 {
			break
		}
	}
	fmt.Printf("steady: %d steps\n", step+1)
	return c.Barrier(ctx)
}

// mismatchAndStall disagrees with the other rank about a tensor's shape
// (both get the mismatch, and the job goes on), then stalls: rank 0 submits
// a tensor rank 1 never does, and the daemon's stall shutdown fails the job.
func mismatchAndStall(ctx context.Context, c *hvdd.Client) error {
	x := make([]float32, 4+c.Rank())
	err := hvdd.Allreduce(ctx, c, x, hvdd.WithName("m"))
	if !errors.Is(err, hvdd.ErrMismatch) {
		return fmt.Errorf("shapes 4 and 5: %v, want a mismatch", err)
	}
	if err := hvdd.Allreduce(ctx, c, []float32{1}, hvdd.WithName("after"), hvdd.WithOp(hvdd.Sum)); err != nil {
		return fmt.Errorf("after the mismatch: %w", err)
	}
	if c.Rank() == 0 {
		err = hvdd.Allreduce(ctx, c, []float32{1}, hvdd.WithName("lonely"))
	} else {
		err = c.Barrier(ctx) // never met: rank 0 is in "lonely"
	}
	if !errors.Is(err, hvdd.ErrAborted) || !strings.Contains(err.Error(), "stall") {
		return fmt.Errorf("rank %d: %v, want the stall shutdown", c.Rank(), err)
	}
	fmt.Println("mismatchstall: ok")
	return nil
}

// dieMidJob: rank 1 exits without shutdown while rank 0 waits in an
// allreduce, which fails naming the lost rank.
func dieMidJob(ctx context.Context, c *hvdd.Client) error {
	if c.Rank() == 1 {
		os.Exit(3)
	}
	err := hvdd.Allreduce(ctx, c, []float32{1}, hvdd.WithName("x"))
	if !errors.Is(err, hvdd.ErrAborted) || !strings.Contains(err.Error(), "rank 1") {
		return fmt.Errorf("%v, want the abort naming rank 1", err)
	}
	fmt.Println("dies: ok")
	return nil
}

// TestJobsIsolated runs two jobs of different uids on one daemon at once:
// job "steady" (this test's uid) runs a checked workload while the other
// uid's jobs mismatch, stall (failed by the daemon's stall shutdown) and
// lose a rank; "steady" runs on unharmed and completes. A process of the
// other uid cannot join "steady".
func TestJobsIsolated(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run processes of another uid")
	}
	const nobody = 65534
	s := daemontest.Start(t, daemon.Config{Slots: 4, AllowGIDs: []uint32{nobody},
		StallCheck: 300 * time.Millisecond, StallShutdown: time.Second})
	s.OpenSocket(t)
	stop := filepath.Join(t.TempDir(), "stop")
	steady := daemontest.Spawn(t, s.Socket, "steady", 2, "HVDD_JOB=steady", "HVDD_LOCAL_SIZE=2",
		"HVDD_TEST_STEPS=20", "HVDD_TEST_STOP="+stop)
	s.WaitLog(t, `msg="job formed" job=1`, 30*time.Second)
	other := daemontest.AsUID(t, nobody, nobody)
	for _, job := range []struct{ scenario, want string }{
		{"mismatchstall", "mismatchstall: ok"},
		{"dies", "dies: ok"},
	} {
		ws := daemontest.SpawnWith(t, s.Socket, job.scenario, 2, other, "HVDD_JOB="+job.scenario, "HVDD_LOCAL_SIZE=2")
		if err := ws[0].Wait(60 * time.Second); err != nil || !strings.Contains(ws[0].Output(), job.want) {
			t.Fatalf("%s: rank 0: %v\n%s", job.scenario, err, ws[0].Output())
		}
		ws[1].Wait(60 * time.Second)
	}
	// Another uid's process cannot join the running job.
	intruder := daemontest.SpawnWith(t, s.Socket, "collectives", 1, other, "HVDD_JOB=steady", "HVDD_LOCAL_SIZE=2")
	if err := intruder[0].Wait(60 * time.Second); err == nil || !strings.Contains(intruder[0].Output(), `job "steady" belongs to uid 0; a process of uid 65534 cannot join it`) {
		t.Errorf("intruder: %v\n%s", err, intruder[0].Output())
	}
	// The steady job ran through all of it.
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, w := range steady {
		if err := w.Wait(60 * time.Second); err != nil || !strings.Contains(w.Output(), "steady: ") {
			t.Fatalf("steady rank %d: %v\n%s", w.Rank, err, w.Output())
		}
	}
	logs := s.Logs()
	for _, want := range []string{`msg="job failed" job=2`, "stalled", `msg="job failed" job=3`, "rank 1 (pid"} {
		if !strings.Contains(logs, want) {
			t.Errorf("daemon log lacks %q", want)
		}
	}
	if strings.Contains(logs, `msg="job failed" job=1`) {
		t.Errorf("the steady job failed:\n%s", logs)
	}
}

// TestPermissionDeniedSays: a process whose user may not open the daemon's
// socket is told at once that it lacks the permission and what to do, not
// that no daemon runs.
func TestPermissionDeniedSays(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a process of another uid")
	}
	s := daemontest.Start(t, daemon.Config{Slots: 1})
	s.OpenSocket(t)
	if err := os.Chmod(s.Socket, 0o600); err != nil {
		t.Fatal(err)
	}
	w := daemontest.SpawnWith(t, s.Socket, "collectives", 1, daemontest.AsUID(t, 65534, 65534))[0]
	if err := w.Wait(60 * time.Second); err == nil || !strings.Contains(w.Output(), "permission denied on the daemon's socket") ||
		!strings.Contains(w.Output(), "usermod -aG hvdd") {
		t.Fatalf("a process that may not open the socket: %v\n%s", err, w.Output())
	}
}
