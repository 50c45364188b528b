//go:build mpi

package mpi

// The tests run under a real mpirun. A test called by `go test` (no MPI
// environment) re-executes the test binary as the ranks of an mpirun job
// with -test.run naming itself; the same test, finding itself an MPI rank,
// runs the per-rank checks and prints a marker line the parent counts.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// okMarker starts the line each rank prints when its checks passed.
const okMarker = "hvdd-mpi-ok"

// underMPI reports whether this process is a rank of an mpirun job.
func underMPI() bool {
	for _, v := range []string{"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"} {
		if os.Getenv(v) != "" {
			return true
		}
	}
	return false
}

// job describes one mpirun launch of this test binary.
type job struct {
	np      int
	run     string   // -test.run pattern for the ranks
	mpiArgs []string // extra mpirun arguments (before the program)
	env     []string // extra KEY=VALUE for mpirun and the ranks
	timeout time.Duration
	program []string // what to run instead of the test binary
}

// openMPI reports whether mpirun is Open MPI's (whose flags the tests use).
func openMPI(t testing.TB, mpirun string) bool {
	out, _ := exec.Command(mpirun, "--version").CombinedOutput()
	return bytes.Contains(out, []byte("Open MPI")) || bytes.Contains(out, []byte("OpenRTE"))
}

// mpirun runs j and returns its combined output; it fails t when mpirun
// exits non-zero or runs past the timeout.
func mpirun(t testing.TB, j job) string {
	t.Helper()
	path, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skipf("mpirun not found (apt-get install -y openmpi-bin libopenmpi-dev): %v", err)
	}
	if j.timeout == 0 {
		j.timeout = 60 * time.Second
	}
	var args []string
	if openMPI(t, path) {
		args = append(args, "--allow-run-as-root", "--oversubscribe",
			"--timeout", fmt.Sprint(int(j.timeout/time.Second)))
		for _, kv := range j.env {
			k, _, _ := strings.Cut(kv, "=")
			args = append(args, "-x", k)
		}
	}
	args = append(args, "-np", fmt.Sprint(j.np))
	args = append(args, j.mpiArgs...)
	if j.program != nil {
		args = append(args, j.program...)
	} else {
		args = append(args, os.Args[0], "-test.run=^"+j.run+"$", "-test.count=1",
			fmt.Sprintf("-test.timeout=%v", j.timeout))
	}
	ctx, cancel := context.WithTimeout(context.Background(), j.timeout+10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	// Open MPI 4.1's orted can crash writing its hwloc topology to shared
	// memory when several "hosts" share one machine; these tests need no
	// process binding, so its rtc/hwloc component is left out.
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_rtc=^hwloc")
	cmd.Env = append(cmd.Env, j.env...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("mpirun %s: %v in %v", strings.Join(args, " "), errStr(err), time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("mpirun failed: %v\n%s", err, out)
	}
	return string(out)
}

func errStr(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// checkRanks fails t unless out has the ok marker of every rank.
func checkRanks(t *testing.T, out string, np int) {
	t.Helper()
	for r := range np {
		if !strings.Contains(out, fmt.Sprintf("%s rank=%d size=%d", okMarker, r, np)) {
			t.Fatalf("rank %d of %d did not report success:\n%s", r, np, out)
		}
	}
}

// markOK prints the marker line of this rank.
func markOK(b *Backend, detail string) {
	fmt.Printf("%s rank=%d size=%d %s\n", okMarker, b.Rank(), b.Size(), detail)
}
