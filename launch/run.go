package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Exit codes Run returns along with a non-nil error, following the shell's
// conventions.
const (
	exitLaunchFailed = 1   // the daemon or a rank could not be started
	exitUsage        = 2   // invalid Config
	exitNotRunnable  = 126 // the command exists but cannot be executed
	exitNotFound     = 127 // the command does not exist
)

// Run starts cfg.NP ranks of cfg.Command, first starting a daemon if none
// listens on the socket, and supervises them until every rank has exited.
// It blocks until then, and until a daemon it started has been stopped.
//
// exitCode is the job's: 0 if every rank exited 0; otherwise the status of
// the first rank that failed (128+N for death by signal N), or 128+N when
// the job was stopped by signal N (128+SIGTERM when ctx was cancelled)
// before any rank failed.
//
// err is non-nil only when the job could not be run as asked: invalid
// Config, command not found, daemon failed to start, or ctx cancelled. Its
// message says what to do. exitCode then still holds a status suitable for
// os.Exit: 2 for an invalid Config, 127 for a command not found, 126 for one
// that cannot be executed, 128+N when interrupted by signal N while starting,
// 143 when stopped by ctx, and 1 otherwise.
//
// Cancelling ctx stops the job as SIGTERM would: ranks get SIGTERM, then
// SIGKILL after cfg.KillGrace.
func Run(ctx context.Context, cfg Config) (exitCode int, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return exitUsage, err
	}
	if len(cfg.Hosts) > 0 {
		nodes, err := layout(cfg.Hosts, cfg.NP)
		if err != nil {
			return exitUsage, err
		}
		isLocal := isLocalHost
		if cfg.localHost != nil {
			isLocal = cfg.localHost
		}
		for i := range nodes {
			nodes[i].Local = isLocal(nodes[i].Host)
		}
		if len(nodes) > 1 || !nodes[0].Local {
			return runMulti(ctx, &cfg, nodes)
		}
		// Every rank on this machine: the single-node path.
	}
	path, code, err := lookCommand(&cfg)
	if err != nil {
		return code, err
	}
	o := &output{stdout: cfg.Stdout, stderr: cfg.Stderr}

	sigs := cfg.Signals
	if sigs == nil {
		ch := make(chan os.Signal, 8)
		signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
		defer signal.Stop(ch)
		sigs = ch
	}

	d, sig, err := startDaemonInterruptibly(ctx, &cfg, o, sigs)
	if code, err := startFailed(ctx, sig, err, "the hvdd daemon"); err != nil {
		return code, err
	}
	j := &job{cfg: &cfg, o: o, exits: make(chan exitEvent, cfg.NP)}
	if d != nil {
		defer d.stop(cfg.KillGrace)
		j.daemons = []*daemonProc{d}
	}
	for rank := range cfg.NP {
		if err := j.start(path, rank); err != nil {
			j.abort()
			code := exitLaunchFailed
			switch {
			case errors.Is(err, fs.ErrNotExist):
				code = exitNotFound
			case errors.Is(err, fs.ErrPermission):
				code = exitNotRunnable
			}
			return code, fmt.Errorf("start rank %d: %w; check that the command exists and is executable", rank, err)
		}
	}
	return j.supervise(ctx, sigs)
}

// lookCommand resolves cfg.Command[0] before anything is started, so that a
// typo fails fast and says so.
func lookCommand(cfg *Config) (path string, code int, err error) {
	name := cfg.Command[0]
	if strings.Contains(name, "/") {
		return name, 0, nil // relative to cfg.Dir; Start reports problems
	}
	path, err = exec.LookPath(name)
	if err != nil {
		return "", exitNotFound, fmt.Errorf("command %q not found in $PATH; check its spelling, or give its path (e.g. ./%s)", name, name)
	}
	return path, 0, nil
}

// startDaemonInterruptibly runs ensureDaemon, giving up when a signal
// arrives. It returns the signal if one did.
func startDaemonInterruptibly(ctx context.Context, cfg *Config, o *output, sigs <-chan os.Signal) (*daemonProc, os.Signal, error) {
	var d *daemonProc
	sig, err := interruptibly(ctx, sigs, func(ctx context.Context) (err error) {
		d, err = ensureDaemon(ctx, cfg, o)
		return err
	})
	if sig != nil && d != nil {
		d.stop(cfg.KillGrace)
		d = nil
	}
	return d, sig, err
}

