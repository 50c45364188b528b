package launch

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon/daemontest"
)

// The real hvdd binary, built once for the tests that start real daemons.
var (
	hvddBinOnce sync.Once
	hvddBinDir  string
	hvddBin     string
	hvddBinErr  error
)

func buildHvdd(t *testing.T) string {
	t.Helper()
	hvddBinOnce.Do(func() {
		hvddBinDir, hvddBinErr = os.MkdirTemp("", "hvdd-launch-bin")
		if hvddBinErr != nil {
			return
		}
		hvddBin = filepath.Join(hvddBinDir, "hvdd")
		out, err := exec.Command("go", "build", "-o", hvddBin, "github.com/hvdd/hvdd/cmd/hvdd").CombinedOutput()
		if err != nil {
			hvddBinErr = fmt.Errorf("go build hvdd: %v\n%s", err, out)
		}
	})
	if hvddBinErr != nil {
		t.Fatal(hvddBinErr)
	}
	return hvddBin
}

// allreduceHelper is a rank of a real job: it sums 1 over every rank with
// the Go client and prints what it sees. Rank $HVDD_TEST_FAIL_RANK then
// exits with status 3; the others wait for a signal.
func allreduceHelper() int {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM)
	c, err := hvdd.Init(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "init:", err)
		return 1
	}
	x := []float32{1}
	if err := hvdd.Allreduce(ctx, c, x, hvdd.WithOp(hvdd.Sum)); err != nil {
		fmt.Fprintln(os.Stderr, "allreduce:", err)
		return 1
	}
	fmt.Printf("rank=%d size=%d env=%s/%s local=%s/%s cross=%s/%s sum=%g pid=%d socket=%s\n",
		c.Rank(), c.Size(), os.Getenv("HVDD_RANK"), os.Getenv("HVDD_SIZE"),
		os.Getenv("HOROVOD_LOCAL_RANK"), os.Getenv("HOROVOD_LOCAL_SIZE"),
		os.Getenv("HOROVOD_CROSS_RANK"), os.Getenv("HOROVOD_CROSS_SIZE"),
		x[0], os.Getpid(), os.Getenv("HVDD_SOCKET"))
	if os.Getenv(envFailRank) == os.Getenv("HVDD_RANK") {
		fmt.Fprintf(os.Stderr, "rank %s failing\n", os.Getenv("HVDD_RANK"))
		os.Stdout.Sync()
		return 3
	}
	if os.Getenv(envFailRank) != "" {
		<-ch
		return 143
	}
	c.Close()
	return 0
}

var rankLine = regexp.MustCompile(`^\[(\d+)\]<stdout>:rank=(\d+) size=(\d+) env=(\d+)/(\d+) local=(\d+)/(\d+) cross=(\d+)/(\d+) sum=(\S+) pid=(\d+) socket=(\S+)$`)

type rankInfo struct {
	tag, rank, size, local, localSize, cross, crossSize, pid int
	sum, socket                                              string
}

// parseRanks reads the helper's lines from stdout, keyed by tag.
func parseRanks(t *testing.T, stdout string) map[int]rankInfo {
	t.Helper()
	got := map[int]rankInfo{}
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		m := rankLine.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("unexpected stdout line %q", line)
			continue
		}
		n := make([]int, len(m))
		for i := range m {
			n[i], _ = strconv.Atoi(m[i])
		}
		if n[2] != n[4] || n[3] != n[5] {
			t.Errorf("client rank/size %d/%d differ from HVDD_RANK/SIZE %d/%d", n[2], n[3], n[4], n[5])
		}
		got[n[1]] = rankInfo{tag: n[1], rank: n[2], size: n[3], local: n[6], localSize: n[7], cross: n[8], crossSize: n[9], sum: m[10], pid: n[11], socket: m[12]}
	}
	return got
}

// jobProcesses lists the processes whose command line mentions the job's
// sockets (daemons, and wrappers started through the agent).
func jobProcesses(socketDir string) []string {
	var found []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cl, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cl, []byte(socketDir)) && !isZombie(e.Name()) {
			found = append(found, e.Name()+": "+strings.ReplaceAll(string(cl), "\x00", " "))
		}
	}
	return found
}

