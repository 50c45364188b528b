package launch

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The shared node's daemon: this machine's daemon on Config.Socket, which
// outlives jobs when it was started by hand (hvdd serve, systemd), and which
// a job starts from Config.DaemonCommand, and stops at its end, when none
// listens. Concurrent hvdd runs on one socket agree through <socket>.lock.

// ensureDaemon makes sure a daemon accepts connections on cfg.Socket. It
// returns nil and no error if one already did, and the started daemon
// otherwise; a daemon it started but that did not become ready is stopped.
func ensureDaemon(ctx context.Context, cfg *Config, o *output) (*daemonProc, error) {
	if probe(cfg.Socket) == nil {
		o.verbosef("using the hvdd daemon already listening on %s", cfg.Socket)
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
		// Started by another hvdd run while we waited.
		o.verbosef("using the hvdd daemon that another hvdd run started on %s", cfg.Socket)
		return nil, nil
	}
	if !abstract {
		if err := removeStale(cfg.Socket, err); err != nil {
			return nil, err
		}
	}
	if len(cfg.DaemonCommand) == 0 {
		return nil, fmt.Errorf("no hvdd daemon is listening on %s and none is configured to start; start one with 'hvdd serve --socket %s'", cfg.Socket, cfg.Socket)
	}
	d, err := startDaemonProc(o, exec.Command(cfg.DaemonCommand[0], cfg.DaemonCommand[1:]...), "", "[hvdd] ", "")
	if err != nil {
		return nil, fmt.Errorf("start the hvdd daemon (%s): %w", strings.Join(cfg.DaemonCommand, " "), err)
	}
	if err := waitShared(ctx, d, cfg, deadline); err != nil {
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

// waitShared polls cfg.Socket until the shared daemon d, just started,
// accepts connections. On failure it stops the daemon (still holding the
// socket's lock) and returns an error quoting its output.
func waitShared(ctx context.Context, d *daemonProc, cfg *Config, deadline time.Time) error {
	switch d.await(ctx, deadline, func() bool { return probe(cfg.Socket) == nil }) {
	case daemonExited:
		_, how := describeExit(d.cmd.ProcessState)
		return fmt.Errorf("the hvdd daemon (%s) %s before accepting connections on %s; its last output:\n%s\nfix what it reports, or start a daemon yourself with 'hvdd serve --socket %s'",
			strings.Join(cfg.DaemonCommand, " "), how, cfg.Socket, d.tail.lines(10), cfg.Socket)
	case waitCancelled:
		d.stop(cfg.KillGrace)
		return fmt.Errorf("waiting for the hvdd daemon to start: %w", context.Cause(ctx))
	case waitTimedOut:
		d.stop(cfg.KillGrace)
		return fmt.Errorf("the hvdd daemon (pid %d: %s) did not accept connections on %s within %v, so it was stopped; its last output:\n%s\ncheck that it listens on that socket, or raise --start-timeout",
			d.cmd.Process.Pid, strings.Join(cfg.DaemonCommand, " "), cfg.Socket, cfg.StartTimeout, d.tail.lines(10))
	}
	return nil
}

// warnRunningDaemon warns, when the job runs on a shared daemon that was
// already running (and that hvdd run leaves alone), that the daemon
// settings given for the job do not reach it: a running daemon's settings
// are fixed by its own command line.
func (j *job) warnRunningDaemon() {
	if !j.shared() || len(j.daemons) > 0 {
		return
	}
	k := &j.cfg.Knobs
	var given []string
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"--fusion-threshold-mb", k.FusionThresholdMB != nil},
		{"--cycle-time-ms", k.CycleTimeMS != nil},
		{"--no-stall-check", k.NoStallCheck != nil && *k.NoStallCheck},
		{"--stall-check-warning-time-seconds", k.StallCheckWarningSeconds != nil},
		{"--stall-check-shutdown-time-seconds", k.StallCheckShutdownSeconds != nil},
		{"--log-level", k.LogLevel != nil},
	} {
		if f.set {
			given = append(given, f.name)
		}
	}
	if len(given) == 0 {
		return
	}
	j.o.logf("warning: the hvdd daemon on %s was already running: it keeps the settings it was started with, so %s have no effect on it "+
		"(the ranks get their HOROVOD_* variables all the same); to apply them, stop that daemon and let hvdd run start one for the job, "+
		"or restart it as 'hvdd serve --slots N --socket %s %s'",
		j.cfg.Socket, strings.Join(given, ", "), j.cfg.Socket, strings.Join(j.cfg.ServeFlags(), " "))
}
