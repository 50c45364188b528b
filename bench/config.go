package bench

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/hvdd/hvdd/tensor"
)

// Usage is the help text of `hvdd bench`.
const Usage = `Usage: hvdd bench [flags]

Measure hvdd's collectives the way nccl-tests does: for each size, time every
iteration, take the maximum over ranks of each iteration's time, and print
the median (and min and max) with the algorithm and bus bandwidth.

Run it as the ranks of a job (under hvdd run, or with HVDD_SOCKET set), or
alone with --np N, which starts a private daemon and N ranks itself.

  algbw = bytes / time
  busbw = algbw * 2(n-1)/n   allreduce
          algbw * (n-1)/n    allgather, reducescatter, alltoall
          algbw              broadcast
  bytes is the buffer allreduce and broadcast work on, the gathered result of
  allgather (each rank sends bytes/n), and the per-rank input of alltoall and
  reducescatter (each rank receives bytes/n).

Sizes of 64 KiB or less run at least --small-iters iterations and at least
--small-time worth of them (as OSU does), so that latency rows are stable; a
latency row is allreduce at 4 bytes.

--check fills each rank's input with small whole numbers, checks every
result of every iteration against a reference computed locally (exact for
integers, a few ulps for floats), and for allgather, alltoall and
reducescatter overwrites the input as soon as the op is done, so that a
daemon still reading it is caught. Exit status: 0, 1 on a failure or a
wrong result, 2 on bad usage.

Profiles (--profile):
  resnet50   per step, allreduce (Average) ResNet-50's 161 gradient tensors
             (25,557,032 float32) asynchronously and wait for all; compare
             with one fused allreduce of the same bytes
  idle       connect the ranks, do nothing for --duration, and report the
             CPU use of the daemon and of each client, as % of one core

Flags:
`

const usageExamples = `
Examples:
  hvdd bench --np 2                                  # allreduce sweep 4 B..64 MiB
  hvdd bench --np 2 --min-bytes 4 --max-bytes 4      # latency row
  hvdd bench --np 2 --min-bytes 64M --max-bytes 64M --iters 20
  hvdd bench --np 2 --max-bytes 4 --gap 50ms --iters 60  # 4 B after 50 ms pauses
  hvdd bench --np 4 --op allgather --dtype float16 --check
  hvdd bench --np 2 --op reducescatter --op-reduce average --json
  hvdd bench --np 2 --profile resnet50
  hvdd bench --np 2 --profile resnet50 --timeline /tmp/tl.json  # the same, traced
  hvdd bench --np 2 --profile resnet50 --gap 100ms   # steps 100 ms apart
  hvdd bench --np 2 --profile resnet50 --timeline /tmp/tl.json --timeline-compare  # steps traced and not
  hvdd bench --np 2 --profile idle --duration 10s
  hvdd run -np 2 -- hvdd bench --op broadcast        # as the ranks of a job
`

// Config is one `hvdd bench` invocation.
type Config struct {
	Op         tensor.OpType   // collective to measure
	DType      tensor.DType    // element type
	Reduce     tensor.ReduceOp // reduction for allreduce and reducescatter
	MinBytes   int64           // smallest size
	MaxBytes   int64           // largest size
	StepFactor float64         // size multiplier between rows
	Iters      int             // timed iterations per size
	Warmup     int             // untimed iterations before them
	SmallIters int             // least iterations for sizes <= SmallBytes
	SmallTime  time.Duration   // least timed duration for sizes <= SmallBytes
	Gap        time.Duration   // sleep before each timed iteration
	Check      bool            // verify every result
	JSON       bool            // one JSON object per row
	ZeroCopy   bool            // buffers from hvdd.Alloc
	Profile    string          // "", "resnet50" or "idle"
	Duration   time.Duration   // idle profile length
	NP         int             // ranks to launch (0: be one rank)
	Socket     string          // daemon socket
	Timeout    time.Duration   // whole-run limit per rank
	Device     string          // "" (host memory), "cuda" or "fake": GPU tensors through that driver

	// Timeline, when not empty, is the file rank 0 asks the daemon to
	// write Horovod's timeline to for the whole run (StartTimeline before
	// the first timed op, StopTimeline after the last), with cycle marks
	// when TimelineMarkCycles.
	Timeline           string
	TimelineMarkCycles bool
	// TimelineCompare makes the resnet50 profile time steps with the
	// timeline off and on, alternately, instead of the step and the fused
	// allreduce (Timeline is the file).
	TimelineCompare bool
}