func isZombie(pid string) bool {
	st, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return true // gone
	}
	i := bytes.LastIndexByte(st, ')')
	return i < 0 || i+2 >= len(st) || st[i+2] == 'Z' || st[i+2] == 'X'
}

func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil && !isZombie(strconv.Itoa(pid))
}

// checkCleanedUp checks that the job left no daemon, socket or rank behind.
func checkCleanedUp(t *testing.T, ranks map[int]rankInfo) {
	t.Helper()
	dirs := map[string]bool{}
	for _, r := range ranks {
		dirs[filepath.Dir(r.socket)] = true
		if alive(r.pid) {
			t.Errorf("rank %d (pid %d) still runs after Run returned", r.rank, r.pid)
		}
	}
	for dir := range dirs {
		if !strings.HasPrefix(dir, "/tmp/hvdd-run-") {
			t.Errorf("socket directory %s is not a per-job one under /tmp", dir)
		}
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("socket directory %s was left behind", dir)
		}
		if ps := jobProcesses(dir); len(ps) > 0 {
			t.Errorf("processes of the job still run after Run returned:\n%s", strings.Join(ps, "\n"))
		}
	}
}

// agentScript writes an agent that runs the command on this machine (as if
// ssh had run it on HOST), recording each host in $dir/agent.log.
func agentScript(t *testing.T, dir, body string) string {
	t.Helper()
	p := filepath.Join(dir, "agent")
	script := "#!/bin/sh\n# agent HOST COMMAND, as ssh HOST COMMAND\necho \"$1\" >> " + shellQuote(filepath.Join(dir, "agent.log")) + "\n" + body + "\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func multiRun(t *testing.T, cfg Config) result {
	t.Helper()
	cfg.HvddPath = buildHvdd(t)
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cfg.Stdout, cfg.Stderr = &stdout, &stderr
	if cfg.Signals == nil {
		cfg.Signals = make(chan os.Signal)
	}
	code, err := Run(ctx, cfg)
	r := result{code, err, stdout.String(), stderr.String()}
	if testing.Verbose() || t.Failed() {
		t.Logf("code %d, err %v\nstdout:\n%.4000s\nstderr:\n%.4000s", r.code, r.err, r.stdout, r.stderr)
	}
	return r
}

// checkJob checks a successful 2 hosts x 2 slots job's output.
func checkJob(t *testing.T, r result, np int, slots []int) map[int]rankInfo {
	t.Helper()
	if r.code != 0 || r.err != nil {
		t.Fatalf("Run = %d, %v; want 0, nil\nstderr:\n%s", r.code, r.err, r.stderr)
	}
	ranks := parseRanks(t, r.stdout)
	if len(ranks) != np {
		t.Fatalf("%d ranks printed, want %d:\n%s", len(ranks), np, r.stdout)
	}
	rank := 0
	sockets := map[string]int{}
	var nodes []node
	for _, n := range slots {
		nodes = append(nodes, node{Slots: n})
	}
	for node, n := range slots {
		for lr := range n {
			cross, crossSize := crossRank(nodes, node, lr)
			ri, ok := ranks[rank]
			switch {
			case !ok:
				t.Errorf("no output tagged [%d]", rank)
			case ri.rank != rank || ri.size != np || ri.sum != strconv.Itoa(np) || ri.local != lr || ri.localSize != n || ri.cross != cross || ri.crossSize != crossSize:
				t.Errorf("rank %d on node %d: %+v; want rank %d size %d sum %d local %d/%d cross %d/%d", rank, node, ri, rank, np, np, lr, n, cross, crossSize)
			}
			sockets[ri.socket] = node
			rank++
		}
	}
	if len(sockets) != len(slots) {
		t.Errorf("ranks used %d sockets, want one per host: %v", len(sockets), sockets)
	}
	return ranks
}

