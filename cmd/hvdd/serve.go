package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"reflect"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hvdd/hvdd/auth"
	"github.com/hvdd/hvdd/backends/mpi"
	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/ipc"
)

func version() string { return daemon.Version }

const serveUsage = `Usage: hvdd serve [flags]

Runs the node daemon: local training processes connect to its Unix socket, and
it runs their collectives over shared memory.

Flags:
`

const serveEnv = `
Environment (Horovod's knobs, honoured when the flag is not given):
  HVDD_SOCKET                          socket path
  HVDD_SECRET                          shared secret of a multi-node job (hex or raw)
  HVDD_SPIN                            --spin, as a duration (-1ns: never spin)
  HVDD_TCP_STREAMS                     --tcp-streams
  HVDD_CONTROL                         --control (auto, tcp or mpi)
  HOROVOD_FUSION_THRESHOLD             bytes per fused response (0 disables fusion)
  HOROVOD_CYCLE_TIME                   ms between dispatched plans (batching window)
  HOROVOD_STALL_CHECK_TIME_SECONDS     stall warning time
  HOROVOD_STALL_SHUTDOWN_TIME_SECONDS  fail the job after a stall this long
  HOROVOD_STALL_CHECK_DISABLE          1 disables the stall check
  HOROVOD_LOG_LEVEL                    trace, debug, info, warning, error, fatal

Examples:
  hvdd serve --slots 4 --socket /tmp/hvdd.sock
  # two nodes, 2 processes each; the same secret file on both:
  hvdd serve --slots 2 --nodes 2 --node-rank 0 --rendezvous 10.0.0.1:29500 --advertise 10.0.0.1 --secret-file s
  hvdd serve --slots 2 --nodes 2 --node-rank 1 --rendezvous 10.0.0.1:29500 --advertise 10.0.0.2 --secret-file s
  # one daemon per node under mpirun (hvdd built with -tags mpi); --bind-to none
  # lets each use all its node's cores. MPI carries control and data, and
  # makes the job's secret:
  mpirun --bind-to none -np 2 -H 10.0.0.1,10.0.0.2 \
      hvdd serve --slots 2 --nodes -1 --node-rank -1 --backend mpi
  # the same with control over TCP links, faster (what hvdd run --backend mpi does):
  HVDD_SECRET=$(cat s) mpirun --bind-to none -x HVDD_SECRET -np 2 -H 10.0.0.1,10.0.0.2 \
      hvdd serve --slots 2 --nodes -1 --node-rank -1 --rendezvous 10.0.0.1:29500 --backend mpi
`

