package daemon

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/hvdd/hvdd/daemon/internal/loop"
	"github.com/hvdd/hvdd/daemon/internal/nodes"
	"github.com/hvdd/hvdd/daemon/metrics"
	"github.com/hvdd/hvdd/gpu"
)

// Config configures a Server. Every field's zero value has the meaning its
// comment gives; New validates the whole.
type Config struct {
	// Slots is the number of local client processes a job has on this node.
	// Required (>= 1).
	Slots int

	// AllowGIDs are group ids whose members may connect besides the daemon's own
	// uid and root: a process whose primary group or one of whose
	// supplementary groups is among them. Empty: only the daemon's uid and
	// root.
	AllowGIDs []uint32

	// FusionThreshold is the most bytes fused into one response. Zero means the
	// default, 128 MiB (Horovod's since 0.21); negative disables fusion.
	FusionThreshold int64

	// CycleTime, when positive, is the least time between two dispatched plans:
	// work that becomes ready sooner waits so that it can be fused. Zero (the
	// default) dispatches as soon as work is ready and the executor is free.
	CycleTime time.Duration

	// StallCheck is how long some ranks may wait for the others on a tensor
	// before the daemon logs the missing ranks. Zero means 60 s; negative
	// disables the check.
	StallCheck time.Duration

	// StallShutdown, when positive, fails the job once a tensor has stalled this
	// long. Zero never fails it. It is ignored (with a warning) when shorter than
	// StallCheck, as Horovod does.
	StallShutdown time.Duration

	// OutputRegion is the size of each daemon-owned output region granted to a
	// client (allgather, alltoall and reducescatter results). Zero means 256 MiB;
	// memfd pages cost nothing until written. Larger outputs get a region of
	// their own size.
	OutputRegion int64

	// Spin is how long the daemon keeps polling its clients without sleeping
	// after each burst of activity, so that the next request of a busy job
	// costs no wake-up. Zero means 50 µs; negative never spins (every request
	// then pays a wake-up, about 30 µs across cores). The window adapts up to
	// 10x (ipc.AdaptSpin) for jobs whose requests come just after it. An idle
	// daemon sleeps.
	Spin time.Duration

	// Workers bounds the goroutines of one local reduction. Zero means
	// GOMAXPROCS.
	Workers int

	// Logger receives the daemon's logs. Nil means slog's default logger.
	Logger *slog.Logger

	// Nodes is the number of nodes (daemons) in a job. Zero or 1: this node
	// alone, and the fields below are ignored.
	Nodes int
	// NodeRank is this daemon's node index in [0, Nodes); node 0 coordinates
	// and serves the rendezvous.
	NodeRank int
	// Rendezvous is node 0's rendezvous address (host:port); node 0 binds it
	// unless ExternalRendezvous.
	Rendezvous string
	// ExternalRendezvous says another process serves the rendezvous at
	// Rendezvous (hvdd run's elastic driver, hvdd rendezvous): node 0 is
	// its client as the other nodes are, so the store outlives any node, and
	// an elastic job's coordination moves to another node when the
	// coordinator is lost (package nodes).
	ExternalRendezvous bool
	// ElasticDriver says that hvdd run's elastic driver, which serves the
	// external rendezvous, decides the membership of every epoch of an
	// elastic job after the first, as Horovod's driver does: the daemons
	// report each forming epoch's workers there and form it only with the
	// nodes and ranks the driver publishes (package nodes, driven.go).
	// Needs Elastic and ExternalRendezvous.
	ElasticDriver bool
	// Advertise is the host this node binds its control and data listeners
	// on and that other nodes dial. Required with Nodes > 1.
	Advertise string
	// Secret authenticates daemons to each other and to the rendezvous.
	// Required with Nodes > 1 (at least 16 bytes).
	Secret []byte
	// NewBackend creates the data engine of each multi-node job. Required
	// with Nodes > 1 (cmd/hvdd passes the tcp or mpi engine).
	NewBackend nodes.BackendFactory
	// Control, when set, carries the control links between the daemons
	// instead of TCP, and the nodes need no rendezvous (cmd/hvdd passes the
	// MPI bridge with --backend mpi, so that MPI carries control and data).
	Control nodes.ControlTransport
	// Elastic makes the daemon take part in elastic jobs across nodes whose
	// node set changes: it forms jobs with the other nodes even when Nodes
	// is 1 (node 0 then starts a job alone that nodes may join), and node 0
	// takes nodes that join a running elastic job, whatever their NodeRank
	// (hvdd serve --elastic; hvdd run starts elastic jobs' daemons so).
	Elastic bool
	// StartTimeout bounds forming a job across nodes. Zero means 120 s.
	StartTimeout time.Duration
	// ExitAfterJob makes the daemon serve one job and exit when that job's
	// last local connection has closed (a job that never formed included):
	// the daemon that a job's own processes start for themselves when they
	// run under mpirun or srun without one (the Python client's
	// hvdd._launcher). An elastic job's next epoch is the same job.
	ExitAfterJob bool

	// IdleExit, when positive, makes the daemon exit once no client has been
	// connected for this long (since it started, or since the last one
	// left). Zero never exits for idleness.
	IdleExit time.Duration

	// ElasticTimeout bounds how long the next epoch of an elastic job waits
	// for its surviving ranks to re-initialise (horovodrun's
	// --elastic-timeout). Zero means 600 s.
	ElasticTimeout time.Duration
	// Heartbeat and PeerTimeout tune the control links: a node silent for
	// PeerTimeout is lost. Zero means 1 s and 3 s.
	Heartbeat, PeerTimeout time.Duration

	// OnStatus, when set, is called with what the daemon is doing (Status)
	// when the event loop starts and whenever that changes: a job forming,
	// running, failing or ending, a drain beginning. It runs on the loop's
	// goroutine, so it must return at once and not call the Server (cmd/hvdd
	// hands the line to a goroutine that tells systemd). Nil: not called.
	OnStatus func(loop.Status)

	// Autotune tunes the settings of every job this daemon coordinates
	// while the job runs (Horovod's HOROVOD_AUTOTUNE); its zero value leaves
	// them as configured.
	Autotune loop.AutotuneConfig

	// GPU is the CUDA driver (gpu/gpuload: hvdd serve --gpu) through which
	// the daemon takes clients' GPU tensors (Enqueue.device_buffer). Nil,
	// or a driver that lists no GPU, runs the daemon CPU-only: clients then
	// stage GPU tensors through host memory.
	GPU gpu.Driver
	// NCCL reduces tensors that local ranks hold on different GPUs (one
	// communicator per local GPU). Nil: such tensors are reduced through
	// host memory.
	NCCL gpu.NCCL
	// GPUAllreduce chooses how GPU tensors are reduced across nodes
	// (hvdd serve --gpu-allreduce, HOROVOD_GPU_ALLREDUCE,
	// HOROVOD_HIERARCHICAL_ALLREDUCE): GPUAllreduceHierarchical (also the
	// zero value "") reduces the node's ranks on the GPU, moves the node's
	// result through the job's engine (NewBackend) in host memory and
	// copies it back; GPUAllreduceNCCL reduces the node's ranks on the GPU
	// the same way and joins the nodes with an NCCL communicator of one GPU
	// per node (its unique id sent in the coordinator's plan over the
	// control links) where the coordinator's plan says so: for a response
	// that every node's ranks can run so (plan.NCCLAcross); otherwise, and
	// on a node configured otherwise, each node runs its own path for it
	// (the nodes' modes may differ); GPUAllreduceHost stages
	// every GPU tensor through host memory and runs the CPU path, on one
	// node too.
	GPUAllreduce string
	// GPUCompletion is how a GPU op's completion reaches its client (hvdd
	// serve --gpu-completion, $HVDD_GPU_COMPLETION): GPUCompletionHost
	// (also "") synchronises with the GPU before each Done;
	// GPUCompletionStream sends the Done once the work is enqueued, with an
	// event the client's stream waits on, where the op's route allows it
	// (one GPU, on one node) and its client waits so (the Python client's
	// device ops).
	GPUCompletion string

	// OpenGPUSampler opens the sampler of the node's GPUs. Each of its
	// rounds (every GPUSampleInterval, on a goroutine of the Server's own,
	// never the loop's) feeds Metrics' hvdd_gpu_* families and hvdd
	// status's GPU figures, and a GPU a round reports lost (NVML's
	// ERROR_GPU_IS_LOST, or XID 79) fails the device tensors on it from
	// then on, naming it, while host tensors and the other GPUs go on. It
	// is called once, on that goroutine, after Serve has started; an error
	// is logged, shown by hvdd status, and leaves the daemon unsampled. Nil
	// means gpu/nvml's OpenSampler when the daemon has GPUs (GPU lists
	// some), and no sampling without.
	OpenGPUSampler func() (GPUSampler, error)
	// GPUSampleInterval is the time between the starts of two sampling
	// rounds (hvdd serve --gpu-sample-interval). Zero means 10 s; negative
	// turns sampling off.
	GPUSampleInterval time.Duration

	// Metrics, when set, receives the daemon's Prometheus metrics (package
	// daemon/metrics; hvdd serve --metrics-addr serves them): ops, bytes,
	// latency, fusion, negotiation waits, stalls, clients and jobs, links,
	// shared memory. Nil counts nothing (every hook is a nil check). One
	// Metrics serves one Server at a time.
	Metrics *metrics.Metrics
}