// TestMultiHostLocal runs 2 hosts x 2 slots on two loopback addresses of
// this machine: both daemons and all ranks are started directly.
func TestMultiHostLocal(t *testing.T) {
	t.Parallel()
	r := multiRun(t, Config{
		NP:      4,
		Command: helperCmd("allreduce"),
		Hosts:   []Host{{"127.0.0.2", 2}, {"127.0.0.3", 2}},
	})
	ranks := checkJob(t, r, 4, []int{2, 2})
	checkCleanedUp(t, ranks)
	if strings.Contains(r.stderr, "warning: host") {
		t.Errorf("loopback warning with local hosts only:\n%s", r.stderr)
	}
}

// TestMultiHostUneven places 3 ranks on hosts of 1, 3 and 4 slots: the last
// host gets none and is not used.
func TestMultiHostUneven(t *testing.T) {
	t.Parallel()
	r := multiRun(t, Config{
		NP:      3,
		Command: helperCmd("allreduce"),
		Hosts:   []Host{{"127.0.0.4", 1}, {"127.0.0.5", 3}, {"127.0.0.6", 4}},
	})
	ranks := checkJob(t, r, 3, []int{1, 2})
	checkCleanedUp(t, ranks)
}

// TestMultiHostFailFast: a failing rank stops the other ranks and every
// daemon, and the job exits with its status.
func TestMultiHostFailFast(t *testing.T) {
	t.Parallel()
	r := multiRun(t, Config{
		NP:      4,
		Command: helperCmd("allreduce"),
		Hosts:   []Host{{"127.0.0.7", 2}, {"127.0.0.8", 2}},
		Env:     []string{envFailRank + "=2"},
	})
	if r.code != 3 || r.err != nil {
		t.Fatalf("Run = %d, %v; want 3, nil", r.code, r.err)
	}
	if !regexp.MustCompile(`hvdd run: rank 2 \(pid \d+\) exited with status 3; stopping the other`).MatchString(r.stderr) {
		t.Errorf("stderr does not report rank 2's failure:\n%s", r.stderr)
	}
	checkCleanedUp(t, parseRanks(t, r.stdout))
}

// TestMultiHostAgent starts the second host through a custom agent (which
// runs the command on this machine): the remote path's quoting, secret
// hand-over, ready marker and environment. Then a remote rank fails: the
// local ranks and the remote ones are stopped, the latter by closing their
// agents' stdin.
func TestMultiHostAgent(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	agent := agentScript(t, dir, `exec sh -c "$2"`)
	cfg := Config{
		NP:        4,
		Command:   append(helperCmd("allreduce"), "it's a \"quoted\" $arg"),
		Hosts:     []Host{{"127.0.0.9", 2}, {"127.0.0.10", 2}},
		Agent:     agent,
		localHost: func(h string) bool { return h == "127.0.0.9" },
		Env:       []string{"HVDD_TEST_EXTRA=a b'c"},
	}
	ranks := checkJob(t, multiRun(t, cfg), 4, []int{2, 2})
	checkCleanedUp(t, ranks)
	// The agent ran the second host's daemon and its two ranks.
	if got := readLines(filepath.Join(dir, "agent.log")); !slices.Equal(got, []string{"127.0.0.10", "127.0.0.10", "127.0.0.10"}) {
		t.Errorf("agent ran for %q, want 127.0.0.10 three times", got)
	}

	t.Run("remote rank fails", func(t *testing.T) {
		cfg.Env = append(cfg.Env, envFailRank+"=3")
		r := multiRun(t, cfg)
		if r.code != 3 || r.err != nil {
			t.Fatalf("Run = %d, %v; want 3, nil", r.code, r.err)
		}
		if !regexp.MustCompile(`hvdd run: rank 3 on 127.0.0.10 \(agent pid \d+\) exited with status 3; stopping the other 3 ranks`).MatchString(r.stderr) {
			t.Errorf("stderr does not report rank 3's failure:\n%s", r.stderr)
		}
		checkCleanedUp(t, parseRanks(t, r.stdout))
	})

	t.Run("local rank fails", func(t *testing.T) {
		cfg.Env = append(cfg.Env, envFailRank+"=0")
		r := multiRun(t, cfg)
		if r.code != 3 || r.err != nil {
			t.Fatalf("Run = %d, %v; want 3, nil", r.code, r.err)
		}
		checkCleanedUp(t, parseRanks(t, r.stdout))
	})
}

