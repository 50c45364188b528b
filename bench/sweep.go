package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/tensor"
)

// Row is one line of output: a size of a sweep, or one variant of a profile.
type Row struct {
	Profile  string  `json:"profile,omitempty"`
	Variant  string  `json:"variant,omitempty"`
	Op       string  `json:"op,omitempty"`
	Bytes    int64   `json:"bytes,omitempty"`
	Count    int64   `json:"count,omitempty"`
	DType    string  `json:"dtype,omitempty"`
	Reduce   string  `json:"reduce,omitempty"`
	Ranks    int     `json:"ranks"`
	ZeroCopy bool    `json:"zero_copy"`
	GapUS    float64 `json:"gap_us,omitempty"`
	Iters    int     `json:"iters,omitempty"`
	MedianUS float64 `json:"median_us,omitempty"`
	MinUS    float64 `json:"min_us,omitempty"`
	MaxUS    float64 `json:"max_us,omitempty"`
	AlgBW    float64 `json:"algbw_gbps,omitempty"`
	BusBW    float64 `json:"busbw_gbps,omitempty"`
	Check    string  `json:"check,omitempty"`
	Ratio    float64 `json:"ratio,omitempty"`

	// Idle profile.
	DurationS      float64   `json:"duration_s,omitempty"`
	DaemonPID      int       `json:"daemon_pid,omitempty"`
	DaemonCPUPct   *float64  `json:"daemon_cpu_pct,omitempty"`
	ClientCPUPct   []float64 `json:"client_cpu_pct,omitempty"`
	ClientsCPUPct  *float64  `json:"clients_cpu_pct_total,omitempty"`
	ClockTicksPerS int       `json:"clock_ticks_per_s,omitempty"`
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// fillStats sets the timing columns of r from per-iteration times.
func (r *Row) fillStats(ts []time.Duration, bytes int64, busFactor float64) {
	s := Summarize(ts)
	r.Iters = s.N
	r.MedianUS, r.MinUS, r.MaxUS = us(s.Median), us(s.Min), us(s.Max)
	r.AlgBW = AlgBW(bytes, s.Median)
	r.BusBW = r.AlgBW * busFactor
}

// maxOverRanks replaces each local per-iteration time with the maximum over
// ranks, through hvdd itself, after the timed loop. extra values (such as a
// mismatch count) ride along and come back maxed too.
func maxOverRanks(ctx context.Context, c *hvdd.Client, ts []time.Duration, extra ...float64) ([]time.Duration, []float64, error) {
	buf := make([]float64, len(ts)+len(extra))
	for i, t := range ts {
		buf[i] = t.Seconds()
	}
	copy(buf[len(ts):], extra)
	if err := hvdd.Allreduce(ctx, c, buf, hvdd.WithOp(hvdd.Max)); err != nil {
		return nil, nil, fmt.Errorf("allreduce of the timings: %w", err)
	}
	out := make([]time.Duration, len(ts))
	for i := range ts {
		out[i] = time.Duration(buf[i] * float64(time.Second))
	}
	return out, buf[len(ts):], nil
}

// minOverRanks is maxOverRanks with each time the minimum over ranks (the
// maximum of the negated times); extra values still come back maxed.
func minOverRanks(ctx context.Context, c *hvdd.Client, ts []time.Duration, extra ...float64) ([]time.Duration, []float64, error) {
	neg := make([]time.Duration, len(ts))
	for i, t := range ts {
		neg[i] = -t
	}
	out, ex, err := maxOverRanks(ctx, c, neg, extra...)
	for i := range out {
		out[i] = -out[i]
	}
	return out, ex, err
}

// buffer returns n elements: shared memory from Alloc with zero-copy, else a
// plain Go slice; free gives shared memory back.
func buffer[T hvdd.Elem](c *hvdd.Client, n int, zeroCopy bool) (buf []T, free func(), err error) {
	if !zeroCopy {
		return make([]T, n), func() {}, nil
	}
	buf, err = hvdd.Alloc[T](c, n)
	if err != nil {
		return nil, nil, fmt.Errorf("alloc %d elements: %w", n, err)
	}
	return buf, func() { hvdd.Free(c, buf) }, nil
}

// runOnce performs one collective of e.Op on in and returns this rank's
// result (in itself for the in-place ops).
func runOnce[T hvdd.Elem](ctx context.Context, c *hvdd.Client, e Expect, in []T) ([]T, error) {
	red := hvdd.WithOp(e.Reduce)
	switch e.Op {
	case tensor.Allreduce:
		return in, hvdd.Allreduce(ctx, c, in, red)
	case tensor.Broadcast:
		return in, hvdd.Broadcast(ctx, c, in, 0)
	case tensor.Allgather:
		return hvdd.Allgather(ctx, c, in)
	case tensor.Alltoall:
		out, _, err := hvdd.Alltoall(ctx, c, in, nil)
		return out, err
	case tensor.Reducescatter:
		return hvdd.Reducescatter(ctx, c, in, red)
	}
	return nil, fmt.Errorf("unsupported op %s", e.Op)
}

// sweep measures cfg.Op at every size of the sweep and prints a row per size
// on rank 0. It returns an error on a failed collective or a failed check.
func sweep[T hvdd.Elem](ctx context.Context, c *hvdd.Client, cfg Config, out, errOut io.Writer) error {
	n, rank := c.Size(), c.Rank()
	p := newPrinter(cfg, out, rank == 0)
	iters := fmt.Sprintf("iters %d (sizes <= 64K: >= %d and >= %v)", cfg.Iters, cfg.SmallIters, cfg.SmallTime)
	if cfg.Gap > 0 {
		iters = fmt.Sprintf("iters %d, each after a %v pause", cfg.Iters, cfg.Gap)
	}
	p.header(fmt.Sprintf("# hvdd bench: %s %s, %d ranks, reduce %s, zero-copy %v, warmup %d, %s, check %v",
		lower(cfg.Op.String()), cfg.DType, n, cfg.Reduce, cfg.ZeroCopy, cfg.Warmup, iters, cfg.Check),
		tableHeader)
	es := cfg.DType.Size()
	failed := false
	for _, bytes := range Sizes(cfg.MinBytes, cfg.MaxBytes, cfg.StepFactor, es, Divisor(cfg.Op, n)) {
		e := Expect{Op: cfg.Op, Reduce: cfg.Reduce, DType: cfg.DType, Ranks: n, Rank: rank, Count: bytes / int64(es)}
		row, bad, err := measureSize[T](ctx, c, cfg, e, errOut)
		if err != nil {
			return fmt.Errorf("%s of %d bytes: %w", lower(cfg.Op.String()), bytes, err)
		}
		row.Bytes = bytes
		p.row(row)
		failed = failed || bad
	}
	if failed {
		return errCheckFailed
	}
	return nil
}

var errCheckFailed = fmt.Errorf("--check found wrong results")

// measureSize runs the warm-up and the timed loop of one size.
func measureSize[T hvdd.Elem](ctx context.Context, c *hvdd.Client, cfg Config, e Expect, errOut io.Writer) (Row, bool, error) {
	row := Row{Op: lower(e.Op.String()), Count: e.Count, DType: e.DType.String(), Ranks: e.Ranks, ZeroCopy: cfg.ZeroCopy, GapUS: us(cfg.Gap)}
	if e.Op == tensor.Allreduce || e.Op == tensor.Reducescatter {
		row.Reduce = e.Reduce.String()
	}
	in, free, err := buffer[T](c, int(e.InputLen()), cfg.ZeroCopy)
	if err != nil {
		return row, false, err
	}
	defer free()
	var pristine []T
	if cfg.Check {
		pristine = make([]T, len(in))
		Fill(e, pristine)
	}
	// Without --check the buffer holds zeros, a fixed point of every
	// reduction, so repeated in-place runs neither overflow nor go subnormal.
	clear(in)
	var bad int64
	one := func() (time.Duration, error) {
		if cfg.Check {
			copy(in, pristine)
		}
		t0 := time.Now()
		res, err := runOnce(ctx, c, e, in)
		dt := time.Since(t0)
		if err != nil {
			return 0, err
		}
		if cfg.Check && e.Op != tensor.Allreduce && e.Op != tensor.Broadcast {
			// The input is ours again once the op is done: clobber it at
			// once, so that a daemon still reading it gives wrong results.
			poison(in)
		}
		if cfg.Check {
			if nb, first := Verify(e, res); nb > 0 {
				if bad == 0 {
					fmt.Fprintf(errOut, "hvdd bench: rank %d: %s of %d elements of %s: %d wrong; %s\n",
						e.Rank, lower(e.Op.String()), e.Count, e.DType, nb, first)
				}
				bad += nb
			}
		}
		return dt, nil
	}
	warm := make([]time.Duration, 0, cfg.Warmup)
	for range cfg.Warmup {
		dt, err := one()
		if err != nil {
			return row, false, err
		}
		warm = append(warm, dt)
	}
	iters := cfg.Iters
	bytes := e.Count * int64(e.DType.Size())
	if bytes <= SmallBytes && cfg.Gap == 0 {
		// Every rank must run the same number of iterations: agree on the
		// slowest rank's warm-up estimate.
		est := Summarize(warm).Median
		m, _, err := maxOverRanks(ctx, c, []time.Duration{est})
		if err != nil {
			return row, false, err
		}
		iters = IterationsFor(bytes, cfg.Iters, cfg.SmallIters, cfg.SmallTime, m[0])
	}
	// With --gap, rank 0 also measures the CPU time of the daemon (the
	// process serving the socket) over the paced loop: what ops that come
	// apart cost it (bench/gapcpu.sh).
	daemon, cpu0 := 0, int64(0)
	if cfg.Gap > 0 && e.Rank == 0 {
		if pid, err := FindDaemon(c.Socket); err == nil {
			if cpu0, err = CPUTicks(pid); err == nil {
				daemon = pid
			}
		}
	}
	t0 := time.Now()
	ts := make([]time.Duration, iters)
	for i := range ts {
		if cfg.Gap > 0 {
			time.Sleep(cfg.Gap)
		}
		if ts[i], err = one(); err != nil {
			return row, false, err
		}
	}
	if daemon > 0 {
		if cpu1, err := CPUTicks(daemon); err == nil {
			v := cpuPct(cpu1-cpu0, time.Since(t0))
			row.DaemonPID, row.DaemonCPUPct = daemon, &v
		}
	}
	overRanks := maxOverRanks
	if cfg.Gap > 0 {
		// After a pause an iteration's time is the minimum over ranks: each
		// rank leaves its pause at a slightly different moment (a sleep
		// overshoots by up to a millisecond), and the last to arrive times
		// the op itself where the others time their wait for it too.
		overRanks = minOverRanks
	}
	ts, extra, err := overRanks(ctx, c, ts, float64(bad))
	if err != nil {
		return row, false, err
	}
	row.fillStats(ts, bytes, BusFactor(e.Op, e.Ranks))
	row.Check = "off"
	failed := false
	if cfg.Check {
		row.Check = "ok"
		if extra[0] > 0 {
			row.Check, failed = "FAIL", true
		}
	}
	return row, failed, nil
}

func lower(s string) string {
	b := []byte(s)
	for i, ch := range b {
		if 'A' <= ch && ch <= 'Z' {
			b[i] = ch + 'a' - 'A'
		}
	}
	return string(b)
}

// poison overwrites buf with a value no check input holds (99; true for bool).
func poison[T hvdd.Elem](buf []T) {
	v := encode[T](99)
	for i := range buf {
		buf[i] = v
	}
}
