package launch

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// horovodrun's tuneable parameters, and what hvdd run makes of them.
//
// horovodrun (horovod/runner/launch.py) turns these flags, and the keys of
// its --config-file, into HOROVOD_* variables in the ranks' environment
// (config_parser.set_env_from_args), which Horovod's background thread in
// every rank reads. hvdd's ranks have no such thread: the node daemon
// negotiates and fuses. So hvdd run passes each knob twice: to the ranks'
// environment under horovodrun's name and value (scripts may read them),
// and, where the daemon has a matching setting, to every daemon it starts
// as an `hvdd serve` flag (Config.ServeFlags). Knobs with no daemon setting
// (the response cache, hierarchical collectives) reach the environment
// only; Usage says what each does here.

// Knobs are horovodrun's tuneable parameters. A nil field was not given
// (neither on the command line nor in a config file): hvdd run then sets
// neither its variable nor its daemon flag, and the daemon's own default
// (or its HOROVOD_* environment) applies. The zero value gives none.
type Knobs struct {
	// FusionThresholdMB is --fusion-threshold-mb: HOROVOD_FUSION_THRESHOLD
	// (in bytes) and hvdd serve --fusion-threshold. 0 disables fusion.
	FusionThresholdMB *int64
	// CycleTimeMS is --cycle-time-ms: HOROVOD_CYCLE_TIME and hvdd serve
	// --cycle-time.
	CycleTimeMS *float64
	// CacheCapacity is --cache-capacity: HOROVOD_CACHE_CAPACITY only (hvdd
	// has no response cache).
	CacheCapacity *int64
	// HierarchicalAllreduce and HierarchicalAllgather are
	// --[no-]hierarchical-allreduce and --[no-]hierarchical-allgather:
	// HOROVOD_HIERARCHICAL_ALLREDUCE/ALLGATHER only (hvdd is hierarchical
	// by construction).
	HierarchicalAllreduce, HierarchicalAllgather *bool
	// Autotune is --autotune: HOROVOD_AUTOTUNE=1 and the autotune fields
	// below (the log file an absolute path) in the environment, and hvdd
	// serve --autotune and its --autotune-* flags for the daemons.
	Autotune                     *bool
	AutotuneLogFile              *string
	AutotuneWarmupSamples        *int64
	AutotuneStepsPerSample       *int64
	AutotuneBayesOptMaxSamples   *int64
	AutotuneGaussianProcessNoise *float64
	// TimelineFilename is --timeline-filename, an absolute path:
	// HOROVOD_TIMELINE, which the ranks hand to the daemon.
	TimelineFilename *string
	// TimelineMarkCycles is --timeline-mark-cycles:
	// HOROVOD_TIMELINE_MARK_CYCLES.
	TimelineMarkCycles *bool
	// NoStallCheck, StallCheckWarningSeconds and StallCheckShutdownSeconds
	// are --no-stall-check, --stall-check-warning-time-seconds and
	// --stall-check-shutdown-time-seconds: HOROVOD_STALL_CHECK_DISABLE,
	// HOROVOD_STALL_CHECK_TIME_SECONDS, HOROVOD_STALL_SHUTDOWN_TIME_SECONDS
	// and hvdd serve --stall-check, --stall-shutdown.
	NoStallCheck              *bool
	StallCheckWarningSeconds  *int64
	StallCheckShutdownSeconds *int64
	// LogLevel is --log-level (TRACE, DEBUG, INFO, WARNING, ERROR, FATAL):
	// HOROVOD_LOG_LEVEL and hvdd serve --log-level.
	LogLevel *string
	// LogWithTimestamp is --log-with-timestamp (true) or
	// --log-without-timestamp (false): HOROVOD_LOG_HIDE_TIME only (the
	// daemon's log lines always carry time=).
	LogWithTimestamp *bool
}

// logLevels are horovodrun's --log-level choices (config_parser.LOG_LEVELS).
var logLevels = []string{"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"}