// TestMultiHostAgentFails: an agent that cannot reach the host fails the
// start, quoting its output, and stops the daemon already started.
func TestMultiHostAgentFails(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	agent := agentScript(t, dir, `echo "ssh: connect to host $1 port 22: Connection refused" >&2; exit 255`)
	r := multiRun(t, Config{
		NP:        2,
		Command:   helperCmd("allreduce"),
		Hosts:     []Host{{"127.0.0.11", 1}, {"127.0.0.12", 1}},
		Agent:     agent,
		localHost: func(h string) bool { return h == "127.0.0.11" },
	})
	if r.code != exitLaunchFailed || r.err == nil {
		t.Fatalf("Run = %d, %v; want %d and an error", r.code, r.err, exitLaunchFailed)
	}
	for _, want := range []string{"the hvdd daemon on 127.0.0.12 exited with status 255 before it was ready", "Connection refused", "--hvdd-path"} {
		if !strings.Contains(r.err.Error(), want) {
			t.Errorf("error %q does not contain %q", r.err, want)
		}
	}
	if r.stdout != "" {
		t.Errorf("ranks ran: %s", r.stdout)
	}
}

// TestMultiHostNetns runs a job on two network namespaces joined by a veth
// pair, through an agent that enters the host's namespace: the daemons
// rendezvous and reduce across a real link.
func TestMultiHostNetns(t *testing.T) {
	hosts := daemontest.Hosts(t, 2) // skips unless root with ip(8)
	dir := testDir(t)
	agent := agentScript(t, dir, fmt.Sprintf(`case "$1" in
%s) ns=%s ;;
%s) ns=%s ;;
*) echo "agent: unknown host $1" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" sh -c "$2"`, hosts[0].Addr, hosts[0].NS, hosts[1].Addr, hosts[1].NS))
	r := multiRun(t, Config{
		NP:      4,
		Command: helperCmd("allreduce"),
		Hosts:   []Host{{hosts[0].Addr, 2}, {hosts[1].Addr, 2}},
		Agent:   agent,
	})
	ranks := checkJob(t, r, 4, []int{2, 2})
	checkCleanedUp(t, ranks)
}

// TestCheckOpenMPI: an mpirun other than Open MPI's (here a stand-in that
// answers like MPICH's hydra) is refused with what to do instead.
func TestCheckOpenMPI(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ version, want string }{
		{"mpirun (Open MPI) 4.1.4", ""},
		{"HYDRA build details:\n    Version: 4.0.2", `it says "HYDRA build details:"`},
	} {
		fake := filepath.Join(dir, "mpirun")
		os.WriteFile(fake, []byte("#!/bin/sh\necho '"+strings.ReplaceAll(c.version, "\n", "'\necho '")+"'\n"), 0o755)
		err := checkOpenMPI(fake)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%q refused: %v", c.version, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "--node-rank -1")):
			t.Errorf("%q: got %v, want an error saying %s and how to start the daemons", c.version, err, c.want)
		}
	}
}

func TestMultiHostBackendMPI(t *testing.T) {
	t.Parallel()
	r := multiRun(t, Config{
		NP: 2, Command: helperCmd("allreduce"), Backend: "mpi",
		Hosts: []Host{{"127.0.0.2", 1}, {"127.0.0.3", 1}},
	})
	// The test binary's hvdd has no MPI engine (or there is no mpirun): the
	// launch must fail saying so, not hang. cmd/hvdd's mpi-tagged tests run
	// the real thing.
	if r.code == 0 || r.err == nil || !strings.Contains(r.err.Error(), "mpi") {
		t.Errorf("Run = %d, %v; want a failure that mentions mpi", r.code, r.err)
	}
}