// SmallBytes is the size up to which SmallIters and SmallTime apply.
const SmallBytes = 64 << 10

// DefaultConfig returns the defaults of every flag.
func DefaultConfig() Config {
	return Config{
		Op: tensor.Allreduce, DType: tensor.Float32, Reduce: tensor.Sum,
		MinBytes: 4, MaxBytes: 64 << 20, StepFactor: 2, Iters: 20, Warmup: 5,
		SmallIters: 1000, SmallTime: 200 * time.Millisecond, ZeroCopy: true,
		Duration: 10 * time.Second, Timeout: 30 * time.Minute,
	}
}

// ParseArgs parses the command line of `hvdd bench`. It returns
// flag.ErrHelp after writing the help to out when asked for it.
func ParseArgs(args []string, out io.Writer) (Config, error) {
	cfg := DefaultConfig()
	var text textFlags
	fs := newFlagSet(&cfg, &text, out)
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q (see hvdd bench --help)", fs.Arg(0))
	}
	if err := text.apply(&cfg); err != nil {
		return cfg, err
	}
	if err := cfg.validate(); err != nil {
		return cfg, err
	}
	profile, err := parseProfile(cfg.Profile)
	if err != nil {
		return cfg, err
	}
	cfg.Profile = profile
	if cfg.TimelineCompare && profile != "resnet50" {
		return cfg, errors.New("--timeline-compare times the resnet50 profile: add --profile resnet50")
	}
	return cfg, nil
}

// textFlags are the flags that ParseArgs takes as text and parses itself
// into Config (textFlags.apply).
type textFlags struct {
	op, dtype, reduce, minBytes, maxBytes string
}

