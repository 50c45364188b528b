package hvdd_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/backends/tcp"
	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/daemon/daemontest"
)

var testSecret = []byte("multi-node test secret, 32 bytes")

func tcpFactory(ctx context.Context, j daemon.MultiNodeJob) (backends.Backend, error) {
	return tcp.New(ctx, tcp.Config{Rank: j.NodeRank, Size: j.Nodes, Store: j.Store, Prefix: j.ID,
		ListenAddr: net.JoinHostPort(j.Host, "0"), Secret: j.Secret, Logger: j.Logger,
		Heartbeat: 100 * time.Millisecond, PeerTimeout: 2 * time.Second})
}

// freePort finds a free TCP port on host.
func freePort(t *testing.T, host string) string {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startNodes runs one daemon per node, each on its own loopback address.
func startNodes(t *testing.T, slots ...int) []*daemontest.Server {
	return startNodesCfg(t, nil, slots...)
}

// startNodesCfg is startNodes with node n's Config changed by edit(n, cfg).
func startNodesCfg(t *testing.T, edit func(int, *daemon.Config), slots ...int) []*daemontest.Server {
	rdv := freePort(t, "127.0.0.2")
	var ss []*daemontest.Server
	nodes := len(slots)
	for n := 0; n < nodes; n++ {
		cfg := daemon.Config{
			Slots: slots[n], Nodes: nodes, NodeRank: n, Rendezvous: rdv,
			Advertise: fmt.Sprintf("127.0.0.%d", n+2), Secret: testSecret, NewBackend: tcpFactory,
			Heartbeat: 100 * time.Millisecond, PeerTimeout: 2 * time.Second, StartTimeout: 30 * time.Second,
		}
		if edit != nil {
			edit(n, &cfg)
		}
		ss = append(ss, daemontest.Start(t, cfg))
	}
	return ss
}

func spawnNodes(t *testing.T, ss []*daemontest.Server, scenario string, slots ...int) [][]*daemontest.Worker {
	return spawnNodesEnv(t, ss, scenario, nil, slots...)
}

// runNodes runs scenario's ranks on the daemons ss (slots ranks on each) and
// waits up to timeout for each of them, failing the test for every rank that
// does not exit 0.
func runNodes(t *testing.T, ss []*daemontest.Server, scenario string, timeout time.Duration, slots ...int) {
	t.Helper()
	for n, node := range spawnNodes(t, ss, scenario, slots...) {
		for _, w := range node {
			if err := w.Wait(timeout); err != nil {
				t.Errorf("%s: node %d rank %d: %v\n%s", scenario, n, w.Rank, err, w.Output())
			}
		}
	}
}

// spawnNodesEnv is spawnNodes with extra environment entries.
func spawnNodesEnv(t *testing.T, ss []*daemontest.Server, scenario string, env []string, slots ...int) [][]*daemontest.Worker {
	sockets := make([]string, len(ss))
	for i, s := range ss {
		sockets[i] = s.Socket
	}
	return spawnSocketsEnv(t, sockets, scenario, env, slots...)
}

// spawnSockets starts every node's ranks of scenario on the daemons listening on
// sockets (by node), with the job's sizes in their environment.
func spawnSockets(t *testing.T, sockets []string, scenario string, slots ...int) [][]*daemontest.Worker {
	return spawnSocketsEnv(t, sockets, scenario, nil, slots...)
}

// spawnSocketsEnv is spawnSockets with extra environment entries.
func spawnSocketsEnv(t *testing.T, sockets []string, scenario string, extra []string, slots ...int) [][]*daemontest.Worker {
	total := 0
	for _, n := range slots {
		total += n
	}
	hetero := false
	for _, n := range slots {
		hetero = hetero || n != slots[0]
	}
	var ws [][]*daemontest.Worker
	for i, s := range sockets {
		env := []string{fmt.Sprint("HVDD_TEST_SIZE=", total), fmt.Sprint("HVDD_TEST_LOCAL_SIZE=", slots[i])}
		if hetero {
			env = append(env, "HVDD_TEST_HETERO=1")
		}
		ws = append(ws, daemontest.Spawn(t, s, scenario, slots[i], append(env, extra...)...))
	}
	return ws
}

func TestMultiNodeCollectives(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node suite is long")
	}
	for _, slots := range [][]int{{1, 1}, {2, 2}, {1, 1, 1}, {1, 2}, {1, 1, 1, 1}} {
		t.Run(fmt.Sprint(slots), func(t *testing.T) {
			if raceEnabled && !slices.Equal(slots, []int{1, 2}) && len(slots) != 4 {
				// Under the race detector the uneven and the widest layouts
				// cover every code path (a CI run's long pole was this
				// matrix: 104 s); scripts/test.sh runs all five without it.
				t.Skip("under -race only [1 2] and [1 1 1 1]; scripts/test.sh runs this layout without -race")
			}
			runScenarios(t, slots...)
		})
	}
}