// TestMultiHostOneLocalHost: when every rank fits on this machine the job
// has one node, the shared one: the daemon listening on the socket is used.
func TestMultiHostOneLocalHost(t *testing.T) {
	t.Parallel()
	r := run(t, Config{NP: 2, Command: helperCmd("dial"), Hosts: []Host{{"localhost", 4}, {"192.0.2.1", 4}}})
	if r.code != 0 || r.err != nil || r.stdout != "[0]<stdout>:dial ok\n[1]<stdout>:dial ok\n" && r.stdout != "[1]<stdout>:dial ok\n[0]<stdout>:dial ok\n" {
		t.Errorf("Run = %d, %v, stdout %q; want both ranks on the single-node path", r.code, r.err, r.stdout)
	}
}

func TestParseArgsHosts(t *testing.T) {
	dir := t.TempDir()
	hf := filepath.Join(dir, "hosts")
	os.WriteFile(hf, []byte("a slots=2\nb:3\n"), 0o600)
	c, err := ParseArgs([]string{"-np", "5", "--hostfile", hf, "--backend", "tcp", "--rendezvous-port", "29600",
		"-p", "2222", "-i", "/k", "--agent", "ssh -x", "--hvdd-path", "/opt/hvdd", "--", "cmd"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Hosts, []Host{{"a", 2}, {"b", 3}}) || c.Backend != "tcp" || c.RendezvousPort != 29600 ||
		c.SSHPort != 2222 || c.SSHIdentityFile != "/k" || c.Agent != "ssh -x" || c.RemoteHvddPath != "/opt/hvdd" {
		t.Errorf("ParseArgs = %+v", c)
	}
	c, err = ParseArgs([]string{"-np", "3", "-H", "a:1,b:2", "--ssh-port", "22", "--ssh-identity-file", "/k2", "cmd"})
	if err != nil || !slices.Equal(c.Hosts, []Host{{"a", 1}, {"b", 2}}) || c.SSHPort != 22 || c.SSHIdentityFile != "/k2" {
		t.Errorf("ParseArgs = %+v, %v", c, err)
	}
	for _, tt := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"-np", "4", "-H", "a:1,b:2", "cmd"}, "-np 4 is more than the 3 slots"},
		{[]string{"-np", "1", "-H", "a", "--hostfile", hf, "cmd"}, "pass one of them"},
		{[]string{"-np", "1", "-H", "", "cmd"}, "-H is empty"},
		{[]string{"-np", "1", "--hosts", "a:0", "cmd"}, "at least 1"},
		{[]string{"-np", "1", "--hostfile", filepath.Join(dir, "none"), "cmd"}, "no such file"},
		{[]string{"-np", "1", "-H", "a", "--backend", "gloo", "cmd"}, "unknown --backend"},
		{[]string{"-np", "1", "-H", "a", "--ssh-port", "70000", "cmd"}, "not a TCP port"},
		{[]string{"-np", "1", "-H", "a", "--agent", " ", "cmd"}, "--agent is blank"},
	} {
		if _, err := ParseArgs(tt.args); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("ParseArgs(%q) error %v, want one containing %q", tt.args, err, tt.wantErr)
		}
	}
}

// TestMultiHostSignal forwards SIGINT: local ranks get it, remote ones (their
// agent's stdin closed) SIGTERM from the remote wrapper.
func TestMultiHostSignal(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	agent := agentScript(t, dir, `exec sh -c "$2"`)
	buildHvdd(t) // here, not in multiRun's goroutine, which must not t.Fatal
	sigs := make(chan os.Signal, 1)
	done := make(chan result, 1)
	go func() {
		done <- multiRun(t, Config{
			NP:        4,
			Command:   helperCmd("job"),
			Hosts:     []Host{{"127.0.0.13", 2}, {"127.0.0.14", 2}},
			Agent:     agent,
			localHost: func(h string) bool { return h == "127.0.0.13" },
			Env:       []string{envDir + "=" + dir},
			Signals:   sigs,
		})
	}()
	mustWaitForFiles(t, dir, readyFiles(0, 1, 2, 3)...)
	sigs <- syscall.SIGINT
	r := <-done
	if r.code != 128+int(syscall.SIGINT) || r.err != nil {
		t.Fatalf("Run = %d, %v; want %d, nil", r.code, r.err, 128+int(syscall.SIGINT))
	}
	for rank, want := range []string{"SIGINT", "SIGINT", "SIGTERM", "SIGTERM"} {
		if got := readLines(filepath.Join(dir, "sig."+strconv.Itoa(rank))); !slices.Equal(got, []string{want}) {
			t.Errorf("rank %d got signals %q, want %s", rank, got, want)
		}
	}
}

