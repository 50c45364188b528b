package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
)

// End-to-end tests of the elastic driver: real daemons (the hvdd binary)
// and ranks of the Go client (driverRankHelper), on loopback addresses
// 127.0.0.20-127.0.0.29.

// driverRankHelper is a rank of a real elastic job, looping as hvd.elastic.run
// does: every step sums 1 over the ranks; rank 0 adds whether the daemon
// told it of a host update (HostsUpdates, polled every step) and whether
// $HVDD_TEST_DIR/finish exists, so that every rank learns both at the same
// step. On a host update every rank re-initialises (CloseToReset, then
// Init: the joiners come in, the ranks of a removed host are refused); on
// a lost rank (a failed step) too (Close, Init), after printing a LOST
// line. It prints a line per epoch, and exits with the code in
// $HVDD_TEST_DIR/exit.<pid> (without Close: a lost rank) as soon as that
// file appears. A rank whose Init is refused because its host was removed
// ("<host>[<local_rank>] has been removed from elastic job") prints a
// REMOVED line and exits with exitRemoved. On node $HVDD_TEST_FAIL_NODE
// it exits with 127 at once, before Init, as a command that cannot start
// there. With $HVDD_TEST_LINGER (a duration) it ends the job as Python's
// atexit shutdown does (CloseAtExit) and exits that long after, as a
// process whose teardown is slow on a loaded machine.
func driverRankHelper() int {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir, pid := os.Getenv(envDir), os.Getpid()
	if n := os.Getenv(envFailNode); n != "" && strings.HasSuffix(filepath.Dir(os.Getenv("HVDD_SOCKET")), "-"+n) {
		// As a command that cannot start there.
		fmt.Fprintln(os.Stderr, "train: error while loading shared libraries: libcudart.so.12: cannot open shared object file")
		return 127
	}
	exitCode := func() int {
		b, err := os.ReadFile(filepath.Join(dir, "exit."+strconv.Itoa(pid)))
		if err != nil {
			return -1
		}
		code, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return code
	}
	for {
		c := &hvdd.Client{Elastic: true}
		if err := c.Init(ctx); err != nil {
			if strings.Contains(err.Error(), "has been removed from elastic job") {
				fmt.Printf("REMOVED pid=%d: %v\n", pid, err)
				return exitRemoved
			}
			fmt.Fprintln(os.Stderr, "init:", err)
			return 1
		}
		fmt.Printf("EPOCH epoch=%d rank=%d size=%d pid=%d socket=%s\n", c.Epoch(), c.Rank(), c.Size(), pid, os.Getenv("HVDD_SOCKET"))
		for step := 0; ; step++ {
			if code := exitCode(); code >= 0 {
				fmt.Fprintf(os.Stderr, "rank %d exiting with %d\n", c.Rank(), code)
				return code
			}
			x := []float32{1, 0, 0}
			if c.Rank() == 0 {
				if len(c.HostsUpdates()) > 0 {
					x[1] = 1
				}
				if _, err := os.Stat(filepath.Join(dir, "finish")); err == nil {
					x[2] = 1
				}
			}
			err := hvdd.Allreduce(ctx, c, x, hvdd.WithName(fmt.Sprint("step.", step)), hvdd.WithOp(hvdd.Sum))
			var herr *hvdd.Error
			switch {
			case errors.As(err, &herr):
				fmt.Printf("LOST rank=%d size=%d pid=%d: %v\n", c.Rank(), c.Size(), pid, err)
				c.Close() // a rank was lost: re-form
			case err != nil:
				fmt.Fprintln(os.Stderr, "allreduce:", err)
				return 1
			case int(x[0]) != c.Size():
				fmt.Fprintf(os.Stderr, "sum %g over %d ranks\n", x[0], c.Size())
				return 1
			case x[2] > 0:
				if linger, err := time.ParseDuration(os.Getenv(envLinger)); err == nil {
					c.CloseAtExit()
					time.Sleep(linger)
					return 0
				}
				c.Close()
				return 0
			case x[1] > 0:
				c.CloseToReset()
			default:
				time.Sleep(20 * time.Millisecond)
				continue
			}
			break
		}
	}
}

