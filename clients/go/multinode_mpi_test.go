//go:build mpi

package hvdd_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMPIMultiNodeCollectives runs the scenarios of TestMultiNodeCollectives
// on the mpi engine: one hvdd daemon per "node", started by a real mpirun
// (Open MPI, --backend mpi, node rank and count from MPI), and real client
// processes on every node's socket checking every collective and dtype
// against references computed in the test. The control messages travel over
// the daemons' TCP links, and in two cases over MPI too: --control mpi, and a
// bare mpirun (no rendezvous, no secret), where --control auto picks MPI and
// the MPI bridge makes the secret.
func TestMPIMultiNodeCollectives(t *testing.T) {
	bin := buildMPI(t)
	for _, c := range []struct {
		nodes, slots int
		control      string
	}{{2, 1, "tcp"}, {2, 2, "tcp"}, {4, 2, "tcp"}, {2, 2, "mpi"}, {2, 1, "auto"}} {
		nodes, slots := c.nodes, c.slots
		t.Run(fmt.Sprintf("%dx%d,control=%s", nodes, slots, c.control), func(t *testing.T) {
			perNode := make([]int, nodes)
			for i := range perNode {
				perNode[i] = slots
			}
			sockets, _ := startMPINodes(t, bin, nodes, slots, "--control", c.control)
			runScenariosOn(t, sockets, perNode...)
		})
	}
}

// TestMPIMultiNodeAdasum runs the adasum scenario (TestMultiNodeAdasum) on
// the mpi engine, whose Allgatherv carries the nodes' subtree values.
func TestMPIMultiNodeAdasum(t *testing.T) {
	bin := buildMPI(t)
	for _, slots := range []int{1, 2} {
		t.Run(fmt.Sprintf("2x%d", slots), func(t *testing.T) {
			sockets, _ := startMPINodes(t, bin, 2, slots, "--control", "tcp")
			for _, node := range spawnSockets(t, sockets, "adasum", slots, slots) {
				for _, w := range node {
					if err := w.Wait(120 * time.Second); err != nil {
						t.Errorf("rank %d: %v\n%s", w.Rank, err, w.Output())
					}
				}
			}
		})
	}
}

// TestMPIMultiNodeProcessSets runs the process set scenarios
// (TestMultiNodeProcessSets) on the mpi engine: sets whose members live on
// some nodes run on a communicator of those nodes (MPI_Comm_create_group),
// with the control links over TCP and over MPI.
func TestMPIMultiNodeProcessSets(t *testing.T) {
	bin := buildMPI(t)
	for _, c := range []struct {
		nodes, slots int
		control      string
	}{{2, 2, "tcp"}, {3, 1, "tcp"}, {3, 1, "mpi"}} {
		t.Run(fmt.Sprintf("%dx%d,control=%s", c.nodes, c.slots, c.control), func(t *testing.T) {
			sockets, _ := startMPINodes(t, bin, c.nodes, c.slots, "--control", c.control)
			perNode := make([]int, c.nodes)
			for i := range perNode {
				perNode[i] = c.slots
			}
			for _, node := range spawnSocketsEnv(t, sockets, "setsmulti", []string{fmt.Sprint("HVDD_TEST_NODE0=", c.slots)}, perNode...) {
				for _, w := range node {
					if err := w.Wait(120 * time.Second); err != nil {
						t.Errorf("rank %d: %v\n%s", w.Rank, err, w.Output())
					}
				}
			}
		})
	}
}

// TestMPICHMultiNodeCollectives runs the collective scenarios on daemons
// built for MPICH (-tags 'mpi mpich') and started by its mpiexec, with the
// control links over TCP and over MPI, and under a bare mpiexec (auto): hvdd
// run launches through Open MPI only, but the daemons run under MPICH too.
func TestMPICHMultiNodeCollectives(t *testing.T) {
	bin := buildMPITags(t, mpich, "mpi mpich")
	for _, control := range []string{"tcp", "mpi", "auto"} {
		t.Run("2x1,control="+control, func(t *testing.T) {
			sockets, _ := startMPINodesWith(t, mpich, bin, 2, 1, "--control", control)
			runScenariosOn(t, sockets, 1, 1)
		})
	}
}

// buildMPI builds hvdd with -tags mpi for the test, for Open MPI.
func buildMPI(t *testing.T) string { return buildMPITags(t, openMPI, "mpi") }

// buildMPITags builds hvdd with the given build tags, for launcher l's MPI.
func buildMPITags(t *testing.T, l mpiLauncher, tags string) string {
	t.Helper()
	if _, err := exec.LookPath(l.path); err != nil {
		t.Fatalf("%s missing: %s (scripts/setup.sh installs it)", l.path, l.install)
	}
	bin := filepath.Join(t.TempDir(), "hvdd-mpi")
	build := exec.Command("go", "build", "-tags", tags, "-o", bin, "../../cmd/hvdd")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags %q: %v\n%s", tags, err, out)
	}
	return bin
}

// mpiLauncher starts the n ranks of one MPI job.
type mpiLauncher struct {
	path    string
	install string               // what provides it
	args    func(n int) []string // before the program
	env     []string
}