func TestAgentCommand(t *testing.T) {
	m := &job{cfg: &Config{SSHPort: 2222, SSHIdentityFile: "/k ey"}}
	got := m.agent("node1", "echo 'hi'").Args
	want := []string{"ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new", "-p", "2222", "-i", "/k ey", "node1", `sh -c 'echo '\''hi'\'''`}
	if !slices.Equal(got, want) {
		t.Errorf("ssh agent = %q, want %q", got, want)
	}
	m.cfg = &Config{Agent: "  my-agent --flag  x ", SSHPort: 2222}
	got = m.agent("node1", "true").Args
	if want := []string{"my-agent", "--flag", "x", "node1", "sh -c true"}; !slices.Equal(got, want) {
		t.Errorf("custom agent = %q, want %q", got, want)
	}
	t.Setenv(secretEnv, "leak")
	for _, kv := range m.agent("node1", "true").Env {
		if strings.HasPrefix(kv, secretEnv+"=") {
			t.Errorf("the agent inherits %s", kv)
		}
	}
}

// TestMpirunArgsControl: HVDD_CONTROL reaches the daemons started by
// mpirun (it selects what carries their control links), and only when set.
func TestMpirunArgsControl(t *testing.T) {
	m := &job{cfg: &Config{HvddPath: "/bin/hvdd"}, nodes: []node{{Host: "a", Slots: 1, Local: true, Socket: "/tmp/hvdd-run-x-0/hvdd.sock"}, {Host: "b", Slots: 1, Socket: "/tmp/hvdd-run-x-1/hvdd.sock"}},
		id: "x", rendezvous: "a:1", remoteHvdd: "hvdd"}
	has := func() bool { return strings.Contains(strings.Join(m.mpirunArgs(), " "), "-x HVDD_CONTROL") }
	t.Setenv("HVDD_CONTROL", "")
	if has() {
		t.Error("HVDD_CONTROL forwarded while unset")
	}
	t.Setenv("HVDD_CONTROL", "mpi")
	if !has() {
		t.Errorf("HVDD_CONTROL not forwarded: %v", m.mpirunArgs())
	}
	// mpirun reaches the hosts with our ssh command (port included), or
	// with the agent.
	m.cfg.SSHPort = 2222
	if args := strings.Join(m.mpirunArgs(), " "); !strings.Contains(args, "--mca plm_rsh_agent ssh -o BatchMode=yes -o StrictHostKeyChecking=accept-new -p 2222 -np 1") {
		t.Errorf("mpirun's rsh agent is not our ssh: %s", args)
	}
	m.cfg.Agent = "my-agent -x"
	if args := strings.Join(m.mpirunArgs(), " "); !strings.Contains(args, "--mca plm_rsh_agent my-agent -x -np 1") {
		t.Errorf("mpirun's rsh agent is not --agent: %s", args)
	}
	// Every daemon may use all its host's cores; root may launch, as with
	// horovodrun.
	if args := strings.Join(m.mpirunArgs(), " "); !strings.HasPrefix(args, "--allow-run-as-root --bind-to none ") {
		t.Errorf("mpirun binds the daemons or refuses root: %s", args)
	}
}

// TestMpirunHint: an mpirun that fails before the daemons are up gets a
// hint that fits its output.
func TestMpirunHint(t *testing.T) {
	for _, c := range []struct{ tail, want string }{
		{"ORTE was unable to reliably start one or more daemons.", "could not start its daemon"},
		{"hvdd: unknown --backend \"mpi\" (this hvdd was built without -tags mpi)", "-tags mpi"},
		{"", "-tags mpi"},
	} {
		if got := mpirunHint(c.tail); !strings.Contains(got, c.want) {
			t.Errorf("mpirunHint(%q) = %q, want it to mention %q", c.tail, got, c.want)
		}
	}
}