// interruptibly runs start with a context that is cancelled when a signal
// arrives on sigs, and returns that signal (nil if none came) with start's
// error.
func interruptibly(ctx context.Context, sigs <-chan os.Signal, start func(context.Context) error) (os.Signal, error) {
	startCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var sig os.Signal
	stopWatch, watchDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watchDone)
		select {
		case sig = <-sigs:
			cancel()
		case <-stopWatch:
		}
	}()
	err := start(startCtx)
	close(stopWatch)
	<-watchDone
	return sig, err
}

// How long output may lag behind the process that wrote it. A rank's
// stdout and stderr normally reach EOF as it exits, but a child it left
// behind can hold them open.
const (
	// exitOutputWait bounds how long a rank's exit report waits for the
	// rank's output to end, so that a failure message follows the rank's
	// last lines (its traceback) without being held up by an orphan.
	exitOutputWait = 250 * time.Millisecond
	// drainWait bounds how long Run waits, once every rank has exited, for
	// output still coming from their orphans before it closes the pipes.
	drainWait = time.Second
)

// job is a started set of ranks. Only the goroutine running supervise (or
// abort) touches its fields after the ranks have started.
type job struct {
	cfg     *Config
	o       *output
	workers []*exec.Cmd
	exited  []bool
	running int
	pumps   []*pump        // every rank's output copiers
	exits   chan exitEvent // one per started rank
	daemons []*daemonProc  // the daemons this Run started; none if one was already running
	// stdins holds, per rank started through the agent (a remote host), the
	// write end of the agent's standard input: closing it makes the remote
	// wrapper stop the rank. Nil entries (and a nil slice) are local ranks.
	stdins []*os.File
	// hosts names the host of each rank started through the agent.
	hosts map[int]string
}

type exitEvent struct {
	rank  int
	state *os.ProcessState // nil if Wait failed before the process was reaped
}

// A pump copies one rank's stdout or stderr from a pipe to the job's
// output. Run makes the pipes itself rather than letting os/exec do it, so
// that a rank's exit is seen when the rank exits, not when the last process
// holding its pipe does.
type pump struct {
	r, w  *os.File // w is the child's end; closed in our process once started
	sink  io.Writer
	flush func() // writes out a final partial line; nil for raw output
	done  chan struct{}
}

func (p *pump) run() {
	defer close(p.done)
	io.Copy(p.sink, p.r) // ends at EOF, or when drain closes r
	if p.flush != nil {
		p.flush()
	}
}

// waitPumps waits up to d for every pump in ps to finish, and reports
// whether they all did.
func waitPumps(ps []*pump, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for _, p := range ps {
		select {
		case <-p.done:
		case <-t.C:
			return false
		}
	}
	return true
}

// start starts one rank and a goroutine that reports its exit on j.exits.
func (j *job) start(path string, rank int) error {
	cfg := j.cfg
	cmd := exec.Command(path, cfg.Command[1:]...)
	cmd.Args[0] = cfg.Command[0]
	cmd.Dir = cfg.Dir
	cmd.Env = workerEnv(cfg, rank)
	if rank == 0 {
		cmd.Stdin = cfg.Stdin
	}
	// Ranks stay in our process group, so a terminal's Ctrl-C reaches them
	// directly; they also get SIGTERM if hvdd run itself is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	return j.startCmd(cmd, rank, nil)
}

