package loop

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/daemon/autotune"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/plan"
)

// Autotuning (Config.Autotune, Horovod's HOROVOD_AUTOTUNE). The node that
// decides a job's plans (the job's coordination says coordinates) gives
// every batch it dispatches to a tuner: an autotune.Manager over the knobs
// below that the user did not fix. When the Manager moves to another
// configuration the loop applies it: the cycle time and spin window to
// itself, the fusion threshold to its plan table (it alone fuses), and,
// across nodes, the whole in the next plan (clusterpb.Tuning), which every
// node applies before that plan's responses, the engine's settings
// included (backends.Tunable). Every node therefore changes the engine
// between the same two collectives. When tuning ends the best
// configuration stays for the rest of the job; a new job (or an elastic
// job's next epoch, as Horovod's reset) tunes anew from the configured
// values.

// The knobs autotuning can tune, by the names of Config.Autotune.Fixed, the
// log and the CSV file's header.
const (
	// KnobFusion is the fusion threshold in MiB (--fusion-threshold,
	// HOROVOD_FUSION_THRESHOLD), on a log scale from 64 KiB to 256 MiB.
	KnobFusion = "fusion_threshold_mb"
	// KnobCycle is the cycle time in ms (--cycle-time,
	// HOROVOD_CYCLE_TIME), 0 to 20.
	KnobCycle = "cycle_time_ms"
	// KnobSpin is the loop's spin window in µs (--spin), 0 to 500.
	KnobSpin = "spin_us"
	// KnobStreams is how many of the engine's connections per peer a
	// large collective uses (--tcp-streams fixes it), 1 to the connections
	// opened.
	KnobStreams = "streams"
	// KnobChunk is the engine's pipeline segment in KiB, on a log scale
	// from 16 KiB to 16 MiB.
	KnobChunk = "chunk_kb"
	// KnobSmall is the engine's small-message threshold in KiB, on a log
	// scale from 1 KiB to 4 MiB.
	KnobSmall = "small_kb"
)

// KnobNames are the knobs autotuning can tune.
var KnobNames = []string{KnobFusion, KnobCycle, KnobSpin, KnobStreams, KnobChunk, KnobSmall}

// Fix adds knob to the fixed knobs, which autotuning leaves alone.
func (a *AutotuneConfig) Fix(knob string) {
	if !slices.Contains(a.Fixed, knob) {
		a.Fixed = append(a.Fixed, knob)
	}
}

// Validate checks the autotuning settings.
func (a *AutotuneConfig) Validate() error {
	var errs []error
	for _, k := range a.Fixed {
		if !slices.Contains(KnobNames, k) {
			errs = append(errs, fmt.Errorf("autotune: unknown knob %q (want one of %s)", k, strings.Join(KnobNames, ", ")))
		}
	}
	if a.StepsPerSample < 0 || a.MaxSamples < 0 {
		errs = append(errs, fmt.Errorf("autotune: steps per sample (%d) and samples (%d) must not be negative", a.StepsPerSample, a.MaxSamples))
	}
	if a.Noise > 1 {
		errs = append(errs, fmt.Errorf("autotune: Gaussian process noise %v must be in [0, 1]", a.Noise))
	}
	return errors.Join(errs...)
}

// tuner tunes one job's settings on the node that decides its plans.
type tuner struct {
	m     *autotune.Manager
	names []string     // the Manager's knobs, in order
	base  job.Settings // the configured values (the fixed knobs keep them)
	start time.Time
	log   *slog.Logger
	csv   *os.File // nil without a log file
	w     *bufio.Writer
}

