package launch

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	hvdd "github.com/hvdd/hvdd/clients/go"
)

// watchBuffer is a goroutine-safe buffer whose reader can wait for text.
type watchBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

func newWatchBuffer() *watchBuffer { return &watchBuffer{changed: make(chan struct{}, 1)} }

func (w *watchBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case w.changed <- struct{}{}:
	default:
	}
	return w.buf.Write(p)
}

func (w *watchBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// waitFor waits until the buffer holds s.
func (w *watchBuffer) waitFor(t *testing.T, s string, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for !strings.Contains(w.String(), s) {
		select {
		case <-w.changed:
		case <-deadline:
			t.Fatalf("output lacks %q after %v:\n%s", s, d, w.String())
		}
	}
}

// TestRunElasticGoesOn: with --min-np, a failed rank does not stop the
// others while enough run; the job then ends as they do.
func TestRunElasticGoesOn(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	stderr := newWatchBuffer()
	sigs, done := start(t.Context(), t, Config{
		NP: 3, MinNP: 2, Command: helperCmd("job"), Stderr: stderr,
		Env: []string{envDir + "=" + dir, envFailRank + "=1", envFailCode + "=3"},
	})
	stderr.waitFor(t, "; the elastic job goes on with 2 ranks (--min-np 2; reset 1)", 20*time.Second)
	sigs <- syscall.SIGTERM
	r := <-done
	if r.code != 128+int(syscall.SIGTERM) || r.err != nil {
		t.Fatalf("Run = %d, %v; want %d, nil\n%s", r.code, r.err, 128+int(syscall.SIGTERM), stderr)
	}
	// The survivors got the forwarded SIGTERM only, nothing on the failure.
	for _, rank := range []int{0, 2} {
		if got := readLines(filepath.Join(dir, "sig."+strconv.Itoa(rank))); !slices.Equal(got, []string{"SIGTERM"}) {
			t.Errorf("rank %d received %q, want [SIGTERM]", rank, got)
		}
	}
}

// TestRunElasticBelowMin: a failure that leaves fewer than --min-np ranks
// stops the job as a plain one stops.
func TestRunElasticBelowMin(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	r := run(t, Config{
		NP: 3, MinNP: 3, Command: helperCmd("job"),
		Env: []string{envDir + "=" + dir, envFailRank + "=1", envFailCode + "=3"},
	})
	if r.code != 3 || r.err != nil {
		t.Fatalf("Run = %d, %v; want 3, nil\n%s", r.code, r.err, r.stderr)
	}
	if want := "; 2 ranks left, fewer than --min-np 3; stopping the other 2 ranks"; !strings.Contains(r.stderr, want) {
		t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
	}
}

// TestRunElasticEnv: the ranks of an elastic job run with HOROVOD_ELASTIC=1
// (what clients send the daemon), those of others without it.
func TestRunElasticEnv(t *testing.T) {
	t.Parallel()
	for _, min := range []int{0, 1} {
		r := run(t, Config{NP: 2, MinNP: min, Command: []string{"sh", "-c", "echo elastic=$HOROVOD_ELASTIC"}})
		want := "elastic="
		if min > 0 {
			want = "elastic=1"
		}
		if r.code != 0 || strings.Count(r.stdout, want+"\n") != 2 {
			t.Errorf("--min-np %d: code %d, stdout:\n%s", min, r.code, r.stdout)
		}
	}
	r := run(t, Config{NP: 1, MinNP: 1, ElasticTimeout: 90 * time.Second, Command: []string{"sh", "-c", "echo timeout=$HOROVOD_ELASTIC_TIMEOUT"}})
	if r.code != 0 || r.stdout != "[0]<stdout>:timeout=90\n" {
		t.Errorf("--elastic-timeout 90: code %d, stdout %q; want HOROVOD_ELASTIC_TIMEOUT=90 (how long a joiner waits)", r.code, r.stdout)
	}
	if err := (&Config{NP: 2, MinNP: 3, Command: []string{"x"}}).validate(); err == nil || !strings.Contains(err.Error(), "--min-np 3 must be between 1 and -np 2") {
		t.Errorf("--min-np above -np: %v", err)
	}
}

// TestRunElasticResetLimit: the failure that would be the job's
// --reset-limit+1-th reset stops it, with Horovod's message.
func TestRunElasticResetLimit(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	r := run(t, Config{
		NP: 4, MinNP: 1, ResetLimit: 1, Command: helperCmd("job"),
		Env: []string{envDir + "=" + dir, envFailRank + "=1,2", envFailCode + "=3"},
	})
	if r.code != 3 || r.err != nil {
		t.Fatalf("Run = %d, %v; want 3, nil\n%s", r.code, r.err, r.stderr)
	}
	for _, want := range []string{
		"; the elastic job goes on with 3 ranks (--min-np 1; reset 1)",
		"; Horovod was shutdown because number of resets during elastic job exceeded limit: 1; stopping the other 2 ranks",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
}

// TestParseElasticFlags: --min-np, --reset-limit and --elastic-timeout as
// horovodrun takes them, and their refusals.
func TestParseElasticFlags(t *testing.T) {
	c, err := ParseArgs([]string{"-np", "4", "--min-np", "2", "--reset-limit", "3", "--elastic-timeout", "60", "--", "x"})
	if err != nil || c.MinNP != 2 || c.ResetLimit != 3 || c.ElasticTimeout != time.Minute {
		t.Fatalf("ParseArgs = %+v, %v", c, err)
	}
	for args, want := range map[string]string{
		"--reset-limit 0":     "--reset-limit must be at least 1",
		"--elastic-timeout 0": "--elastic-timeout must be a positive number of seconds",
	} {
		_, err := ParseArgs(append([]string{"-np", "2", "--min-np", "1"}, append(strings.Fields(args), "--", "x")...))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", args, err, want)
		}
	}
	if err := (&Config{NP: 2, ResetLimit: 1, Command: []string{"x"}}).validate(); err == nil || !strings.Contains(err.Error(), "pass --min-np too") {
		t.Errorf("--reset-limit without --min-np: %v", err)
	}
}

// elasticHelper is a rank of a real elastic job (the Go client): it sums 1
// over every rank for a few steps. At step 2 rank $HVDD_TEST_FAIL_RANK
// exits with status 3, or, with $HVDD_TEST_KILL_DAEMON set, first SIGKILLs
// its node's daemon (a host lost). The others see the step fail, re-initialise
// into the next epoch and print its rank and size after summing again.
func elasticHelper() int {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := &hvdd.Client{Elastic: true}
	if err := c.Init(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "init:", err)
		return 1
	}
	var lost error
	for step := 0; step < 4 && lost == nil; step++ {
		if step == 2 && os.Getenv(envFailRank) == strconv.Itoa(c.Rank()) {
			if os.Getenv("HVDD_TEST_KILL_DAEMON") != "" {
				if err := killDaemon(os.Getenv("HVDD_SOCKET")); err != nil {
					fmt.Fprintln(os.Stderr, "kill the daemon:", err)
				}
			}
			fmt.Fprintf(os.Stderr, "rank %d failing\n", c.Rank())
			return 3
		}
		x := []float32{1}
		lost = hvdd.Allreduce(ctx, c, x, hvdd.WithName(fmt.Sprint("step.", step)), hvdd.WithOp(hvdd.Sum))
	}
	if lost == nil {
		fmt.Fprintln(os.Stderr, "no rank was lost")
		return 1
	}
	c.Close()
	c2 := &hvdd.Client{Elastic: true}
	if err := c2.Init(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "re-init:", err)
		return 4
	}
	defer c2.Close()
	x := []float32{1}
	if err := hvdd.Allreduce(ctx, c2, x, hvdd.WithName("step.again"), hvdd.WithOp(hvdd.Sum)); err != nil {
		fmt.Fprintln(os.Stderr, "allreduce after re-init:", err)
		return 1
	}
	fmt.Printf("REFORMED rank=%d size=%d sum=%g epoch=%d\n", c2.Rank(), c2.Size(), x[0], c2.Epoch())
	return 0
}