// newFlagSet returns the flags of `hvdd bench`, writing to cfg (whose values
// are the defaults) and text, with its help going to out.
func newFlagSet(cfg *Config, text *textFlags, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("hvdd bench", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&text.op, "op", "allreduce", "collective: allreduce, allgather, broadcast, alltoall or reducescatter")
	fs.StringVar(&text.dtype, "dtype", "float32", "element type: uint8, int8, uint16, int16, int32, int64, float16, bfloat16, float32, float64, bool")
	fs.StringVar(&text.reduce, "op-reduce", "sum", "reduction for allreduce and reducescatter: sum, average, min, max, product, or adasum (allreduce of floats, a power-of-two number of ranks, without --check)")
	fs.StringVar(&text.minBytes, "min-bytes", "4", "smallest size in bytes; K, M and G suffixes are binary (64K = 65536)")
	fs.StringVar(&text.maxBytes, "max-bytes", "64M", "largest size in bytes")
	fs.Float64Var(&cfg.StepFactor, "step-factor", cfg.StepFactor, "multiply the size by this between rows (nccl-tests -f)")
	fs.IntVar(&cfg.Iters, "iters", cfg.Iters, "timed iterations per size (and steps of a profile)")
	fs.IntVar(&cfg.Warmup, "warmup", cfg.Warmup, "untimed iterations before the timed ones")
	fs.IntVar(&cfg.SmallIters, "small-iters", cfg.SmallIters, "least timed iterations for sizes <= 64 KiB")
	fs.DurationVar(&cfg.SmallTime, "small-time", cfg.SmallTime, "least timed duration for sizes <= 64 KiB (iterations estimated from the warm-up)")
	fs.DurationVar(&cfg.Gap, "gap", 0, "sleep this long before each timed iteration, as a training step's compute would: the time of an op after a pause, taken by the last rank to arrive (the minimum over ranks); every size then runs --iters iterations, and the row adds the daemon's CPU over them; with --profile resnet50, before each step and each fused allreduce")
	fs.BoolVar(&cfg.Check, "check", false, "verify every result against a locally computed reference; exit 1 on any mismatch")
	fs.BoolVar(&cfg.JSON, "json", false, "print one JSON object per row instead of the table")
	fs.BoolVar(&cfg.ZeroCopy, "zero-copy", cfg.ZeroCopy, "use buffers from hvdd.Alloc (shared memory); false: plain Go slices the client stages")
	fs.StringVar(&cfg.Profile, "profile", "", "run a profile instead of a sweep: resnet50 or idle")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of the idle profile")
	fs.IntVar(&cfg.NP, "np", 0, "start a private daemon and this many ranks (default: be one rank of a running job)")
	fs.StringVar(&cfg.Socket, "socket", "", "daemon socket (default $HVDD_SOCKET; with --np a private temporary one)")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "give up after this long")
	fs.StringVar(&cfg.Device, "device", "", "measure GPU tensors: cuda or fake (gpu/fake, for tests); each rank allocates on the GPU the daemon lists at its local rank and hands it over through CUDA IPC; with --np the daemon gets --gpu the same (default: host memory)")
	fs.StringVar(&cfg.Timeline, "timeline", "", "write Horovod's timeline of the run to this file (rank 0 starts it before the warm-up and stops it at the end; as HOROVOD_TIMELINE does at init)")
	fs.BoolVar(&cfg.TimelineMarkCycles, "timeline-mark-cycles", false, "with --timeline, mark every cycle of the daemon's loop (HOROVOD_TIMELINE_MARK_CYCLES)")
	fs.BoolVar(&cfg.TimelineCompare, "timeline-compare", false, "with --timeline and --profile resnet50: time steps with the timeline off and on, alternately in blocks of 5 (rank 0 starts it before each traced block and stops it after, untimed; the file keeps the last traced block), and print both with their ratio")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), Usage)
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), usageExamples)
	}
	return fs
}

// apply parses the text flags into cfg: the op (a collective hvdd bench
// measures), the dtype, the reduction (one the op supports) and the sizes.
func (t *textFlags) apply(cfg *Config) error {
	var err error
	if cfg.Op, err = tensor.ParseOpType(t.op); err != nil {
		return err
	}
	switch cfg.Op {
	case tensor.Allreduce, tensor.Allgather, tensor.Broadcast, tensor.Alltoall, tensor.Reducescatter:
	default:
		return fmt.Errorf("--op %s: want allreduce, allgather, broadcast, alltoall or reducescatter", t.op)
	}
	if cfg.DType, err = tensor.ParseDType(t.dtype); err != nil {
		return err
	}
	if cfg.Reduce, err = tensor.ParseReduceOp(t.reduce); err != nil {
		return err
	}
	if cfg.Reduce == tensor.Adasum {
		switch {
		case cfg.Op != tensor.Allreduce:
			return fmt.Errorf("--op-reduce adasum: Adasum reduces only allreduce, not %s", t.op)
		case cfg.DType != tensor.Float16 && cfg.DType != tensor.Float32 && cfg.DType != tensor.Float64:
			return fmt.Errorf("--op-reduce adasum: Adasum reduces float16, float32 and float64, not %s", cfg.DType)
		case cfg.Check:
			return errors.New("--op-reduce adasum: --check verifies element by element, and an Adasum result depends on whole vectors; time it without --check (the client tests check Adasum against its formula)")
		}
	}
	if cfg.Op == tensor.Reducescatter && cfg.Reduce != tensor.Sum && cfg.Reduce != tensor.Average {
		return fmt.Errorf("reducescatter supports only sum and average, not %s", cfg.Reduce)
	}
	switch cfg.Device {
	case "", "host":
		cfg.Device = ""
	case "cuda", "fake":
		if cfg.Profile != "" {
			return fmt.Errorf("--device %s measures the sweep, not --profile %s", cfg.Device, cfg.Profile)
		}
	default:
		return fmt.Errorf("--device %s: want cuda or fake (or host)", cfg.Device)
	}
	if cfg.MinBytes, err = ParseSize(t.minBytes); err != nil {
		return fmt.Errorf("--min-bytes: %w", err)
	}
	if cfg.MaxBytes, err = ParseSize(t.maxBytes); err != nil {
		return fmt.Errorf("--max-bytes: %w", err)
	}
	return nil
}

