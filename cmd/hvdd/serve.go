package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"os/user"
	"reflect"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hvdd/hvdd/auth"
	"github.com/hvdd/hvdd/backends"
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
  HVDD_TCP_CHUNK_BYTES                 --tcp-chunk-bytes
  HVDD_TCP_SMALL_BYTES                 --tcp-small-bytes
  HVDD_WIRE_COMPRESSION                --wire-compression (none, fp16 or bf16)
  HVDD_CONTROL                         --control (auto, tcp or mpi)
  HVDD_GPU_DRIVER                      --gpu (auto, cuda, fake or off)
  HVDD_GPU_COMPLETION                  --gpu-completion (host or stream)
  HVDD_GPU_INPUT_WAIT                  host: wait for a client's GPU event on the host, not on the daemon's stream (an experiment)
  HOROVOD_GPU_ALLREDUCE                --gpu-allreduce: NCCL nccl, MPI or GLOO host
  HOROVOD_HIERARCHICAL_ALLREDUCE       1: --gpu-allreduce hierarchical (also the default)
  HOROVOD_FUSION_THRESHOLD             bytes per fused response (0 disables fusion)
  HOROVOD_CYCLE_TIME                   ms between dispatched plans (batching window)
  HOROVOD_STALL_CHECK_TIME_SECONDS     stall warning time
  HOROVOD_STALL_SHUTDOWN_TIME_SECONDS  fail the job after a stall this long
  HOROVOD_STALL_CHECK_DISABLE          1 disables the stall check
  HOROVOD_LOG_LEVEL                    trace, debug, info, warning, error, fatal
  HOROVOD_AUTOTUNE                     1: --autotune
  HOROVOD_AUTOTUNE_LOG                 --autotune-log-file
  HOROVOD_AUTOTUNE_WARMUP_SAMPLES, HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE,
  HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES, HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE
                                       the --autotune-* details

Set by systemd (deploy/systemd; README.md, "Running hvdd as a service"):
  LISTEN_PID, LISTEN_FDS, LISTEN_FDNAMES the socket to serve instead of --socket (hvdd.socket)
  NOTIFY_SOCKET                        Type=notify: READY=1, STATUS= lines, STOPPING=1
  WATCHDOG_USEC, WATCHDOG_PID          WatchdogSec=: WATCHDOG=1 while the event loop answers

Examples:
  hvdd serve --slots 4 --socket /tmp/hvdd.sock
  # with Prometheus metrics on http://127.0.0.1:9464/metrics (loopback only):
  hvdd serve --slots 4 --metrics-addr :9464
  # two nodes, 2 processes each; the same secret file on both:
  hvdd serve --slots 2 --nodes 2 --node-rank 0 --rendezvous 10.0.0.1:29500 --advertise 10.0.0.1 --secret-file s
  hvdd serve --slots 2 --nodes 2 --node-rank 1 --rendezvous 10.0.0.1:29500 --advertise 10.0.0.2 --secret-file s
  # an elastic job whose rendezvous is served apart (10.0.0.9), so that it
  # outlives node 0 and the coordination can move (hvdd rendezvous --help):
  hvdd rendezvous --addr 10.0.0.9:29500 --secret-file s
  hvdd serve --slots 2 --nodes 2 --node-rank 0 --rendezvous 10.0.0.9:29500 --rendezvous-external --elastic --advertise 10.0.0.1 --secret-file s
  hvdd serve --slots 2 --nodes 2 --node-rank 1 --rendezvous 10.0.0.9:29500 --rendezvous-external --elastic --advertise 10.0.0.2 --secret-file s
  # one daemon per node under mpirun (hvdd built with -tags mpi); --bind-to none
  # lets each use all its node's cores. MPI carries control and data, and
  # makes the job's secret:
  mpirun --bind-to none -np 2 -H 10.0.0.1,10.0.0.2 \
      hvdd serve --slots 2 --nodes -1 --node-rank -1 --backend mpi
  # the same with control over TCP links, faster (what hvdd run --backend mpi does):
  HVDD_SECRET=$(cat s) mpirun --bind-to none -x HVDD_SECRET -np 2 -H 10.0.0.1,10.0.0.2 \
      hvdd serve --slots 2 --nodes -1 --node-rank -1 --rendezvous 10.0.0.1:29500 --backend mpi