// startCmd starts cmd as rank, with its output tagged, and a goroutine that
// reports its exit on j.exits. stdin, if non-nil, is the write end of the
// pipe cmd reads (a rank started through the agent); the job closes it to
// stop the rank.
func (j *job) startCmd(cmd *exec.Cmd, rank int, stdin *os.File) error {
	cfg := j.cfg
	var pumps []*pump
	started := false
	defer func() {
		for _, p := range pumps {
			p.w.Close() // the child has its copy
			if !started {
				p.r.Close()
			}
		}
	}()
	connect := func(dst io.Writer, stream string) (io.Writer, error) {
		var p pump
		switch f, ok := dst.(*os.File); {
		case cfg.NoTagOutput && ok:
			return f, nil // the rank shares our descriptor, and sees a terminal if it is one
		case cfg.NoTagOutput:
			p.sink = lockedWriter{j.o, dst}
		default:
			lw := newLineWriter(j.o, dst, "["+strconv.Itoa(rank)+"]<"+stream+">:", maxLine)
			p.sink, p.flush = lw, func() { lw.Flush() }
		}
		var err error
		if p.r, p.w, err = os.Pipe(); err != nil {
			return nil, err
		}
		p.done = make(chan struct{})
		pumps = append(pumps, &p)
		return p.w, nil
	}
	var err error
	if cmd.Stdout, err = connect(cfg.Stdout, "stdout"); err != nil {
		return err
	}
	if cmd.Stderr, err = connect(cfg.Stderr, "stderr"); err != nil {
		return err
	}
	// Don't wait forever to copy a Stdin that is not an *os.File.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return err
	}
	started = true
	for _, p := range pumps {
		go p.run()
	}
	j.pumps = append(j.pumps, pumps...)
	j.workers = append(j.workers, cmd)
	j.exited = append(j.exited, false)
	if stdin != nil {
		for len(j.stdins) < rank {
			j.stdins = append(j.stdins, nil)
		}
		j.stdins = append(j.stdins, stdin)
	}
	j.running++
	go func() {
		cmd.Wait()
		waitPumps(pumps, exitOutputWait)
		j.exits <- exitEvent{rank: rank, state: cmd.ProcessState}
	}()
	return nil
}

// drain waits up to drainWait for the ranks' output to end, then closes the
// pipes (a process still writing to one gets EPIPE) and waits for the pumps
// to flush.
func (j *job) drain() {
	if !waitPumps(j.pumps, drainWait) {
		j.o.logf("output pipes still open %v after the last rank exited (a rank left a child process running?); closing them", drainWait)
	}
	for _, p := range j.pumps {
		p.r.Close()
		<-p.done
	}
}

// workerEnv is rank's environment: ours, then cfg.Env, then the rank
// variables (os/exec keeps the last of duplicate names).
func workerEnv(cfg *Config, rank int) []string {
	r, n := strconv.Itoa(rank), strconv.Itoa(cfg.NP)
	env := append(os.Environ(), cfg.Env...)
	return append(env,
		"HVDD_SOCKET="+cfg.Socket,
		"HVDD_RANK="+r,
		"HVDD_SIZE="+n,
		"HVDD_LOCAL_RANK="+r,
		"HVDD_LOCAL_SIZE="+n,
		"HOROVOD_RANK="+r,
		"HOROVOD_SIZE="+n,
		"HOROVOD_LOCAL_RANK="+r,
		"HOROVOD_LOCAL_SIZE="+n,
		"HOROVOD_CROSS_RANK=0",
		"HOROVOD_CROSS_SIZE=1",
	)
}

// abort kills the ranks started so far and waits for them.
func (j *job) abort() {
	j.signalAll(syscall.SIGKILL)
	j.closeStdins()
	for ; j.running > 0; j.running-- {
		<-j.exits
	}
	j.drain()
}

// signalAll sends sig to every rank that has not been seen to exit. A rank
// that exited meanwhile is not an error: os.Process refuses to signal a
// reaped process, so a recycled pid is never hit.
//
// A rank on a remote host cannot be signalled: any signal but SIGKILL closes
// its agent's standard input, on which the remote wrapper sends the rank
// SIGTERM (and SIGKILL after the kill grace); SIGKILL kills the agent.
func (j *job) signalAll(sig os.Signal) {
	for i, cmd := range j.workers {
		if j.exited[i] {
			continue
		}
		if i < len(j.stdins) && j.stdins[i] != nil && sig != syscall.SIGKILL {
			j.stdins[i].Close()
			continue
		}
		cmd.Process.Signal(sig)
	}
}

// closeStdins closes what is left of the remote ranks' standard inputs.
func (j *job) closeStdins() {
	for _, f := range j.stdins {
		if f != nil {
			f.Close() // a second Close just fails
		}
	}
}

