//go:build mpi

package hvdd_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestMPIMultiNodeCollectives runs the scenarios of TestMultiNodeCollectives
// on the mpi engine: one hvdd daemon per "node", started by a real mpirun
// (Open MPI, --backend mpi, node rank and count from MPI), and real client
// processes on every node's socket checking every collective and dtype
// against references computed in the test. The control messages travel over
// the daemons' TCP links, and in one case over MPI too (--control mpi).
func TestMPIMultiNodeCollectives(t *testing.T) {
	if _, err := exec.LookPath("mpirun"); err != nil {
		t.Fatal("mpirun missing: apt-get install openmpi-bin libopenmpi-dev (scripts/setup.sh does)")
	}
	bin := filepath.Join(t.TempDir(), "hvdd-mpi")
	build := exec.Command("go", "build", "-tags", "mpi", "-o", bin, "../../cmd/hvdd")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags mpi: %v\n%s", err, out)
	}
	for _, c := range []struct {
		nodes, slots int
		control      string
	}{{2, 1, "tcp"}, {2, 2, "tcp"}, {4, 2, "tcp"}, {2, 2, "mpi"}} {
		nodes, slots := c.nodes, c.slots
		t.Run(fmt.Sprintf("%dx%d,control=%s", nodes, slots, c.control), func(t *testing.T) {
			perNode := make([]int, nodes)
			for i := range perNode {
				perNode[i] = slots
			}
			runScenariosOn(t, startMPINodes(t, bin, nodes, slots, "--control", c.control), perNode...)
		})
	}
}

// startMPINodes starts nodes daemons of slots local ranks each under mpirun
// (with extra serve arguments) and returns their sockets, by node rank. The
// daemons stop with the test.
func startMPINodes(t *testing.T, bin string, nodes, slots int, extra ...string) []string {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "mpirun", "-np", strconv.Itoa(nodes), "--oversubscribe", "-x", "HVDD_SECRET",
		bin, "serve", "--slots", strconv.Itoa(slots), "--nodes", "-1", "--node-rank", "-1", "--backend", "mpi",
		"--rendezvous", freePort(t, "127.0.0.1"), "--socket", filepath.Join(dir, "n{node}.sock"))
	cmd.Args = append(cmd.Args, extra...)
	// Open MPI 4.1's orted can crash writing its hwloc topology to shared
	// memory when several "hosts" share one machine; no binding is needed.
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_rtc=^hwloc",
		"HVDD_SECRET="+string(testSecret))
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
		if t.Failed() {
			t.Logf("mpirun output:\n%s", logs.String())
		}
	})
	sockets := make([]string, nodes)
	for n := range sockets {
		sockets[n] = filepath.Join(dir, fmt.Sprintf("n%d.sock", n))
	}
	return sockets
}