// runScenarios starts a daemon per node (tcp engine) and runs the
// collectives, errors, join and async scenarios on them, one job each.
func runScenarios(t *testing.T, slots ...int) {
	ss := startNodes(t, slots...)
	sockets := make([]string, len(ss))
	for i, s := range ss {
		sockets[i] = s.Socket
	}
	runScenariosOn(t, sockets, slots...)
}

// runScenariosOn runs the scenarios on daemons already listening on sockets.
func runScenariosOn(t *testing.T, sockets []string, slots ...int) {
	for _, scenario := range []string{"collectives", "errors", "join", "async"} {
		for _, node := range spawnSockets(t, sockets, scenario, slots...) {
			for _, w := range node {
				if err := w.Wait(180 * time.Second); err != nil {
					t.Errorf("%s: rank %d: %v\n%s", scenario, w.Rank, err, w.Output())
				}
			}
		}
	}
}

// TestMultiNodeLargeFused runs fused allreduces large enough for the
// daemons to pipeline them in chunks through the engine, checked element by
// element, on two nodes of two ranks and three of one.
func TestMultiNodeLargeFused(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node suite is long")
	}
	for _, slots := range [][]int{{2, 2}, {1, 1, 1}} {
		t.Run(fmt.Sprint(slots), func(t *testing.T) {
			if raceEnabled && len(slots) == 3 {
				t.Skip("under -race only [2 2]; scripts/test.sh runs this layout without -race")
			}
			ss := startNodes(t, slots...)
			runNodes(t, ss, "bigfused", 180*time.Second, slots...)
		})
	}
}