// killDaemon SIGKILLs the process listening on socket (its peer
// credentials name it).
func killDaemon(socket string) error {
	conn, err := net.Dial("unix", socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if cerr != nil {
		return cerr
	}
	return syscall.Kill(int(cred.Pid), syscall.SIGKILL)
}

// TestMultiHostElastic: an elastic job across two hosts (real daemons on
// two loopback addresses) goes on when a rank fails, and when a whole host
// is lost (its daemon SIGKILLed): the survivors on the other host re-form
// the job at the smaller size and finish, and the job exits 0.
func TestMultiHostElastic(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		hosts      []Host
		failRank   int
		killDaemon bool
		wantSize   int
	}{
		// A failed rank's host is blacklisted with its other ranks (see
		// TestDriverFailedRankBlacklistsHost): here each lost rank is its
		// host's only one, so the size of the next epoch is certain.
		{"rank lost", []Host{{"127.0.0.11", 3}, {"127.0.0.12", 1}}, 3, false, 3},
		{"host's only rank lost", []Host{{"127.0.0.13", 2}, {"127.0.0.14", 1}}, 2, false, 2},
		{"host lost", []Host{{"127.0.0.15", 1}, {"127.0.0.16", 2}}, 2, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			np := 0
			for _, h := range tc.hosts {
				np += h.Slots
			}
			env := []string{envFailRank + "=" + strconv.Itoa(tc.failRank)}
			if tc.killDaemon {
				env = append(env, "HVDD_TEST_KILL_DAEMON=1")
			}
			r := multiRun(t, Config{NP: np, MinNP: 1, Command: helperCmd("elastic"), Hosts: tc.hosts, Env: env})
			if r.code != 0 || r.err != nil {
				t.Fatalf("Run = %d, %v; want 0, nil\nstderr:\n%s", r.code, r.err, r.stderr)
			}
			for rank := range tc.wantSize {
				want := fmt.Sprintf("REFORMED rank=%d size=%d sum=%d epoch=1", rank, tc.wantSize, tc.wantSize)
				if !strings.Contains(r.stdout, want) {
					t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
				}
			}
			// The driver reports the lost rank and goes on. What it says
			// after depends on when it sees the exit: before the survivors
			// finish (it goes on with how many run then: a lost host's ranks
			// go one by one, in either order with its daemon's death), or
			// after (their status is the job's).
			lost := fmt.Sprintf("hvdd run: rank %d ", tc.failRank)
			if !strings.Contains(r.stderr, lost) || !strings.Contains(r.stderr, "; the elastic job goes on with ") && !strings.Contains(r.stderr, "; a rank has finished the job with status 0") {
				t.Errorf("stderr does not report %q lost and the job going on:\n%s", lost, r.stderr)
			}
		})
	}
}