`

// serveArgs holds the flags of hvdd serve as given (before environment
// defaults and mpirun's ranks are applied).
type serveArgs struct {
	socket, allowGID, logLevel                 string
	slots, workers                             int
	fusion                                     int64
	cycle, stallCheck, stallShutdown           time.Duration
	spin, elasticTimeout                       time.Duration
	nodes, nodeRank, streams                   int
	chunkBytes, smallBytes                     int
	elastic                                    bool
	rendezvous, advertise, secretFile, backend string
	iface                                      string
	rendezvousExternal, exitAfterJob           bool
	elasticDriver                              bool
	control                                    string
	wireCompression                            string
	compression                                backends.Compression // wireCompression parsed
	idleExit, stopTimeout                      time.Duration
	logFile, removeOnExit                      string
	metricsAddr                                string
	gpuDriver, gpuAllreduce, gpuCompletion     string
	gpuSampleInterval                          time.Duration

	// Autotuning (HOROVOD_AUTOTUNE and its details when not given).
	autotune                      bool
	autotuneLog                   string
	autotuneWarmup, autotuneSteps int
	autotuneSamples               int
	autotuneNoise                 float64
	given                         map[string]bool // the flags on the command line
}

// usageError is a command-line error whose message the flag package has
// already printed: code is the exit status, 2, or 0 for --help.
type usageError struct{ code int }

// Error says which exit status the error stands for.
func (e usageError) Error() string { return fmt.Sprintf("usage (exit status %d)", e.code) }

// serveMain is hvdd serve: flags, then the daemon's configuration, then the
// daemon until a signal stops it. It returns the exit status.
func serveMain(argv []string) int {
	args, err := parseServeArgs(argv)
	if usage := (usageError{}); errors.As(err, &usage) {
		return usage.code
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "hvdd serve: %v\n", err)
		return 2
	}
	defer removeOnExit(args)
	// The stop signals are caught from here on: one that comes while the
	// daemon is still being configured or starting (a supervisor's, a
	// test's that saw the first log line) stops it the usual way once it
	// runs, instead of killing it before it could clean up.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	cfg, socket, err := serveConfig(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hvdd serve: %v\n", err)
		return 2
	}
	stopMetrics, err := startMetrics(&cfg, args.metricsAddr) // metrics.go
	if err != nil {
		fmt.Fprintf(os.Stderr, "hvdd serve: %v\n", err)
		return 1
	}
	defer stopMetrics()
	return serve(cfg, socket, args.stopTimeout, sigs)
}

// removeOnExit removes --remove-on-exit's files, and --log-file if the
// daemon wrote nothing there.
func removeOnExit(args serveArgs) {
	for _, f := range strings.Split(args.removeOnExit, ",") {
		if f != "" {
			os.Remove(f)
		}
	}
	if args.logFile != "" {
		if st, err := os.Stat(args.logFile); err == nil && st.Size() == 0 {
			os.Remove(args.logFile)
		}
	}
}

// parseServeArgs parses the command line of hvdd serve. A parse error or
// --help has been printed by the flag package and comes back as usageError.
func parseServeArgs(argv []string) (serveArgs, error) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var args serveArgs
	fs.StringVar(&args.socket, "socket", "", "Unix socket path; {node} is replaced by the node rank (default $HVDD_SOCKET, else "+ipc.DefaultSocket()+")")
	fs.IntVar(&args.slots, "slots", 0, "number of local processes per job (required)")
	fs.StringVar(&args.allowGID, "allow-gid", "", "comma-separated groups (names or numeric ids) whose members may connect besides the daemon's uid and root: their primary or a supplementary group (hvdd.service passes hvdd)")
	fs.Int64Var(&args.fusion, "fusion-threshold", -2, "bytes per fused response; 0 disables fusion (default $HOROVOD_FUSION_THRESHOLD, else 128 MiB)")
	fs.DurationVar(&args.cycle, "cycle-time", -1, "least time between dispatched plans, to batch more into one (default $HOROVOD_CYCLE_TIME ms, else 0: event driven)")
	fs.DurationVar(&args.stallCheck, "stall-check", -2, "log ranks missing from a tensor after this long; negative disables (default $HOROVOD_STALL_CHECK_TIME_SECONDS, else 60s)")
	fs.DurationVar(&args.stallShutdown, "stall-shutdown", -1, "fail the job after a stall this long; 0 never (default $HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, else 0)")
	defSpin, err := time.ParseDuration(os.Getenv("HVDD_SPIN"))
	if err != nil {
		defSpin = 0
	}
	fs.DurationVar(&args.elasticTimeout, "elastic-timeout", 600*time.Second, "how long the next epoch of an elastic job (HOROVOD_ELASTIC=1) waits for its surviving ranks to re-initialise after a rank was lost")
	fs.DurationVar(&args.spin, "spin", defSpin, "after activity, poll clients (their shared-memory rings) this long before sleeping; the window widens to 10x for jobs whose requests come just after it (default $HVDD_SPIN, else 0: 50µs; negative: never spin)")
	fs.IntVar(&args.workers, "workers", 0, "goroutines per local reduction (default GOMAXPROCS)")
	fs.IntVar(&args.nodes, "nodes", 1, "number of nodes (daemons) in a job; -1: mpirun's process count")
	fs.BoolVar(&args.elastic, "elastic", false, "take part in elastic jobs across nodes whose node set changes (hvdd run starts its daemons so): the node forms jobs with the other nodes even with --nodes 1, and node 0 takes in nodes that join a running elastic job (their --node-rank may exceed --nodes)")
	fs.IntVar(&args.nodeRank, "node-rank", 0, "this node's index in [0, --nodes); node 0 coordinates (with --elastic --rendezvous-external, until it is lost) and serves the rendezvous unless --rendezvous-external; -1: mpirun's rank")
	fs.StringVar(&args.rendezvous, "rendezvous", "", "node 0's rendezvous address HOST:PORT (node 0 binds it, unless --rendezvous-external)")
	fs.BoolVar(&args.rendezvousExternal, "rendezvous-external", false, "another process serves --rendezvous (hvdd rendezvous, or hvdd run's elastic driver): node 0 does not bind it, and with --elastic the coordination of a job moves to another node when node 0 is lost")
	fs.BoolVar(&args.elasticDriver, "elastic-driver", false, "with --elastic --rendezvous-external: hvdd run's elastic driver, which serves the rendezvous, decides each epoch's nodes and ranks after a failure or a host update, as Horovod's driver does; the daemons report the workers that re-form and wait for its decision (hvdd run passes it)")
	fs.StringVar(&args.advertise, "advertise", "", "this node's address (host) that the other nodes reach; control and data listeners bind it (default: the local address of the route to --rendezvous)")
	fs.StringVar(&args.iface, "network-interface", "", "NAME[,NAME...]: advertise and bind the address of the first of these network interfaces that this host has, instead of --advertise (horovodrun --network-interface)")
	fs.StringVar(&args.secretFile, "secret-file", "", "file holding the job's shared secret (default $HVDD_SECRET); required with --nodes > 1")
	fs.StringVar(&args.backend, "backend", "tcp", "cross-node engine: tcp (embedded) or mpi (needs a build with -tags mpi)")
	defGPUCompletion := os.Getenv("HVDD_GPU_COMPLETION")
	if defGPUCompletion == "" {
		defGPUCompletion = daemon.GPUCompletionHost
	}
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
	defChunk, _ := strconv.Atoi(os.Getenv("HVDD_TCP_CHUNK_BYTES"))
	fs.IntVar(&args.chunkBytes, "tcp-chunk-bytes", defChunk, "tcp engine: pipeline segment of large collectives, in bytes, the same on every node (default $HVDD_TCP_CHUNK_BYTES, else 1 MiB)")
	defSmall, _ := strconv.Atoi(os.Getenv("HVDD_TCP_SMALL_BYTES"))
	fs.IntVar(&args.smallBytes, "tcp-small-bytes", defSmall, "tcp engine: the largest collective in bytes that takes the latency algorithms rather than the pipelined rings, the same on every node; negative: always the rings (default $HVDD_TCP_SMALL_BYTES, else 64 KiB)")
	defWire := os.Getenv("HVDD_WIRE_COMPRESSION")
	if defWire == "" {
		defWire = "none"
	}
	fs.StringVar(&args.wireCompression, "wire-compression", defWire, "tcp engine: send the float32 data of sums (allreduce and reducescatter: gradients) between nodes as none, fp16 or bf16, while every sum accumulates in float32: half the bytes, results within the error bound in docs/ARCHITECTURE.md (about n x 2^-11, fp16, or n x 2^-8, bf16, of the sum of |x| over n nodes); values beyond fp16's range travel uncompressed; other dtypes, min/max/product, broadcast and allgather travel as they are; the same on every node (default $HVDD_WIRE_COMPRESSION, else none)")
	fs.BoolVar(&args.exitAfterJob, "exit-after-job", false, "serve one job, then exit once its last local process has gone (what the processes of a job under mpirun or srun do when they start a daemon for themselves)")
	fs.DurationVar(&args.idleExit, "idle-exit", 0, "exit once no process has been connected for this long (since the start, or since the last one left); 0 never")
	fs.DurationVar(&args.stopTimeout, "stop-timeout", 0, "on SIGTERM or SIGINT, wait up to this long for the running job to end before stopping (draining: new jobs are refused meanwhile; a second signal stops at once); 0 stops at once, failing the job's pending operations with the reason (hvdd.service sets this to match its TimeoutStopSec=)")
	fs.StringVar(&args.logFile, "log-file", "", "append the log to this file instead of standard error; an empty log file is removed when the daemon exits")
	fs.StringVar(&args.removeOnExit, "remove-on-exit", "", "comma-separated files to remove when the daemon exits (e.g. the lock file of whoever started it)")
	fs.StringVar(&args.metricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics: HOST:PORT binds that host, while a bare :PORT or PORT binds loopback (127.0.0.1) only; give 0.0.0.0:PORT to let other hosts scrape (default: off)")
	fs.StringVar(&args.logLevel, "log-level", "", "debug, info, warning or error (default $HOROVOD_LOG_LEVEL, else info)")
	fs.BoolVar(&args.autotune, "autotune", false, "tune each job's fusion threshold, cycle time, spin window and (across nodes) the tcp engine's streams, segment and small-message threshold while it runs, by Bayesian optimisation of its bytes per second, then keep the best; settings given by flag or HOROVOD_* variable stay fixed (default $HOROVOD_AUTOTUNE)")
	fs.StringVar(&args.autotuneLog, "autotune-log-file", "", "with --autotune, write each configuration tried and its score (bytes/µs) to this CSV file, the best last (default $HOROVOD_AUTOTUNE_LOG)")
	fs.IntVar(&args.autotuneWarmup, "autotune-warmup-samples", 3, "with --autotune, scores discarded at the start of a job (default $HOROVOD_AUTOTUNE_WARMUP_SAMPLES, else 3)")
	fs.IntVar(&args.autotuneSteps, "autotune-steps-per-sample", 10, "with --autotune, training steps (a tensor seen again) per sample; 5 samples score a configuration (default $HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE, else 10)")
	fs.IntVar(&args.autotuneSamples, "autotune-bayes-opt-max-samples", 20, "with --autotune, configurations scored before the best is kept (default $HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES, else 20)")
	fs.Float64Var(&args.autotuneNoise, "autotune-gaussian-process-noise", 0.8, "with --autotune, the Gaussian process's noise in [0, 1]: higher trusts single scores less (default $HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE, else 0.8)")
	fs.StringVar(&args.gpuDriver, "gpu", defaultGPUDriver(), "GPU driver: auto (the CUDA driver, loaded at run time, when it sees a GPU; else CPU-only), cuda, fake (gpu/fake, for tests) or off; GPU tensors of clients travel through CUDA IPC (default $HVDD_GPU_DRIVER, else auto)")
	defGPUAllreduce, err := defaultGPUAllreduce(os.Getenv)
	if err != nil {
		return args, err
	}
	fs.StringVar(&args.gpuAllreduce, "gpu-allreduce", defGPUAllreduce, "how GPU tensors are reduced: hierarchical (on the GPUs, NCCL between a node's GPUs, the node's result through the cross-node engine in host memory), nccl (the same, with the nodes joined on NCCL, one GPU per node, for each collective every node can run so: a node with another mode keeps the job off NCCL) or host (staged through host memory, the CPU path) (default: $HOROVOD_HIERARCHICAL_ALLREDUCE=1 hierarchical, else $HOROVOD_GPU_ALLREDUCE: NCCL nccl, MPI or GLOO host; else hierarchical)")
	fs.StringVar(&args.gpuCompletion, "gpu-completion", defGPUCompletion, "how a GPU op's completion reaches its client: host (the daemon waits for the GPU before each reply) or stream (the reply goes out once the work is enqueued, and the client's stream waits on the daemon's event: no host wait per op; for one GPU's ops on one node, from clients that wait so, the Python client's; others stay host)")
	fs.DurationVar(&args.gpuSampleInterval, "gpu-sample-interval", daemon.DefaultGPUSampleInterval, "how often to sample the GPUs through NVML (utilization, memory, temperature, power, PCIe/NVLink throughput, ECC and XID errors) for /metrics and hvdd status; a GPU found lost (XID 79) fails the GPU tensors on it; 0 turns sampling off")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), serveUsage)
		printDefaults(fs)
		fmt.Fprint(fs.Output(), serveEnv)
	}
	if err := fs.Parse(argv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return args, usageError{0}
		}
		return args, usageError{2}
	}
	if fs.NArg() > 0 {
		return args, fmt.Errorf("unexpected argument %q (see hvdd serve --help)", fs.Arg(0))
	}
	args.given = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { args.given[f.Name] = true })
	return args, nil
}

// serveConfig builds the daemon's configuration from the flags, the
// environment and mpirun's ranks, and returns it with the socket path. With
// --control mpi it starts the MPI bridge (a collective call: every daemon of
// the mpirun job makes it at once).
func serveConfig(args serveArgs) (daemon.Config, string, error) {
	levelName := args.logLevel
	if levelName == "" {
		levelName = os.Getenv("HOROVOD_LOG_LEVEL")
	}
	level, err := daemon.LogLevel(levelName)
	if err != nil {
		return daemon.Config{}, "", err
	}
	logOut := io.Writer(os.Stderr)
	if args.logFile != "" {
		f, err := os.OpenFile(args.logFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return daemon.Config{}, "", fmt.Errorf("--log-file: %w", err)
		}
		logOut = f
	}
	cfg := daemon.Config{Slots: args.slots, Workers: args.workers, Spin: args.spin, ElasticTimeout: args.elasticTimeout,
		ExitAfterJob: args.exitAfterJob, IdleExit: args.idleExit, Logger: daemon.NewLogger(logOut, level)}
	if err := cfg.ApplyHorovodEnv(os.Getenv); err != nil {
		return cfg, "", err
	}
	overrideHorovodEnv(&cfg, args)
	if cfg.AllowGIDs, err = parseGIDs(args.allowGID); err != nil {
		return cfg, "", err
	}
	if cfg.StallShutdown > 0 && cfg.StallCheck > 0 && cfg.StallShutdown < cfg.StallCheck {
		cfg.Logger.Warn("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS is less than HOROVOD_STALL_CHECK_TIME_SECONDS, will not shutdown.")
	}
	if err := fromLauncher(&args); err != nil {
		return cfg, "", err
	}
	if err := gpuConfig(&cfg, args.gpuDriver, args.gpuAllreduce); err != nil { // gpu.go
		return cfg, "", err
	}
	switch args.gpuCompletion {
	case daemon.GPUCompletionHost, daemon.GPUCompletionStream:
		cfg.GPUCompletion = args.gpuCompletion
	default:
		return cfg, "", fmt.Errorf("--gpu-completion %q: want %s or %s", args.gpuCompletion, daemon.GPUCompletionHost, daemon.GPUCompletionStream)
	}
	cfg.GPUSampleInterval = args.gpuSampleInterval
	if args.gpuSampleInterval <= 0 {
		cfg.GPUSampleInterval = -1 // off
	}
	// Checked on every daemon, though only one across nodes uses it.
	if args.compression, err = backends.ParseCompression(args.wireCompression); err != nil {
		return cfg, "", fmt.Errorf("--wire-compression: %w", err)
	}
	socket := args.socket
	if socket == "" {
		socket = os.Getenv("HVDD_SOCKET")
	}
	if socket == "" {
		socket = ipc.DefaultSocket()
	}
	socket = strings.ReplaceAll(socket, "{node}", strconv.Itoa(args.nodeRank))
	multi := args.nodes > 1 || args.elastic
	if args.iface != "" {
		if args.advertise != "" {
			return cfg, "", errors.New("--advertise and --network-interface both give this node's address; pass one of them")
		}
		if args.advertise, err = interfaceAddr(args.iface); err != nil {
			return cfg, "", err
		}
	}
	if multi && args.advertise == "" {
		args.advertise = routeTo(args.rendezvous)
	}
	if multi {
		if err := clusterConfig(&cfg, args); err != nil {
			return cfg, "", err
		}
	}
	return cfg, socket, nil
}

// fromLauncher resolves --nodes -1 and --node-rank -1: under mpirun, the
// node count and rank come from the MPI launcher.
func fromLauncher(args *serveArgs) error {
	if args.nodes >= 0 && args.nodeRank >= 0 {
		return nil
	}
	n, r, ok := launcherRank()
	if !ok {
		return errors.New("--nodes -1 / --node-rank -1 need mpirun (OMPI_COMM_WORLD_RANK or PMI_RANK unset)")
	}
	if args.nodes < 0 {
		args.nodes = n
	}
	if args.nodeRank < 0 {
		args.nodeRank = r
	}
	return nil
}

// overrideHorovodEnv applies the flags that take precedence over the
// HOROVOD_* variables ApplyHorovodEnv read, where they were given.
func overrideHorovodEnv(cfg *daemon.Config, args serveArgs) {
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
	a := &cfg.Autotune
	if args.given["autotune"] {
		a.Enabled = args.autotune
	}
	if args.given["autotune-log-file"] {
		a.LogFile = args.autotuneLog
	}
	if args.given["autotune-warmup-samples"] {
		a.WarmupSamples = args.autotuneWarmup
		if args.autotuneWarmup == 0 {
			a.WarmupSamples = -1 // none; 0 is the default in Config
		}
	}
	if args.given["autotune-steps-per-sample"] {
		a.StepsPerSample = args.autotuneSteps
	}
	if args.given["autotune-bayes-opt-max-samples"] {
		a.MaxSamples = args.autotuneSamples
	}
	if args.given["autotune-gaussian-process-noise"] {
		a.Noise = args.autotuneNoise
		if args.autotuneNoise == 0 {
			a.Noise = -1
		}
	}
	// Settings the user gave stay as given, as Horovod holds parameters set
	// explicitly (ApplyHorovodEnv fixes those of HOROVOD_* variables).
	for flagName, knob := range map[string]string{"fusion-threshold": daemon.KnobFusion, "cycle-time": daemon.KnobCycle,
		"spin": daemon.KnobSpin, "tcp-streams": daemon.KnobStreams, "tcp-chunk-bytes": daemon.KnobChunk, "tcp-small-bytes": daemon.KnobSmall} {
		if args.given[flagName] && !slices.Contains(a.Fixed, knob) {
			a.Fixed = append(a.Fixed, knob)
		}
	}
	for env, knob := range map[string]string{"HVDD_SPIN": daemon.KnobSpin, "HVDD_TCP_STREAMS": daemon.KnobStreams,
		"HVDD_TCP_CHUNK_BYTES": daemon.KnobChunk, "HVDD_TCP_SMALL_BYTES": daemon.KnobSmall} {
		if os.Getenv(env) != "" && !slices.Contains(a.Fixed, knob) {
			a.Fixed = append(a.Fixed, knob)
		}
	}
	slices.Sort(a.Fixed)
}

// parseGIDs parses --allow-gid: comma-separated group names or numeric
// ids, blanks ignored. Names are looked up with os/user (through the C
// library's NSS where hvdd is built with cgo, else in /etc/group).
func parseGIDs(list string) ([]uint32, error) {
	var gids []uint32
	for _, g := range strings.Split(list, ",") {
		if g = strings.TrimSpace(g); g == "" {
			continue
		}
		if g[0] < '0' || g[0] > '9' {
			grp, err := user.LookupGroup(g)
			if err != nil {
				return nil, fmt.Errorf("--allow-gid %q: no such group (create it: groupadd --system %s, or give its numeric id)", g, g)
			}
			g = grp.Gid
		}
		id, err := strconv.ParseUint(g, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("--allow-gid %q: want group names or numeric group ids", g)
		}
		gids = append(gids, uint32(id))
	}
	return gids, nil
}

// clusterConfig fills in what a daemon of a multi-node job needs: the
// control transport (starting the MPI bridge for --control mpi), the job's
// secret and the cross-node engine. args.nodes and args.nodeRank are
// resolved.
func clusterConfig(cfg *daemon.Config, args serveArgs) error {
	control, err := resolveControl(args.control, args.backend, args.rendezvous)
	if err != nil {
		return err
	}
	var bridge *mpi.Bridge
	if control == "mpi" {
		// MPI carries the control links too: no rendezvous needed.
		if bridge, err = mpiControl(args.nodeRank, args.nodes); err != nil {
			return err
		}
		cfg.Control = bridge
	}
	secret, err := loadSecret(args.secretFile)
	if errors.Is(err, auth.ErrNoSecret) && bridge != nil {
		// The links travel inside the MPI job: the one rank 0 made.
		secret, err = bridge.Secret(), nil
	}
	if err != nil {
		return secretError(err)
	}
	factory, err := backendFactory(args.backend, tcpSettings{streams: args.streams, chunk: args.chunkBytes, small: args.smallBytes, compression: args.compression})
	if err != nil {
		return err
	}
	if args.compression != backends.CompressNone {
		cfg.Logger.Info("wire compression: float32 sums cross nodes in 16 bits", "format", args.compression)
	}
	cfg.Nodes, cfg.NodeRank, cfg.Rendezvous, cfg.Advertise = args.nodes, args.nodeRank, args.rendezvous, args.advertise
	cfg.Elastic = args.elastic
	cfg.ExternalRendezvous = args.rendezvousExternal
	cfg.ElasticDriver = args.elasticDriver
	cfg.Secret, cfg.NewBackend = secret, factory
	warnIfBound(cfg.Logger)
	return nil
}

// loadSecret reads a job's shared secret from --secret-file file, else
// from $HVDD_SECRET (auth.LoadSecret: exactly one of them, hex or raw, at
// least auth.MinSecretLen bytes).
func loadSecret(file string) ([]byte, error) {
	return auth.LoadSecret(file, os.Getenv("HVDD_SECRET"))
}

// secretError is loadSecret's error with how to make a secret.
func secretError(err error) error {
	return fmt.Errorf("%w (generate one with: head -c 32 /dev/urandom | xxd -p -c 64 > secret; give every node the same file)", err)
}

// serve runs the daemon on socket (or on the listener systemd passed) until
// a signal stops it (see stopOnSignals), and returns the exit status: 2 for
// a configuration the daemon refuses, 1 when it cannot listen or fails.
func serve(cfg daemon.Config, socket string, stopTimeout time.Duration, sigs chan os.Signal) int {
	sd := newService(cfg.Logger)
	if sd.n.enabled() {
		cfg.OnStatus = sd.onStatus
	}
	srv, err := daemon.New(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hvdd serve: %v\n", err)
		return 2
	}
	// The signals are acted on before the socket exists: a SIGTERM sent as
	// soon as it appears stops the daemon the usual way.
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(context.Canceled)
	stopSignals := stopOnSignals(sigs, srv, cancel, stopTimeout, sd, cfg.Logger)
	defer stopSignals()
	ln, err := systemdListener()
	if err == nil && ln == nil {
		ln, err = daemon.Listen(socket)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "hvdd serve: %v\n", err)
		return 1
	}
	go sd.run(ctx, srv)
	if p := os.Getenv("HVDD_CPUPROFILE"); p != "" {
		// A debugging aid, not a stable interface.
		if f, err := os.Create(p); err == nil {
			pprof.StartCPUProfile(f)
			defer pprof.StopCPUProfile()
		}
	}
	go logGPUs(cfg.Logger) // gpus.go: the node's GPUs, or "CPU-only", once
	err = srv.Serve(ctx, ln)
	sd.send("STOPPING=1")
	if err != nil && !errors.Is(err, daemon.ErrServerClosed) && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(os.Stderr, "hvdd serve: %v\n", err)
		return 1
	}
	return 0
}

// stopOnSignals stops the daemon on SIGINT or SIGTERM. With stopTimeout 0
// it stops at once: a running job's ranks are told why (the signal), and
// their pending operations fail. With a stopTimeout (the unit sets one to
// match its TimeoutStopSec=) the first signal drains the daemon instead
// (daemon.Server.Shutdown): the running job runs to its end and new jobs
// are refused, then the daemon exits; if the job has not ended after
// stopTimeout, or a second signal comes, the daemon stops at once, and the
// job's ranks are told that. Under mpirun a SIGTERM usually means that
// mpirun ends the whole job because a daemon on another node died (MPI
// jobs do not outlive a rank), which the message says. ch is where the
// signals arrive (signal.Notify'd by the caller, maybe before the daemon
// existed). The returned func stops listening for signals.
func stopOnSignals(ch chan os.Signal, srv *daemon.Server, stop context.CancelCauseFunc, stopTimeout time.Duration, sd *service, log *slog.Logger) func() {
	done := make(chan struct{})
	go func() {
		var sig os.Signal
		select {
		case sig = <-ch:
		case <-done:
			return
		}
		why := "it received " + unix.SignalName(sig.(syscall.Signal))
		if _, _, ok := launcherRank(); ok && sig == syscall.SIGTERM {
			why += " (under mpirun: mpirun ends the whole job when any of its daemons dies)"
		}
		sd.send("STOPPING=1")
		if stopTimeout <= 0 {
			stop(errors.New(why))
			return
		}
		log.Warn("stopping once the running job has ended (new jobs are refused); send the signal again to stop at once",
			"signal", unix.SignalName(sig.(syscall.Signal)), "stop_timeout", stopTimeout)
		go func() {
			ctx, cancel := context.WithTimeoutCause(context.Background(), stopTimeout,
				fmt.Errorf("%s, and its job did not end within --stop-timeout %v", why, stopTimeout))
			defer cancel()
			if srv.Shutdown(ctx) != nil {
				log.Warn("the running job did not end within --stop-timeout; stopped it", "stop_timeout", stopTimeout)
			}
		}()
		select {
		case sig = <-ch:
			stop(fmt.Errorf("it received %s while waiting for its job to end", unix.SignalName(sig.(syscall.Signal))))
		case <-done:
		}
	}()
	return func() { signal.Stop(ch); close(done) }
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
