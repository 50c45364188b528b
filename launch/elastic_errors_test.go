package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Error paths of the elastic driver, on fake daemons and ranks
// (elastic_fake_test.go): hosts added later whose daemon or ranks cannot
// start.

// TestDriverAddedHostDaemonFails: a host added by discovery whose daemon
// cannot start (its agent cannot reach it, hvdd is not where --hvdd-path
// says, the agent or hvdd binary does not exist) is blacklisted saying
// why, and the job goes on on the first host: discovery keeps listing
// the host and nothing is started on it again (no cooldown range), and
// Run returns the first host's status, 0.
func TestDriverAddedHostDaemonFails(t *testing.T) {
	t.Parallel()
	const first, added = "127.0.0.62", "127.0.0.63"
	tests := []struct {
		name  string
		agent string // the agent's body (agentScript), or an absolute path
		cfg   func(cfg *Config, dir string)
		// want are the driver's messages, in order.
		want []string
		// pidFile, if set, is where the agent left its pid: it must have
		// been stopped.
		pidFile string
	}{
		{
			// The agent never returns (ssh hanging on the connection):
			// the daemon is not ready within --start-timeout, and the
			// driver stops the agent by closing its stdin.
			name:  "never ready",
			agent: `if [ "$1" = ` + added + ` ]; then d=$(dirname "$0"); echo $$ > "$d/agent.pid.tmp"; mv "$d/agent.pid.tmp" "$d/agent.pid"; echo "connecting to $1" >&2; exec cat >/dev/null; fi; exec sh -c "$2"`,
			cfg:   func(cfg *Config, _ string) { cfg.StartTimeout = time.Second },
			want: []string{
				"hvdd run: host " + added + " joins the elastic job: starting its hvdd daemon (node 1) for 1 rank (reset 1)\n",
				"hvdd run: the hvdd daemon on " + added + " was not ready within 1s; its last output:\n\tconnecting to " + added + "\n",
				"there (--hvdd-path), or raise --start-timeout; blacklisting host " + added + " for good (no --blacklist-cooldown-range)\n",
			},
			pidFile: "agent.pid",
		},
		{
			name:  "agent exits 255",
			agent: `if [ "$1" = ` + added + ` ]; then echo "ssh: connect to host $1 port 22: Connection refused" >&2; exit 255; fi; exec sh -c "$2"`,
			want: []string{
				"hvdd run: host " + added + " joins the elastic job: starting its hvdd daemon (node 1) for 1 rank (reset 1)\n",
				"hvdd run: the hvdd daemon on " + added + " exited with status 255 before it was ready; its last output:\n\tssh: connect to host " + added + " port 22: Connection refused\n",
				"(--hvdd-path); blacklisting host " + added + " for good (no --blacklist-cooldown-range)\n",
			},
		},
		{
			name:  "hvdd path wrong",
			agent: `exec sh -c "$2"`,
			cfg:   func(cfg *Config, _ string) { cfg.RemoteHvddPath = "/nonexistent/hvdd" },
			want: []string{
				"hvdd run: host " + added + " joins the elastic job: starting its hvdd daemon (node 1) for 1 rank (reset 1)\n",
				"hvdd run: the hvdd daemon on " + added + " exited with status 127 before it was ready; its last output:\n",
				"\tsh: 1: /nonexistent/hvdd: not found\n",
				"and that hvdd is at /nonexistent/hvdd there (--hvdd-path); blacklisting host " + added + " for good (no --blacklist-cooldown-range)\n",
			},
		},
		{
			name:  "agent missing",
			agent: "/nonexistent/agent",
			want: []string{
				"hvdd run: host " + added + " joins the elastic job: starting its hvdd daemon (node 1) for 1 rank (reset 1)\n",
				"hvdd run: start the agent for " + added + " (/nonexistent/agent): fork/exec /nonexistent/agent: no such file or directory; install ssh or pass --agent; blacklisting host " + added + " for good (no --blacklist-cooldown-range)\n",
			},
		},
		{
			// The first host through the agent, the added one this
			// machine, whose hvdd (HvddPath) is missing.
			name:  "local hvdd missing",
			agent: `exec sh -c "$2"`,
			cfg: func(cfg *Config, dir string) {
				cfg.RemoteHvddPath = cfg.HvddPath
				cfg.HvddPath = "/nonexistent/hvdd"
				cfg.localHost = func(h string) bool { return h == added }
			},
			want: []string{
				"hvdd run: host " + added + " joins the elastic job: starting its hvdd daemon (node 1) for 1 rank (reset 1)\n",
				"hvdd run: start the hvdd daemon for " + added + " (/nonexistent/hvdd): fork/exec /nonexistent/hvdd: no such file or directory; pass the hvdd binary's path; blacklisting host " + added + " for good (no --blacklist-cooldown-range)\n",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := testDir(t)
			agent := tt.agent
			if !strings.HasPrefix(agent, "/") {
				agent = agentScript(t, dir, agent)
			}
			cfg := Config{NP: 1, HostDiscoveryScript: discoveryScript(t, dir, first+":1\n"), Agent: agent,
				localHost: func(h string) bool { return h == first }}
			fj := startFakeWith(t, dir, cfg, tt.cfg)
			fj.rank(0)
			setHosts(t, dir, first+":1\n"+added+":1\n")
			for _, w := range tt.want {
				fj.stderr.waitFor(t, w, 10*time.Second)
			}
			since := len(fj.stderr.String())
			waitDiscoveries(t, dir, 3)
			if log := fj.stderr.String()[since:]; rankStarts.MatchString(log) || strings.Contains(fj.stdout.String(), "[1]<stdout>") {
				t.Errorf("something was started after host %s was blacklisted:\n%s", added, log)
			}
			checkInOrder(t, fj.stderr.String(), tt.want)
			if tt.pidFile != "" {
				fj.waitGone(readPid(t, dir, tt.pidFile), "the agent of the daemon that was not ready")
			}
			if strings.Contains(fj.stderr.String(), "while the job was running") {
				t.Errorf("a daemon that never was ready is reported as lost while the job ran:\n%s", fj.stderr)
			}
			fj.exit(0, 0)
			if r := fj.wait(); r.code != 0 || r.err != nil {
				t.Errorf("Run = %d, %v; want 0, nil", r.code, r.err)
			}
		})
	}
}

