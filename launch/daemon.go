package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Every node's ranks talk to one daemon on the node's socket. Where it comes
// from is a property of the node:
//
//   - The shared node (a job on this machine only) uses the machine's
//     daemon on Config.Socket: one already listening is left alone, else one
//     is started from Config.DaemonCommand for the job (shared.go).
//   - Every other node gets a daemon of its own for the job, `hvdd serve
//     --slots S --nodes H --node-rank I --rendezvous HOST0:PORT --advertise
//     HOST --socket /tmp/hvdd-run-JOB-I/hvdd.sock --secret-file /dev/stdin`,
//     with a fresh random secret for the job on its standard input (never
//     on a command line). Node 0 coordinates and serves the rendezvous;
//     in a job the elastic driver runs, hvdd run serves it and every
//     daemon gets --elastic --rendezvous-external and the driver's address
//     (elastic_rendezvous.go).
//     Nodes on this machine (isLocalHost) get it as a child process, ready
//     when its socket accepts a connection; remote ones through the agent
//     (agent.go), ready when the remote wrapper sees the socket appear and
//     prints a marker line, which hvdd run takes out of the daemon's output.
//   - With --backend mpi, the daemons of all nodes are the ranks of one
//     mpirun (mpi.go).

// secretEnv is the daemon's environment variable for the secret; it must not
// reach a daemon given --secret-file (hvdd serve refuses both).
const secretEnv = "HVDD_SECRET"

// Polling bounds while waiting for a daemon to listen or for the socket lock.
const (
	pollMin = 5 * time.Millisecond
	pollMax = 200 * time.Millisecond
)

// probe dials the socket once and hangs up. A nil result means something
// accepts connections there.
func probe(socket string) error {
	c, err := net.DialTimeout("unix", socket, time.Second)
	if err != nil {
		if errors.Is(err, syscall.EAGAIN) {
			return nil // listening, with a full backlog
		}
		return err
	}
	return c.Close()
}

// daemonProc is a daemon (or the agent or mpirun that runs daemons) started
// by Run.
type daemonProc struct {
	cmd   *exec.Cmd
	tail  *tailBuffer   // its last output, for error messages
	done  chan struct{} // closed once cmd.Wait has returned
	ready chan struct{} // closed when its ready marker line arrives (remote daemons)

	host  string   // the host it serves; empty for the shared daemon
	stdin *os.File // remote: the write end of the agent's stdin; closing it stops the daemon
	// remoteGrace is how long after stdin closes the remote wrapper waits
	// before it SIGKILLs the daemon.
	remoteGrace time.Duration
}

// startDaemonProc starts cmd (its Stdin set by the caller) as a daemon
// serving host: in a process group of its own, so that a terminal's Ctrl-C
// stops the ranks but not the daemon they talk to (Run stops it afterwards),
// and with SIGTERM when hvdd run dies. Its output goes to the job's stderr,
// every line prefixed; if marker is not empty, a stdout line equal to it is
// left out and closes d.ready.
func startDaemonProc(o *output, cmd *exec.Cmd, host, prefix, marker string) (*daemonProc, error) {
	d := &daemonProc{cmd: cmd, tail: &tailBuffer{max: 8 << 10}, done: make(chan struct{}), ready: make(chan struct{}), host: host}
	out := newLineWriter(o, o.stderr, prefix, maxLine)
	out.tail = d.tail
	writers := []*lineWriter{out}
	cmd.Stdout, cmd.Stderr = out, out
	if marker != "" {
		stdout := newLineWriter(o, o.stderr, prefix, maxLine)
		stdout.tail = d.tail
		var once sync.Once
		stdout.drop = func(line []byte) bool {
			if bytes.Equal(bytes.TrimRight(line, "\r\n"), []byte(marker)) {
				once.Do(func() { close(d.ready) })
				return true
			}
			return false
		}
		cmd.Stdout = stdout
		writers = append(writers, stdout)
	}
	// Don't outlive hvdd run if it is killed. (Pdeathsig fires when the
	// forking OS thread exits; the Go runtime keeps its threads.)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	cmd.WaitDelay = time.Second // don't hang on a grandchild holding the pipe
	what := "the hvdd daemon"
	if host != "" {
		what += " for " + host
	}
	o.verbosef("starting %s: %s", what, strings.Join(cmd.Args, " "))
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		cmd.Wait()
		for _, w := range writers {
			w.Flush()
		}
		close(d.done)
	}()
	return d, nil
}

