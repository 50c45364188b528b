package autotune

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Horovod's autotuning defaults (HOROVOD_AUTOTUNE_*), used for Config's zero
// fields.
const (
	DefaultWarmupSamples  = 3
	DefaultStepsPerSample = 10
	DefaultMaxSamples     = 20
	DefaultNoise          = 0.8
)

// SamplesPerScore is how many samples make one configuration's score: their
// median, as in Horovod (its SAMPLES), so that one disturbed sample (a
// checkpoint, a neighbour's burst) does not decide.
const SamplesPerScore = 5

// Knob is one setting the Manager tunes.
type Knob struct {
	// Name identifies the knob in logs and in the CSV log's header.
	Name string
	// Lo and Hi bound its values (Lo < Hi), in the knob's own unit.
	Lo, Hi float64
	// Log searches the range on a logarithmic scale (Lo must be positive):
	// for sizes, where 64 KiB against 128 KiB matters as much as 32 MiB
	// against 64 MiB.
	Log bool
	// Integer rounds the knob's values to whole numbers.
	Integer bool
	// Start is the value before tuning: the first configuration measured,
	// so the defaults are always among the candidates. It is clamped into
	// [Lo, Hi].
	Start float64
}

// Optimizer proposes configurations in the unit cube [0,1]^d to maximise a
// noisy score; *BayesianOptimization is the one NewManager uses by default.
type Optimizer interface {
	// AddSample records the score y measured at x.
	AddSample(x []float64, y float64)
	// NextSample returns the next point to measure.
	NextSample() []float64
}

// Config configures a Manager. The zero value of each field but Knobs has
// the meaning its comment gives.
type Config struct {
	// Knobs are the settings to tune, at least one; settings the user fixed
	// are left out by the caller.
	Knobs []Knob
	// WarmupSamples is how many scores are discarded at the start, while
	// caches, pools and the job's own pace settle (HOROVOD_AUTOTUNE_WARMUP_SAMPLES).
	// Zero means DefaultWarmupSamples; negative means none.
	WarmupSamples int
	// StepsPerSample is how many times a tensor must have been seen for a
	// sample to end: about that many training steps
	// (HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE). Zero means DefaultStepsPerSample.
	StepsPerSample int
	// MaxSamples is how many configurations are scored before the best is
	// kept (HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES). Zero means
	// DefaultMaxSamples.
	MaxSamples int
	// Noise is the Gaussian process's noise level, on standardised scores
	// (HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE). Zero means DefaultNoise;
	// negative means none.
	Noise float64
	// Seed seeds the optimiser's random source, so that a run can be
	// repeated.
	Seed uint64
	// NewOptimizer, when set, replaces the Bayesian optimiser (tests give
	// a scripted one). It is called once, with the dimension.
	NewOptimizer func(dims int, noise float64, rng *rand.Rand) Optimizer
}