// TestDriverAddedHostDaemonBack: a host whose daemon fails to start is
// blacklisted for the cooldown, and tried again after it as a new node,
// whose daemon and rank start; the job takes them in.
func TestDriverAddedHostDaemonBack(t *testing.T) {
	t.Parallel()
	const first, added = "127.0.0.64", "127.0.0.65"
	dir := testDir(t)
	fail := filepath.Join(dir, "agent.fail")
	touch(fail)
	agent := agentScript(t, dir, `if [ "$1" = `+added+` ] && [ -e `+shellQuote(fail)+` ]; then echo "ssh: connect to host $1 port 22: No route to host" >&2; exit 255; fi; exec sh -c "$2"`)
	fj := startFake(t, dir, Config{NP: 1, MinNP: 1, HostDiscoveryScript: discoveryScript(t, dir, first+":1\n"), Agent: agent,
		localHost:         func(h string) bool { return h == first },
		BlacklistCooldown: CooldownRange{time.Second, time.Second}})
	fj.rank(0)
	setHosts(t, dir, first+":1\n"+added+":1\n")
	fj.stderr.waitFor(t, "(--hvdd-path); blacklisting host "+added+" for 1s (--blacklist-cooldown-range)\n", 10*time.Second)
	os.Remove(fail)
	fj.stderr.waitFor(t, "hvdd run: host "+added+"'s blacklisting is over (its cooldown ended)\n", 10*time.Second)
	fj.stderr.waitFor(t, "hvdd run: host "+added+" joins the elastic job: starting its hvdd daemon (node 2) for 1 rank (reset 2)\n", 10*time.Second)
	checkRank(t, 1, fj.rank(1), fakeRankInfo{rank: "1", size: "2", local: "-1/0/1", cross: "1/2", elastic: "1", sock: fj.socket(2)})
	fj.exit(0, 0)
	fj.exit(1, 0)
	if r := fj.wait(); r.code != 0 || r.err != nil {
		t.Errorf("Run = %d, %v; want 0, nil", r.code, r.err)
	}
}