func serveMain(argv []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var args struct {
		socket, allowGID, logLevel                 string
		slots, workers                             int
		fusion                                     int64
		cycle, stallCheck, stallShutdown           time.Duration
		spin                                       time.Duration
		nodes, nodeRank, streams                   int
		rendezvous, advertise, secretFile, backend string
		control                                    string
	}
	fs.StringVar(&args.socket, "socket", "", "Unix socket path; {node} is replaced by the node rank (default $HVDD_SOCKET, else "+ipc.DefaultSocket()+")")
	fs.IntVar(&args.slots, "slots", 0, "number of local processes per job (required)")
	fs.StringVar(&args.allowGID, "allow-gid", "", "comma-separated group ids allowed to connect besides the daemon's uid and root")
	fs.Int64Var(&args.fusion, "fusion-threshold", -2, "bytes per fused response; 0 disables fusion (default $HOROVOD_FUSION_THRESHOLD, else 128 MiB)")
	fs.DurationVar(&args.cycle, "cycle-time", -1, "least time between dispatched plans, to batch more into one (default $HOROVOD_CYCLE_TIME ms, else 0: event driven)")
	fs.DurationVar(&args.stallCheck, "stall-check", -2, "log ranks missing from a tensor after this long; negative disables (default $HOROVOD_STALL_CHECK_TIME_SECONDS, else 60s)")
	fs.DurationVar(&args.stallShutdown, "stall-shutdown", -1, "fail the job after a stall this long; 0 never (default $HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, else 0)")
	defSpin, err := time.ParseDuration(os.Getenv("HVDD_SPIN"))
	if err != nil {
		defSpin = 0
	}
	fs.DurationVar(&args.spin, "spin", defSpin, "after activity, poll clients (their shared-memory rings) this long before sleeping; the window widens to 10x for jobs whose requests come just after it (default $HVDD_SPIN, else 0: 50µs; negative: never spin)")
	fs.IntVar(&args.workers, "workers", 0, "goroutines per local reduction (default GOMAXPROCS)")
	fs.IntVar(&args.nodes, "nodes", 1, "number of nodes (daemons) in a job; -1: mpirun's process count")
	fs.IntVar(&args.nodeRank, "node-rank", 0, "this node's index in [0, --nodes); node 0 coordinates and serves the rendezvous; -1: mpirun's rank")
	fs.StringVar(&args.rendezvous, "rendezvous", "", "node 0's rendezvous address HOST:PORT (node 0 binds it)")
	fs.StringVar(&args.advertise, "advertise", "", "this node's address (host) that the other nodes reach; control and data listeners bind it (default: the local address of the route to --rendezvous)")
	fs.StringVar(&args.secretFile, "secret-file", "", "file holding the job's shared secret (default $HVDD_SECRET); required with --nodes > 1")
	fs.StringVar(&args.backend, "backend", "tcp", "cross-node engine: tcp (embedded) or mpi (needs a build with -tags mpi)")
	defControl := os.Getenv("HVDD_CONTROL")
	if defControl == "" {
		defControl = "auto"
	}
	fs.StringVar(&args.control, "control", defControl, "what carries the daemons' control messages: tcp (authenticated links over --rendezvous, fastest), mpi (with --backend mpi: MPI messages; no rendezvous, and MPI makes the secret if none is given; see docs/BENCHMARKS.md for the cost), or auto: mpi with --backend mpi and no --rendezvous, else tcp (default $HVDD_CONTROL, else auto)")
	defStreams, err := strconv.Atoi(os.Getenv("HVDD_TCP_STREAMS"))
	if err != nil || defStreams <= 0 {
		// Measured across two network namespaces: 4 streams filled the link
		// better than 2, and 8 better than 4 (docs/BENCHMARKS.md).
		defStreams = 8
	}
	fs.IntVar(&args.streams, "tcp-streams", defStreams, "tcp engine: data connections per peer node, the same on every node (default $HVDD_TCP_STREAMS, else 8)")
	fs.StringVar(&args.logLevel, "log-level", "", "debug, info, warning or error (default $HOROVOD_LOG_LEVEL, else info)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), serveUsage)
		printDefaults(fs)
		fmt.Fprint(fs.Output(), serveEnv)
	}
	if err := fs.Parse(argv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "hvdd serve: unexpected argument %q (see hvdd serve --help)\n", fs.Arg(0))
		return 2
	}
	levelName := args.logLevel
	if levelName == "" {
		levelName = os.Getenv("HOROVOD_LOG_LEVEL")
	}
	level, err := daemon.LogLevel(levelName)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hvdd serve: %v\n", err)
		return 2
	}
	cfg := daemon.Config{Slots: args.slots, Workers: args.workers, Spin: args.spin, Logger: daemon.NewLogger(os.Stderr, level)}
	if err := cfg.ApplyHorovodEnv(os.Getenv); err != nil {
		fmt.Fprintf(os.Stderr, "hvdd serve: %v\n", err)
		return 2
	}
	if args.fusion != -2 {
		cfg.FusionThreshold = args.fusion
		if args.fusion == 0 {
			cfg.FusionThreshold = -1
		}
	}
	if args.cycle >= 0 {
		cfg.CycleTime = args.cycle
	}
	if args.stallCheck != -2 {
		cfg.StallCheck = args.stallCheck
	}
	if args.stallShutdown >= 0 {
		cfg.StallShutdown = args.stallShutdown
	}
	for _, g := range strings.Split(args.allowGID, ",") {
		if g = strings.TrimSpace(g); g == "" {
			continue
		}
		id, err := strconv.ParseUint(g, 10, 32)
		if err != nil {
			fmt.Fprintf(os.Stderr, "hvdd serve: --allow-gid %q: want numeric group ids\n", g)
			return 2
		}
		cfg.AllowGIDs = append(cfg.AllowGIDs, uint32(id))
	}
	if cfg.StallShutdown > 0 && cfg.StallCheck > 0 && cfg.StallShutdown < cfg.StallCheck {
		cfg.Logger.Warn("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS is less than HOROVOD_STALL_CHECK_TIME_SECONDS, will not shutdown.")
	}
	socket := args.socket
	if socket == "" {
		socket = os.Getenv("HVDD_SOCKET")
	}
	if socket == "" {
		socket = ipc.DefaultSocket()
	}
	// Under mpirun, -1 takes the node rank and count from the MPI launcher.
	if args.nodes < 0 || args.nodeRank < 0 {
		n, r, ok := launcherRank()
		if !ok {
			fmt.Fprintln(os.Stderr, "hvdd serve: --nodes -1 / --node-rank -1 need mpirun (OMPI_COMM_WORLD_RANK or PMI_RANK unset)")
			return 2
		}
		if args.nodes < 0 {
			args.nodes = n
		}
		if args.nodeRank < 0 {
			args.nodeRank = r
		}
	}
	socket = strings.ReplaceAll(socket, "{node}", strconv.Itoa(args.nodeRank))
	if args.nodes > 1 && args.advertise == "" {
		args.advertise = routeTo(args.rendezvous)
	}
	if args.nodes > 1 {
		control, err := resolveControl(args.control, args.backend, args.rendezvous)
		if err != nil {
			fmt.Fprintf(os.Stderr, "hvdd serve: %v\n", err)
			return 2
		}
		var bridge *mpi.Bridge
		if control == "mpi" {
			// MPI carries the control links too: no rendezvous needed.
			if bridge, err = mpiControl(args.nodeRank, args.nodes); err != nil {
				fmt.Fprintf(os.Stderr, "hvdd serve: %v\n", err)
				return 2
			}
			cfg.Control = bridge
		}
		secret, err := auth.LoadSecret(args.secretFile, os.Getenv("HVDD_SECRET"))
		if errors.Is(err, auth.ErrNoSecret) && bridge != nil {
			// The links travel inside the MPI job: the one rank 0 made.
			secret, err = bridge.Secret(), nil
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "hvdd serve: %v (generate one with: head -c 32 /dev/urandom | xxd -p -c 64 > secret; give every node the same file)\n", err)
			return 2
		}
		factory, err := backendFactory(args.backend, args.streams)
		if err != nil {
			fmt.Fprintf(os.Stderr, "hvdd serve: %v\n", err)
			return 2
		}
		cfg.Nodes, cfg.NodeRank, cfg.Rendezvous, cfg.Advertise = args.nodes, args.nodeRank, args.rendezvous, args.advertise
		cfg.Secret, cfg.NewBackend = secret, factory
		warnIfBound(cfg.Logger)
	}
	srv, err := daemon.New(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hvdd serve: %v\n", err)
		return 2
	}
	ln, err := systemdListener()
	if err == nil && ln == nil {
		ln, err = daemon.Listen(socket)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "hvdd serve: %v\n", err)
		return 1
	}
	ctx, stop := signalContext()
	defer stop()
	if p := os.Getenv("HVDD_CPUPROFILE"); p != "" {
		// A debugging aid, not a stable interface.
		if f, err := os.Create(p); err == nil {
			pprof.StartCPUProfile(f)
			defer pprof.StopCPUProfile()
		}
	}
	sdNotify("READY=1")
	err = srv.Serve(ctx, ln)
	sdNotify("STOPPING=1")
	if err != nil && !errors.Is(err, daemon.ErrServerClosed) && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(os.Stderr, "hvdd serve: %v\n", err)
		return 1
	}
	return 0
}