// describe names the daemon in messages.
func (d *daemonProc) describe() string {
	switch {
	case d.host == "":
		return fmt.Sprintf("the hvdd daemon (pid %d)", d.cmd.Process.Pid)
	case d.stdin != nil:
		return fmt.Sprintf("the hvdd daemon on %s (agent pid %d)", d.host, d.cmd.Process.Pid)
	}
	return fmt.Sprintf("the hvdd daemon for %s (pid %d)", d.host, d.cmd.Process.Pid)
}

// How waiting for a daemon to be ready ended.
type readiness int

const (
	daemonReady readiness = iota
	daemonExited
	waitCancelled
	waitTimedOut
)

// await waits until the daemon is ready: up (polled with growing delays;
// nil to wait for d.ready alone) reports true, or d.ready is closed. It
// gives up when the daemon exits, ctx is done or deadline passes, and says
// which happened.
func (d *daemonProc) await(ctx context.Context, deadline time.Time, up func() bool) readiness {
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	for delay := pollMin; ; delay = min(2*delay, pollMax) {
		var poll <-chan time.Time
		if up != nil {
			if up() {
				return daemonReady
			}
			poll = time.After(delay)
		}
		select {
		case <-d.ready:
			return daemonReady
		case <-d.done:
			return daemonExited
		case <-ctx.Done():
			return waitCancelled
		case <-timeout.C:
			return waitTimedOut
		case <-poll:
		}
	}
}

// stop sends SIGTERM, then SIGKILL after grace, and waits for the daemon to
// exit. It returns at once if the daemon has already exited.
func (d *daemonProc) stop(grace time.Duration) {
	select {
	case <-d.done:
		return
	default:
	}
	if d.stdin != nil {
		// The remote wrapper sends SIGTERM, then SIGKILL after its grace;
		// killing the agent is the last resort.
		d.stdin.Close()
		grace = d.remoteGrace + grace
	} else {
		d.cmd.Process.Signal(syscall.SIGTERM)
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-d.done:
	case <-t.C:
		d.cmd.Process.Kill()
		<-d.done
	}
}

// daemonsName names the job's daemons in messages.
func (j *job) daemonsName() string {
	if j.shared() {
		return "the hvdd daemon"
	}
	return "the hvdd daemons"
}