// readPid waits for the file dir/name, written whole at once, and returns
// the pid it holds.
func readPid(t *testing.T, dir, name string) int {
	t.Helper()
	mustWaitForFiles(t, dir, name)
	b, err := os.ReadFile(filepath.Join(dir, name))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		t.Fatalf("read a pid from %s: %v %q", name, err, b)
	}
	return pid
}

// checkInOrder checks that out holds every string of want, in that order.
func checkInOrder(t *testing.T, out string, want []string) {
	t.Helper()
	rest := out
	for _, w := range want {
		i := strings.Index(rest, w)
		if i < 0 {
			t.Errorf("output lacks %q after the messages before it:\n%s", w, out)
			return
		}
		rest = rest[i+len(w):]
	}
}

// TestDriverDaemonExitBeforeReady: the daemon of a host being added exits
// before it is ready. The driver hears of it twice, in either order: the
// daemon's exit (daemonExited) and the end of the wait for it
// (daemonReady). Either way the host is blacklisted once, as a daemon
// that failed to start, without a reset of its own, and the job goes on.
func TestDriverDaemonExitBeforeReady(t *testing.T) {
	t.Parallel()
	for _, exitFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("exit first %v", exitFirst), func(t *testing.T) {
			t.Parallel()
			var stderr strings.Builder
			cfg := &Config{NP: 1, MinNP: 1, HostDiscoveryScript: "unused", KillGrace: time.Second}
			j := &job{cfg: cfg, o: &output{stdout: io.Discard, stderr: &stderr}, exited: []bool{false}}
			drv := newDriver(j)
			drv.hm.setDiscovered([]Host{{"a", 1}, {"b", 1}})
			drv.addNode("a", 1)
			drv.nodes[0].ready = true
			drv.ranks = []driverRank{{node: 0}}
			i := drv.addNode("b", 1)
			drv.nodes[i].reserved = 1
			drv.resets = 1 // b's addition

			cmd := exec.Command("/bin/sh", "-c", "exit 255")
			cmd.Run()
			d := &daemonProc{cmd: cmd, tail: &tailBuffer{max: 1 << 10}, done: make(chan struct{}), host: "b"}
			close(d.done)
			drv.nodes[i].d = d
			ready := readyEvent{i, errors.New("the hvdd daemon on b exited with status 255 before it was ready")}
			if exitFirst {
				drv.daemonExited(d)
				drv.daemonReady(ready)
			} else {
				drv.daemonReady(ready)
				drv.daemonExited(d)
			}
			want := "hvdd run: the hvdd daemon on b exited with status 255 before it was ready; blacklisting host b for good (no --blacklist-cooldown-range)\n"
			if got := stderr.String(); got != want {
				t.Errorf("the driver logged:\n%s\nwant:\n%s", got, want)
			}
			if !drv.hm.isBlacklisted("b") || drv.resets != 1 || drv.state != jobRunning || !drv.nodes[i].retired {
				t.Errorf("blacklisted %v, resets %d, state %d, node retired %v; want true, 1, running, true",
					drv.hm.isBlacklisted("b"), drv.resets, drv.state, drv.nodes[i].retired)
			}
		})
	}
}