// signalContext is cancelled by SIGINT or SIGTERM, with a cause that names
// the signal: the daemon tells its clients why it stops. Under mpirun a
// SIGTERM usually means that mpirun is ending the job because a daemon on
// another node died (MPI jobs do not outlive a rank), which the message says.
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case sig := <-ch:
			why := fmt.Sprintf("it received %s", unix.SignalName(sig.(syscall.Signal)))
			if _, _, ok := launcherRank(); ok && sig == syscall.SIGTERM {
				why += " (under mpirun: mpirun ends the whole job when any of its daemons dies)"
			}
			cancel(errors.New(why))
		case <-ctx.Done():
		}
	}()
	return ctx, func() { signal.Stop(ch); cancel(context.Canceled) }
}

// printDefaults is fs.PrintDefaults for flags whose usage states their own
// default ("(default $VAR, else ...)"): their value before parsing is only a
// sentinel meaning "not given" (such as -1ns), which flag would print too.
func printDefaults(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		if strings.Contains(f.Usage, "(default $") {
			// flag omits a default that reads as the type's zero value.
			f.DefValue = reflect.New(reflect.TypeOf(f.Value).Elem()).Interface().(flag.Value).String()
		}
	})
	fs.PrintDefaults()
}

// resolveControl turns --control into tcp or mpi. auto picks mpi for daemons
// of the mpi engine given no rendezvous (under a plain mpirun, MPI is all
// they share) and tcp otherwise.
func resolveControl(control, backend, rendezvous string) (string, error) {
	switch {
	case control == "auto" && backend == "mpi" && rendezvous == "":
		return "mpi", nil
	case control == "auto", control == "tcp":
		return "tcp", nil
	case control != "mpi":
		return "", fmt.Errorf("unknown --control %q (want auto, tcp or mpi)", control)
	case backend != "mpi":
		return "", errors.New("--control mpi needs --backend mpi (daemons started by mpirun)")
	}
	return "mpi", nil
}