func (c Config) withDefaults() Config {
	if c.WarmupSamples == 0 {
		c.WarmupSamples = DefaultWarmupSamples
	} else if c.WarmupSamples < 0 {
		c.WarmupSamples = 0
	}
	if c.StepsPerSample == 0 {
		c.StepsPerSample = DefaultStepsPerSample
	}
	if c.MaxSamples == 0 {
		c.MaxSamples = DefaultMaxSamples
	}
	if c.Noise == 0 {
		c.Noise = DefaultNoise
	} else if c.Noise < 0 {
		c.Noise = 0
	}
	if c.NewOptimizer == nil {
		c.NewOptimizer = func(dims int, noise float64, rng *rand.Rand) Optimizer {
			unit := make([]Bounds, dims)
			for i := range unit {
				unit[i] = Bounds{0, 1}
			}
			return NewBayesianOptimization(unit, noise, rng)
		}
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if len(c.Knobs) == 0 {
		errs = append(errs, errors.New("autotune: no knob to tune"))
	}
	seen := map[string]bool{}
	for _, k := range c.Knobs {
		switch {
		case k.Name == "" || strings.ContainsAny(k.Name, ",\n"):
			errs = append(errs, fmt.Errorf("autotune: knob name %q must be non-empty, without commas or newlines", k.Name))
		case seen[k.Name]:
			errs = append(errs, fmt.Errorf("autotune: knob %q given twice", k.Name))
		case !(k.Lo < k.Hi) || math.IsInf(k.Lo, 0) || math.IsInf(k.Hi, 0):
			errs = append(errs, fmt.Errorf("autotune: knob %q: range [%v, %v] is empty or unbounded", k.Name, k.Lo, k.Hi))
		case k.Log && !(k.Lo > 0):
			errs = append(errs, fmt.Errorf("autotune: knob %q: a log scale needs a positive lower bound, got %v", k.Name, k.Lo))
		}
		seen[k.Name] = true
	}
	if c.StepsPerSample < 1 {
		errs = append(errs, fmt.Errorf("autotune: steps per sample must be at least 1, got %d", c.StepsPerSample))
	}
	if c.MaxSamples < 1 {
		errs = append(errs, fmt.Errorf("autotune: max samples must be at least 1, got %d", c.MaxSamples))
	}
	return errors.Join(errs...)
}

// Result is what one Update reports when a configuration's score is
// complete.
type Result struct {
	// Values are the knob values the score was measured with, in Knobs'
	// order.
	Values []float64
	// Score is the median of the configuration's samples, in bytes per
	// microsecond (Horovod's unit: MB/s).
	Score float64
	// Warmup says the score was discarded: the job was still warming up.
	Warmup bool
	// Next are the values to apply now, in Knobs' order; equal to Values
	// when nothing changes.
	Next []float64
	// Done says tuning has finished: Next are the best values found, kept
	// from now on.
	Done bool
	// Best and BestScore are the best configuration so far and its score
	// (nil and 0 during warm-up).
	Best      []float64
	BestScore float64
}

// Manager tunes knobs while a job runs, as Horovod's ParameterManager does:
// the caller reports each batch of tensors it ran (Update); a sample ends
// when some tensor has been seen StepsPerSample more times, and scores the
// bytes moved per microsecond since the last sample ended; the median of
// SamplesPerScore samples scores the configuration, which the optimiser
// takes before it proposes the next one. After WarmupSamples discarded
// scores and MaxSamples scored configurations the best one is kept.
//
// The Manager does no I/O and reads no clock: the caller passes the time,
// logs the Results and applies their values. Not safe for concurrent use.
type Manager struct {
	cfg   Config
	opt   Optimizer
	seeds [][]float64 // unit points measured before the optimiser proposes any

	active bool
	cur    []float64 // unit point being measured
	warmup int       // scores still to discard

	// The samples of the current configuration.
	counts      map[string]int
	sample      int
	scores      [SamplesPerScore]float64
	bytes       int64
	sampleStart time.Duration
	started     bool

	tried     int // configurations scored
	xs        [][]float64
	ys        []float64
	best      []float64
	bestScore float64
}

// NewManager returns a Manager that starts measuring the knobs' Start
// values at once.
func NewManager(cfg Config) (*Manager, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x68766464)) // "hvdd"
	m := &Manager{cfg: cfg, active: true, warmup: cfg.WarmupSamples, counts: map[string]int{}}
	m.opt = cfg.NewOptimizer(len(cfg.Knobs), cfg.Noise, rng)
	start := make([]float64, len(cfg.Knobs))
	for i, k := range cfg.Knobs {
		start[i] = k.unit(k.Start)
	}
	m.cur = start
	m.seeds = seedPoints(start, rng)
	return m, nil
}

// seedPoints are the configurations measured after the start values and
// before the optimiser has a model: Horovod seeds its 2-D search with four
// fixed points; with any number of knobs, three points of a Latin hypercube
// (each knob's range cut in three, each third used once, in a random order
// per knob) spread the first measurements over the whole box.
func seedPoints(start []float64, rng *rand.Rand) [][]float64 {
	const n = 3
	pts := make([][]float64, n)
	for i := range pts {
		pts[i] = make([]float64, len(start))
	}
	for d := range start {
		perm := rng.Perm(n)
		for i := range pts {
			pts[i][d] = (float64(perm[i]) + rng.Float64()) / n
		}
	}
	return pts
}

// Active reports whether tuning goes on.
func (m *Manager) Active() bool { return m.active }

// Knobs returns the knobs tuned, in order.
func (m *Manager) Knobs() []Knob { return slices.Clone(m.cfg.Knobs) }

// Values returns the knob values to apply now: those being measured while
// tuning, then the best found.
func (m *Manager) Values() []float64 {
	if !m.active && m.best != nil {
		return m.values(m.best)
	}
	return m.values(m.cur)
}