// TestDriverDiscoveryFails: once the job runs, a failing discovery script
// is retried (Horovod: a transient error) while the job goes on on the
// hosts found before; a host listed meanwhile is not seen, and is taken in
// once the script works again. When it fails for longer than
// --elastic-timeout, the job stops: its ranks get SIGTERM, the daemons
// are stopped, and Run returns 1 (no rank failed) with the script's
// error.
func TestDriverDiscoveryFails(t *testing.T) {
	t.Parallel()
	const timeout = 2 * time.Second
	dir := testDir(t)
	script := discoveryScript(t, dir, "127.0.0.66:1\n")
	fj := startFake(t, dir, Config{NP: 1, ElasticTimeout: timeout, HostDiscoveryScript: script})
	r0 := fj.rank(0)
	failDiscovery(t, dir, true)
	failure := "hvdd run: Failed to execute discovery script: " + script + ". Exit code: 3; its last output:\n\tcloud API unreachable\n"
	retrying := "; retrying every 50ms for up to 2s (--elastic-timeout); the hosts found before stay\n"
	fj.stderr.waitFor(t, failure, 10*time.Second)
	fj.stderr.waitFor(t, retrying, 10*time.Second)
	setHosts(t, dir, "127.0.0.66:1\n127.0.0.67:1\n")
	since := len(fj.stderr.String())
	waitDiscoveries(t, dir, 2)
	if log := fj.stderr.String()[since:]; log != "" {
		t.Errorf("the driver logged while the script kept failing:\n%s", log)
	}
	failDiscovery(t, dir, false)
	fj.stderr.waitFor(t, "hvdd run: the host discovery script works again\n", 10*time.Second)
	fj.stderr.waitFor(t, "hvdd run: host 127.0.0.67 joins the elastic job: starting its hvdd daemon (node 1) for 1 rank (reset 1)\n", 10*time.Second)
	r1 := fj.rank(1)
	daemons := []int{fj.daemonPid(0), fj.daemonPid(1)}

	failed := time.Now()
	failDiscovery(t, dir, true)
	r := fj.wait()
	if d := time.Since(failed); d < timeout {
		t.Errorf("the job stopped %v after the script began failing, before --elastic-timeout (%v)", d, timeout)
	}
	want := "host discovery has failed for longer than --elastic-timeout (2s): Failed to execute discovery script: " + script + ". Exit code: 3; its last output:\n\tcloud API unreachable\n"
	if r.code != exitLaunchFailed || r.err == nil || !strings.HasPrefix(r.err.Error(), want) {
		t.Errorf("Run = %d, %v; want %d and an error beginning %q", r.code, r.err, exitLaunchFailed, want)
	}
	if n := strings.Count(r.stderr, retrying); n != 2 {
		t.Errorf("the driver said it retries %d times, want 2 (once per time the script began failing)", n)
	}
	if !strings.Contains(r.stderr, "cloud API unreachable\nfix the script: hvdd run runs it with /bin/sh -c in the job's working directory, and it must exit 0; stopping 2 ranks\n") {
		t.Errorf("the driver did not say that it stops the ranks:\n%s", r.stderr)
	}
	for _, pid := range append(daemons, r0.pid, r1.pid) {
		if alive(pid) {
			t.Errorf("pid %d (a rank or daemon) outlived Run", pid)
		}
	}
}

// TestDriverDiscoveryFailsWhileWaiting: a discovery script that worked
// once and then fails while the driver waits for -np slots is retried
// until --elastic-timeout; the job then fails with Horovod's message,
// saying that the script was failing, and nothing is started.
func TestDriverDiscoveryFailsWhileWaiting(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	script := discoveryScript(t, dir, "127.0.0.68:1\n")
	fj := startFake(t, dir, Config{NP: 2, ElasticTimeout: time.Second, HostDiscoveryScript: script})
	fj.stderr.waitFor(t, "hvdd run: waiting up to 1s (--elastic-timeout) for 2 slots; the hosts have 1 (127.0.0.68:1)\n", 10*time.Second)
	failDiscovery(t, dir, true)
	r := fj.wait()
	want := regexp.MustCompile(`^Timed out waiting for minimum number of slots to become available\. Please check that you have enough resources to run at least 2 Horovod processes\. \(After 1s the hosts have 1 usable slot: 127\.0\.0\.68:1; make more available, or raise --elastic-timeout\.\) The host discovery script has failed for the last \S+: Failed to execute discovery script: ` + regexp.QuoteMeta(script) + `\. Exit code: 3`)
	if r.code != exitLaunchFailed || r.err == nil || !want.MatchString(r.err.Error()) {
		t.Errorf("Run = %d, %v; want %d and an error matching %s", r.code, r.err, exitLaunchFailed, want)
	}
	if !strings.Contains(r.stderr, "cloud API unreachable\nfix the script: hvdd run runs it with /bin/sh -c in the job's working directory, and it must exit 0; retrying every 50ms\n") {
		t.Errorf("the driver did not say that it retries the script:\n%s", r.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "serve.log")); err == nil || r.stdout != "" {
		t.Error("something was started")
	}
}