// The GPUCompletion modes.
const (
	GPUCompletionHost   = "host"
	GPUCompletionStream = "stream"
)

// The GPUAllreduce modes.
const (
	GPUAllreduceHierarchical = "hierarchical"
	GPUAllreduceHost         = "host"
	GPUAllreduceNCCL         = "nccl"
)

// DefaultFusionThreshold is Horovod's default fusion buffer size.
const DefaultFusionThreshold = 128 << 20

// DefaultGPUSampleInterval is GPUSampleInterval's default: a node
// service's pace (each round costs about 40 ms of NVML calls per GPU, on
// the sampler's goroutine).
const DefaultGPUSampleInterval = 10 * time.Second

func (c *Config) Validate() error {
	var errs []error
	if c.Slots < 1 {
		errs = append(errs, fmt.Errorf("slots must be at least 1, got %d (set --slots to the number of local processes)", c.Slots))
	}
	if c.CycleTime < 0 {
		errs = append(errs, fmt.Errorf("cycle time must not be negative, got %v", c.CycleTime))
	}
	if c.OutputRegion < 0 {
		errs = append(errs, fmt.Errorf("output region size must not be negative, got %d", c.OutputRegion))
	}
	if err := c.Autotune.Validate(); err != nil {
		errs = append(errs, err)
	}
	switch c.GPUAllreduce {
	case "", GPUAllreduceHierarchical, GPUAllreduceHost, GPUAllreduceNCCL:
	default:
		errs = append(errs, fmt.Errorf("GPU allreduce mode %q: want %q, %q or %q", c.GPUAllreduce, GPUAllreduceHierarchical, GPUAllreduceNCCL, GPUAllreduceHost))
	}
	switch c.GPUCompletion {
	case "", GPUCompletionHost, GPUCompletionStream:
	default:
		errs = append(errs, fmt.Errorf("GPU completion mode %q: want %q or %q", c.GPUCompletion, GPUCompletionHost, GPUCompletionStream))
	}
	if c.Workers < 0 {
		errs = append(errs, fmt.Errorf("workers must not be negative, got %d", c.Workers))
	}
	if c.multiNode() {
		if c.NodeRank < 0 || c.NodeRank >= c.Nodes {
			errs = append(errs, fmt.Errorf("node rank %d is out of range for %d nodes", c.NodeRank, c.Nodes))
		}
		if c.Rendezvous == "" && c.Control == nil {
			errs = append(errs, errors.New("a multi-node job needs --rendezvous HOST:PORT (node 0's address)"))
		}
		if c.Advertise == "" && c.Control == nil {
			errs = append(errs, errors.New("a multi-node job needs --advertise HOST (this node's address the others reach)"))
		}
		if len(c.Secret) < 16 {
			errs = append(errs, errors.New("a multi-node job needs a shared secret of at least 16 bytes (--secret-file or HVDD_SECRET)"))
		}
		if c.NewBackend == nil {
			errs = append(errs, errors.New("a multi-node job needs a backend"))
		}
	}
	if c.ElasticDriver && (!c.Elastic || !c.ExternalRendezvous || c.Control != nil) {
		errs = append(errs, errors.New("--elastic-driver needs --elastic and --rendezvous-external (the driver serves the rendezvous), and TCP control links"))
	}
	return errors.Join(errs...)
}

