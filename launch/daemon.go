package launch

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

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

// daemonProc is a daemon started by Run.
type daemonProc struct {
	cmd  *exec.Cmd
	tail *tailBuffer   // its last output, for error messages
	done chan struct{} // closed once cmd.Wait has returned

	// For the daemons of a job across hosts (multi.go):
	host  string   // the host it serves; empty on the single-node path
	stdin *os.File // remote: the write end of the agent's stdin; closing it stops the daemon
	ready chan struct{}
	// remoteGrace is how long after stdin closes the remote wrapper waits
	// before it SIGKILLs the daemon.
	remoteGrace time.Duration
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

// ensureDaemon makes sure a daemon accepts connections on cfg.Socket. It
// returns nil and no error if one already did, and the started daemon
// otherwise.
func ensureDaemon(ctx context.Context, cfg *Config, o *output) (*daemonProc, error) {
	if probe(cfg.Socket) == nil {
		return nil, nil
	}
	deadline := time.Now().Add(cfg.StartTimeout)
	abstract := strings.HasPrefix(cfg.Socket, "@")
	if !abstract {
		if err := os.MkdirAll(filepath.Dir(cfg.Socket), 0o700); err != nil {
			return nil, fmt.Errorf("create the socket's directory: %w; pass a --socket in a directory you can write to", err)
		}
		// Two hvdd runs starting at once must not both start a daemon, nor
		// remove the socket of the daemon the other one just started.
		unlock, err := lockSocket(ctx, cfg.Socket, deadline)
		if err != nil {
			return nil, err
		}
		defer unlock()
	}
	err := probe(cfg.Socket)
	if err == nil {
		return nil, nil // started by another hvdd run while we waited
	}
	if !abstract {
		if err := removeStale(cfg.Socket, err); err != nil {
			return nil, err
		}
	}
	if len(cfg.DaemonCommand) == 0 {
		return nil, fmt.Errorf("no hvdd daemon is listening on %s and none is configured to start; start one with 'hvdd serve --socket %s'", cfg.Socket, cfg.Socket)
	}
	d, err := startDaemon(cfg, o)
	if err != nil {
		return nil, err
	}
	if err := d.waitReady(ctx, cfg, deadline); err != nil {
		return nil, err
	}
	return d, nil
}

// lockSocket takes an exclusive flock on <socket>.lock, polling until
// deadline. The lock file is never removed: removing it would let two
// processes lock different files of the same name.
func lockSocket(ctx context.Context, socket string, deadline time.Time) (unlock func(), err error) {
	name := socket + ".lock"
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w; pass a --socket in a directory you can write to", err)
	}
	for delay := pollMin; ; delay = min(2*delay, pollMax) {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", name, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("another hvdd run has held %s for longer than the start timeout; wait for it, or pass a different --socket", name)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for %s: %w", name, context.Cause(ctx))
		case <-time.After(delay):
		}
	}
}

// removeStale removes the socket file at path after a dial of it failed
// with dialErr, but only if it is a socket nobody accepts on.
func removeStale(path string, dialErr error) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check the socket: %w", err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket; remove it or pass another --socket", path)
	}
	if !errors.Is(dialErr, syscall.ECONNREFUSED) {
		return fmt.Errorf("cannot connect to the hvdd daemon: %w; check the socket's permissions, or pass another --socket", dialErr)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	return nil
}

func startDaemon(cfg *Config, o *output) (*daemonProc, error) {
	d := &daemonProc{tail: &tailBuffer{max: 8 << 10}, done: make(chan struct{})}
	out := newLineWriter(o, o.stderr, "[hvdd] ", maxLine)
	out.tail = d.tail
	d.cmd = exec.Command(cfg.DaemonCommand[0], cfg.DaemonCommand[1:]...)
	d.cmd.Stdout = out
	d.cmd.Stderr = out
	d.cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own process group, so a terminal's Ctrl-C stops the ranks but
		// not the daemon they are talking to; Run stops it afterwards.
		Setpgid: true,
		// Don't outlive hvdd run if it is killed. (Pdeathsig fires when the
		// forking OS thread exits; the Go runtime keeps its threads.)
		Pdeathsig: syscall.SIGTERM,
	}
	d.cmd.WaitDelay = time.Second // don't hang on a grandchild holding the pipe
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the hvdd daemon (%s): %w", strings.Join(cfg.DaemonCommand, " "), err)
	}
	go func() {
		d.cmd.Wait()
		out.Flush()
		close(d.done)
	}()
	return d, nil
}

// waitReady polls the socket until the daemon accepts connections. On
// failure it stops the daemon and returns an error quoting its output.
func (d *daemonProc) waitReady(ctx context.Context, cfg *Config, deadline time.Time) error {
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	for delay := pollMin; ; delay = min(2*delay, pollMax) {
		if probe(cfg.Socket) == nil {
			return nil
		}
		select {
		case <-d.done:
			_, how := describeExit(d.cmd.ProcessState)
			return fmt.Errorf("the hvdd daemon (%s) %s before accepting connections on %s; its last output:\n%s\nfix what it reports, or start a daemon yourself with 'hvdd serve --socket %s'",
				strings.Join(cfg.DaemonCommand, " "), how, cfg.Socket, d.tail.lines(10), cfg.Socket)
		case <-ctx.Done():
			d.stop(cfg.KillGrace)
			return fmt.Errorf("waiting for the hvdd daemon to start: %w", context.Cause(ctx))
		case <-timeout.C:
			d.stop(cfg.KillGrace)
			return fmt.Errorf("the hvdd daemon (pid %d: %s) did not accept connections on %s within %v, so it was stopped; its last output:\n%s\ncheck that it listens on that socket, or raise --start-timeout",
				d.cmd.Process.Pid, strings.Join(cfg.DaemonCommand, " "), cfg.Socket, cfg.StartTimeout, d.tail.lines(10))
		case <-time.After(delay):
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
