package launch

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hvdd/hvdd/auth"
	"github.com/hvdd/hvdd/rendezvous"
)

// The elastic driver against fake daemons (helper fake-serve: a socket
// that accepts connections, no protocol) and fake ranks (helper fake-rank:
// they exit when told to), to test what the driver starts and stops, and
// when it gives up, apart from what real daemons do with the ranks
// (driver_test.go).

// fakeServe is a fake `hvdd serve`: with --rendezvous-external it adds 1
// to the key "fake-serve" of the store at --rendezvous (with the secret of
// --secret-file) and leaves the count in $HVDD_TEST_DIR/rdv.<node-rank>
// (it fails if the store cannot be reached), and waits in the background
// for the key elastic/removed/<node-rank>, the driver's notice that its
// host was removed: it then writes the key's value (the host) to
// $HVDD_TEST_DIR/removed.<node-rank> and to the file "removed" beside its
// socket, where its fake ranks look. Then it listens on --socket, leaves
// its pid in $HVDD_TEST_DIR/serve.<node-rank>.pid, and exits 0 on SIGTERM.
func fakeServe(args []string) int {
	var socket, nodeRank, rdv, secretFile string
	external := false
	for i := range args {
		if args[i] == "--rendezvous-external" {
			external = true
		}
		if i+1 == len(args) {
			break
		}
		switch args[i] {
		case "--socket":
			socket = args[i+1]
		case "--node-rank":
			nodeRank = args[i+1]
		case "--rendezvous":
			rdv = args[i+1]
		case "--secret-file":
			secretFile = args[i+1]
		}
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM)
	if external {
		secret, err := auth.LoadSecret(secretFile, "")
		if err != nil {
			fmt.Fprintln(os.Stderr, "fake daemon:", err)
			return 3
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		n, err := rendezvous.NewClient(rdv, secret).Add(ctx, "fake-serve", 1)
		cancel()
		if err != nil {
			fmt.Fprintln(os.Stderr, "fake daemon: the rendezvous:", err)
			return 3
		}
		os.WriteFile(filepath.Join(os.Getenv(envDir), "rdv."+nodeRank), []byte(strconv.FormatInt(n, 10)), 0o600)
		go func() {
			// Until the notice comes, or the store closes at the end of
			// the job.
			vals, err := rendezvous.NewClient(rdv, secret).Wait(context.Background(), "elastic/removed/"+nodeRank)
			if err != nil {
				return
			}
			host := vals["elastic/removed/"+nodeRank]
			writeAtomically(filepath.Join(os.Getenv(envDir), "removed."+nodeRank), host)
			writeAtomically(filepath.Join(filepath.Dir(socket), "removed"), host)
		}()
	}
	ln, err := net.Listen("unix", socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake daemon:", err)
		return 3
	}
	writeAtomically(filepath.Join(os.Getenv(envDir), "serve."+nodeRank+".pid"), []byte(strconv.Itoa(os.Getpid())))
	go acceptAndDrop(ln)
	<-ch
	ln.Close()
	return 0
}

// writeAtomically writes data to path through a rename, so that a reader
// sees all of it or nothing.
func writeAtomically(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Environment variables of the fake and driver ranks.
const (
	// envIgnoreRemoval: fake ranks do not take their host's removal in (as
	// ranks of a daemon that predates the notice).
	envIgnoreRemoval = "HVDD_TEST_IGNORE_REMOVAL"
	// exitRemoved is the status of a rank that left the job because its
	// host was removed ("... has been removed from elastic job").
	exitRemoved = 7
)

// fakeRank is a rank of a fake job: it checks that its daemon listens,
// prints its rank variables, and exits on SIGTERM or SIGINT (128+N, after
// adding the signal's name to $HVDD_TEST_DIR/sig.<pid>; with
// $HVDD_TEST_STUBBORN set it only adds the name), or with the code
// written to $HVDD_TEST_DIR/exit.<pid>, or, when its daemon was told that
// its host was removed (unless $HVDD_TEST_IGNORE_REMOVAL is set), with
// exitRemoved and Horovod's message, as a rank refused at its next reset.
func fakeRank() int {
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	c, err := net.Dial("unix", os.Getenv("HVDD_SOCKET"))
	if err != nil {
		fmt.Println("dial failed:", err)
		return 1
	}
	c.Close()
	e := os.Getenv
	fmt.Printf("FAKE pid=%d rank=%s size=%s local=%s/%s/%s cross=%s/%s elastic=%s socket=%s\n", os.Getpid(),
		e("HVDD_RANK"), e("HVDD_SIZE"), e("HVDD_LOCAL_RANK"), e("HOROVOD_LOCAL_RANK"), e("HVDD_LOCAL_SIZE"),
		e("HVDD_CROSS_RANK"), e("HVDD_CROSS_SIZE"), e("HOROVOD_ELASTIC"), e("HVDD_SOCKET"))
	exit := filepath.Join(e(envDir), "exit."+strconv.Itoa(os.Getpid()))
	removed := filepath.Join(filepath.Dir(e("HVDD_SOCKET")), "removed")
	for {
		select {
		case sig := <-ch:
			f, err := os.OpenFile(filepath.Join(e(envDir), "sig."+strconv.Itoa(os.Getpid())), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
			if err == nil {
				fmt.Fprintln(f, signame(sig))
				f.Close()
			}
			if e(envStubborn) == "" {
				return 128 + signum(sig)
			}
			continue
		case <-time.After(20 * time.Millisecond):
		}
		if b, err := os.ReadFile(exit); err == nil {
			code, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			return code
		}
		if b, err := os.ReadFile(removed); err == nil && e(envIgnoreRemoval) == "" {
			fmt.Fprintf(os.Stderr, "%s[%s] has been removed from elastic job\n", b, e("HOROVOD_LOCAL_RANK"))
			return exitRemoved
		}
	}
}

var fakeLine = regexp.MustCompile(`(?m)^\[(\d+)\]<stdout>:FAKE pid=(\d+) rank=(\S*) size=(\S*) local=(\S*) cross=(\S*) elastic=(\S*) socket=(\S*)$`)

// fakeRankInfo is what a fake rank printed.
type fakeRankInfo struct {
	pid                                     int
	rank, size, local, cross, elastic, sock string
}

// fakeJob is a job of fake daemons and ranks run by the elastic driver.
type fakeJob struct {
	t              *testing.T
	dir            string
	stdout, stderr *watchBuffer
	sigs           chan os.Signal
	done           chan result
	cancel         context.CancelFunc // cancels Run's ctx
}

// startFake runs cfg (its hosts, or the discovery script fj.discovery())
// on fake daemons with fake ranks (or cfg.Command, when set).
func startFake(t *testing.T, dir string, cfg Config) *fakeJob {
	t.Helper()
	return startFakeWith(t, dir, cfg, nil)
}

// startFakeWith is startFake, with mod (if not nil) applied to the Config
// last, with the fake hvdd and rank set.
func startFakeWith(t *testing.T, dir string, cfg Config, mod func(cfg *Config, dir string)) *fakeJob {
	t.Helper()
	fj := &fakeJob{t: t, dir: dir, stdout: newWatchBuffer(), stderr: newWatchBuffer(), sigs: make(chan os.Signal, 4), done: make(chan result, 1)}
	bin := filepath.Join(dir, "hvdd")
	script := "#!/bin/sh\necho \"$*\" >> " + shellQuote(filepath.Join(dir, "serve.log")) + "\n" +
		"HVDD_TEST_DIR=" + shellQuote(dir) + " exec " + shellQuote(os.Args[0]) + " " + helperArg + " fake-serve \"$@\"\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg.HvddPath = bin
	if cfg.Command == nil {
		cfg.Command = helperCmd("fake-rank")
	}
	cfg.Env = append(cfg.Env, envDir+"="+dir)
	cfg.Stdout, cfg.Stderr, cfg.Signals = fj.stdout, fj.stderr, fj.sigs
	if cfg.discoverEvery == 0 {
		cfg.discoverEvery = 50 * time.Millisecond
	}
	if mod != nil {
		mod(&cfg, dir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	fj.cancel = cancel
	go func() {
		defer cancel()
		code, err := Run(ctx, cfg)
		fj.done <- result{code, err, fj.stdout.String(), fj.stderr.String()}
	}()
	return fj
}

// discoveryScript returns a discovery script that prints dir/hosts, which
// setHosts writes, and first adds a line to dir/discover.runs, so that
// tests can count its runs (waitDiscoveries). While dir/discover.fail
// exists (failDiscovery), it fails instead: "cloud API unreachable" on
// stderr, status 3.
func discoveryScript(t *testing.T, dir, hosts string) string {
	t.Helper()
	p := filepath.Join(dir, "discover")
	script := "#!/bin/sh\necho run >> " + shellQuote(filepath.Join(dir, "discover.runs")) + "\n" +
		"if test -e " + shellQuote(filepath.Join(dir, "discover.fail")) + "; then echo 'cloud API unreachable' >&2; exit 3; fi\n" +
		"cat " + shellQuote(filepath.Join(dir, "hosts")) + "\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	setHosts(t, dir, hosts)
	return p
}

// failDiscovery makes the discovery script of discoveryScript fail, or
// work again.
func failDiscovery(t *testing.T, dir string, fail bool) {
	t.Helper()
	p := filepath.Join(dir, "discover.fail")
	if !fail {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// rankStarts matches the driver's messages when it starts ranks or a
// host's daemon (it logs them before it takes in the next discovery).
var rankStarts = regexp.MustCompile(`(?m)^hvdd run: (starting \d+ ranks? more|started \d+ ranks? on|host \S+ joins the elastic job|\d+ ranks? more for)`)

// waitDiscoveries waits until the driver has taken in k runs of the
// discovery script of discoveryScript (in dir) that began after the call,
// so that a test can show that nothing happens on them.
//
// The driver runs the script, hands the result to its loop, and runs it
// again only once the loop has received that result; the loop takes each
// result in before it receives the next. So run n+2 begins only after the
// loop has taken run n in, and the run that follows the n runs counted
// now is the first to begin after the call: k runs taken in are k+2
// begun.
func waitDiscoveries(t *testing.T, dir string, k int) {
	t.Helper()
	runs := filepath.Join(dir, "discover.runs")
	want := len(readLines(runs)) + k + 2
	for deadline := time.Now().Add(20 * time.Second); len(readLines(runs)) < want; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the discovery script ran %d times in 20s, want %d", len(readLines(runs)), want)
		}
	}
}

// setHosts replaces what the discovery script prints (atomically).
func setHosts(t *testing.T, dir, hosts string) {
	t.Helper()
	tmp := filepath.Join(dir, "hosts.tmp")
	if err := os.WriteFile(tmp, []byte(hosts), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "hosts")); err != nil {
		t.Fatal(err)
	}
}

// rank waits for the fake rank tagged tag to report.
func (fj *fakeJob) rank(tag int) fakeRankInfo {
	fj.t.Helper()
	prefix := "[" + strconv.Itoa(tag) + "]<stdout>:FAKE "
	fj.stdout.waitFor(fj.t, prefix, 20*time.Second)
	for _, m := range fakeLine.FindAllStringSubmatch(fj.stdout.String(), -1) {
		if m[1] == strconv.Itoa(tag) {
			pid, _ := strconv.Atoi(m[2])
			return fakeRankInfo{pid, m[3], m[4], m[5], m[6], m[7], m[8]}
		}
	}
	fj.t.Fatalf("cannot parse rank %d's line:\n%s", tag, fj.stdout)
	return fakeRankInfo{}
}

// socket returns node i's socket, named after rank 0's (node 0's).
func (fj *fakeJob) socket(i int) string {
	fj.t.Helper()
	node0 := filepath.Dir(fj.rank(0).sock)
	return strings.TrimSuffix(node0, "-0") + "-" + strconv.Itoa(i) + "/hvdd.sock"
}

// exit makes the fake rank tagged tag exit with code.
func (fj *fakeJob) exit(tag, code int) {
	fj.t.Helper()
	r := fj.rank(tag)
	if err := writeAtomically(filepath.Join(fj.dir, "exit."+strconv.Itoa(r.pid)), []byte(strconv.Itoa(code))); err != nil {
		fj.t.Fatal(err)
	}
}

// removed returns the value of elastic/removed/<i> that node i's fake
// daemon got from the store ("" if none).
func (fj *fakeJob) removed(i int) string {
	fj.t.Helper()
	b, _ := os.ReadFile(filepath.Join(fj.dir, "removed."+strconv.Itoa(i)))
	return string(b)
}

// waitGone waits until the process pid (what names it) has exited.
func (fj *fakeJob) waitGone(pid int, what string) {
	fj.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); alive(pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			fj.t.Fatalf("%s still runs after its host left", what)
		}
	}
}

// rdvCount returns the count node i's fake daemon got from the store: the
// fake daemons that reached it before it, itself included.
func (fj *fakeJob) rdvCount(i int) string {
	fj.t.Helper()
	fj.daemonPid(i) // written after rdv.<i>
	b, err := os.ReadFile(filepath.Join(fj.dir, "rdv."+strconv.Itoa(i)))
	if err != nil {
		fj.t.Fatalf("node %d's daemon did not reach the rendezvous: %v", i, err)
	}
	return string(b)
}

// daemonPid returns the pid of node i's fake daemon.
func (fj *fakeJob) daemonPid(i int) int {
	fj.t.Helper()
	return readPid(fj.t, fj.dir, "serve."+strconv.Itoa(i)+".pid")
}

// wait waits for Run to return.
func (fj *fakeJob) wait() result {
	fj.t.Helper()
	select {
	case r := <-fj.done:
		if testing.Verbose() || fj.t.Failed() {
			fj.t.Logf("code %d, err %v\nstdout:\n%s\nstderr:\n%s", r.code, r.err, r.stdout, r.stderr)
		}
		return r
	case <-time.After(30 * time.Second):
		fj.t.Fatalf("Run did not return\nstdout:\n%s\nstderr:\n%s", fj.stdout, fj.stderr)
		return result{}
	}
}

// checkRank compares a fake rank's variables with want.
func checkRank(t *testing.T, tag int, got fakeRankInfo, want fakeRankInfo) {
	t.Helper()
	want.pid = got.pid
	if got != want {
		t.Errorf("rank [%d]: %+v, want %+v", tag, got, want)
	}
}

// TestDriverHostsComeAndGo: a job started on one discovered host takes in a
// second host (its daemon as node 1 with --elastic, its ranks with the
// tags that come next and their place in Horovod's assignment); when it is
// no longer discovered, the driver tells its daemon through the
// rendezvous (elastic/removed/1 = the host) instead of stopping its ranks,
// which leave with Horovod's message (an expected exit: no failure, no
// blacklisting), and then stops the daemon; the job ends with status 0
// when its ranks do.
func TestDriverHostsComeAndGo(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	fj := startFake(t, dir, Config{NP: 1, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.30:1\n")})
	r0 := fj.rank(0)
	node0 := filepath.Dir(r0.sock)
	checkRank(t, 0, r0, fakeRankInfo{rank: "0", size: "1", local: "0/0/1", cross: "0/1", elastic: "1", sock: node0 + "/hvdd.sock"})

	setHosts(t, dir, "127.0.0.30:1\n127.0.0.31:2\n")
	fj.stderr.waitFor(t, "host 127.0.0.31 joins the elastic job: starting its hvdd daemon (node 1) for 2 ranks (reset 1)", 10*time.Second)
	r1, r2 := fj.rank(1), fj.rank(2)
	node1 := strings.TrimSuffix(node0, "-0") + "-1/hvdd.sock"
	checkRank(t, 1, r1, fakeRankInfo{rank: "1", size: "3", local: "-1/0/2", cross: "1/2", elastic: "1", sock: node1})
	checkRank(t, 2, r2, fakeRankInfo{rank: "2", size: "3", local: "-1/1/2", cross: "0/1", elastic: "1", sock: node1})
	serve := readLines(filepath.Join(dir, "serve.log"))
	rendezvous := regexp.MustCompile(`--rendezvous (\S+) `)
	// The driver serves the rendezvous; a host that is this machine
	// reaches it on 127.0.0.1.
	if len(serve) != 2 || !strings.HasPrefix(serve[0], "serve --slots 1 --nodes 1 --node-rank 0 --rendezvous 127.0.0.1:") ||
		!strings.HasPrefix(serve[1], "serve --slots 2 --nodes 2 --node-rank 1 ") ||
		rendezvous.FindString(serve[0]) != rendezvous.FindString(serve[1]) ||
		!strings.HasSuffix(serve[0], " --elastic --rendezvous-external --elastic-driver") || !strings.HasSuffix(serve[1], " --elastic --rendezvous-external --elastic-driver") {
		t.Errorf("daemons started as:\n%s", strings.Join(serve, "\n"))
	}
	if n0, n1 := fj.rdvCount(0), fj.rdvCount(1); n0 != "1" || n1 != "2" {
		t.Errorf("the daemons counted %s and %s at the rendezvous, want 1 and 2 (one store)", n0, n1)
	}
	daemon1 := fj.daemonPid(1)

	setHosts(t, dir, "127.0.0.30:1\n")
	fj.stderr.waitFor(t, "host 127.0.0.31 is no longer discovered: telling its daemon (node 1) that the host has been removed from the elastic job; its ranks ([1] [2]) leave the job at their next reset (reset 2)", 10*time.Second)
	for _, tag := range []int{1, 2} {
		fj.stderr.waitFor(t, fmt.Sprintf("[%d]<stderr>:127.0.0.31[%d] has been removed from elastic job", tag, tag-1), 10*time.Second)
	}
	fj.stderr.waitFor(t, "rank 1 (pid "+strconv.Itoa(r1.pid)+") exited with status 7; it left the elastic job, its host 127.0.0.31 having been removed; the job goes on with 1 rank", 10*time.Second)
	fj.stderr.waitFor(t, "rank 2 (pid "+strconv.Itoa(r2.pid)+") exited with status 7; it left the elastic job, its host 127.0.0.31 having been removed; the job goes on with 1 rank", 10*time.Second)
	if got := fj.removed(1); got != "127.0.0.31" {
		t.Errorf("node 1's daemon got elastic/removed/1 = %q, want 127.0.0.31", got)
	}
	fj.waitGone(daemon1, "node 1's daemon")
	fj.exit(0, 0)
	r := fj.wait()
	if r.code != 0 || r.err != nil {
		t.Errorf("Run = %d, %v; want 0, nil", r.code, r.err)
	}
	for _, no := range []string{"blacklisting", "stopping"} {
		if strings.Contains(r.stderr, no) {
			t.Errorf("the driver logged %q for a removed host's ranks", no)
		}
	}
	if alive(r0.pid) || alive(fj.daemonPid(0)) {
		t.Error("a rank or node 0's daemon outlived Run")
	}
}

// TestDriverFailedRankBlacklistsHost: a rank that fails (any non-zero
// status) while its host's daemon runs on gets its host blacklisted, as
// Horovod's driver blacklists the host of a failed worker, not its slot:
// the host's other rank is stopped and the job goes on with the other
// host's ranks. Without a cooldown range (hosts from discovery) the host
// stays out, and a failure on the last host stops the job (every host
// blacklisted); with one (-H), the host comes back after the cooldown with
// a new daemon (node 2) and ranks.
func TestDriverFailedRankBlacklistsHost(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		a, b     string
		cooldown CooldownRange
	}{
		{"no cooldown", "127.0.0.17", "127.0.0.18", CooldownRange{}},
		{"cooldown", "127.0.0.19", "127.0.0.89", CooldownRange{300 * time.Millisecond, 300 * time.Millisecond}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := testDir(t)
			cfg := Config{NP: 4, MinNP: 2, Hosts: []Host{{tt.a, 2}, {tt.b, 2}}, BlacklistCooldown: tt.cooldown}
			if !tt.cooldown.set() {
				// Discovery, so that the test sees the driver look at the
				// hosts again.
				cfg.Hosts, cfg.HostDiscoveryScript = nil, discoveryScript(t, dir, tt.a+":2\n"+tt.b+":2\n")
			}
			fj := startFake(t, dir, cfg)
			r1 := fj.rank(1)
			r2 := fj.rank(2)
			fj.rank(3)
			fj.exit(0, 3)
			fj.stderr.waitFor(t, "exited with status 3; the elastic job goes on with 2 ranks (--min-np 2; reset 1)", 10*time.Second)
			fj.stderr.waitFor(t, "blacklisting host "+tt.a+" "+cooldownPhrase(tt.cooldown.Min)+", as Horovod blacklists the host of a failed worker; stopping its other ranks ([1])", 10*time.Second)
			fj.stderr.waitFor(t, "rank 1 (pid "+strconv.Itoa(r1.pid)+") exited with status 143; the elastic job goes on with 2 ranks", 10*time.Second)
			if !tt.cooldown.set() {
				since := len(fj.stderr.String())
				waitDiscoveries(t, dir, 3)
				if log := fj.stderr.String()[since:]; rankStarts.MatchString(log) {
					t.Errorf("a rank was started on a host blacklisted for good:\n%s", log)
				}
				fj.exit(2, 4)
				r := fj.wait()
				want := "every host of the elastic job is blacklisted (" + tt.a + ":2, " + tt.b + ":2), so it stops"
				if r.code != 4 || r.err == nil || !strings.Contains(r.err.Error(), want) {
					t.Errorf("Run = %d, %v; want 4 and an error containing %q", r.code, r.err, want)
				}
				return
			}
			fj.stderr.waitFor(t, "host "+tt.a+"'s blacklisting is over (its cooldown ended)", 10*time.Second)
			fj.stderr.waitFor(t, "host "+tt.a+" joins the elastic job: starting its hvdd daemon (node 2) for 2 ranks (reset 2)", 10*time.Second)
			// The host comes back last: ranks 2 and 3 of 4.
			checkRank(t, 4, fj.rank(4), fakeRankInfo{rank: "2", size: "4", local: "-1/0/2", cross: "1/2", elastic: "1", sock: fj.socket(2)})
			fj.rank(5)
			if r2.sock != fj.socket(1) {
				t.Errorf("rank [2] on %s, want node 1's daemon", r2.sock)
			}
			for _, tag := range []int{2, 3, 4, 5} {
				fj.exit(tag, 0)
			}
			if r := fj.wait(); r.code != 0 || r.err != nil {
				t.Errorf("Run = %d, %v; want 0, nil", r.code, r.err)
			}
		})
	}
}

// TestDriverNoCooldown: without a cooldown range a host whose daemon dies
// stays blacklisted, and so does the host of a failed rank; when every host
// is blacklisted the job stops with an error saying so.
func TestDriverNoCooldown(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	fj := startFake(t, dir, Config{NP: 3, MinNP: 1, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.33:2\n127.0.0.34:1\n")})
	fj.rank(0)
	fj.rank(1)
	r2 := fj.rank(2)
	syscall.Kill(fj.daemonPid(1), syscall.SIGKILL)
	fj.stderr.waitFor(t, "blacklisting host 127.0.0.34 for good (no --blacklist-cooldown-range) and stopping the ranks on it ([2]), which lost their daemon (reset 1)", 10*time.Second)
	fj.stderr.waitFor(t, "rank 2 (pid "+strconv.Itoa(r2.pid)+") exited with status 143; the elastic job goes on with 2 ranks", 10*time.Second)
	// Discovery still lists both hosts with all their slots: three runs
	// taken in start nothing.
	since := len(fj.stderr.String())
	waitDiscoveries(t, dir, 3)
	if log := fj.stderr.String()[since:]; rankStarts.MatchString(log) || strings.Contains(fj.stdout.String(), "[3]<stdout>") {
		t.Errorf("a rank was started on a host blacklisted for good:\n%s", log)
	}
	fj.exit(1, 3)
	r := fj.wait()
	want := "Horovod detected that one or more processes exited with non-zero status: every host of the elastic job is blacklisted (127.0.0.33:2, 127.0.0.34:1), so it stops"
	if r.code != 3 || r.err == nil || !strings.Contains(r.err.Error(), want) {
		t.Errorf("Run = %d, %v; want 3 and an error containing %q", r.code, r.err, want)
	}
}

// TestDriverHost0DaemonLost: node 0's daemon dying is a host lost like any
// other: host 0 is blacklisted and its rank stopped, the job goes on, and
// the rendezvous (the driver's) outlives it: a host that joins later
// reaches the same store.
func TestDriverHost0DaemonLost(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	fj := startFake(t, dir, Config{NP: 2, MinNP: 1, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.35:1\n127.0.0.36:1\n")})
	r0 := fj.rank(0)
	fj.rank(1)
	syscall.Kill(fj.daemonPid(0), syscall.SIGKILL)
	fj.stderr.waitFor(t, "blacklisting host 127.0.0.35 for good (no --blacklist-cooldown-range) and stopping the ranks on it ([0]), which lost their daemon (reset 1)", 10*time.Second)
	fj.stderr.waitFor(t, "rank 0 (pid "+strconv.Itoa(r0.pid)+") exited with status 143; the elastic job goes on with 1 rank", 10*time.Second)
	setHosts(t, dir, "127.0.0.35:1\n127.0.0.36:1\n127.0.0.50:1\n")
	fj.stderr.waitFor(t, "host 127.0.0.50 joins the elastic job: starting its hvdd daemon (node 2) for 1 rank (reset 2)", 10*time.Second)
	fj.rank(2)
	if n := fj.rdvCount(2); n != "3" {
		t.Errorf("node 2's daemon counted %s at the rendezvous, want 3 (the store of nodes 0 and 1)", n)
	}
	fj.exit(1, 0)
	fj.exit(2, 0)
	if r := fj.wait(); r.code != 0 || r.err != nil {
		t.Errorf("Run = %d, %v; want 0, nil", r.code, r.err)
	}
}

// TestDriverResetLimit: a host added after --reset-limit resets stops the
// job with Horovod's message.
func TestDriverResetLimit(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	fj := startFake(t, dir, Config{NP: 2, MinNP: 1, ResetLimit: 1, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.37:1\n127.0.0.90:1\n")})
	fj.rank(0)
	fj.exit(1, 3) // reset 1
	fj.stderr.waitFor(t, "(--min-np 1; reset 1)", 10*time.Second)
	setHosts(t, dir, "127.0.0.37:1\n127.0.0.90:1\n127.0.0.38:1\n")
	r := fj.wait()
	if r.code != 3 || r.err == nil || r.err.Error() != "Horovod was shutdown because number of resets during elastic job exceeded limit: 1" {
		t.Errorf("Run = %d, %v", r.code, r.err)
	}
}

// TestDriverMinWait: below --min-np the driver waits --elastic-timeout for
// slots: a host that comes in time ends the wait, and then a wait that
// times out stops the job with Horovod's message.
func TestDriverMinWait(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	fj := startFake(t, dir, Config{NP: 2, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.39:1\n127.0.0.91:1\n"), ElasticTimeout: 2 * time.Second})
	fj.rank(0)
	fj.exit(1, 3)
	fj.stderr.waitFor(t, "1 rank left, fewer than --min-np 2: waiting up to 2s (--elastic-timeout) for slots", 10*time.Second)
	setHosts(t, dir, "127.0.0.39:1\n127.0.0.91:1\n127.0.0.40:1\n")
	fj.stderr.waitFor(t, "the elastic job has 2 ranks again (--min-np 2)", 10*time.Second)
	fj.rank(2)
	setHosts(t, dir, "127.0.0.39:1\n127.0.0.91:1\n")
	fj.stderr.waitFor(t, "host 127.0.0.40 is no longer discovered", 10*time.Second)
	r := fj.wait()
	want := "Timed out waiting for minimum number of slots to become available. Please check that you have enough resources to run at least 2 Horovod processes."
	if r.code != 3 || r.err == nil || !strings.HasPrefix(r.err.Error(), want) {
		t.Errorf("Run = %d, %v; want 3 and %q", r.code, r.err, want)
	}
}

// TestDriverStartErrors: a discovery script that fails on its first run,
// and too few slots within --elastic-timeout, fail the start with
// Horovod's messages; nothing is started.
func TestDriverStartErrors(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	fail := filepath.Join(dir, "fail")
	os.WriteFile(fail, []byte("#!/bin/sh\necho 'no cloud' >&2\nexit 2\n"), 0o755)
	fj := startFake(t, dir, Config{NP: 1, HostDiscoveryScript: fail})
	if r := fj.wait(); r.code != exitLaunchFailed || r.err == nil || !strings.Contains(r.err.Error(), "Failed to execute discovery script: "+fail+". Exit code: 2") {
		t.Errorf("Run = %d, %v", r.code, r.err)
	}
	start := time.Now()
	fj = startFake(t, dir, Config{NP: 3, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.41:2\n"), ElasticTimeout: time.Second})
	r := fj.wait()
	if r.code != exitLaunchFailed || r.err == nil || !strings.HasPrefix(r.err.Error(), "Timed out waiting for minimum number of slots to become available. Please check that you have enough resources to run at least 3 Horovod processes.") ||
		!strings.Contains(r.err.Error(), "127.0.0.41:2") || !strings.Contains(r.err.Error(), "--elastic-timeout") {
		t.Errorf("Run = %d, %v", r.code, r.err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the start gave up after %v, want about 1s", d)
	}
	if _, err := os.Stat(filepath.Join(dir, "serve.log")); err == nil || r.stdout != "" {
		t.Error("something was started")
	}
}

// TestDriverHost0Leaves: host 0 is a host like the others: when it is no
// longer discovered its daemon (node 0) is told that it has been removed,
// its rank leaves, its daemon is stopped and the job goes on (the removal
// is the one reset that --reset-limit 1 allows: the removed rank's exit
// counts for nothing); when its last rank fails, the host is blacklisted
// and its daemon (node 0) stopped, the job goes on, and after the cooldown
// the host comes back with a new daemon (node 2).
func TestDriverHost0Leaves(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	fj := startFake(t, dir, Config{NP: 2, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.42:1\n127.0.0.43:1\n"), MinNP: 1, ResetLimit: 1})
	r0 := fj.rank(0)
	fj.rank(1)
	daemon0 := fj.daemonPid(0)
	setHosts(t, dir, "127.0.0.43:1\n")
	fj.stderr.waitFor(t, "host 127.0.0.42 is no longer discovered: telling its daemon (node 0) that the host has been removed from the elastic job; its ranks ([0]) leave the job at their next reset (reset 1)", 10*time.Second)
	fj.stderr.waitFor(t, "rank 0 (pid "+strconv.Itoa(r0.pid)+") exited with status 7; it left the elastic job, its host 127.0.0.42 having been removed; the job goes on with 1 rank", 10*time.Second)
	if got := fj.removed(0); got != "127.0.0.42" {
		t.Errorf("node 0's daemon got elastic/removed/0 = %q, want 127.0.0.42", got)
	}
	fj.waitGone(daemon0, "node 0's daemon")
	fj.exit(1, 0)
	if r := fj.wait(); r.code != 0 || r.err != nil {
		t.Errorf("Run = %d, %v; want 0, nil", r.code, r.err)
	}

	dir = testDir(t)
	fj = startFake(t, dir, Config{NP: 2, MinNP: 1, Hosts: []Host{{"127.0.0.42", 1}, {"127.0.0.43", 1}}, BlacklistCooldown: CooldownRange{time.Second, time.Second}})
	daemon0 = fj.daemonPid(0)
	fj.rank(1)
	fj.exit(0, 3)
	fj.stderr.waitFor(t, "exited with status 3; the elastic job goes on with 1 rank (--min-np 1; reset 1)", 10*time.Second)
	fj.waitGone(daemon0, "node 0's daemon")
	fj.stderr.waitFor(t, "host 127.0.0.42 joins the elastic job: starting its hvdd daemon (node 2) for 1 rank (reset 2)", 10*time.Second)
	if r2 := fj.rank(2); r2.sock != fj.socket(2) {
		t.Errorf("rank [2] runs on %s, want node 2's daemon (%s)", r2.sock, fj.socket(2))
	}
	fj.exit(1, 0)
	fj.exit(2, 0)
	if r := fj.wait(); r.code != 0 || r.err != nil {
		t.Errorf("Run = %d, %v; want 0, nil", r.code, r.err)
	}
}

// TestDriverAgent: a discovered host that is not this machine gets its
// daemon and ranks through the agent; when it leaves, its daemon is told
// through the driver's rendezvous, its rank leaves, and closing its
// daemon's agent's stdin stops the daemon.
func TestDriverAgent(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	agent := agentScript(t, dir, `exec sh -c "$2"`)
	fj := startFake(t, dir, Config{NP: 1, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.44:1\n"), Agent: agent,
		localHost: func(h string) bool { return h == "127.0.0.44" }})
	fj.rank(0)
	setHosts(t, dir, "127.0.0.44:1\n127.0.0.45:1\n")
	r1 := fj.rank(1)
	if r1.local != "-1/0/1" || r1.rank != "1" || r1.size != "2" {
		t.Errorf("remote joiner: %+v", r1)
	}
	daemon1 := fj.daemonPid(1)
	setHosts(t, dir, "127.0.0.44:1\n")
	fj.stderr.waitFor(t, "rank 1 on 127.0.0.45 (agent pid ", 10*time.Second)
	fj.stderr.waitFor(t, "exited with status 7; it left the elastic job, its host 127.0.0.45 having been removed", 10*time.Second)
	for deadline := time.Now().Add(10 * time.Second); alive(daemon1) || alive(r1.pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the remote daemon or rank still runs after its host left")
		}
	}
	fj.exit(0, 0)
	if r := fj.wait(); r.code != 0 || r.err != nil {
		t.Errorf("Run = %d, %v; want 0, nil", r.code, r.err)
	}
	if got := readLines(filepath.Join(dir, "agent.log")); len(got) != 2 || got[0] != "127.0.0.45" || got[1] != "127.0.0.45" {
		t.Errorf("agent ran for %q, want 127.0.0.45 twice (its daemon and rank)", got)
	}
}

// TestDriverRemovalFallback: the ranks of a removed host that do not take
// the removal in (their daemon predates the notice) are stopped
// --elastic-timeout after it, saying why; one that exits on its own before,
// even with status 0, is a rank that left: it does not finish the job,
// which still takes in a new host.
func TestDriverRemovalFallback(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	const timeout = 3 * time.Second
	fj := startFake(t, dir, Config{NP: 3, MinNP: 1, ElasticTimeout: timeout, Env: []string{envIgnoreRemoval + "=1"},
		HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.59:1\n127.0.0.60:2\n")})
	fj.rank(0)
	r1, r2 := fj.rank(1), fj.rank(2)
	setHosts(t, dir, "127.0.0.59:1\n")
	fj.stderr.waitFor(t, "host 127.0.0.60 is no longer discovered: telling its daemon (node 1) that the host has been removed from the elastic job; its ranks ([1] [2]) leave the job at their next reset (reset 1)", 10*time.Second)
	notice := time.Now()
	fj.exit(1, 0)
	fj.stderr.waitFor(t, "rank 1 (pid "+strconv.Itoa(r1.pid)+") exited with status 0; it left the elastic job, its host 127.0.0.60 having been removed; the job goes on with 1 rank", 10*time.Second)
	fj.stderr.waitFor(t, "the ranks of host 127.0.0.60 ([2]) still run 3s (--elastic-timeout) after its daemon (node 1) was told that the host has been removed from the elastic job; stopping them", 10*time.Second)
	if d := time.Since(notice); d < timeout-100*time.Millisecond {
		t.Errorf("the removed host's rank was stopped %v after the notice, want --elastic-timeout (%v)", d, timeout)
	}
	fj.stderr.waitFor(t, "rank 2 (pid "+strconv.Itoa(r2.pid)+") exited with status 143; it was stopped, its host 127.0.0.60 having been removed from the elastic job; the job goes on with 1 rank", 10*time.Second)
	fj.waitGone(fj.daemonPid(1), "node 1's daemon")
	setHosts(t, dir, "127.0.0.59:1\n127.0.0.61:1\n")
	fj.stderr.waitFor(t, "host 127.0.0.61 joins the elastic job: starting its hvdd daemon (node 2) for 1 rank (reset 2)", 10*time.Second)
	fj.rank(3)
	fj.exit(0, 0)
	fj.exit(3, 0)
	r := fj.wait()
	if r.code != 0 || r.err != nil {
		t.Errorf("Run = %d, %v; want 0, nil", r.code, r.err)
	}
	if strings.Contains(r.stderr, "blacklisting") {
		t.Error("the driver blacklisted something for a removed host's ranks")
	}
}

// TestDriverMaxNP: --max-np bounds the ranks: the older host is filled
// first; the ranks lost with a failed rank's host go to an existing daemon
// with a free slot; more slots do not start ranks beyond the bound.
func TestDriverMaxNP(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	fj := startFake(t, dir, Config{NP: 3, MaxNP: 3, MinNP: 1, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.46:2\n127.0.0.47:2\n")})
	r0, r2 := fj.rank(0), fj.rank(2)
	fj.rank(1)
	if filepath.Dir(r0.sock) == filepath.Dir(r2.sock) {
		t.Errorf("ranks 0 and 2 on one node; want 2 ranks on the first host, 1 on the second")
	}
	// The two daemons start together: either may log first.
	serve := readLines(filepath.Join(dir, "serve.log"))
	if len(serve) != 2 || !slices.ContainsFunc(serve, func(l string) bool { return strings.HasPrefix(l, "serve --slots 1 --nodes 2 --node-rank 1 ") }) {
		t.Errorf("daemons started as:\n%s", strings.Join(serve, "\n"))
	}
	fj.exit(1, 3) // host .46 is blacklisted, rank 0 stopped
	fj.stderr.waitFor(t, "starting 1 rank more on 127.0.0.47 (reset 2)", 10*time.Second)
	checkRank(t, 3, fj.rank(3), fakeRankInfo{rank: "1", size: "2", local: "-1/1/2", cross: "0/1", elastic: "1", sock: r2.sock})
	setHosts(t, dir, "127.0.0.46:3\n127.0.0.47:2\n")
	since := len(fj.stderr.String())
	waitDiscoveries(t, dir, 3)
	if log := fj.stderr.String()[since:]; rankStarts.MatchString(log) || strings.Contains(fj.stdout.String(), "[4]<stdout>") {
		t.Errorf("a rank was started beyond --max-np:\n%s", log)
	}
	for _, tag := range []int{2, 3} {
		fj.exit(tag, 0)
	}
	if r := fj.wait(); r.code != 0 || r.err != nil {
		t.Errorf("Run = %d, %v; want 0, nil", r.code, r.err)
	}
}

// TestDriverRendezvousListens: the driver's rendezvous listens on 127.0.0.1
// only when every host of -H is this machine, on every interface when a
// discovery script may add other hosts; it is closed when Run returns.
func TestDriverRendezvousListens(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cfg     func(dir string) Config
		allIfcs bool // reachable on 127.0.0.2, not only on 127.0.0.1
	}{
		{"fixed local hosts", func(string) Config {
			return Config{NP: 1, MinNP: 1, Hosts: []Host{{"127.0.0.51", 1}}}
		}, false},
		{"discovery", func(dir string) Config {
			return Config{NP: 1, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.52:1\n")}
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := testDir(t)
			fj := startFake(t, dir, tt.cfg(dir))
			fj.rank(0)
			m := regexp.MustCompile(`--rendezvous 127\.0\.0\.1:(\d+) `).FindStringSubmatch(strings.Join(readLines(filepath.Join(dir, "serve.log")), "\n"))
			if m == nil {
				t.Fatalf("node 0's daemon was not given the rendezvous on 127.0.0.1:\n%s", readLines(filepath.Join(dir, "serve.log")))
			}
			dial := func(host string) error {
				c, err := net.DialTimeout("tcp", net.JoinHostPort(host, m[1]), 5*time.Second)
				if err != nil {
					return err
				}
				defer c.Close()
				// A dial to a closed port in the ephemeral range can
				// connect to itself (TCP simultaneous open) when the kernel
				// picks that very port as the source: nothing listens then.
				if c.LocalAddr().String() == c.RemoteAddr().String() {
					return fmt.Errorf("connected to itself (%s): nothing listens", c.LocalAddr())
				}
				return nil
			}
			if err := dial("127.0.0.1"); err != nil {
				t.Errorf("the rendezvous does not answer on 127.0.0.1: %v", err)
			}
			if err := dial("127.0.0.2"); (err == nil) != tt.allIfcs {
				t.Errorf("dial the rendezvous on 127.0.0.2: %v; want it reachable there: %v", err, tt.allIfcs)
			}
			port, _ := strconv.Atoi(m[1])
			if !listensHere(t, port) {
				t.Errorf("no socket of this process listens on the rendezvous's port %d while the job runs", port)
			}
			fj.exit(0, 0)
			if r := fj.wait(); r.code != 0 || r.err != nil {
				t.Errorf("Run = %d, %v; want 0, nil", r.code, r.err)
			}
			// Another process (a test beside this one) may listen on the
			// port by now: what must be gone is this process's listener.
			if listensHere(t, port) {
				t.Error("the rendezvous still listens after Run returned")
			}
		})
	}
}

// listensHere reports whether a socket of this process listens on TCP port
// port (from /proc/net/tcp{,6} and /proc/self/fd).
func listensHere(t *testing.T, port int) bool {
	t.Helper()
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			// local_address is ADDR:PORT in hex; st 0A is LISTEN; field 9 the inode.
			if len(fs) < 10 || fs[3] != "0A" {
				continue
			}
			i := strings.LastIndexByte(fs[1], ':')
			if p, err := strconv.ParseInt(fs[1][i+1:], 16, 32); err == nil && int(p) == port {
				inodes[fs[9]] = true
			}
		}
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("list this process's fds: %v", err)
	}
	for _, fd := range fds {
		l, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") && inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] {
			return true
		}
	}
	return false
}