// TestDriverAddedHostRankFails: on a host added by discovery, whose
// daemon starts, the rank cannot start: its command is not found there
// (through the agent: the rank exits at once with 127), cannot be executed
// on this machine, or is not in $PATH here. The host is blacklisted
// saying why, the job goes
// on with the first host's rank (discovery keeps listing the host, and
// nothing is started again without a cooldown range), and Run returns
// that rank's status, 0.
func TestDriverAddedHostRankFails(t *testing.T) {
	t.Parallel()
	const first, added = "127.0.0.69", "127.0.0.70"
	bin := "bin=" + shellQuote(os.Args[0]) + "\n"
	tests := []struct {
		name    string
		agent   string // the agent's body (agentScript)
		local   string // the host that is this machine
		command func(dir string) []string
		before  func(t *testing.T, dir string) // run before the host is added
		want    []string
	}{
		{
			name:  "command not found there",
			agent: bin + `case "$1" in ` + added + `) exec sh -c "$(printf '%s' "$2" | sed "s|$bin|/nonexistent/train|")";; esac; exec sh -c "$2"`,
			local: first,
			want: []string{
				"hvdd run: host " + added + " joins the elastic job: starting its hvdd daemon (node 1) for 1 rank (reset 1)\n",
				"hvdd run: started 1 rank on " + added + ": [1]\n",
				// env's quotes depend on the locale.
				"[1]<stderr>:env: ", "/nonexistent/train", ": No such file or directory\n",
				") exited with status 127; the elastic job goes on with 1 rank (--min-np 1; reset 2)\n",
				"hvdd run: blacklisting host " + added + " for good (no --blacklist-cooldown-range), as Horovod blacklists the host of a failed worker\n",
			},
		},
		{
			name:  "command not executable here",
			agent: `exec sh -c "$2"`,
			local: added,
			command: func(dir string) []string {
				p := filepath.Join(dir, "train")
				os.WriteFile(p, []byte("#!/bin/sh\nexec "+shellJoin(helperCmd("fake-rank"))+"\n"), 0o755)
				return []string{p}
			},
			before: func(t *testing.T, dir string) {
				if err := os.Chmod(filepath.Join(dir, "train"), 0o644); err != nil {
					t.Fatal(err)
				}
			},
			want: []string{
				"hvdd run: host " + added + " joins the elastic job: starting its hvdd daemon (node 1) for 1 rank (reset 1)\n",
				"hvdd run: start a rank on " + added + ": fork/exec ",
				"/train: permission denied; check that the command exists and is executable there; blacklisting host " + added + " for good (no --blacklist-cooldown-range), as Horovod blacklists the host of a failed worker\n",
			},
		},
		{
			// The first host runs it (the agent finds it there), this
			// machine does not have it.
			name:    "command not in $PATH here",
			agent:   bin + `case "$1" in ` + first + `) exec sh -c "$(printf '%s' "$2" | sed "s|hvdd-test-no-such-command|$bin hvdd-launch-helper fake-rank|")";; esac; exec sh -c "$2"`,
			local:   added,
			command: func(string) []string { return []string{"hvdd-test-no-such-command"} },
			want: []string{
				`hvdd run: command "hvdd-test-no-such-command" not found in $PATH; check its spelling, or give its path (e.g. ./hvdd-test-no-such-command); blacklisting host ` + added + ", which is this machine, for good (no --blacklist-cooldown-range)\n",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := testDir(t)
			cfg := Config{NP: 1, HostDiscoveryScript: discoveryScript(t, dir, first+":1\n"), Agent: agentScript(t, dir, tt.agent),
				localHost: func(h string) bool { return h == tt.local }}
			if tt.command != nil {
				cfg.Command = tt.command(dir)
			}
			fj := startFake(t, dir, cfg)
			fj.rank(0)
			if tt.before != nil {
				tt.before(t, dir)
			}
			setHosts(t, dir, first+":1\n"+added+":1\n")
			for _, w := range tt.want {
				fj.stderr.waitFor(t, w, 10*time.Second)
			}
			checkInOrder(t, fj.stderr.String(), tt.want)
			since := len(fj.stderr.String())
			waitDiscoveries(t, dir, 3)
			if log := fj.stderr.String()[since:]; rankStarts.MatchString(log) {
				t.Errorf("a rank was started again on the blacklisted host:\n%s", log)
			}
			fj.exit(0, 0)
			r := fj.wait()
			if r.code != 0 || r.err != nil {
				t.Errorf("Run = %d, %v; want 0, nil", r.code, r.err)
			}
			if strings.Contains(r.stderr, "stopping") {
				t.Errorf("the driver stopped ranks:\n%s", r.stderr)
			}
		})
	}
}

