package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/rendezvous"
)

const rendezvousUsage = `Usage: hvdd rendezvous --addr HOST:PORT [flags]

Serves the rendezvous store of a job across nodes whose daemons are started
by hand, in a process of its own, so that the store outlives any daemon:
start the daemons with --rendezvous HOST:PORT --rendezvous-external, node 0's
included (node 0 then does not serve it). With --elastic, the daemons then
move the job's coordination to another node when node 0 is lost: they find
the current coordinator under the store's "coordinator" key. (hvdd run's
elastic driver serves the store itself, in process.)

Every request is authenticated with the job's shared secret, the same as the
daemons'. It runs until SIGINT or SIGTERM, and then exits 0.

Flags:
`

const rendezvousEnv = `
Environment:
  HVDD_SECRET        the job's shared secret (hex or raw), when --secret-file is not given
  HOROVOD_LOG_LEVEL  --log-level's default

Example: an elastic job on two nodes, its rendezvous on a third machine,
10.0.0.9; the same secret file everywhere:
  hvdd rendezvous --addr 10.0.0.9:29500 --secret-file s
  hvdd serve --slots 2 --nodes 2 --node-rank 0 --rendezvous 10.0.0.9:29500 --rendezvous-external --elastic --advertise 10.0.0.1 --secret-file s
  hvdd serve --slots 2 --nodes 2 --node-rank 1 --rendezvous 10.0.0.9:29500 --rendezvous-external --elastic --advertise 10.0.0.2 --secret-file s
`

// rendezvousArgs holds the flags of hvdd rendezvous.
type rendezvousArgs struct {
	addr, secretFile, logLevel string
}

// rendezvousMain is hvdd rendezvous: it serves a rendezvous store until
// SIGINT or SIGTERM, and returns the exit status: 0 once stopped by one, 2
// for a bad command line or secret, 1 when it cannot listen or fails.
func rendezvousMain(argv []string) int {
	args, err := parseRendezvousArgs(argv)
	if usage := (usageError{}); errors.As(err, &usage) {
		return usage.code
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "hvdd rendezvous: %v\n", err)
		return 2
	}
	cfg, err := rendezvousConfig(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hvdd rendezvous: %v\n", err)
		return 2
	}
	srv, err := rendezvous.NewServer(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hvdd rendezvous: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := srv.Serve(ctx); ctx.Err() == nil {
		fmt.Fprintf(os.Stderr, "hvdd rendezvous: %v\n", err)
		return 1
	}
	return 0
}

// parseRendezvousArgs parses the command line of hvdd rendezvous. A parse
// error or --help has been printed by the flag package and comes back as
// usageError.
func parseRendezvousArgs(argv []string) (rendezvousArgs, error) {
	fs := flag.NewFlagSet("rendezvous", flag.ContinueOnError)
	var args rendezvousArgs
	fs.StringVar(&args.addr, "addr", "", "HOST:PORT to listen on, the daemons' --rendezvous (required); 0.0.0.0:PORT or [::]:PORT listens on every interface, port 0 on a free port (logged)")
	fs.StringVar(&args.secretFile, "secret-file", "", "file holding the job's shared secret, the daemons' (default $HVDD_SECRET); required")
	fs.StringVar(&args.logLevel, "log-level", "", "debug, info, warning or error (default $HOROVOD_LOG_LEVEL, else info)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), rendezvousUsage)
		printDefaults(fs)
		fmt.Fprint(fs.Output(), rendezvousEnv)
	}
	if err := fs.Parse(argv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return args, usageError{0}
		}
		return args, usageError{2}
	}
	switch {
	case fs.NArg() > 0:
		return args, fmt.Errorf("unexpected argument %q (see hvdd rendezvous --help)", fs.Arg(0))
	case args.addr == "":
		return args, errors.New("--addr HOST:PORT is required: the address the daemons' --rendezvous names (see hvdd rendezvous --help)")
	}
	return args, nil
}

// rendezvousConfig builds the server's configuration from the flags and
// the environment.
func rendezvousConfig(args rendezvousArgs) (rendezvous.ServerConfig, error) {
	levelName := args.logLevel
	if levelName == "" {
		levelName = os.Getenv("HOROVOD_LOG_LEVEL")
	}
	level, err := daemon.LogLevel(levelName)
	if err != nil {
		return rendezvous.ServerConfig{}, err
	}
	secret, err := loadSecret(args.secretFile)
	if err != nil {
		return rendezvous.ServerConfig{}, secretError(err)
	}
	// An address on every interface is what was asked for: --addr names
	// the host explicitly.
	return rendezvous.ServerConfig{Addr: args.addr, Secret: secret, Logger: daemon.NewLogger(os.Stderr, level), AllowAll: true}, nil
}
