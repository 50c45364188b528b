package launch

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
)

// Run starts cfg.NP ranks of cfg.Command on the nodes it plans (this
// machine alone, or the hosts of cfg.Hosts), first making sure every node
// has a daemon, and supervises them until every rank has exited. It blocks
// until then, and until the daemons it started have been stopped. An
// elastic job with a host discovery script, or with hosts and MinNP, is
// run by the elastic driver instead (elastic.go), which adds and removes
// hosts and ranks as it goes.
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
	o := &output{stdout: cfg.Stdout, stderr: cfg.Stderr, verbose: cfg.Verbose}
	for _, w := range cfg.Warnings {
		o.logf("warning: %s", w)
	}
	if err := makeOutputDir(&cfg); err != nil {
		return exitLaunchFailed, err
	}
	if cfg.driven() {
		sigs, stop := signals(&cfg)
		defer stop()
		return runElastic(ctx, &cfg, o, sigs)
	}
	j, code, err := newJob(&cfg)
	if err != nil {
		return code, err
	}
	var path string
	if j.hasLocal() {
		if path, code, err = lookCommand(&cfg); err != nil {
			return code, err
		}
	}
	j.o = o
	j.warnLoopback()

	sigs, stop := signals(&cfg)
	defer stop()

	sig, err := interruptibly(ctx, sigs, j.startDaemons)
	defer j.stopDaemons()
	if code, err := startFailed(ctx, sig, err, j.daemonsName()); err != nil {
		return code, err
	}
	j.warnRunningDaemon()
	if code, err := j.startRanks(path); err != nil {
		return code, err
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

// signals returns the channel of signals to forward: cfg.Signals, else
// SIGINT, SIGTERM and SIGHUP until stop is called.
func signals(cfg *Config) (sigs <-chan os.Signal, stop func()) {
	if cfg.Signals != nil {
		return cfg.Signals, func() {}
	}
	ch := make(chan os.Signal, 8)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	return ch, func() { signal.Stop(ch) }
}