// TestMultiNodeLostRank kills a rank on node 1: the ranks on node 0 fail
// promptly naming it, and both daemons take the next job.
func TestMultiNodeLostRank(t *testing.T) {
	ss := startNodes(t, 1, 1)
	ws := spawnNodes(t, ss, "victim", 1, 1)
	victim := ws[1][0]
	victim.WaitOutput(t, "VICTIM READY", 60*time.Second)
	ws[0][0].WaitOutput(t, "WAITING", 60*time.Second)
	victim.Cmd.Process.Signal(syscall.SIGKILL)
	failsWithin(t, ws[0][0], time.Now(), "rank 1 was killed")
	if err := ws[0][0].Wait(30 * time.Second); err != nil {
		t.Fatalf("survivor: %v\n%s", err, ws[0][0].Output())
	}
	if out := ws[0][0].Output(); !strings.Contains(out, "rank 1 (pid") || !strings.Contains(out, "was lost") {
		t.Errorf("the survivor's error does not name the lost rank:\n%s", out)
	}
	runNodes(t, ss, "async", 60*time.Second, 1, 1)
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// hvddBinary builds cmd/hvdd once per test binary.
func hvddBinary(t *testing.T) string {
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "hvdd-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "hvdd")
		out, err := exec.Command("go", "build", "-o", binPath, "../../cmd/hvdd").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// daemonProc is an hvdd serve process.
type daemonProc struct {
	cmd    *exec.Cmd
	socket string
	logs   *strings.Builder
	mu     sync.Mutex
	done   chan struct{}
}

func (d *daemonProc) Logs() string { d.mu.Lock(); defer d.mu.Unlock(); return d.logs.String() }

type lockedWriter struct{ d *daemonProc }

func (w lockedWriter) Write(p []byte) (int, error) {
	w.d.mu.Lock()
	defer w.d.mu.Unlock()
	return w.d.logs.Write(p)
}

// startDaemonProc runs `hvdd serve` with args (inside host's namespace when
// host is non-nil) and waits until its socket accepts.
func startDaemonProc(t *testing.T, host *daemontest.Host, secretFile string, args ...string) *daemonProc {
	dir := t.TempDir()
	d := &daemonProc{socket: filepath.Join(dir, "hvdd.sock"), logs: &strings.Builder{}, done: make(chan struct{})}
	full := append([]string{"serve", "--socket", d.socket, "--secret-file", secretFile, "--log-level", "debug"}, args...)
	if host != nil {
		d.cmd = host.Exec(hvddBinary(t), full...)
	} else {
		d.cmd = exec.Command(hvddBinary(t), full...)
	}
	d.cmd.Stdout, d.cmd.Stderr = lockedWriter{d}, lockedWriter{d}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		d.cmd.Process.Kill()
		<-d.done
		if t.Failed() {
			t.Logf("daemon %v log:\n%s", args, d.Logs())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.Dial("unix", d.socket)
		if err == nil {
			c.Close()
			return d
		}
		select {
		case <-d.done:
			t.Fatalf("daemon exited at start:\n%s", d.Logs())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon did not listen within 20s:\n%s", d.Logs())
		}
	}
}

func writeSecret(t *testing.T, s string) string {
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// twoNodes starts the daemons of a 2-node job, on loopback addresses or on
// namespaced hosts.
func twoNodes(t *testing.T, hosts []*daemontest.Host, secret0, secret1 string) []*daemonProc {
	addr := []string{"127.0.0.2", "127.0.0.3"}
	if hosts != nil {
		addr = []string{hosts[0].Addr, hosts[1].Addr}
	}
	var rdv string
	if hosts == nil {
		rdv = freePort(t, addr[0])
	} else {
		rdv = net.JoinHostPort(addr[0], "29517")
	}
	var ds []*daemonProc
	for n, sec := range []string{secret0, secret1} {
		var h *daemontest.Host
		if hosts != nil {
			h = hosts[n]
		}
		ds = append(ds, startDaemonProc(t, h, writeSecret(t, sec), "--slots", "1", "--nodes", "2",
			"--node-rank", fmt.Sprint(n), "--rendezvous", rdv, "--advertise", addr[n]))
	}
	return ds
}

func spawnOn(t *testing.T, ds []*daemonProc, scenario string) []*daemontest.Worker {
	var ws []*daemontest.Worker
	for _, d := range ds {
		ws = append(ws, daemontest.Spawn(t, d.socket, scenario, 1, "HVDD_TEST_SIZE=2", "HVDD_TEST_LOCAL_SIZE=1")...)
	}
	return ws
}

const secretA = "0123456789abcdef0123456789abcdef"

// failLimit is how soon after a node, link or rank is lost the ranks on
// other nodes must see their pending collective fail (issue 3: 5 s). The
// daemons' defaults detect a cut link in at most PeerTimeout (3 s) plus
// one heartbeat period (1 s); a closed connection at once.
const failLimit = 5 * time.Second

// failsWithin fails t unless w (the victim scenario's waiting rank) prints
// its error within failLimit of since, and logs how long it took.
func failsWithin(t *testing.T, w *daemontest.Worker, since time.Time, what string) {
	t.Helper()
	w.WaitOutput(t, "error:", 30*time.Second)
	took := time.Since(since)
	t.Logf("rank %d's pending collective failed %v after %s", w.Rank, took.Round(time.Millisecond), what)
	if took > failLimit {
		t.Errorf("rank %d's pending collective failed %v after %s; want within %v", w.Rank, took, what, failLimit)
	}
}

// TestMultiNodeDaemonKilled kills node 1's daemon with SIGKILL while rank 0
// waits in a collective: rank 0 fails naming node 1, and after node 1's
// daemon restarts, the surviving daemon runs the next job.
func TestMultiNodeDaemonKilled(t *testing.T) {
	ds := twoNodes(t, nil, secretA, secretA)
	ws := spawnOn(t, ds, "victim")
	ws[1].WaitOutput(t, "VICTIM READY", 60*time.Second)
	ws[0].WaitOutput(t, "WAITING", 60*time.Second)
	ds[1].cmd.Process.Signal(syscall.SIGKILL)
	failsWithin(t, ws[0], time.Now(), "node 1's daemon was killed")
	if err := ws[0].Wait(30 * time.Second); err != nil {
		t.Fatalf("rank 0: %v\n%s", err, ws[0].Output())
	}
	if out := ws[0].Output(); !strings.Contains(out, "node 1 (rank 1) was lost") {
		t.Errorf("rank 0's error does not name the lost node:\n%s", out)
	}
	ws[1].Cmd.Process.Kill()
	// Node 1 comes back; the job after works.
	rdv := ""
	for _, a := range ds[0].cmd.Args {
		if strings.HasPrefix(a, "127.0.0.2:") {
			rdv = a
		}
	}
	d1 := startDaemonProc(t, nil, writeSecret(t, secretA), "--slots", "1", "--nodes", "2", "--node-rank", "1", "--rendezvous", rdv, "--advertise", "127.0.0.3")
	for _, w := range spawnOn(t, []*daemonProc{ds[0], d1}, "async") {
		if err := w.Wait(60 * time.Second); err != nil {
			t.Errorf("next job: rank %d: %v\n%s", w.Rank, err, w.Output())
		}
	}
}

// TestMultiNodeWrongSecret: a node with another secret is refused, and its
// clients hear why instead of hanging.
func TestMultiNodeWrongSecret(t *testing.T) {
	ds := twoNodes(t, nil, secretA, "another secret that is long enough")
	ws := spawnOn(t, ds, "async")
	if err := ws[1].Wait(60 * time.Second); err == nil || !strings.Contains(ws[1].Output(), "secret") {
		t.Errorf("node 1's rank: %v, want an error about the secret:\n%s", err, ws[1].Output())
	}
	ws[0].Cmd.Process.Kill()
	if !strings.Contains(ds[0].Logs(), "refused") || !strings.Contains(ds[0].Logs(), "wrong secret") {
		t.Errorf("node 0 did not log the refused peer:\n%s", ds[0].Logs())
	}
}

// TestMultiNodeLinkCut runs two nodes in network namespaces and cuts the
// link between them: both sides fail their pending collectives naming the
// other node instead of hanging.
func TestMultiNodeLinkCut(t *testing.T) {
	hosts := daemontest.Hosts(t, 2)
	ds := twoNodes(t, hosts, secretA, secretA)
	// First a job that works across the link.
	for _, w := range spawnOn(t, ds, "async") {
		if err := w.Wait(60 * time.Second); err != nil {
			t.Fatalf("rank %d: %v\n%s", w.Rank, err, w.Output())
		}
	}
	ws := spawnOn(t, ds, "victim")
	ws[1].WaitOutput(t, "VICTIM READY", 60*time.Second)
	ws[0].WaitOutput(t, "WAITING", 60*time.Second)
	hosts[1].SetLink(t, false)
	failsWithin(t, ws[0], time.Now(), "the link was cut")
	if err := ws[0].Wait(30 * time.Second); err != nil {
		t.Fatalf("rank 0: %v\n%s", err, ws[0].Output())
	}
	if out := ws[0].Output(); !strings.Contains(out, "node 1 (rank 1) was lost") {
		t.Errorf("rank 0's error does not name the lost node:\n%s", out)
	}
	ws[1].Cmd.Process.Kill()
}

// TestMultiNodeEngineFails: a data engine that cannot start fails init on
// every node with its reason, and the daemons stay up for the next job. The
// factory returns a typed nil with its error, which once crashed the daemon.
func TestMultiNodeEngineFails(t *testing.T) {
	rdv := freePort(t, "127.0.0.2")
	bad := func(ctx context.Context, j daemon.MultiNodeJob) (backends.Backend, error) {
		var b *tcp.Backend
		return b, errors.New("engine refused to start")
	}
	var ss []*daemontest.Server
	for n := 0; n < 2; n++ {
		ss = append(ss, daemontest.Start(t, daemon.Config{
			Slots: 1, Nodes: 2, NodeRank: n, Rendezvous: rdv,
			Advertise: fmt.Sprintf("127.0.0.%d", n+2), Secret: testSecret, NewBackend: bad,
			Heartbeat: 100 * time.Millisecond, PeerTimeout: 2 * time.Second, StartTimeout: 30 * time.Second,
		}))
	}
	for round := 0; round < 2; round++ {
		for _, node := range spawnNodes(t, ss, "async", 1, 1) {
			for _, w := range node {
				if err := w.Wait(60 * time.Second); err == nil || !strings.Contains(w.Output(), "engine refused to start") {
					t.Errorf("round %d: rank %d: %v, want an init error naming the engine's failure:\n%s", round, w.Rank, err, w.Output())
				}
			}
		}
	}
}

func init() {
	scenarios["unevenwhole"] = func(ctx context.Context, c *hvdd.Client) error {
		n := 3_000_000 // 12 MB: pipelined in chunks where two ranks share a node
		x := input[float32](c.Rank(), n)
		if err := hvdd.Allreduce(ctx, c, x, hvdd.WithName("whole"), hvdd.WithOp(hvdd.Sum)); err != nil {
			return err
		}
		for i := range x {
			var want float32
			for r := 0; r < c.Size(); r++ {
				want += float32(val(r, i))
			}
			if x[i] != want {
				return fmt.Errorf("element %d = %v, want %v", i, x[i], want)
			}
		}
		return nil
	}
}

// TestMultiNodeUnevenLargeAllreduce: a large single-tensor allreduce on
// nodes of 1 and 2 ranks. Each node used to decide alone whether the
// engine took it in one call or in chunks (the one-rank node: whole, the
// two-rank node: chunked), and the result was wrong from the first chunk
// on ("element 262144 = 3, want 10"); sched.Whole now decides it from what
// every node knows alike.
func TestMultiNodeUnevenLargeAllreduce(t *testing.T) {
	ss := startNodes(t, 1, 2)
	runNodes(t, ss, "unevenwhole", 60*time.Second, 1, 2)
}