// validate applies horovodrun's checks (config_parser.validate_config_args),
// naming the flag.
func (k *Knobs) validate() error {
	nonNeg := []struct {
		flag string
		v    *int64
	}{
		{"--fusion-threshold-mb", k.FusionThresholdMB},
		{"--cache-capacity", k.CacheCapacity},
		{"--autotune-warmup-samples", k.AutotuneWarmupSamples},
		{"--autotune-steps-per-sample", k.AutotuneStepsPerSample},
		{"--autotune-bayes-opt-max-samples", k.AutotuneBayesOptMaxSamples},
		{"--stall-check-warning-time-seconds", k.StallCheckWarningSeconds},
		{"--stall-check-shutdown-time-seconds", k.StallCheckShutdownSeconds},
	}
	for _, n := range nonNeg {
		if n.v != nil && *n.v < 0 {
			return fmt.Errorf("%s %d must be >= 0", n.flag, *n.v)
		}
	}
	if k.FusionThresholdMB != nil && *k.FusionThresholdMB > 1<<20 {
		return fmt.Errorf("--fusion-threshold-mb %d is more than a TiB; pass the threshold in MB, e.g. 64", *k.FusionThresholdMB)
	}
	if k.CycleTimeMS != nil && !(*k.CycleTimeMS >= 0 && *k.CycleTimeMS <= 1e6) {
		return fmt.Errorf("--cycle-time-ms %v must be between 0 and 1000000 (milliseconds)", *k.CycleTimeMS)
	}
	if n := k.AutotuneGaussianProcessNoise; n != nil && !(*n >= 0 && *n <= 1) {
		return fmt.Errorf("--autotune-gaussian-process-noise %v must be in [0, 1]", *n)
	}
	if k.LogLevel != nil && !slices.Contains(logLevels, strings.ToUpper(*k.LogLevel)) {
		return fmt.Errorf("--log-level %q: choose from %s", *k.LogLevel, strings.Join(logLevels, ", "))
	}
	return nil
}

// env is the ranks' HOROVOD_* variables for the knobs given, as
// horovodrun's config_parser.set_env_from_args sets them (booleans as 1 or
// 0; the autotune details only with autotuning on).
func (k *Knobs) env() []string {
	var env []string
	add := func(name, value string) { env = append(env, name+"="+value) }
	b := func(v bool) string {
		if v {
			return "1"
		}
		return "0"
	}
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	if k.FusionThresholdMB != nil {
		add("HOROVOD_FUSION_THRESHOLD", i(*k.FusionThresholdMB<<20))
	}
	if k.CycleTimeMS != nil {
		add("HOROVOD_CYCLE_TIME", f(*k.CycleTimeMS))
	}
	if k.CacheCapacity != nil {
		add("HOROVOD_CACHE_CAPACITY", i(*k.CacheCapacity))
	}
	if k.HierarchicalAllreduce != nil {
		add("HOROVOD_HIERARCHICAL_ALLREDUCE", b(*k.HierarchicalAllreduce))
	}
	if k.HierarchicalAllgather != nil {
		add("HOROVOD_HIERARCHICAL_ALLGATHER", b(*k.HierarchicalAllgather))
	}
	if k.autotune() {
		add("HOROVOD_AUTOTUNE", "1")
		if k.AutotuneLogFile != nil {
			add("HOROVOD_AUTOTUNE_LOG", *k.AutotuneLogFile)
		}
		if k.AutotuneWarmupSamples != nil {
			add("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", i(*k.AutotuneWarmupSamples))
		}
		if k.AutotuneStepsPerSample != nil {
			add("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", i(*k.AutotuneStepsPerSample))
		}
		if k.AutotuneBayesOptMaxSamples != nil {
			add("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", i(*k.AutotuneBayesOptMaxSamples))
		}
		if k.AutotuneGaussianProcessNoise != nil {
			add("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", f(*k.AutotuneGaussianProcessNoise))
		}
	}
	if k.TimelineFilename != nil {
		add("HOROVOD_TIMELINE", *k.TimelineFilename)
	}
	if k.TimelineMarkCycles != nil {
		add("HOROVOD_TIMELINE_MARK_CYCLES", b(*k.TimelineMarkCycles))
	}
	if k.NoStallCheck != nil {
		add("HOROVOD_STALL_CHECK_DISABLE", b(*k.NoStallCheck))
	}
	if k.StallCheckWarningSeconds != nil {
		add("HOROVOD_STALL_CHECK_TIME_SECONDS", i(*k.StallCheckWarningSeconds))
	}
	if k.StallCheckShutdownSeconds != nil {
		add("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", i(*k.StallCheckShutdownSeconds))
	}
	if k.LogLevel != nil {
		add("HOROVOD_LOG_LEVEL", strings.ToUpper(*k.LogLevel))
	}
	if k.LogWithTimestamp != nil {
		// horovodrun writes the flag's value here, hiding the time when
		// asked to show it (an inversion in config_parser); the variable's
		// meaning is what counts.
		add("HOROVOD_LOG_HIDE_TIME", b(!*k.LogWithTimestamp))
	}
	return env
}

// autotune reports whether autotuning was asked for.
func (k *Knobs) autotune() bool { return k.Autotune != nil && *k.Autotune }