// supervise waits for every rank to exit, stopping the job on the first
// failure, signal or ctx cancellation. See Run for the result.
func (j *job) supervise(ctx context.Context, sigs <-chan os.Signal) (int, error) {
	const (
		running = iota
		failed
		interrupted
		cancelled
	)
	var (
		state   = running
		code    int
		killC   <-chan time.Time // fires KillGrace after the job began stopping
		ctxDone = ctx.Done()
		daemonC = make(chan *daemonProc, len(j.daemons))
		quit    = make(chan struct{})
	)
	defer close(quit)
	for _, d := range j.daemons {
		go func() {
			select {
			case <-d.done:
				daemonC <- d
			case <-quit:
			}
		}()
	}
	stop := func(sig os.Signal) {
		j.signalAll(sig)
		killC = time.After(j.cfg.KillGrace)
	}
	for j.running > 0 {
		select {
		case e := <-j.exits:
			j.running--
			j.exited[e.rank] = true
			c, how := describeExit(e.state)
			if c == 0 || state != running {
				continue
			}
			state, code = failed, c
			msg := fmt.Sprintf("rank %d (pid %d) %s", e.rank, j.workers[e.rank].Process.Pid, how)
			if h, ok := j.hosts[e.rank]; ok {
				msg = fmt.Sprintf("rank %d on %s (agent pid %d) %s", e.rank, h, j.workers[e.rank].Process.Pid, how)
			}
			if j.running > 0 {
				msg += fmt.Sprintf("; stopping the other %s", ranks(j.running))
			}
			j.o.logf("%s", msg)
			stop(syscall.SIGTERM)

		case sig := <-sigs:
			switch {
			case state == running:
				state, code = interrupted, 128+signum(sig)
				hint := ""
				if sig == syscall.SIGINT {
					hint = " (Ctrl-C again to kill them now)"
				}
				j.o.logf("received %s; forwarding it to %s%s", signame(sig), ranks(j.running), hint)
				stop(sig)
			case sig == syscall.SIGINT:
				j.o.logf("received SIGINT again; killing %s", ranks(j.running))
				j.signalAll(syscall.SIGKILL)
			default:
				j.signalAll(sig)
			}

		case <-ctxDone:
			ctxDone = nil
			if state == running {
				state, code = cancelled, 128+int(syscall.SIGTERM)
				j.o.logf("%v; stopping %s", context.Cause(ctx), ranks(j.running))
				stop(syscall.SIGTERM)
			}

		case <-killC:
			killC = nil
			j.o.logf("%s still running %v after being asked to stop; sending SIGKILL", ranks(j.running), j.cfg.KillGrace)
			j.signalAll(syscall.SIGKILL)

		case d := <-daemonC:
			_, how := describeExit(d.cmd.ProcessState)
			j.o.logf("%s %s while the job was running; its last output:\n%s",
				d.describe(), how, d.tail.lines(10))
		}
	}
	j.closeStdins()
	j.drain()
	if state == cancelled {
		return code, fmt.Errorf("job stopped: %w", context.Cause(ctx))
	}
	return code, nil
}

// describeExit returns a process's exit code in the shell's convention
// (128+N for death by signal N) and a phrase saying how it ended.
func describeExit(ps *os.ProcessState) (int, string) {
	if ps == nil {
		return exitLaunchFailed, "could not be waited for"
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), "was killed by " + signame(ws.Signal())
	}
	c := ps.ExitCode()
	return c, fmt.Sprintf("exited with status %d", c)
}

func ranks(n int) string {
	if n == 1 {
		return "1 rank"
	}
	return strconv.Itoa(n) + " ranks"
}

func signum(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return int(s)
	}
	return int(syscall.SIGTERM)
}

func signame(sig os.Signal) string {
	if s, ok := sig.(syscall.Signal); ok {
		if name := unix.SignalName(s); name != "" {
			return name
		}
	}
	return sig.String()
}

// startFailed turns what starting the daemons (what) returned into the exit
// code and error of the run: a signal that interrupted it, a cancelled ctx, or
// a failed launch. A nil error means the start went well.
func startFailed(ctx context.Context, sig os.Signal, err error, what string) (int, error) {
	if sig != nil {
		return 128 + signum(sig), fmt.Errorf("interrupted by %s while starting %s", signame(sig), what)
	}
	if err != nil {
		if ctx.Err() != nil {
			return 128 + int(syscall.SIGTERM), err
		}
		return exitLaunchFailed, err
	}
	return 0, nil
}