// newTuner returns the tuner of a job, or nil when every knob is fixed.
// engine is the job's data engine, nil on one node. cfg has its defaults.
func newTuner(cfg Config, base job.Settings, engine backends.Backend, log *slog.Logger) (*tuner, error) {
	a := cfg.Autotune
	fixed := func(k string) bool { return slices.Contains(a.Fixed, k) }
	var knobs []autotune.Knob
	add := func(k autotune.Knob) {
		if !fixed(k.Name) {
			knobs = append(knobs, k)
		}
	}
	add(autotune.Knob{Name: KnobFusion, Lo: 1.0 / 16, Hi: 256, Log: true, Start: float64(base.Fusion) / (1 << 20)})
	add(autotune.Knob{Name: KnobCycle, Lo: 0, Hi: 20, Start: float64(base.Cycle) / float64(time.Millisecond)})
	add(autotune.Knob{Name: KnobSpin, Lo: 0, Hi: 500, Start: float64(base.Spin) / float64(time.Microsecond)})
	if tb, ok := engine.(backends.Tunable); ok {
		base.Engine = tb.Tuning()
		if n := tb.MaxStreams(); n > 1 {
			add(autotune.Knob{Name: KnobStreams, Lo: 1, Hi: float64(n), Integer: true, Start: float64(base.Engine.Streams)})
		}
		add(autotune.Knob{Name: KnobChunk, Lo: 16, Hi: 16 << 10, Log: true, Integer: true, Start: float64(base.Engine.ChunkBytes) / 1024})
		add(autotune.Knob{Name: KnobSmall, Lo: 1, Hi: 4 << 10, Log: true, Integer: true, Start: float64(base.Engine.SmallBytes) / 1024})
	}
	if len(knobs) == 0 {
		log.Warn("autotune: every knob is fixed (set explicitly); nothing to tune", "fixed", strings.Join(a.Fixed, ","))
		return nil, nil
	}
	m, err := autotune.NewManager(autotune.Config{
		Knobs: knobs, WarmupSamples: a.WarmupSamples, StepsPerSample: a.StepsPerSample,
		MaxSamples: a.MaxSamples, Noise: a.Noise, Seed: uint64(time.Now().UnixNano()),
	})
	if err != nil {
		return nil, err
	}
	t := &tuner{m: m, base: base, start: time.Now(), log: log}
	for _, k := range knobs {
		t.names = append(t.names, k.Name)
	}
	if a.LogFile != "" {
		f, err := os.Create(a.LogFile)
		if err != nil {
			log.Warn("autotune: cannot write the log file; tuning goes on without it", "err", err)
		} else {
			t.csv, t.w = f, bufio.NewWriter(f)
			t.row(autotune.CSVHeader(knobs))
		}
	}
	log.Info("autotune: tuning", "knobs", strings.Join(t.names, ","), "fixed", strings.Join(a.Fixed, ","), "log_file", a.LogFile)
	return t, nil
}

// row writes a line of the CSV log, flushed at once so that a job that
// ends early leaves what it measured.
func (t *tuner) row(line string) {
	if t.w == nil {
		return
	}
	t.w.WriteString(line)
	t.w.WriteByte('\n')
	if err := t.w.Flush(); err != nil {
		t.log.Warn("autotune: writing the log file failed; it stops here", "err", err)
		t.Close()
	}
}

// close closes the CSV log.
func (t *tuner) Close() {
	if t.csv != nil {
		t.csv.Close()
		t.csv, t.w = nil, nil
	}
}

// settings are the base settings with the Manager's knob values.
func (t *tuner) settings(values []float64) job.Settings {
	s := t.base
	for i, name := range t.names {
		v := values[i]
		switch name {
		case KnobFusion:
			s.Fusion = int64(v * (1 << 20))
		case KnobCycle:
			s.Cycle = time.Duration(v * float64(time.Millisecond))
		case KnobSpin:
			s.Spin = time.Duration(v * float64(time.Microsecond))
		case KnobStreams:
			s.Engine.Streams = int(v)
		case KnobChunk:
			s.Engine.ChunkBytes = int(v) << 10
		case KnobSmall:
			s.Engine.SmallBytes = int(v) << 10
		}
	}
	return s
}

