package autotune

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// scripted is an Optimizer that proposes the points it was given, in order,
// and remembers what it was told.
type scripted struct {
	next [][]float64
	xs   [][]float64
	ys   []float64
}

func (s *scripted) AddSample(x []float64, y float64) {
	s.xs = append(s.xs, slices.Clone(x))
	s.ys = append(s.ys, y)
}

func (s *scripted) NextSample() []float64 {
	p := s.next[0]
	s.next = s.next[1:]
	return p
}

func newScripted(t *testing.T, cfg Config, next ...[]float64) (*Manager, *scripted) {
	t.Helper()
	s := &scripted{next: next}
	cfg.NewOptimizer = func(dims int, noise float64, rng *rand.Rand) Optimizer {
		if dims != len(cfg.Knobs) {
			t.Fatalf("optimizer made for %d dims, want %d", dims, len(cfg.Knobs))
		}
		return s
	}
	m, err := NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m, s
}

// step feeds one training step of the given tensors (one batch) taking dt,
// and returns the clock after it.
func step(m *Manager, now time.Duration, dt time.Duration, bytes int64, names ...string) (time.Duration, *Result) {
	now += dt
	return now, m.Update(names, bytes, now)
}

func TestSampleScoreIsBytesPerMicrosecond(t *testing.T) {
	// Two tensors per step, 1000 bytes per step, one step every 10 µs:
	// 100 bytes/µs. With StepsPerSample 2, a sample ends at the first
	// batch that holds a tensor for the third time; SamplesPerScore samples
	// later the score is complete.
	m, _ := newScripted(t, Config{Knobs: []Knob{{Name: "k", Lo: 0, Hi: 1, Start: 0.5}}, StepsPerSample: 2, WarmupSamples: -1, MaxSamples: 3},
		[]float64{0.1})
	var now time.Duration
	var res *Result
	steps := 0
	for res == nil {
		now, res = step(m, now, 10*time.Microsecond, 1000, "a", "b")
		steps++
		if steps > 100 {
			t.Fatal("no result after 100 steps")
		}
	}
	// The first sample starts at the first batch; each sample is 2 steps,
	// ended by the next batch: 1 + 5*2 batches.
	if steps != 11 {
		t.Errorf("score after %d steps, want 11", steps)
	}
	if math.Abs(res.Score-100) > 1e-9 {
		t.Errorf("score %v bytes/µs, want 100", res.Score)
	}
	if res.Warmup || res.Done || res.Values[0] != 0.5 {
		t.Errorf("result %+v: want the start value 0.5 scored, not warm-up, not done", res)
	}
}

func TestScoreIsTheMedianOfFiveSamples(t *testing.T) {
	m, s := newScripted(t, Config{Knobs: []Knob{{Name: "k", Lo: 0, Hi: 1}}, StepsPerSample: 1, WarmupSamples: -1, MaxSamples: 5})
	// Each sample is one step (ended by the next batch); the samples take
	// 10, 1000, 20, 5, 30 µs for 1000 bytes: scores 100, 1, 50, 200, 33.3.
	var now time.Duration
	now, _ = step(m, now, 0, 1000, "a") // starts the first sample
	var res *Result
	for _, us := range []int{10, 1000, 20, 5, 30} {
		now, res = step(m, now, time.Duration(us)*time.Microsecond, 1000, "a")
	}
	if res == nil {
		t.Fatal("no score after five samples")
	}
	if math.Abs(res.Score-50) > 1e-9 {
		t.Errorf("score %v, want the median 50", res.Score)
	}
	if len(s.ys) != 1 || s.ys[0] != res.Score {
		t.Errorf("optimizer told %v, want [%v]", s.ys, res.Score)
	}
}

func TestWarmupSeedsOptimizerDone(t *testing.T) {
	knobs := []Knob{
		{Name: "mb", Lo: 1, Hi: 64, Log: true, Start: 64},
		{Name: "streams", Lo: 1, Hi: 8, Integer: true, Start: 2},
	}
	proposals := [][]float64{{0.5, 0.5}, {1, 0}, {0, 1}}
	m, s := newScripted(t, Config{Knobs: knobs, StepsPerSample: 1, WarmupSamples: 2, MaxSamples: 6}, proposals...)
	if got := m.Values(); !slices.Equal(got, []float64{64, 2}) {
		t.Fatalf("start values %v, want [64 2]", got)
	}
	// A score per configuration: the score rises with the first knob's
	// unit value, so the best is the proposal {1, 0}: mb=64, streams=1.
	var now time.Duration
	var results []*Result
	for i := 0; len(results) < 2+6; i++ {
		if i > 1000 {
			t.Fatal("tuning did not finish")
		}
		u := knobs[0].unit(m.Values()[0])
		bytes := int64(1000 + 1000*u)
		if m.Values()[1] == 1 {
			bytes += 10 // the tie-breaker between {1,0} and the start {1, 1/7}
		}
		var r *Result
		now, r = step(m, now, time.Microsecond, bytes, "t")
		if r != nil {
			results = append(results, r)
		}
	}
	for i, r := range results[:2] {
		if !r.Warmup || !slices.Equal(r.Next, []float64{64, 2}) {
			t.Errorf("result %d: %+v, want a warm-up that keeps the start values", i, r)
		}
	}
	if len(s.ys) != 6 {
		t.Fatalf("optimizer got %d scores, want 6 (warm-ups are not scored)", len(s.ys))
	}
	// The first scored configuration is the start, then three seeds, then
	// the optimiser's proposals.
	if !slices.Equal(s.xs[0], []float64{1, 1.0 / 7}) {
		t.Errorf("first scored point %v, want the start values' unit point [1 0.142857]", s.xs[0])
	}
	for i := 1; i <= 3; i++ {
		for _, u := range s.xs[i] {
			if u < 0 || u > 1 {
				t.Errorf("seed %d = %v outside the unit box", i, s.xs[i])
			}
		}
	}
	// Seeds are a Latin hypercube: each knob's thirds are each used once.
	for d := 0; d < 2; d++ {
		thirds := map[int]bool{}
		for i := 1; i <= 3; i++ {
			thirds[int(s.xs[i][d]*3)] = true
		}
		if len(thirds) != 3 {
			t.Errorf("knob %d: seeds %v, %v, %v do not cover the three thirds", d, s.xs[1][d], s.xs[2][d], s.xs[3][d])
		}
	}
	if !slices.Equal(s.xs[4], proposals[0]) || !slices.Equal(s.xs[5], proposals[1]) {
		t.Errorf("scored %v, %v after the seeds, want the optimiser's %v, %v", s.xs[4], s.xs[5], proposals[0], proposals[1])
	}
	last := results[len(results)-1]
	if !last.Done || m.Active() {
		t.Fatalf("last result %+v, active %v: want done", last, m.Active())
	}
	want := []float64{64, 1}
	if !slices.Equal(last.Next, want) || !slices.Equal(m.Values(), want) || !slices.Equal(last.Best, want) {
		t.Errorf("after tuning: next %v, values %v, best %v; want %v", last.Next, m.Values(), last.Best, want)
	}
	if r := m.Update([]string{"t"}, 1, now+time.Hour); r != nil {
		t.Errorf("Update after tuning returned %+v", r)
	}
}