func (m *Manager) values(u []float64) []float64 {
	v := make([]float64, len(u))
	for i, k := range m.cfg.Knobs {
		v[i] = k.value(u[i])
	}
	return v
}

// Update records a batch the job ran: the names of its tensors and their
// bytes, at time now (any monotonic origin). It returns a Result when the
// batch completed a configuration's score, else nil; once tuning is done
// it does nothing.
func (m *Manager) Update(names []string, bytes int64, now time.Duration) *Result {
	if !m.active {
		return nil
	}
	if !m.started {
		m.started, m.sampleStart = true, now
	}
	// As Horovod: a sample ends at the first batch that holds a tensor seen
	// StepsPerSample more times than at the sample's start; that batch's
	// bytes count towards the next sample.
	for _, n := range names {
		c := m.counts[n]
		m.counts[n] = c + 1
		if c >= (m.sample+1)*m.cfg.StepsPerSample {
			us := float64(now-m.sampleStart) / float64(time.Microsecond)
			m.scores[m.sample] = float64(m.bytes) / max(us, 1)
			m.bytes, m.sampleStart = 0, now
			m.sample++
			break
		}
	}
	m.bytes += bytes
	if m.sample < SamplesPerScore {
		return nil
	}
	s := m.scores
	slices.Sort(s[:])
	return m.tune(s[SamplesPerScore/2])
}

// tune takes a configuration's score and moves to the next configuration.
func (m *Manager) tune(score float64) *Result {
	// The next configuration's samples start afresh (the current sample
	// time goes on: the batch that ended this sample began the next).
	clear(m.counts)
	m.sample = 0
	r := &Result{Values: m.values(m.cur), Score: score}
	if m.warmup > 0 {
		m.warmup--
		r.Warmup, r.Next = true, r.Values
		return r
	}
	m.tried++
	m.xs = append(m.xs, slices.Clone(m.cur))
	m.ys = append(m.ys, score)
	m.opt.AddSample(m.cur, score)
	if m.best == nil || score > m.bestScore {
		m.best, m.bestScore = slices.Clone(m.cur), score
	}
	switch {
	case m.tried >= m.cfg.MaxSamples:
		m.active = false
		r.Done = true
	case m.tried-1 < len(m.seeds):
		m.cur = m.seeds[m.tried-1]
	default:
		m.cur = clampUnit(m.opt.NextSample())
	}
	r.Next = m.Values()
	r.Best, r.BestScore = m.values(m.best), m.bestScore
	return r
}

func clampUnit(x []float64) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		if math.IsNaN(v) {
			v = 0.5
		}
		out[i] = min(max(v, 0), 1)
	}
	return out
}

// unit maps a knob value to [0, 1].
func (k Knob) unit(v float64) float64 {
	v = min(max(v, k.Lo), k.Hi)
	if k.Log {
		return math.Log(v/k.Lo) / math.Log(k.Hi/k.Lo)
	}
	return (v - k.Lo) / (k.Hi - k.Lo)
}

// value maps u in [0, 1] to the knob's range.
func (k Knob) value(u float64) float64 {
	var v float64
	switch {
	case u <= 0:
		return k.Lo
	case u >= 1:
		return k.Hi
	}
	if k.Log {
		v = k.Lo * math.Exp(u*math.Log(k.Hi/k.Lo))
	} else {
		v = k.Lo + u*(k.Hi-k.Lo)
	}
	if k.Integer {
		v = math.Round(v)
	}
	return min(max(v, k.Lo), k.Hi)
}

// CSVHeader is the header line of the autotune log for these knobs: one
// column per knob, then the score (bytes per microsecond), as Horovod's
// HOROVOD_AUTOTUNE_LOG has its parameters then "score".
func CSVHeader(knobs []Knob) string {
	var b strings.Builder
	for _, k := range knobs {
		b.WriteString(k.Name)
		b.WriteByte(',')
	}
	b.WriteString("score")
	return b.String()
}

// CSVRow is one line of the autotune log: the values and their score.
func CSVRow(values []float64, score float64) string {
	var b strings.Builder
	for _, v := range values {
		fmt.Fprintf(&b, "%g,", v)
	}
	fmt.Fprintf(&b, "%g", score)
	return b.String()
}