// update gives the tuner a dispatched batch: its tensors' names and bytes.
// It returns the settings to apply when the configuration changes.
func (t *tuner) update(names []string, bytes int64) (job.Settings, bool) {
	r := t.m.Update(names, bytes, time.Since(t.start))
	if r == nil {
		return job.Settings{}, false
	}
	if r.Warmup {
		t.log.Info("autotune: warming up", "score_mb_per_s", r.Score)
		return job.Settings{}, false
	}
	attrs := []any{"score_mb_per_s", r.Score}
	for i, n := range t.names {
		attrs = append(attrs, n, r.Values[i])
	}
	attrs = append(attrs, "best_mb_per_s", r.BestScore)
	t.log.Info("autotune: sample", attrs...)
	t.row(autotune.CSVRow(r.Values, r.Score))
	s := t.settings(r.Next)
	if r.Done {
		s.Final = true
		t.row(autotune.CSVRow(r.Best, r.BestScore))
		t.log.Info("autotune: done; keeping the best settings", append([]any{"score_mb_per_s", r.BestScore}, s.Attrs()...)...)
		t.Close()
		return s, true
	}
	return s, !slices.Equal(r.Next, r.Values)
}

// startTuner starts the autotuner of a job that has just formed, when
// autotuning is on and this node decides the job's plans.
func (l *Loop) startTuner(j *job.Job) {
	if !j.Coord.Coordinates() {
		return
	}
	cfg := l.cfg
	if j.Members.Offset == 0 && len(j.Slots) > 0 && j.Slots[0] != nil {
		// Global rank 0's HOROVOD_AUTOTUNE*, as Horovod reads them in
		// rank 0's process, over the daemon's own.
		if env := clientOf(j.Slots[0]).helloMsg.GetAutotuneEnv(); len(env) > 0 {
			var err error
			if cfg.Autotune, err = jobAutotune(cfg.Autotune, env); err != nil {
				l.cfg.Log.Warn("autotune: rank 0's HOROVOD_AUTOTUNE* variables are ignored", "job", j.ID, "err", err)
				cfg.Autotune = l.cfg.Autotune
			}
		}
	}
	if !cfg.Autotune.Enabled {
		return
	}
	if len(l.order) > 1 {
		// The cycle time and the spin window are the loop's, shared by
		// every job of the daemon: one job does not tune them for all.
		cfg.Autotune.Fixed = slices.Clone(cfg.Autotune.Fixed)
		cfg.Autotune.Fix(KnobCycle)
		cfg.Autotune.Fix(KnobSpin)
	}
	base := job.Settings{Fusion: l.cfg.FusionThreshold, Cycle: l.cfg.CycleTime, Spin: l.cfg.Spin}
	t, err := newTuner(cfg, base, j.Engine(), l.cfg.Log.With("job", j.ID))
	if err != nil {
		l.cfg.Log.Error("autotune: cannot tune this job; it runs with the configured settings", "job", j.ID, "err", err)
		return
	}
	l.laneOf(j).tune = t
}

// jobAutotune is the daemon's autotune settings a with a client's
// HOROVOD_AUTOTUNE* variables (Hello.autotune_env: NAME=VALUE) applied.
// applyHorovodEnv applies Horovod's HOROVOD_AUTOTUNE* variables, read
// through getenv, over a (Config.ApplyHorovodEnv's part for the autotuner).
func (a *AutotuneConfig) ApplyHorovodEnv(getenv func(string) string) error {
	var errs []error
	num := func(key string, f func(float64)) {
		if err := EnvNumber(getenv, key, f); err != nil {
			errs = append(errs, err)
		}
	}
	if v := strings.TrimSpace(getenv("HOROVOD_AUTOTUNE")); v != "" && v != "0" {
		a.Enabled = true
	}
	if v := getenv("HOROVOD_AUTOTUNE_LOG"); v != "" {
		a.LogFile = v
	}
	num("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", func(x float64) {
		a.WarmupSamples = int(x)
		if x == 0 {
			a.WarmupSamples = -1 // none, where 0 means the default
		}
	})
	num("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", func(x float64) { a.StepsPerSample = int(x) })
	num("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", func(x float64) { a.MaxSamples = int(x) })
	num("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", func(x float64) {
		a.Noise = x
		if x == 0 {
			a.Noise = -1
		}
	})
	return errors.Join(errs...)
}