// received returns the signals the fake rank pid received, by name.
func (fj *fakeJob) received(pid int) []string {
	return readLines(filepath.Join(fj.dir, "sig."+strconv.Itoa(pid)))
}

// waitSig waits until the fake rank pid has received a signal.
func (fj *fakeJob) waitSig(pid int) {
	fj.t.Helper()
	mustWaitForFiles(fj.t, fj.dir, "sig."+strconv.Itoa(pid))
}

// TestDriverSignals: SIGINT and SIGTERM sent to hvdd run while the
// elastic driver runs a job on this machine's host and a host reached
// through the agent are forwarded as by the non-elastic path: the local
// rank gets the signal, the remote one SIGTERM (its agent's stdin
// closed), the daemons are stopped, and Run returns 128+N with no error.
func TestDriverSignals(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		sig     syscall.Signal
		host    string // the agent's host; 127.0.0.73 is this machine
		message string
	}{
		{syscall.SIGINT, "127.0.0.74", "hvdd run: received SIGINT; forwarding it to 2 ranks (Ctrl-C again to kill them now)\n"},
		{syscall.SIGTERM, "127.0.0.75", "hvdd run: received SIGTERM; forwarding it to 2 ranks\n"},
	} {
		t.Run(signame(tt.sig), func(t *testing.T) {
			t.Parallel()
			dir := testDir(t)
			fj := startFake(t, dir, Config{NP: 2, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.73:1\n"+tt.host+":1\n"),
				Agent: agentScript(t, dir, `exec sh -c "$2"`), localHost: func(h string) bool { return h == "127.0.0.73" }})
			ranks := []int{fj.rank(0).pid, fj.rank(1).pid}
			pids := append([]int{fj.daemonPid(0), fj.daemonPid(1)}, ranks...)
			fj.sigs <- tt.sig
			r := fj.wait()
			if r.code != 128+int(tt.sig) || r.err != nil {
				t.Errorf("Run = %d, %v; want %d, nil", r.code, r.err, 128+int(tt.sig))
			}
			if !strings.Contains(r.stderr, tt.message) {
				t.Errorf("stderr lacks %q", tt.message)
			}
			// Rank 0 runs here (tag 0: host 127.0.0.73 comes first).
			for i, want := range []string{signame(tt.sig), "SIGTERM"} {
				if got := fj.received(ranks[i]); !slices.Equal(got, []string{want}) {
					t.Errorf("rank %d received %q, want [%s]", i, got, want)
				}
			}
			for _, pid := range pids {
				if alive(pid) {
					t.Errorf("pid %d (a rank or daemon) outlived Run", pid)
				}
			}
		})
	}
}