// multiNode reports whether the daemon forms jobs with other nodes.
func (c *Config) multiNode() bool { return c.Nodes > 1 || c.Elastic }

func (c *Config) withDefaults() Config {
	out := *c
	if out.FusionThreshold == 0 {
		out.FusionThreshold = DefaultFusionThreshold
	} else if out.FusionThreshold < 0 {
		out.FusionThreshold = 0
	}
	if out.StallCheck == 0 {
		out.StallCheck = 60 * time.Second
	}
	if out.Spin == 0 {
		out.Spin = 50 * time.Microsecond
	} else if out.Spin < 0 {
		out.Spin = 0
	}
	if out.OutputRegion == 0 {
		out.OutputRegion = 256 << 20
	}
	if out.StartTimeout == 0 {
		out.StartTimeout = 120 * time.Second
	}
	if out.ElasticTimeout == 0 {
		out.ElasticTimeout = 600 * time.Second
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.GPUSampleInterval == 0 {
		out.GPUSampleInterval = DefaultGPUSampleInterval
	}
	return out
}

// ApplyHorovodEnv overrides fields from Horovod's environment knobs where they
// are set (HOROVOD_FUSION_THRESHOLD in bytes, HOROVOD_CYCLE_TIME in ms,
// HOROVOD_STALL_CHECK_DISABLE, HOROVOD_STALL_CHECK_TIME_SECONDS,
// HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, HOROVOD_AUTOTUNE and its
// HOROVOD_AUTOTUNE_* details); a fusion threshold or cycle time set there is
// held fixed by autotuning, as in Horovod. getenv is os.Getenv in production. The
// knobs exist for Horovod users' scripts; hvdd's flags are the stable interface.
func (c *Config) ApplyHorovodEnv(getenv func(string) string) error {
	var errs []error
	num := func(key string, f func(float64)) {
		if err := loop.EnvNumber(getenv, key, f); err != nil {
			errs = append(errs, err)
		}
	}
	num("HOROVOD_FUSION_THRESHOLD", func(x float64) {
		if x == 0 {
			c.FusionThreshold = -1 // Horovod: 0 disables fusion
		} else {
			c.FusionThreshold = int64(x)
		}
	})
	num("HOROVOD_CYCLE_TIME", func(x float64) { c.CycleTime = time.Duration(x * float64(time.Millisecond)) })
	if getenv("HOROVOD_FUSION_THRESHOLD") != "" {
		c.Autotune.Fix(loop.KnobFusion)
	}
	if getenv("HOROVOD_CYCLE_TIME") != "" {
		c.Autotune.Fix(loop.KnobCycle)
	}
	errs = append(errs, c.Autotune.ApplyHorovodEnv(getenv))
	num("HOROVOD_STALL_CHECK_TIME_SECONDS", func(x float64) { c.StallCheck = time.Duration(x * float64(time.Second)) })
	num("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", func(x float64) { c.StallShutdown = time.Duration(x * float64(time.Second)) })
	if v := getenv("HOROVOD_STALL_CHECK_DISABLE"); v != "" && v != "0" {
		c.StallCheck = -1
	}
	return errors.Join(errs...)
}

// LogLevel maps Horovod's HOROVOD_LOG_LEVEL names (TRACE, DEBUG, INFO, WARNING,
// ERROR, FATAL; any case) and slog's to a slog level.
func LogLevel(name string) (slog.Level, error) {
	switch strings.ToUpper(strings.TrimSpace(name)) {
	case "TRACE", "DEBUG":
		return slog.LevelDebug, nil
	case "INFO", "":
		return slog.LevelInfo, nil
	case "WARNING", "WARN":
		return slog.LevelWarn, nil
	case "ERROR", "FATAL":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("unknown log level %q (want trace, debug, info, warning, error or fatal)", name)
}

// NewLogger returns a text logger at level writing to w (os.Stderr if nil).
func NewLogger(w io.Writer, level slog.Level) *slog.Logger {
	if w == nil {
		w = os.Stderr
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// MultiNodeJob describes a formed multi-node job to a BackendFactory.
type MultiNodeJob = nodes.MultiNodeJob

// ControlTransport opens the streams that carry the control links between
// daemons when they do not use TCP (nodes.ControlTransport says how).
type ControlTransport = nodes.ControlTransport

// BackendFactory creates the cross-node engine of a job; every node calls it
// at about the same time, and it returns once the engine is connected.
type BackendFactory = nodes.BackendFactory

// AutotuneConfig configures autotuning (Horovod's HOROVOD_AUTOTUNE*).
type AutotuneConfig = loop.AutotuneConfig

// The autotuner's knobs (AutotuneConfig.Fixed, hvdd serve --autotune-fixed).
const (
	KnobFusion  = loop.KnobFusion
	KnobCycle   = loop.KnobCycle
	KnobSpin    = loop.KnobSpin
	KnobStreams = loop.KnobStreams
	KnobChunk   = loop.KnobChunk
	KnobSmall   = loop.KnobSmall
)

// Status is what the daemon is doing (Config.OnStatus, Server.Probe).
type Status = loop.Status

// JobStatus is one job in a Status.
type JobStatus = loop.JobStatus

// JobState is where a job is in its life (JobStatus.State).
type JobState = loop.JobState

// The states of a job.
const (
	JobForming   = loop.JobForming
	JobRunning   = loop.JobRunning
	JobFailed    = loop.JobFailed
	JobReforming = loop.JobReforming
)

// DriverGrace is how much longer than the elastic timeout a daemon under
// hvdd run's elastic driver (Config.ElasticDriver) waits for an epoch's
// survivors before it gives them up itself. The driver owns that timeout:
// it waits --elastic-timeout for slots from the failure it sees, which can
// be a second after the daemons saw it (a rank's exit status), and then
// ends the job with Horovod's message. A daemon that timed out first would
// refuse the survivors, and the job would end on their failures instead.
const DriverGrace = 30 * time.Second

// reformTimeout is the loop's bound on an epoch's re-formation: the elastic
// timeout, and DriverGrace more when the driver decides the membership.
func (c Config) reformTimeout() time.Duration {
	if c.ElasticDriver {
		return c.ElasticTimeout + DriverGrace
	}
	return c.ElasticTimeout
}