var epochLine = regexp.MustCompile(`(?m)^\[(\d+)\]<stdout>:EPOCH epoch=(\d+) rank=(\d+) size=(\d+) pid=(\d+) socket=\S+$`)

// realJob is a job of real daemons and driverRankHelper ranks run by the
// driver.
type realJob struct {
	t              *testing.T
	dir            string
	stdout, stderr *watchBuffer
	done           chan result
}

func startReal(t *testing.T, dir, hvddBin string, cfg Config) *realJob {
	t.Helper()
	rj := &realJob{t: t, dir: dir, stdout: newWatchBuffer(), stderr: newWatchBuffer(), done: make(chan result, 1)}
	cfg.HvddPath, cfg.Command = hvddBin, helperCmd("driver-rank")
	cfg.Env = append(cfg.Env, envDir+"="+dir)
	cfg.Stdout, cfg.Stderr, cfg.Signals = rj.stdout, rj.stderr, make(chan os.Signal)
	if cfg.discoverEvery == 0 {
		cfg.discoverEvery = 100 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	go func() {
		defer cancel()
		code, err := Run(ctx, cfg)
		rj.done <- result{code, err, rj.stdout.String(), rj.stderr.String()}
	}()
	return rj
}

// epoch waits until every rank tagged tags has printed an epoch of size
// ranks, and returns the pids by tag. It fails at once if Run returns
// first.
func (rj *realJob) epoch(size int, tags ...int) map[int]int {
	rj.t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for {
		var ended *result
		select {
		case r := <-rj.done:
			ended = &r
			rj.done <- r // for wait
		default:
		}
		pids := map[int]int{}
		for _, m := range epochLine.FindAllStringSubmatch(rj.stdout.String(), -1) {
			tag, _ := strconv.Atoi(m[1])
			pid, _ := strconv.Atoi(m[5])
			if m[4] == strconv.Itoa(size) {
				pids[tag] = pid
			}
		}
		all := true
		for _, tag := range tags {
			_, ok := pids[tag]
			all = all && ok
		}
		if all {
			return pids
		}
		if ended != nil {
			rj.t.Fatalf("Run returned %d, %v before ranks %v all reached an epoch of %d ranks\nstdout:\n%s\nstderr:\n%s", ended.code, ended.err, tags, size, ended.stdout, ended.stderr)
		}
		if time.Now().After(deadline) {
			rj.t.Fatalf("ranks %v did not all reach an epoch of %d ranks\nstdout:\n%s\nstderr:\n%s", tags, size, rj.stdout, rj.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exit makes the rank whose pid is pid exit with code (a lost rank).
func (rj *realJob) exit(pid, code int) {
	rj.t.Helper()
	if err := writeAtomically(filepath.Join(rj.dir, "exit."+strconv.Itoa(pid)), []byte(strconv.Itoa(code))); err != nil {
		rj.t.Fatal(err)
	}
}

// finish makes the ranks end the job together, with status 0, and checks
// that Run returns 0, nil.
func (rj *realJob) finish() result {
	rj.t.Helper()
	touch(filepath.Join(rj.dir, "finish"))
	r := rj.wait()
	if r.code != 0 || r.err != nil {
		rj.t.Errorf("Run = %d, %v; want 0, nil", r.code, r.err)
	}
	return r
}

func (rj *realJob) wait() result {
	rj.t.Helper()
	select {
	case r := <-rj.done:
		if testing.Verbose() || rj.t.Failed() {
			rj.t.Logf("code %d, err %v\nstdout:\n%.6000s\nstderr:\n%.6000s", r.code, r.err, r.stdout, r.stderr)
		}
		return r
	case <-time.After(60 * time.Second):
		rj.t.Fatalf("Run did not return\nstdout:\n%s\nstderr:\n%s", rj.stdout, rj.stderr)
		return result{}
	}
}

// checkCleanedUp checks that the job left no daemon or socket directory
// behind.
func (rj *realJob) checkCleanedUp() {
	rj.t.Helper()
	dirs := map[string]bool{}
	for _, m := range regexp.MustCompile(`/tmp/hvdd-run-[0-9a-f]+-\d+`).FindAllString(rj.stdout.String(), -1) {
		dirs[m] = true
	}
	for dir := range dirs {
		if _, err := os.Stat(dir); err == nil {
			rj.t.Errorf("socket directory %s was left behind", dir)
		}
		if ps := jobProcesses(dir); len(ps) > 0 {
			rj.t.Errorf("processes of the job still run after Run returned:\n%s", strings.Join(ps, "\n"))
		}
	}
}

// TestDriverE2ERefill (a): -H with --min-np and a cooldown range: a rank
// fails, its host is blacklisted and its other rank stopped, the others
// re-form without them, and after the cooldown the host comes back as a
// new node (2) whose ranks [4] [5] join the job.
func TestDriverE2ERefill(t *testing.T) {
	t.Parallel()
	bin := buildHvdd(t)
	dir := testDir(t)
	rj := startReal(t, dir, bin, Config{
		NP: 4, MinNP: 2, Hosts: []Host{{"127.0.0.20", 2}, {"127.0.0.21", 2}},
		BlacklistCooldown: CooldownRange{time.Second, time.Second},
	})
	pids := rj.epoch(4, 0, 1, 2, 3)
	rj.exit(pids[3], 3)
	rj.stderr.waitFor(t, "blacklisting host 127.0.0.21 for 1s (--blacklist-cooldown-range), as Horovod blacklists the host of a failed worker; stopping its other ranks ([2])", 10*time.Second)
	rj.epoch(2, 0, 1)
	rj.stderr.waitFor(t, "host 127.0.0.21 joins the elastic job: starting its hvdd daemon (node 2) for 2 ranks", 20*time.Second)
	rj.stderr.waitFor(t, "started 2 ranks on 127.0.0.21: [4] [5]", 20*time.Second)
	rj.epoch(4, 0, 1, 4, 5)
	rj.finish()
	rj.checkCleanedUp()
}

// TestDriverE2EAddHost (b): a job discovered on one host takes in a second
// one: a daemon starts there (node 1), its ranks join, and every rank goes
// on in an epoch of 3.
func TestDriverE2EAddHost(t *testing.T) {
	t.Parallel()
	bin := buildHvdd(t)
	dir := testDir(t)
	rj := startReal(t, dir, bin, Config{NP: 1, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.22:1\n")})
	rj.epoch(1, 0)
	setHosts(t, dir, "127.0.0.22:1\n127.0.0.23:2\n")
	rj.stderr.waitFor(t, "host 127.0.0.23 joins the elastic job: starting its hvdd daemon (node 1) for 2 ranks", 10*time.Second)
	rj.epoch(3, 0, 1, 2)
	rj.finish()
	rj.checkCleanedUp()
}

// removalTimeout is the --elastic-timeout of the jobs that remove a host:
// how long the driver waits for the removed host's ranks to leave before
// it stops them (so that a rank that ignores the removal fails the test
// in seconds, not in the default 600).
const removalTimeout = 10 * time.Second

// TestDriverE2ERemoveHost (c): a host that is no longer discovered is
// removed as Horovod removes one: the driver tells its daemon, rank 0
// learns of the update, every rank resets at the same step, and the
// removed host's ranks are refused in their re-init ("... has been removed
// from elastic job"); the others re-form without them, without seeing a
// lost rank, and finish.
func TestDriverE2ERemoveHost(t *testing.T) {
	t.Parallel()
	bin := buildHvdd(t)
	dir := testDir(t)
	rj := startReal(t, dir, bin, Config{NP: 3, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.24:1\n127.0.0.25:2\n"), MinNP: 1, ElasticTimeout: removalTimeout})
	rj.epoch(3, 0, 1, 2)
	setHosts(t, dir, "127.0.0.24:1\n")
	rj.stderr.waitFor(t, "host 127.0.0.25 is no longer discovered: telling its daemon (node 1) that the host has been removed from the elastic job; its ranks ([1] [2]) leave the job at their next reset", 10*time.Second)
	rj.epoch(1, 0)
	rj.checkRemoved("127.0.0.25", 1, 2)
	rj.finish()
	rj.checkCleanedUp()
}

// TestDriverE2EAddThenRemove: Horovod's "hosts added and removed"
// schedule in one job: a host is added (epoch of 3), then the first host,
// node 0 and the job's first coordinator, is removed (epoch of 2, the
// coordination moving to the added host's daemon), and the job finishes.
func TestDriverE2EAddThenRemove(t *testing.T) {
	t.Parallel()
	bin := buildHvdd(t)
	dir := testDir(t)
	rj := startReal(t, dir, bin, Config{NP: 1, MinNP: 1, ElasticTimeout: removalTimeout, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.60:1\n")})
	rj.epoch(1, 0)
	setHosts(t, dir, "127.0.0.60:1\n127.0.0.61:2\n")
	rj.stderr.waitFor(t, "host 127.0.0.61 joins the elastic job: starting its hvdd daemon (node 1) for 2 ranks", 10*time.Second)
	rj.epoch(3, 0, 1, 2)
	setHosts(t, dir, "127.0.0.61:2\n")
	rj.stderr.waitFor(t, "host 127.0.0.60 is no longer discovered: telling its daemon (node 0) that the host has been removed from the elastic job", 10*time.Second)
	rj.epoch(2, 1, 2)
	rj.checkRemoved("127.0.0.60", 0)
	rj.finish()
	rj.checkCleanedUp()
}

// checkRemoved checks that the ranks tagged tags, of host, left the job
// because it was removed (each printed the refusal of its re-init, with
// its own local rank, and the driver saw it exit with exitRemoved, not
// stopped), and that no rank saw a rank lost.
func (rj *realJob) checkRemoved(host string, tags ...int) {
	rj.t.Helper()
	// A rank's exit is reported once its output is in. (The driver's
	// line: the daemons' logs name ranks as "rank N (pid P)" too.)
	for _, tag := range tags {
		rj.stderr.waitFor(rj.t, fmt.Sprintf("hvdd run: rank %d (pid ", tag), 20*time.Second)
	}
	out := rj.stdout.String()
	if lost := regexp.MustCompile(`(?m)^\[\d+\]<stdout>:LOST .*$`).FindAllString(out, -1); len(lost) > 0 {
		rj.t.Errorf("ranks saw a rank lost when host %s was removed:\n%s", host, strings.Join(lost, "\n"))
	}
	locals := map[string]bool{}
	for _, tag := range tags {
		re := regexp.MustCompile(`(?m)^\[` + strconv.Itoa(tag) + `\]<stdout>:REMOVED .*` + regexp.QuoteMeta(host) + `\[(\d+)\] has been removed from elastic job`)
		m := re.FindStringSubmatch(out)
		if m == nil {
			rj.t.Errorf("rank [%d] did not report that its host %s has been removed from elastic job", tag, host)
			continue
		}
		locals[m[1]] = true
		want := regexp.MustCompile(`rank ` + strconv.Itoa(tag) + ` \(pid \d+\) exited with status ` + strconv.Itoa(exitRemoved) + `; it left the elastic job, its host ` + regexp.QuoteMeta(host) + ` having been removed`)
		if !want.MatchString(rj.stderr.String()) {
			rj.t.Errorf("the driver did not see rank [%d] leave with status %d", tag, exitRemoved)
		}
	}
	if len(locals) > 0 && len(locals) != len(tags) {
		rj.t.Errorf("the removed ranks reported local ranks %v, want %d different ones", locals, len(tags))
	}
	if strings.Contains(rj.stderr.String(), "was told that the host has been removed from the elastic job; stopping them") {
		rj.t.Errorf("the driver had to stop the removed host's ranks after --elastic-timeout")
	}
}

// TestDriverE2EMinNPTimeout (d): fewer slots than -np within
// --elastic-timeout: Horovod's error, and nothing hangs or is started.
func TestDriverE2EMinNPTimeout(t *testing.T) {
	t.Parallel()
	bin := buildHvdd(t)
	dir := testDir(t)
	start := time.Now()
	rj := startReal(t, dir, bin, Config{NP: 2, MinNP: 2, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.26:1\n"), ElasticTimeout: time.Second})
	r := rj.wait()
	want := "Timed out waiting for minimum number of slots to become available. Please check that you have enough resources to run at least 2 Horovod processes."
	if r.code != exitLaunchFailed || r.err == nil || !strings.HasPrefix(r.err.Error(), want) {
		t.Errorf("Run = %d, %v; want %d and %q", r.code, r.err, exitLaunchFailed, want)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Run returned after %v, want about 1s", d)
	}
	if r.stdout != "" || strings.Contains(r.stderr, "[hvdd") {
		t.Errorf("something was started:\n%s\n%s", r.stdout, r.stderr)
	}
}

// TestDriverE2EAllBlacklisted (e): without a cooldown range, a failed
// rank's host stays out; when the last host's rank fails too, every host
// is blacklisted and the job stops saying so.
func TestDriverE2EAllBlacklisted(t *testing.T) {
	t.Parallel()
	bin := buildHvdd(t)
	dir := testDir(t)
	rj := startReal(t, dir, bin, Config{NP: 2, MinNP: 1, Hosts: []Host{{"127.0.0.27", 1}, {"127.0.0.28", 1}}})
	pids := rj.epoch(2, 0, 1)
	rj.exit(pids[1], 3)
	rj.stderr.waitFor(t, "blacklisting host 127.0.0.28 for good", 20*time.Second)
	rj.epoch(1, 0)
	rj.exit(pids[0], 5)
	r := rj.wait()
	want := "every host of the elastic job is blacklisted (127.0.0.27:1, 127.0.0.28:1), so it stops"
	if r.code != 5 || r.err == nil || !strings.Contains(r.err.Error(), want) {
		t.Errorf("Run = %d, %v; want 5 and %q", r.code, r.err, want)
	}
	rj.checkCleanedUp()
}

// TestDriverE2EHostBack: a host whose daemon dies is blacklisted and its
// rank stopped; after the cooldown it comes back as a new node (index 2,
// never reused), whose rank joins the job.
func TestDriverE2EHostBack(t *testing.T) {
	t.Parallel()
	bin := buildHvdd(t)
	dir := testDir(t)
	rj := startReal(t, dir, bin, Config{
		NP: 2, MinNP: 1, Hosts: []Host{{"127.0.0.48", 1}, {"127.0.0.49", 1}},
		BlacklistCooldown: CooldownRange{time.Second, time.Second},
	})
	rj.epoch(2, 0, 1)
	m := regexp.MustCompile(`\[1\]<stdout>:EPOCH .* socket=(\S+)`).FindStringSubmatch(rj.stdout.String())
	if err := killDaemon(m[1]); err != nil {
		t.Fatal(err)
	}
	rj.stderr.waitFor(t, "blacklisting host 127.0.0.49 for 1s (--blacklist-cooldown-range) and stopping the ranks on it ([1])", 10*time.Second)
	rj.epoch(1, 0)
	rj.stderr.waitFor(t, "host 127.0.0.49's blacklisting is over", 10*time.Second)
	rj.stderr.waitFor(t, "host 127.0.0.49 joins the elastic job: starting its hvdd daemon (node 2) for 1 rank", 10*time.Second)
	pids := rj.epoch(2, 0, 2)
	if m := regexp.MustCompile(`\[2\]<stdout>:EPOCH .* socket=(\S+)`).FindStringSubmatch(rj.stdout.String()); m == nil || !strings.HasSuffix(filepath.Dir(m[1]), "-2") {
		t.Errorf("rank [2] is not on node 2's socket: %v", m)
	}
	rj.finish()
	if alive(pids[2]) {
		t.Error("rank [2] outlived Run")
	}
	rj.checkCleanedUp()
}

// Host 0 is a host like the others: its daemon (node 0, the job's first
// coordinator) may die, its host leave, or its last rank fail, and the
// job goes on on the other hosts. The rendezvous is the driver's, so it
// outlives node 0; the daemons move the coordination to another node.

// socketOf returns the socket of the rank tagged tag, from its first epoch
// line.
func (rj *realJob) socketOf(tag int) string {
	rj.t.Helper()
	m := regexp.MustCompile(`\[` + strconv.Itoa(tag) + `\]<stdout>:EPOCH .* socket=(\S+)`).FindStringSubmatch(rj.stdout.String())
	if m == nil {
		rj.t.Fatalf("rank [%d] printed no epoch:\n%s", tag, rj.stdout)
	}
	return m[1]
}

// TestDriverE2EHost0DaemonLost: host 0's daemon is SIGKILLed: host 0 is
// blacklisted and its rank stopped, and the ranks of host 1 re-form the
// job without node 0 and finish it.
func TestDriverE2EHost0DaemonLost(t *testing.T) {
	t.Parallel()
	bin := buildHvdd(t)
	dir := testDir(t)
	rj := startReal(t, dir, bin, Config{NP: 3, MinNP: 1, Hosts: []Host{{"127.0.0.53", 1}, {"127.0.0.54", 2}}})
	rj.epoch(3, 0, 1, 2)
	if err := killDaemon(rj.socketOf(0)); err != nil {
		t.Fatal(err)
	}
	rj.stderr.waitFor(t, "blacklisting host 127.0.0.53 for good (no --blacklist-cooldown-range) and stopping the ranks on it ([0])", 10*time.Second)
	rj.epoch(2, 1, 2)
	rj.finish()
	rj.checkCleanedUp()
}

// TestDriverE2EHost0Leaves: host 0 is no longer discovered: its daemon
// (node 0, the job's coordinator) is told that it has been removed, its
// rank is refused at the ranks' reset, the ranks of host 1 re-form the job
// without seeing a rank lost and finish it, and node 0's daemon is
// stopped.
func TestDriverE2EHost0Leaves(t *testing.T) {
	t.Parallel()
	bin := buildHvdd(t)
	dir := testDir(t)
	rj := startReal(t, dir, bin, Config{NP: 3, MinNP: 1, ElasticTimeout: removalTimeout, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.55:1\n127.0.0.56:2\n")})
	rj.epoch(3, 0, 1, 2)
	setHosts(t, dir, "127.0.0.56:2\n")
	rj.stderr.waitFor(t, "host 127.0.0.55 is no longer discovered: telling its daemon (node 0) that the host has been removed from the elastic job; its ranks ([0]) leave the job at their next reset", 10*time.Second)
	rj.epoch(2, 1, 2)
	rj.checkRemoved("127.0.0.55", 0)
	rj.finish()
	rj.checkCleanedUp()
}

// TestDriverE2EHost0RankLost: host 0's only rank fails (no cooldown: the
// host stays out, its daemon is stopped), and host 1's rank goes on alone
// and finishes.
func TestDriverE2EHost0RankLost(t *testing.T) {
	t.Parallel()
	bin := buildHvdd(t)
	dir := testDir(t)
	rj := startReal(t, dir, bin, Config{NP: 2, MinNP: 1, Hosts: []Host{{"127.0.0.57", 1}, {"127.0.0.58", 1}}})
	pids := rj.epoch(2, 0, 1)
	rj.exit(pids[0], 3)
	rj.stderr.waitFor(t, "blacklisting host 127.0.0.57 for good", 20*time.Second)
	rj.epoch(1, 1)
	rj.finish()
	rj.checkCleanedUp()
}

// TestDriverE2EFinishSlowExit is run 11's failure of the test command: the
// ranks end the job together, saying their processes exit (Python's atexit
// shutdown), and take longer to exit than the report wait, as an
// interpreter's teardown can on a loaded machine. Their daemons report the
// next epoch empty. hvdd run must wait for their exit statuses (0: the job
// finished) rather than stop them as ranks that left an epoch but still
// run, judge their signal exits failures and end the finished job with an
// error.
func TestDriverE2EFinishSlowExit(t *testing.T) {
	t.Parallel()
	bin := buildHvdd(t)
	dir := testDir(t)
	rj := startReal(t, dir, bin, Config{
		NP: 4, MinNP: 2, Hosts: []Host{{"127.0.0.92", 2}, {"127.0.0.93", 2}},
		Env: []string{envLinger + "=2s"}, reportWait: 200 * time.Millisecond,
	})
	rj.epoch(4, 0, 1, 2, 3)
	r := rj.finish()
	if !strings.Contains(r.stderr, "saying its process exits") {
		t.Errorf("hvdd run did not say it waits for the ranks that said they exit:\n%s", r.stderr)
	}
	for _, bad := range []string{"stopping it", "blacklisting"} {
		if strings.Contains(r.stderr, bad) {
			t.Errorf("hvdd run's log has %q: it judged ranks of a finished job:\n%s", bad, r.stderr)
		}
	}
	rj.checkCleanedUp()
}
