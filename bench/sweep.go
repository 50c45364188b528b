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
	Device   string  `json:"device,omitempty"`
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

// buffer returns the bytes of n elements of el: shared memory from Alloc
// with zero-copy, else a plain Go slice; free gives shared memory back.
func buffer(c *hvdd.Client, el elems, n int, zeroCopy bool) (buf []byte, free func(), err error) {
	buf, err = el.alloc(c, n, zeroCopy)
	if err != nil {
		return nil, nil, fmt.Errorf("alloc %d elements: %w", n, err)
	}
	if !zeroCopy {
		return buf, func() {}, nil
	}
	return buf, func() { el.free(c, buf) }, nil
}

// sweep measures cfg.Op on elements of el (cfg.DType's) at every size of
// the sweep and prints a row per size on rank 0. It returns an error on a
// failed collective or a failed check.
func sweep(ctx context.Context, c *hvdd.Client, cfg Config, el elems, out, errOut io.Writer) error {
	n, rank := c.Size(), c.Rank()
	p := newPrinter(cfg, out, rank == 0)
	iters := fmt.Sprintf("iters %d (sizes <= 64K: >= %d and >= %v)", cfg.Iters, cfg.SmallIters, cfg.SmallTime)
	if cfg.Gap > 0 {
		iters = fmt.Sprintf("iters %d, each after a %v pause", cfg.Iters, cfg.Gap)
	}
	mem := fmt.Sprintf("zero-copy %v", cfg.ZeroCopy)
	var dev *deviceEnv
	if cfg.Device != "" {
		var err error
		if dev, err = openDevice(c, cfg.Device); err != nil {
			return err
		}
		defer dev.close()
		mem = fmt.Sprintf("device %s: %s (%s), rank 0's", cfg.Device, dev.name, dev.uuid)
	}
	p.header(fmt.Sprintf("# hvdd bench: %s %s, %d ranks, reduce %s, %s, warmup %d, %s, check %v",
		lower(cfg.Op.String()), cfg.DType, n, cfg.Reduce, mem, cfg.Warmup, iters, cfg.Check),
		tableHeader)
	es := cfg.DType.Size()
	failed := false
	for _, bytes := range Sizes(cfg.MinBytes, cfg.MaxBytes, cfg.StepFactor, es, Divisor(cfg.Op, n)) {
		e := Expect{Op: cfg.Op, Reduce: cfg.Reduce, DType: cfg.DType, Ranks: n, Rank: rank, Count: bytes / int64(es)}
		m := &sizeRun{ctx: ctx, c: c, cfg: cfg, el: el, e: e, errOut: errOut}
		row, bad, err := m.measure(dev)
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

// measure runs the warm-up and the timed loop of the size, with its input
// on dev's GPU when dev is not nil, and returns its row and whether --check
// found wrong results on any rank.
func (m *sizeRun) measure(dev *deviceEnv) (Row, bool, error) {
	ctx, c, cfg, e := m.ctx, m.c, m.cfg, m.e
	row := Row{Op: lower(e.Op.String()), Count: e.Count, DType: e.DType.String(), Ranks: e.Ranks, ZeroCopy: cfg.ZeroCopy, GapUS: us(cfg.Gap), Device: cfg.Device}
	if e.Op == tensor.Allreduce || e.Op == tensor.Reducescatter {
		row.Reduce = e.Reduce.String()
	}
	in, free, err := buffer(c, m.el, int(e.InputLen()), cfg.ZeroCopy)
	if err != nil {
		return row, false, err
	}
	defer free()
	m.in = in
	if cfg.Check {
		m.pristine = make([]byte, len(in))
		fillRaw(e, e.DType, m.pristine)
	}
	// Without --check the buffer holds zeros, a fixed point of every
	// reduction, so repeated in-place runs neither overflow nor go subnormal.
	clear(in)
	if dev != nil {
		if m.dev, err = dev.alloc(len(in)); err != nil {
			return row, false, err
		}
		defer m.dev.free(c)
		if err := m.dev.upload(in); err != nil {
			return row, false, err
		}
	}
	warm := make([]time.Duration, 0, cfg.Warmup)
	for range cfg.Warmup {
		dt, err := m.once()
		if err != nil {
			return row, false, err
		}
		warm = append(warm, dt)
	}
	bytes := e.Count * int64(e.DType.Size())
	iters, err := m.iterations(bytes, warm)
	if err != nil {
		return row, false, err
	}
	ts, err := m.timed(iters, &row)
	if err != nil {
		return row, false, err
	}
	overRanks := maxOverRanks
	if cfg.Gap > 0 {
		// After a pause an iteration's time is the minimum over ranks: each
		// rank leaves its pause at a slightly different moment (a sleep
		// overshoots by up to a millisecond), and the last to arrive times
		// the op itself where the others time their wait for it too.
		overRanks = minOverRanks
	}
	ts, extra, err := overRanks(ctx, c, ts, float64(m.bad))
	if err != nil {
		return row, false, err
	}
	row.fillStats(ts, bytes, BusFactor(e.Op, e.Ranks))
	row.Check = checkColumn(cfg.Check, extra[0])
	return row, row.Check == "FAIL", nil
}

// sizeRun is one size of a sweep while it runs: its input buffer and its
// count of wrong results.
type sizeRun struct {
	ctx      context.Context
	c        *hvdd.Client
	cfg      Config
	el       elems // the element type, e.DType's
	e        Expect
	errOut   io.Writer
	in       []byte     // the input's bytes
	pristine []byte     // in's input, restored before each run (--check only)
	dev      *devBuffer // with --device: the input on the GPU (in is then the host copy)
	bad      int64      // wrong elements seen so far (--check)
}

// once runs and times one collective; under --check it verifies the result.
func (m *sizeRun) once() (time.Duration, error) {
	if m.cfg.Check {
		copy(m.in, m.pristine)
		if m.dev != nil {
			if err := m.dev.upload(m.in); err != nil {
				return 0, err
			}
		}
	}
	t0 := time.Now()
	var res []byte
	var err error
	if m.dev != nil {
		res, err = runDevice(m.ctx, m.c, m.e, m.dev, m.cfg.Check)
	} else {
		res, err = m.el.run(m.ctx, m.c, m.e.Op, m.in, hvdd.WithOp(m.e.Reduce))
	}
	dt := time.Since(t0)
	if err != nil {
		return 0, err
	}
	if m.cfg.Check && m.e.Op != tensor.Allreduce && m.e.Op != tensor.Broadcast {
		// The input is ours again once the op is done: clobber it at
		// once, so that a daemon still reading it gives wrong results.
		poison(m.e.DType, m.in)
	}
	if m.cfg.Check {
		if nb, first := verifyRaw(m.e, m.e.DType, res); nb > 0 {
			if m.bad == 0 {
				fmt.Fprintf(m.errOut, "hvdd bench: rank %d: %s of %d elements of %s: %d wrong; %s\n",
					m.e.Rank, lower(m.e.Op.String()), m.e.Count, m.e.DType, nb, first)
			}
			m.bad += nb
		}
	}
	return dt, nil
}

// timed runs the timed iterations, each after a --gap pause if one is
// given, and returns their times. With --gap, rank 0 also measures the CPU
// time of the daemon (the process serving the socket) over the paced loop,
// into row: what ops that come apart cost it (bench/gapcpu.sh).
func (m *sizeRun) timed(iters int, row *Row) ([]time.Duration, error) {
	var cpu daemonCPU
	if m.cfg.Gap > 0 && m.e.Rank == 0 {
		cpu = startDaemonCPU(m.c.Socket)
	}
	ts := make([]time.Duration, iters)
	for i := range ts {
		if m.cfg.Gap > 0 {
			time.Sleep(m.cfg.Gap)
		}
		var err error
		if ts[i], err = m.once(); err != nil {
			return nil, err
		}
	}
	cpu.stop(row)
	return ts, nil
}

// iterations returns how many timed iterations a size of bytes runs:
// --iters, or for small sizes without --gap as many as IterationsFor
// gives for the slowest rank's warm-up estimate, so that every rank runs
// the same number.
func (m *sizeRun) iterations(bytes int64, warm []time.Duration) (int, error) {
	if bytes > SmallBytes || m.cfg.Gap != 0 {
		return m.cfg.Iters, nil
	}
	est := Summarize(warm).Median
	slowest, _, err := maxOverRanks(m.ctx, m.c, []time.Duration{est})
	if err != nil {
		return 0, err
	}
	return IterationsFor(bytes, m.cfg.Iters, m.cfg.SmallIters, m.cfg.SmallTime, slowest[0]), nil
}

// daemonCPU is a reading of the daemon's CPU time; the zero value (daemon
// not found) measures nothing.
type daemonCPU struct {
	pid   int
	ticks int64
	t0    time.Time
}

// startDaemonCPU reads the CPU time of the daemon serving socket.
func startDaemonCPU(socket string) daemonCPU {
	pid, err := FindDaemon(socket)
	if err != nil {
		return daemonCPU{}
	}
	ticks, err := CPUTicks(pid)
	if err != nil {
		return daemonCPU{}
	}
	return daemonCPU{pid: pid, ticks: ticks, t0: time.Now()}
}

// stop reads the daemon's CPU time again and sets row's daemon columns to
// its use since startDaemonCPU, as % of one core.
func (d daemonCPU) stop(row *Row) {
	if d.pid <= 0 {
		return
	}
	if ticks, err := CPUTicks(d.pid); err == nil {
		v := cpuPct(ticks-d.ticks, time.Since(d.t0))
		row.DaemonPID, row.DaemonCPUPct = d.pid, &v
	}
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
