//go:build mpi

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
)

// TestMPIBackend starts two daemons as the ranks of a real mpirun (--backend
// mpi, node rank and count from MPI) and runs a client on each: the allreduce
// crosses the MPI engine.
func TestMPIBackend(t *testing.T) {
	dir := t.TempDir()
	bin := buildMPI(t, dir)
	ln := freeTCP(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "mpirun", "-np", "2", "--oversubscribe", "-x", "HVDD_SECRET", bin, "serve",
		"--slots", "1", "--nodes", "-1", "--node-rank", "-1", "--backend", "mpi",
		"--rendezvous", ln, "--socket", filepath.Join(dir, "n{node}.sock"))
	// Open MPI 4.1's orted can crash writing its hwloc topology to shared
	// memory when several "hosts" share one machine; these tests need no
	// process binding, so its rtc/hwloc component is left out.
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_rtc=^hwloc",
		"HVDD_SECRET=0123456789abcdef0123456789abcdef")
	var logs strings.Builder
	var mu sync.Mutex
	cmd.Stdout, cmd.Stderr = lockedBuilder{&logs, &mu}, lockedBuilder{&logs, &mu}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			mu.Lock()
			t.Logf("mpirun output:\n%s", logs.String())
			mu.Unlock()
		}
	}()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for n := 0; n < 2; n++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &hvdd.Client{Socket: filepath.Join(dir, fmt.Sprintf("n%d.sock", n))}
			if err := c.Init(ctx); err != nil {
				errs[n] = err
				return
			}
			defer c.Close()
			if c.Size() != 2 || c.Rank() != n || !strings.Contains(fmt.Sprint(c.Rank()), fmt.Sprint(n)) {
				errs[n] = fmt.Errorf("rank %d of %d on node %d", c.Rank(), c.Size(), n)
				return
			}
			x := []float32{1, float32(n)}
			if err := hvdd.Allreduce(ctx, c, x, hvdd.WithOp(hvdd.Sum), hvdd.WithName("x")); err != nil {
				errs[n] = err
				return
			}
			if x[0] != 2 || x[1] != 1 {
				errs[n] = fmt.Errorf("allreduce gave %v, want [2 1]", x)
			}
			g, err := hvdd.Allgather(ctx, c, []int32{int32(n), int32(n)}, hvdd.WithName("g"))
			if err != nil || fmt.Sprint(g) != "[0 0 1 1]" {
				errs[n] = fmt.Errorf("allgather gave %v, %v", g, err)
			}
		}()
	}
	wg.Wait()
	for n, err := range errs {
		if err != nil {
			t.Errorf("node %d: %v", n, err)
		}
	}
}

type lockedBuilder struct {
	b  *strings.Builder
	mu *sync.Mutex
}

func (l lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// TestRunBackendMPI: `hvdd run --backend mpi` across two "hosts" (two
// loopback addresses; mpirun reaches them through an agent that runs the
// command here) with hvdd bench --check as the ranks.
func TestRunBackendMPI(t *testing.T) {
	dir := t.TempDir()
	bin := buildMPI(t, dir)
	agent := filepath.Join(dir, "agent")
	// Every "host" is this machine. Each orted gets a session directory of
	// its own: under one hostname they would share Open MPI's, and two
	// orteds creating it at once can fail with EEXIST (seen in CI).
	script := "#!/bin/sh\n" +
		"OMPI_MCA_orte_tmpdir_base=" + dir + "/ompi-$1; export OMPI_MCA_orte_tmpdir_base\n" +
		"mkdir -p \"$OMPI_MCA_orte_tmpdir_base\"; shift\n" +
		"exec sh -c \"$*\"\n"
	if err := os.WriteFile(agent, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "run", "-np", "2", "-H", "127.0.0.2:1,127.0.0.3:1", "--backend", "mpi", "--agent", agent, "--",
		bin, "bench", "--op", "allreduce", "--check", "--min-bytes", "4", "--max-bytes", "1K", "--step-factor", "16",
		"--iters", "3", "--warmup", "1", "--small-iters", "5", "--small-time", "0")
	// Open MPI 4.1's orted can crash writing its hwloc topology to shared
	// memory when several "hosts" share one machine; these tests need no
	// process binding, so its rtc/hwloc component is left out.
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_rtc=^hwloc")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok") {
		t.Fatalf("hvdd run --backend mpi: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "mismatch") {
		t.Fatalf("wrong results:\n%s", out)
	}
}

// buildMPI builds hvdd with the MPI engine into dir. These tests only build
// with -tags mpi, so a missing mpirun is a broken set-up, not a skip.
func buildMPI(t *testing.T, dir string) string {
	t.Helper()
	if _, err := exec.LookPath("mpirun"); err != nil {
		t.Fatal("mpirun missing: apt-get install openmpi-bin libopenmpi-dev (scripts/setup.sh does)")
	}
	bin := filepath.Join(dir, "hvdd-mpi")
	if out, err := exec.Command("go", "build", "-tags", "mpi", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -tags mpi: %v\n%s", err, out)
	}
	return bin
}
