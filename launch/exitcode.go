package launch

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

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

// rankStartFailed is the exit code of a run whose rank could not be started
// with err: the shell's 127 for a command that does not exist, 126 for one
// that cannot be executed, else 1.
func rankStartFailed(err error) int {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return exitNotFound
	case errors.Is(err, fs.ErrPermission):
		return exitNotRunnable
	}
	return exitLaunchFailed
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