// EnvNumber reads key through getenv and, when it is set, passes its value
// to f; a value that is not a non-negative number is an error.
func EnvNumber(getenv func(string) string, key string, f func(float64)) error {
	v := strings.TrimSpace(getenv(key))
	if v == "" {
		return nil
	}
	x, err := strconv.ParseFloat(v, 64)
	if err != nil || x < 0 {
		return fmt.Errorf("%s=%q: want a non-negative number", key, v)
	}
	f(x)
	return nil
}

func jobAutotune(a AutotuneConfig, env []string) (AutotuneConfig, error) {
	vars := map[string]string{}
	for _, kv := range env {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || (name != "HOROVOD_AUTOTUNE" && !strings.HasPrefix(name, "HOROVOD_AUTOTUNE_")) {
			return a, fmt.Errorf("%q is not a HOROVOD_AUTOTUNE* variable", kv)
		}
		vars[name] = value
	}
	b := a
	b.Fixed = slices.Clone(a.Fixed)
	if err := b.ApplyHorovodEnv(func(k string) string { return vars[k] }); err != nil {
		return a, err
	}
	if v, ok := vars["HOROVOD_AUTOTUNE"]; ok && strings.TrimSpace(v) == "0" {
		b.Enabled = false // the job asked for none
	}
	if err := b.Validate(); err != nil {
		return a, err
	}
	return b, nil
}

// tuneBatch gives the autotuner the responses just dispatched, and applies
// the settings it moves to.
func (l *Loop) tuneBatch(j *job.Job, resps []plan.Response) {
	var names []string
	var bytes int64
	for i := range resps {
		if r := &resps[i]; r.Err == nil {
			for _, t := range r.Tensors {
				names = append(names, t.Name)
			}
			bytes += r.Bytes
		}
	}
	s, changed := l.laneOf(j).tune.update(names, bytes)
	if !changed {
		return
	}
	l.Tuned(s)
	j.Coord.Retune(s)
}

// Tuned applies the loop's part of tuned settings (loopHooks).
func (l *Loop) Tuned(s job.Settings) {
	l.cycleTime, l.spin = s.Cycle, s.Spin
}

// AutotuneConfig configures autotuning (autotune.go). The zero value is
// off; zero numbers mean Horovod's defaults.
type AutotuneConfig struct {
	// Enabled tunes, for each job whose plans this daemon decides (one
	// node's jobs, and node 0's across nodes), the fusion threshold, the
	// cycle time, the loop's spin window and, across nodes, the tcp
	// engine's streams, segment and small-message threshold (the knobs
	// KnobNames lists), by Bayesian optimisation of the bytes the job moves
	// per microsecond; then it keeps the best. The coordinator applies them
	// on every node.
	Enabled bool
	// LogFile, when set, is the CSV file the coordinator writes
	// (HOROVOD_AUTOTUNE_LOG): a header of the knobs tuned, one row per
	// configuration scored, and the best configuration last.
	LogFile string
	// WarmupSamples is how many scores are discarded first
	// (HOROVOD_AUTOTUNE_WARMUP_SAMPLES); zero means 3, negative none.
	WarmupSamples int
	// StepsPerSample is how many times a tensor is seen per sample
	// (HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE); zero means 10.
	StepsPerSample int
	// MaxSamples is how many configurations are scored
	// (HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES); zero means 20.
	MaxSamples int
	// Noise is the Gaussian process's noise, in [0, 1]
	// (HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE); zero means 0.8, negative
	// none.
	Noise float64
	// Fixed names knobs the user set explicitly (flags, HOROVOD_* knobs),
	// which tuning keeps as configured, as Horovod keeps parameters set
	// explicitly; each is one of KnobNames.
	Fixed []string
}