var (
	// Open MPI 4.1's orted can crash writing its hwloc topology to shared
	// memory when several "hosts" share one machine; no binding is needed.
	openMPI = mpiLauncher{"mpirun", "apt-get install openmpi-bin libopenmpi-dev",
		func(n int) []string { return []string{"-np", strconv.Itoa(n), "--oversubscribe", "-x", "HVDD_SECRET"} },
		[]string{"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_rtc=^hwloc"}}
	// MPICH's hydra passes the whole environment.
	mpich = mpiLauncher{"mpiexec.mpich", "apt-get install mpich libmpich-dev",
		func(n int) []string { return []string{"-n", strconv.Itoa(n)} }, nil}
)

// startMPINodes starts nodes daemons of slots local ranks each under Open
// MPI's mpirun (with extra serve arguments) and returns their sockets, by
// node rank, and a channel closed when mpirun exits. The daemons stop with
// the test.
func startMPINodes(t *testing.T, bin string, nodes, slots int, extra ...string) ([]string, <-chan struct{}) {
	return startMPINodesWith(t, openMPI, bin, nodes, slots, extra...)
}

// startMPINodesWith is startMPINodes under launcher l. The daemons get a
// rendezvous address and a secret, except with extra "--control auto": then
// they get neither, as under a bare mpirun.
func startMPINodesWith(t *testing.T, l mpiLauncher, bin string, nodes, slots int, extra ...string) ([]string, <-chan struct{}) {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, l.path, l.args(nodes)...)
	cmd.Args = append(cmd.Args, bin, "serve", "--slots", strconv.Itoa(slots), "--nodes", "-1", "--node-rank", "-1", "--backend", "mpi",
		"--socket", filepath.Join(dir, "n{node}.sock"))
	cmd.Args = append(cmd.Args, extra...)
	cmd.Env = append(os.Environ(), l.env...)
	if bare := strings.Join(extra, " ") == "--control auto"; !bare {
		cmd.Args = append(cmd.Args, "--rendezvous", freePort(t, "127.0.0.1"))
		cmd.Env = append(cmd.Env, "HVDD_SECRET="+string(testSecret))
	}
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cancel()
		<-exited
		if t.Failed() {
			t.Logf("%s output:\n%s", l.path, logs.String())
		}
	})
	sockets := make([]string, nodes)
	for n := range sockets {
		sockets[n] = filepath.Join(dir, fmt.Sprintf("n%d.sock", n))
	}
	// Wait for every daemon's socket, or fail at once if the launcher ends
	// first (a daemon that refused to start): the ranks would retry for
	// their whole start timeout in each scenario.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(60 * time.Second)
	for _, sock := range sockets {
		for {
			if _, err := os.Stat(sock); err == nil {
				break
			}
			select {
			case <-exited:
				t.Fatalf("%s ended before the daemons were up (its output follows)", l.path)
			case <-deadline:
				t.Fatalf("no daemon socket %s after 60 s (the launcher's output follows)", sock)
			case <-tick.C:
			}
		}
	}
	return sockets, exited
}

// TestMPIMultiNodeDaemonKilled kills node 1's daemon with SIGKILL while rank
// 0 waits in a collective, on the mpi engine, with control links over TCP
// and over MPI. Open MPI's mpirun then ends the whole job, node 0's daemon
// included (MPI has no surviving ranks without ULFM), so rank 0 hears either
// that node 1 was lost (the TCP link broke first) or that its daemon was
// stopped by mpirun (over MPI nothing breaks: only the heartbeat timeout
// would tell); it must fail with that error within failLimit instead of
// hanging, and mpirun must end.
func TestMPIMultiNodeDaemonKilled(t *testing.T) {
	bin := buildMPI(t)
	for _, control := range []string{"tcp", "mpi"} {
		t.Run("control="+control, func(t *testing.T) { mpiDaemonKilled(t, bin, control) })
	}
}

func mpiDaemonKilled(t *testing.T, bin, control string) {
	sockets, exited := startMPINodes(t, bin, 2, 1, "--control", control)
	ws := spawnSockets(t, sockets, "victim", 1, 1)
	ws[1][0].WaitOutput(t, "VICTIM READY", 60*time.Second)
	ws[0][0].WaitOutput(t, "WAITING", 60*time.Second)
	pid := daemonPID(t, sockets[1])
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	err := ws[0][0].Wait(30 * time.Second)
	took := time.Since(killed)
	out := ws[0][0].Output()
	t.Logf("rank 0 exited %v after the kill (%v):\n%s", took.Round(time.Millisecond), err, out)
	if took > failLimit {
		t.Errorf("rank 0 ended %v after node 1's daemon was killed; want within %v", took, failLimit)
	}
	if !strings.Contains(out, "node 1 (rank 1) was lost") && !strings.Contains(out, "mpirun ends the whole job") {
		t.Errorf("rank 0's error names neither node 1 nor mpirun's end of the job:\n%s", out)
	}
	ws[1][0].Cmd.Process.Kill()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Error("mpirun did not end after a daemon was killed")
	}
}

// daemonPID returns the pid of the daemon listening on socket (SO_PEERCRED).
func daemonPID(t *testing.T, socket string) int {
	t.Helper()
	c, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var cred *unix.Ucred
	raw.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if err != nil {
		t.Fatal(err)
	}
	return int(cred.Pid)
}