// TestDriverSecondSIGINT: ranks that survive the SIGINT forwarded to them
// are killed by a second one, long before the kill grace.
func TestDriverSecondSIGINT(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	fj := startFake(t, dir, Config{NP: 2, KillGrace: time.Hour, Env: []string{envStubborn + "=1"},
		HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.76:1\n127.0.0.77:1\n")})
	r0, r1 := fj.rank(0), fj.rank(1)
	fj.sigs <- syscall.SIGINT
	fj.waitSig(r0.pid)
	fj.waitSig(r1.pid)
	fj.sigs <- syscall.SIGINT
	r := fj.wait()
	if r.code != 130 || r.err != nil {
		t.Errorf("Run = %d, %v; want 130, nil", r.code, r.err)
	}
	if want := "hvdd run: received SIGINT again; killing 2 ranks\n"; !strings.Contains(r.stderr, want) {
		t.Errorf("stderr lacks %q", want)
	}
	if alive(r0.pid) || alive(r1.pid) || alive(fj.daemonPid(0)) || alive(fj.daemonPid(1)) {
		t.Error("a rank or daemon outlived Run")
	}
}

// TestDriverContextCancel: cancelling Run's ctx stops the elastic job as
// SIGTERM does (every rank gets SIGTERM, the daemons are stopped), and
// Run returns 143 with an error wrapping context.Canceled.
func TestDriverContextCancel(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	fj := startFake(t, dir, Config{NP: 2, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.78:1\n127.0.0.79:1\n")})
	r0, r1 := fj.rank(0), fj.rank(1)
	daemons := []int{fj.daemonPid(0), fj.daemonPid(1)}
	fj.cancel()
	r := fj.wait()
	if r.code != 143 || !errors.Is(r.err, context.Canceled) || r.err.Error() != "job stopped: context canceled" {
		t.Errorf("Run = %d, %v; want 143, job stopped: context canceled", r.code, r.err)
	}
	if want := "hvdd run: context canceled; stopping 2 ranks\n"; !strings.Contains(r.stderr, want) {
		t.Errorf("stderr lacks %q", want)
	}
	for _, pid := range []int{r0.pid, r1.pid} {
		if got := fj.received(pid); !slices.Equal(got, []string{"SIGTERM"}) {
			t.Errorf("rank pid %d received %q, want [SIGTERM]", pid, got)
		}
	}
	for _, pid := range daemons {
		if alive(pid) {
			t.Errorf("daemon pid %d outlived Run", pid)
		}
	}
}

// TestDriverStopWhileStarting: a signal, or ctx cancelled, while the
// driver waits for -np slots ends the start (128+N, 143) with nothing
// started; a signal while a host's daemon is still starting stops the job
// and that daemon's agent too.
func TestDriverStopWhileStarting(t *testing.T) {
	t.Parallel()
	waiting := "hvdd run: waiting up to 10m0s (--elastic-timeout) for 2 slots; the hosts have 1 (127.0.0.80:1)\n"
	t.Run("signal while waiting for slots", func(t *testing.T) {
		t.Parallel()
		dir := testDir(t)
		fj := startFake(t, dir, Config{NP: 2, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.80:1\n")})
		fj.stderr.waitFor(t, waiting, 10*time.Second)
		fj.sigs <- syscall.SIGTERM
		r := fj.wait()
		if r.code != 143 || r.err == nil || r.err.Error() != "interrupted by SIGTERM while starting the elastic job" {
			t.Errorf("Run = %d, %v; want 143, interrupted by SIGTERM while starting the elastic job", r.code, r.err)
		}
		if _, err := os.Stat(filepath.Join(dir, "serve.log")); err == nil || r.stdout != "" {
			t.Error("something was started")
		}
	})
	t.Run("ctx cancelled while waiting for slots", func(t *testing.T) {
		t.Parallel()
		dir := testDir(t)
		fj := startFake(t, dir, Config{NP: 2, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.80:1\n")})
		fj.stderr.waitFor(t, waiting, 10*time.Second)
		fj.cancel()
		r := fj.wait()
		if r.code != 143 || !errors.Is(r.err, context.Canceled) || !strings.HasPrefix(r.err.Error(), "waiting for 2 slots: ") {
			t.Errorf("Run = %d, %v; want 143, waiting for 2 slots: context canceled", r.code, r.err)
		}
		if _, err := os.Stat(filepath.Join(dir, "serve.log")); err == nil || r.stdout != "" {
			t.Error("something was started")
		}
	})
	t.Run("signal while a host's daemon starts", func(t *testing.T) {
		t.Parallel()
		dir := testDir(t)
		// The agent of 127.0.0.82 never returns, as ssh hanging.
		agent := agentScript(t, dir, `if [ "$1" = 127.0.0.82 ]; then d=$(dirname "$0"); echo $$ > "$d/agent.pid.tmp"; mv "$d/agent.pid.tmp" "$d/agent.pid"; exec cat >/dev/null; fi; exec sh -c "$2"`)
		fj := startFake(t, dir, Config{NP: 1, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.81:1\n"), Agent: agent,
			localHost: func(h string) bool { return h == "127.0.0.81" }})
		r0 := fj.rank(0)
		setHosts(t, dir, "127.0.0.81:1\n127.0.0.82:1\n")
		agentPid := readPid(t, dir, "agent.pid")
		fj.sigs <- syscall.SIGTERM
		r := fj.wait()
		if r.code != 143 || r.err != nil {
			t.Errorf("Run = %d, %v; want 143, nil", r.code, r.err)
		}
		if got := fj.received(r0.pid); !slices.Equal(got, []string{"SIGTERM"}) {
			t.Errorf("rank 0 received %q, want [SIGTERM]", got)
		}
		if alive(agentPid) || alive(fj.daemonPid(0)) {
			t.Error("the starting daemon's agent or node 0's daemon outlived Run")
		}
	})
}