// daemonFlags is the `hvdd serve` flags for the knobs that the daemon has a
// setting for, except the log level (Config.ServeFlags adds it).
func (k *Knobs) daemonFlags() []string {
	var args []string
	if k.FusionThresholdMB != nil {
		args = append(args, "--fusion-threshold", strconv.FormatInt(*k.FusionThresholdMB<<20, 10))
	}
	if k.CycleTimeMS != nil {
		args = append(args, "--cycle-time", strconv.FormatFloat(*k.CycleTimeMS, 'f', -1, 64)+"ms")
	}
	if k.autotune() {
		args = append(args, "--autotune")
		if k.AutotuneLogFile != nil {
			args = append(args, "--autotune-log-file", *k.AutotuneLogFile)
		}
		if k.AutotuneWarmupSamples != nil {
			args = append(args, "--autotune-warmup-samples", strconv.FormatInt(*k.AutotuneWarmupSamples, 10))
		}
		if k.AutotuneStepsPerSample != nil {
			args = append(args, "--autotune-steps-per-sample", strconv.FormatInt(*k.AutotuneStepsPerSample, 10))
		}
		if k.AutotuneBayesOptMaxSamples != nil {
			args = append(args, "--autotune-bayes-opt-max-samples", strconv.FormatInt(*k.AutotuneBayesOptMaxSamples, 10))
		}
		if k.AutotuneGaussianProcessNoise != nil {
			args = append(args, "--autotune-gaussian-process-noise", strconv.FormatFloat(*k.AutotuneGaussianProcessNoise, 'f', -1, 64))
		}
	}
	switch {
	case k.NoStallCheck != nil && *k.NoStallCheck:
		args = append(args, "--stall-check", "-1s") // negative: disabled
	case k.StallCheckWarningSeconds != nil:
		args = append(args, "--stall-check", seconds(*k.StallCheckWarningSeconds))
	}
	if k.StallCheckShutdownSeconds != nil {
		args = append(args, "--stall-shutdown", seconds(*k.StallCheckShutdownSeconds))
	}
	return args
}

func seconds(n int64) string { return (time.Duration(n) * time.Second).String() }

// knobFlags registers horovodrun's tuneable-parameter flags on fs, each
// setting its field of k when given.
func knobFlags(fs *flag.FlagSet, k *Knobs) {
	intKnob := func(name string, p **int64) {
		fs.Func(name, "", func(s string) error {
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return errors.New("want a whole number")
			}
			*p = &v
			return nil
		})
	}
	floatKnob := func(name string, p **float64) {
		fs.Func(name, "", func(s string) error {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return errors.New("want a number")
			}
			*p = &v
			return nil
		})
	}
	// boolKnob registers --NAME, and --no-NAME for false when neg is set
	// (horovodrun's mutually exclusive pairs).
	boolKnob := func(name, neg string, p **bool, value bool) {
		set := func(s string) error {
			v, err := strconv.ParseBool(s)
			if err != nil {
				return errors.New("want no value, or =true or =false")
			}
			v = v == value
			*p = &v
			return nil
		}
		fs.BoolFunc(name, "", set)
		if neg != "" {
			fs.BoolFunc(neg, "", func(s string) error {
				if err := set(s); err != nil {
					return err
				}
				**p = !**p
				return nil
			})
		}
	}
	strKnob := func(name string, p **string) {
		fs.Func(name, "", func(s string) error { *p = &s; return nil })
	}
	intKnob("fusion-threshold-mb", &k.FusionThresholdMB)
	floatKnob("cycle-time-ms", &k.CycleTimeMS)
	intKnob("cache-capacity", &k.CacheCapacity)
	boolKnob("hierarchical-allreduce", "no-hierarchical-allreduce", &k.HierarchicalAllreduce, true)
	boolKnob("hierarchical-allgather", "no-hierarchical-allgather", &k.HierarchicalAllgather, true)
	boolKnob("autotune", "no-autotune", &k.Autotune, true)
	strKnob("autotune-log-file", &k.AutotuneLogFile)
	intKnob("autotune-warmup-samples", &k.AutotuneWarmupSamples)
	intKnob("autotune-steps-per-sample", &k.AutotuneStepsPerSample)
	intKnob("autotune-bayes-opt-max-samples", &k.AutotuneBayesOptMaxSamples)
	floatKnob("autotune-gaussian-process-noise", &k.AutotuneGaussianProcessNoise)
	strKnob("timeline-filename", &k.TimelineFilename)
	boolKnob("timeline-mark-cycles", "no-timeline-mark-cycles", &k.TimelineMarkCycles, true)
	boolKnob("no-stall-check", "stall-check", &k.NoStallCheck, true)
	intKnob("stall-check-warning-time-seconds", &k.StallCheckWarningSeconds)
	intKnob("stall-check-shutdown-time-seconds", &k.StallCheckShutdownSeconds)
	strKnob("log-level", &k.LogLevel)
	boolKnob("log-with-timestamp", "log-without-timestamp", &k.LogWithTimestamp, true)
	// Deprecated spellings horovodrun still takes.
	boolKnob("log-hide-timestamp", "no-log-hide-timestamp", &k.LogWithTimestamp, false)
}

// warnings says what of the knobs given hvdd run accepts without doing it:
// nothing now (autotuning was the last).
func (k *Knobs) warnings() []string { return nil }