// startDaemons makes sure every node's daemon is ready: it finds or starts
// the shared one, or starts the job's own and waits until all are ready; the
// first failure ends the wait. Whatever it started, ready or not, is in
// j.daemons for stopDaemons.
func (j *job) startDaemons(ctx context.Context) error {
	switch {
	case j.shared():
		d, err := ensureDaemon(ctx, j.cfg, j.o)
		if d != nil {
			j.daemons = []*daemonProc{d}
		}
		return err
	case j.cfg.Backend == "mpi":
		return j.startMPIDaemons(ctx)
	}
	deadline := time.Now().Add(j.cfg.StartTimeout)
	for i := range j.nodes {
		d, err := j.startDaemon(i)
		if err != nil {
			return err
		}
		j.daemons = append(j.daemons, d)
	}
	// They all start at once; wait for each in turn, the first failure
	// (or the deadline) ends the wait.
	errs := make(chan error, len(j.daemons))
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i, d := range j.daemons {
		n := j.nodes[i]
		go func() { errs <- j.waitReady(waitCtx, d, n, deadline) }()
	}
	var first error
	for range j.daemons {
		if err := <-errs; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	return first
}

// startDaemon starts the job's own daemon for node i.
func (j *job) startDaemon(i int) (*daemonProc, error) {
	n := j.nodes[i]
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close() // the daemon has its copy
	w.WriteString(j.secret + "\n")
	var cmd *exec.Cmd
	marker := ""
	if n.Local {
		if err := j.mkSocketDir(i); err != nil {
			w.Close()
			return nil, err
		}
		cmd = exec.Command(j.cfg.HvddPath, j.daemonArgs(i)...)
		cmd.Env = environ()
		// 65 bytes fit in any pipe buffer: written, and closed before the
		// start.
		w.Close()
	} else {
		// The wrapper reads the secret; then w stays open.
		cmd = j.agent(n.Host, j.daemonScript(i))
		marker = j.readyMarker(i)
	}
	cmd.Stdin = r
	d, err := startDaemonProc(j.o, cmd, n.Host, "[hvdd "+n.Host+"] ", marker)
	if err != nil {
		if n.Local {
			return nil, fmt.Errorf("start the hvdd daemon for %s (%s): %w; pass the hvdd binary's path", n.Host, j.cfg.HvddPath, err)
		}
		w.Close()
		return nil, fmt.Errorf("start the agent for %s (%s): %w; install ssh or pass --agent", n.Host, j.agentString(), err)
	}
	if !n.Local {
		d.stdin = w
		d.remoteGrace = time.Duration(max(j.grace, 1)) * time.Second
	}
	return d, nil
}

// waitReady waits until node n's own daemon d is ready, or fails saying
// why. It reads no field of j that Run changes, so it may run beside the
// elastic driver.
func (j *job) waitReady(ctx context.Context, d *daemonProc, n node, deadline time.Time) error {
	where := "on " + n.Host
	hint := fmt.Sprintf("check that '%s %s true' works without a password and that hvdd is at %s there (--hvdd-path)", j.agentString(), n.Host, j.remoteHvdd)
	var up func() bool // remote: the ready marker
	if n.Local {
		where = "for " + n.Host + " on this machine"
		hint = "fix what it reports"
		up = func() bool { return probe(n.Socket) == nil }
	}
	switch d.await(ctx, deadline, up) {
	case daemonExited:
		_, how := describeExit(d.cmd.ProcessState)
		return fmt.Errorf("the hvdd daemon %s %s before it was ready; its last output:\n%s\n%s",
			where, how, d.tail.lines(10), hint)
	case waitCancelled:
		return fmt.Errorf("waiting for the hvdd daemon %s to start: %w", where, context.Cause(ctx))
	case waitTimedOut:
		return fmt.Errorf("the hvdd daemon %s was not ready within %v; its last output:\n%s\n%s, or raise --start-timeout",
			where, j.cfg.StartTimeout, d.tail.lines(10), hint)
	}
	return nil
}

// stopDaemons stops the daemons Run started (all at once) and removes the
// socket directories it made.
func (j *job) stopDaemons() {
	var wg sync.WaitGroup
	for _, d := range j.daemons {
		wg.Go(func() { d.stop(j.cfg.KillGrace) })
	}
	wg.Wait()
	for _, dir := range j.dirs {
		os.RemoveAll(dir)
	}
}

// daemonArgs is the `hvdd serve` command line of node i's own daemon after
// the program name.
func (j *job) daemonArgs(i int) []string {
	n := j.nodes[i]
	args := []string{"serve", "--slots", strconv.Itoa(n.Slots), "--nodes", strconv.Itoa(len(j.nodes)),
		"--node-rank", strconv.Itoa(i), "--rendezvous", j.rendezvousFor(i),
		"--socket", n.Socket, "--secret-file", "/dev/stdin"}
	args = append(args, j.serveFlags(i)...)
	if j.cfg.Backend != "" {
		args = append(args, "--backend", j.cfg.Backend)
	}
	if j.cfg.ElasticTimeout > 0 {
		args = append(args, "--elastic-timeout", j.cfg.ElasticTimeout.String())
	}
	if j.cfg.driven() {
		// Its node set changes: the multi-node formation even alone, and
		// the coordinator takes nodes that join the running job. The
		// driver serves the rendezvous, so that the coordination can move
		// off node 0.
		args = append(args, "--elastic", "--rendezvous-external", "--elastic-driver")
	}
	return args
}

// serveFlags is the `hvdd serve` flags node i's daemon, in a job across
// hosts, gets for its address and the job's settings: --advertise with the
// host's name, or --network-interface (the daemon advertises the address
// of the interface on its host), then Config.ServeFlags.
func (j *job) serveFlags(i int) []string {
	args := []string{"--advertise", j.nodes[i].Host}
	if len(j.cfg.NetworkInterfaces) > 0 {
		args = []string{"--network-interface", strings.Join(j.cfg.NetworkInterfaces, ",")}
	}
	return append(args, j.cfg.ServeFlags()...)
}