func TestKnobScales(t *testing.T) {
	tests := []struct {
		k    Knob
		u    float64
		want float64
	}{
		{Knob{Lo: 0, Hi: 100}, 0.25, 25},
		{Knob{Lo: 1, Hi: 1024, Log: true}, 0.5, 32},
		{Knob{Lo: 64, Hi: 8192, Log: true, Integer: true}, 1.0 / 7, 128},
		{Knob{Lo: 1, Hi: 8, Integer: true}, 0.5, 5}, // 4.5 rounds away from zero
		{Knob{Lo: 1, Hi: 8, Integer: true}, 1, 8},
		{Knob{Lo: 0, Hi: 1}, -3, 0}, // clamped
	}
	for _, tc := range tests {
		if got := tc.k.value(tc.u); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%+v value(%v) = %v, want %v", tc.k, tc.u, got, tc.want)
		}
		if tc.u >= 0 && tc.u <= 1 && !tc.k.Integer {
			if back := tc.k.unit(tc.want); math.Abs(back-tc.u) > 1e-9 {
				t.Errorf("%+v unit(%v) = %v, want %v", tc.k, tc.want, back, tc.u)
			}
		}
	}
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no knobs", Config{}, "no knob"},
		{"empty range", Config{Knobs: []Knob{{Name: "a", Lo: 1, Hi: 1}}}, "range [1, 1]"},
		{"log from zero", Config{Knobs: []Knob{{Name: "a", Lo: 0, Hi: 1, Log: true}}}, "positive lower bound"},
		{"duplicate", Config{Knobs: []Knob{{Name: "a", Lo: 0, Hi: 1}, {Name: "a", Lo: 0, Hi: 1}}}, "given twice"},
		{"comma", Config{Knobs: []Knob{{Name: "a,b", Lo: 0, Hi: 1}}}, "without commas"},
		{"steps", Config{Knobs: []Knob{{Name: "a", Lo: 0, Hi: 1}}, StepsPerSample: -1}, "steps per sample"},
		{"max samples", Config{Knobs: []Knob{{Name: "a", Lo: 0, Hi: 1}}, MaxSamples: -2}, "max samples"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewManager(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewManager: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestCSV(t *testing.T) {
	knobs := []Knob{{Name: "fusion_threshold_mb"}, {Name: "cycle_time_ms"}}
	if got, want := CSVHeader(knobs), "fusion_threshold_mb,cycle_time_ms,score"; got != want {
		t.Errorf("header %q, want %q", got, want)
	}
	if got, want := CSVRow([]float64{64, 2.5}, 1234.5), "64,2.5,1234.5"; got != want {
		t.Errorf("row %q, want %q", got, want)
	}
}

// TestDefaultOptimizerStaysInRange runs a whole tuning with the default
// optimiser and random scores: every value applied lies in its knob's range.
func TestDefaultOptimizerStaysInRange(t *testing.T) {
	knobs := []Knob{
		{Name: "mb", Lo: 0.0625, Hi: 256, Log: true, Start: 128},
		{Name: "cycle", Lo: 0, Hi: 20, Start: 0},
		{Name: "streams", Lo: 1, Hi: 8, Integer: true, Start: 2},
	}
	m, err := NewManager(Config{Knobs: knobs, StepsPerSample: 1, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var now time.Duration
	for i := 0; m.Active(); i++ {
		if i > 10000 {
			t.Fatal("tuning did not finish")
		}
		now += time.Duration(1+rng.IntN(100)) * time.Microsecond
		if r := m.Update([]string{"t"}, 1000, now); r != nil {
			for j, v := range r.Next {
				if v < knobs[j].Lo || v > knobs[j].Hi || (knobs[j].Integer && v != math.Round(v)) {
					t.Fatalf("knob %s = %v outside its range", knobs[j].Name, v)
				}
			}
		}
	}
}
