package launch

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Error paths of the elastic driver with real daemons and Go ranks
// (driver_test.go), where what the daemons do matters.

// TestDriverE2EAddedRankFails: the rank started on a host added by
// discovery exits at once (its command cannot start there). The new
// host's daemon, which has joined the job, runs on without a rank; the
// first host's rank goes on in its epoch of one (it does not wait for the
// joiner that never came), finishes the job, and Run returns 0.
func TestDriverE2EAddedRankFails(t *testing.T) {
	t.Parallel()
	bin := buildHvdd(t)
	dir := testDir(t)
	rj := startReal(t, dir, bin, Config{NP: 1, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.71:1\n"), Env: []string{envFailNode + "=1"}})
	rj.epoch(1, 0)
	setHosts(t, dir, "127.0.0.71:1\n127.0.0.72:1\n")
	rj.stderr.waitFor(t, "hvdd run: host 127.0.0.72 joins the elastic job: starting its hvdd daemon (node 1) for 1 rank (reset 1)\n", 10*time.Second)
	rj.stderr.waitFor(t, "[1]<stderr>:train: error while loading shared libraries: libcudart.so.12: cannot open shared object file\n", 20*time.Second)
	rj.stderr.waitFor(t, ") exited with status 127; the elastic job goes on with 1 rank (--min-np 1; reset 2)\n", 20*time.Second)
	rj.stderr.waitFor(t, "hvdd run: blacklisting host 127.0.0.72 for good (no --blacklist-cooldown-range), as Horovod blacklists the host of a failed worker\n", 20*time.Second)
	rj.finish()
	rj.checkCleanedUp()
}

// TestDriverE2ESignal: SIGINT or SIGTERM sent to a real `hvdd run`
// process whose elastic driver runs a job on two hosts: hvdd run forwards
// it to the ranks, stops the daemons, leaves nothing behind, and exits
// with 128+N, as the non-elastic path does.
func TestDriverE2ESignal(t *testing.T) {
	t.Parallel()
	bin := buildHvdd(t)
	for _, tt := range []struct {
		sig   syscall.Signal
		hosts string
	}{
		{syscall.SIGINT, "127.0.0.83:1\n127.0.0.84:1\n"},
		{syscall.SIGTERM, "127.0.0.85:1\n127.0.0.86:1\n"},
	} {
		t.Run(signame(tt.sig), func(t *testing.T) {
			t.Parallel()
			dir := testDir(t)
			cmd := exec.Command(bin, "run", "-np", "2", "--host-discovery-script", discoveryScript(t, dir, tt.hosts),
				"-x", envDir+"="+dir, "--", os.Args[0], helperArg, "driver-rank")
			rj := &realJob{t: t, dir: dir, stdout: newWatchBuffer(), stderr: newWatchBuffer(), done: make(chan result, 1)}
			cmd.Stdout, cmd.Stderr = rj.stdout, rj.stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill() })
			go func() {
				cmd.Wait()
				rj.done <- result{code: cmd.ProcessState.ExitCode(), stdout: rj.stdout.String(), stderr: rj.stderr.String()}
			}()
			pids := rj.epoch(2, 0, 1)
			if err := cmd.Process.Signal(tt.sig); err != nil {
				t.Fatal(err)
			}
			r := rj.wait()
			if r.code != 128+int(tt.sig) {
				t.Errorf("hvdd run exited with %d, want %d", r.code, 128+int(tt.sig))
			}
			if want := "hvdd run: received " + signame(tt.sig) + "; forwarding it to 2 ranks"; !strings.Contains(r.stderr, want) {
				t.Errorf("stderr lacks %q", want)
			}
			for tag, pid := range pids {
				if alive(pid) {
					t.Errorf("rank [%d] (pid %d) outlived hvdd run", tag, pid)
				}
			}
			rj.checkCleanedUp()
		})
	}
}