// validate checks the numeric fields of c, naming the flag at fault.
func (c *Config) validate() error {
	switch {
	case c.MinBytes < 1:
		return errors.New("--min-bytes must be at least 1")
	case c.MaxBytes < c.MinBytes:
		return fmt.Errorf("--max-bytes %d is below --min-bytes %d", c.MaxBytes, c.MinBytes)
	case !(c.StepFactor > 1) || math.IsInf(c.StepFactor, 0):
		return fmt.Errorf("--step-factor %v must be above 1", c.StepFactor)
	case c.Iters < 1:
		return errors.New("--iters must be at least 1")
	case c.Warmup < 0:
		return errors.New("--warmup must not be negative")
	case c.SmallIters < 0 || c.SmallTime < 0:
		return errors.New("--small-iters and --small-time must not be negative")
	case c.Gap < 0:
		return errors.New("--gap must not be negative")
	case c.NP < 0:
		return errors.New("--np must not be negative")
	case c.Duration <= 0:
		return errors.New("--duration must be positive")
	case c.Timeout <= 0:
		return errors.New("--timeout must be positive")
	case c.TimelineMarkCycles && c.Timeline == "":
		return errors.New("--timeline-mark-cycles needs --timeline")
	case c.TimelineCompare && c.Timeline == "":
		return errors.New("--timeline-compare needs --timeline")
	}
	return nil
}

// parseProfile returns the profile --profile names: "" (a sweep), "idle"
// or "resnet50" (also spelt "resnet").
func parseProfile(name string) (string, error) {
	switch name {
	case "", "idle":
		return name, nil
	case "resnet50", "resnet":
		return "resnet50", nil
	}
	return "", fmt.Errorf("--profile %q: want resnet50 or idle", name)
}

// ParseSize parses a byte count: a whole number with an optional binary
// suffix K, M or G (also KB/KiB, MB/MiB, GB/GiB; any case), so "64K" is 65536.
func ParseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	needUnit := false
	switch {
	case strings.HasSuffix(t, "IB"):
		t, needUnit = t[:len(t)-2], true
	case strings.HasSuffix(t, "B"):
		t = t[:len(t)-1]
	}
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult, t = 1<<10, t[:n-1]
		case 'M':
			mult, t = 1<<20, t[:n-1]
		case 'G':
			mult, t = 1<<30, t[:n-1]
		}
	}
	if needUnit && mult == 1 {
		return 0, fmt.Errorf("bad size %q: want KiB, MiB or GiB", s)
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("bad size %q: want a whole number of bytes, optionally with K, M or G (binary)", s)
	}
	if v > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return v * mult, nil
}

// FormatSize prints a byte count compactly with a binary suffix when exact
// ("64M", "4K", "1000").
func FormatSize(n int64) string {
	for _, u := range []struct {
		s string
		m int64
	}{{"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if n >= u.m && n%u.m == 0 {
			return strconv.FormatInt(n/u.m, 10) + u.s
		}
	}
	return strconv.FormatInt(n, 10)
}
