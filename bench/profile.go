package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/tensor"
)

// resnet runs the resnet50 profile on elements of el (cfg.DType's): per
// step, ResNet-50's 161 gradients are allreduced (Average) asynchronously
// and waited for; then one fused allreduce of the same total is timed the
// same way. With --timeline-compare the two variants are instead the step
// with the timeline off and the step with it on.
func resnet(ctx context.Context, c *hvdd.Client, cfg Config, el elems, out, errOut io.Writer) error {
	n := c.Size()
	var total int64
	for _, s := range ResNet50Sizes {
		total += int64(s)
	}
	bytes := total * int64(cfg.DType.Size())
	p := newPrinter(cfg, out, c.Rank() == 0)
	gap := ""
	if cfg.Gap > 0 {
		gap = fmt.Sprintf(", each after a %v pause", cfg.Gap)
	}
	p.header(fmt.Sprintf("# resnet50: %d tensors, %d %s (%.1f MB), %d ranks, Average, zero-copy %v, warmup %d, iters %d%s, check %v",
		len(ResNet50Sizes), total, cfg.DType, float64(bytes)/1e6, n, cfg.ZeroCopy, cfg.Warmup, cfg.Iters, gap, cfg.Check),
		"# variant                    median_ms     min_ms     max_ms  algbw_GB/s  busbw_GB/s  check")

	r := &resnetRun{ctx: ctx, c: c, cfg: cfg, el: el, errOut: errOut}
	defer r.free()
	if err := r.alloc(total); err != nil {
		return err
	}
	step := fmt.Sprintf("%d_async_waitall", len(r.grads))
	variants := []variant{{step, r.step}, {"1_fused", r.fusedStep}}
	ratio := "step/fused"
	measure := r.measure
	if cfg.TimelineCompare {
		variants = []variant{{step, r.step}, {step + "_timeline", r.step}}
		ratio = "timeline on/off"
		measure = r.compare
	}
	times, err := measure(variants)
	if err != nil {
		return err
	}
	// After a pause the ranks wake at different times, so a step's time is
	// the last rank's to arrive (the minimum), as the sweep's --gap rows.
	overRanks := maxOverRanks
	if cfg.Gap > 0 {
		overRanks = minOverRanks
	}
	all, extra, err := overRanks(ctx, c, times, float64(r.bad))
	if err != nil {
		return err
	}
	check := checkColumn(cfg.Check, extra[0])
	rows := make([]Row, len(variants))
	for i, v := range variants {
		row := &rows[i]
		row.Profile, row.Variant = "resnet50", v.name
		row.Op, row.Bytes, row.Count, row.DType, row.Reduce = "allreduce", bytes, total, cfg.DType.String(), tensor.Average.String()
		row.Ranks, row.ZeroCopy, row.Check, row.GapUS = n, cfg.ZeroCopy, check, us(cfg.Gap)
		row.fillStats(all[i*cfg.Iters:(i+1)*cfg.Iters], bytes, BusFactor(tensor.Allreduce, n))
	}
	printResNet(p, rows, ratio)
	if check == "FAIL" {
		return errCheckFailed
	}
	return nil
}

// variant is one of the two things the resnet50 profile times alternately.
type variant struct {
	name string
	run  func() (time.Duration, error)
}

// checkColumn is the check column of a row: off without --check, else ok,
// or FAIL when any rank saw a wrong result (bad, maxed over ranks, > 0).
func checkColumn(check bool, bad float64) string {
	switch {
	case !check:
		return "off"
	case bad > 0:
		return "FAIL"
	}
	return "ok"
}

// printResNet prints the two variants' rows, the first with the ratio of
// their medians (the second's over the first's for the timeline, the
// first's over the second's for step/fused), named by label.
func printResNet(p *printer, rows []Row, label string) {
	ratio := rows[0].MedianUS / rows[1].MedianUS
	if label == "timeline on/off" {
		ratio = 1 / ratio
	}
	if p.cfg.JSON {
		rows[0].Ratio = ratio
		p.json(rows[0])
		p.json(rows[1])
		return
	}
	for _, r := range rows {
		p.text("%-26s %10.2f %10.2f %10.2f %11.3f %11.3f  %s\n", r.Variant, r.MedianUS/1e3, r.MinUS/1e3, r.MaxUS/1e3, r.AlgBW, r.BusBW, r.Check)
	}
	p.text("ratio %-20s %10.3f\n", label, ratio)
}

// resnetTensor is one allreduce of the resnet50 profile.
type resnetTensor struct {
	e        Expect // what the result must be
	buf      []byte // the elements' bytes
	pristine []byte // buf's input, restored before each run (--check only)
	name     string
}

// resnetRun holds the resnet50 profile's buffers and its count of wrong
// results while it runs.
type resnetRun struct {
	ctx     context.Context
	c       *hvdd.Client
	cfg     Config
	el      elems // the element type, cfg.DType's
	errOut  io.Writer
	grads   []resnetTensor // ResNet50Sizes, one allreduce each
	fused   resnetTensor   // all of them in one
	handles []*hvdd.Handle // grads' handles during a step
	frees   []func()
	bad     int64 // wrong elements seen so far (--check)
}

// alloc makes the gradients' buffers and the fused one (total elements),
// zeroed, with their check inputs under --check.
func (r *resnetRun) alloc(total int64) error {
	r.grads = make([]resnetTensor, len(ResNet50Sizes))
	for i, s := range ResNet50Sizes {
		if err := r.tensor(&r.grads[i], int64(s), "resnet50.grad."+strconv.Itoa(i)); err != nil {
			return err
		}
	}
	r.handles = make([]*hvdd.Handle, len(r.grads))
	return r.tensor(&r.fused, total, "resnet50.fused")
}

// tensor makes t: count elements named name.
func (r *resnetRun) tensor(t *resnetTensor, count int64, name string) error {
	b, free, err := buffer(r.c, r.el, int(count), r.cfg.ZeroCopy)
	if err != nil {
		return err
	}
	r.frees = append(r.frees, free)
	clear(b)
	*t = resnetTensor{
		e:   Expect{Op: tensor.Allreduce, Reduce: tensor.Average, DType: r.cfg.DType, Ranks: r.c.Size(), Rank: r.c.Rank(), Count: count},
		buf: b, name: name,
	}
	if r.cfg.Check {
		t.pristine = make([]byte, len(b))
		fillRaw(t.e, t.e.DType, t.pristine)
	}
	return nil
}

// free gives back the buffers alloc made, the last first.
func (r *resnetRun) free() {
	for i := len(r.frees) - 1; i >= 0; i-- {
		r.frees[i]()
	}
}

// measure runs the warm-up and the timed iterations of the variants and
// returns their times, variant after variant. The variants alternate,
// iteration by iteration, so that a shared machine's drift (this VM's speed
// moves by tens of percent between seconds) weighs on both alike.
func (r *resnetRun) measure(variants []variant) ([]time.Duration, error) {
	iters := r.cfg.Iters
	ts := make([]time.Duration, len(variants)*iters)
	for i := -r.cfg.Warmup; i < iters; i++ {
		for k, v := range variants {
			r.pause()
			t, err := v.run()
			if err != nil {
				return nil, fmt.Errorf("resnet50 %s: %w", v.name, err)
			}
			if i >= 0 {
				ts[k*iters+i] = t
			}
		}
	}
	return ts, nil
}

// pause sleeps for --gap, untimed, before a step: a training step's
// compute (on a device, or anywhere but these cores) between reductions.
func (r *resnetRun) pause() {
	if r.cfg.Gap > 0 {
		time.Sleep(r.cfg.Gap)
	}
}

// step times one training step's gradient reduction: every gradient
// allreduced asynchronously, then waited for.
func (r *resnetRun) step() (time.Duration, error) {
	if r.cfg.Check {
		for i := range r.grads {
			copy(r.grads[i].buf, r.grads[i].pristine)
		}
	}
	avg := hvdd.WithOp(tensor.Average)
	t0 := time.Now()
	for i := range r.grads {
		h, err := r.el.allreduceAsync(r.c, r.grads[i].buf, avg, hvdd.WithName(r.grads[i].name))
		if err != nil {
			return 0, err
		}
		r.handles[i] = h
	}
	for _, h := range r.handles {
		if err := h.Wait(r.ctx); err != nil {
			return 0, err
		}
	}
	dt := time.Since(t0)
	if r.cfg.Check {
		for i := range r.grads {
			r.verify(&r.grads[i])
		}
	}
	return dt, nil
}

// compareBlock is how many steps in a row --timeline-compare runs with
// the timeline on, or off.
const compareBlock = 5

// compare is measure for --timeline-compare: variants[0] (run with the
// timeline off) and variants[1] (run with it on) alternate in blocks of
// compareBlock steps. Rank 0 starts the timeline in the --timeline file
// before each traced block and stops it after, untimed, with a barrier
// after each so that a block is traced whole and nothing else is. Within a
// block the timeline runs as it would in a job: its writer goroutine
// formats and writes a step's events while the next step runs; only the
// writing left after the block's last step falls into the untimed stop
// (each start truncates the file, which is left with the last traced
// block, and names its rows afresh: a little more to write than a timeline
// that runs on). The first --warmup steps are not timed.
func (r *resnetRun) compare(variants []variant) ([]time.Duration, error) {
	iters := r.cfg.Iters
	ts := make([]time.Duration, 0, 2*iters)
	got := [2][]time.Duration{}
	warm := r.cfg.Warmup
	for blk := 0; len(got[0]) < iters || len(got[1]) < iters; blk++ {
		k := blk % 2
		if k == 1 {
			if err := r.timeline(true); err != nil {
				return nil, err
			}
		}
		for range compareBlock {
			r.pause()
			t, err := variants[k].run()
			if err != nil {
				return nil, fmt.Errorf("resnet50 %s: %w", variants[k].name, err)
			}
			if warm > 0 {
				warm--
			} else if len(got[k]) < iters {
				got[k] = append(got[k], t)
			}
		}
		if k == 1 {
			if err := r.timeline(false); err != nil {
				return nil, err
			}
		}
	}
	return append(append(ts, got[0]...), got[1]...), nil
}

// timeline starts or stops the --timeline on rank 0, then waits for every
// rank.
func (r *resnetRun) timeline(on bool) error {
	if r.c.Rank() == 0 {
		var err error
		if on {
			err = r.c.StartTimeline(r.ctx, r.cfg.Timeline, r.cfg.TimelineMarkCycles)
		} else {
			err = r.c.StopTimeline(r.ctx)
		}
		if err != nil {
			return fmt.Errorf("timeline: %w", err)
		}
	}
	return r.c.Barrier(r.ctx)
}

// fusedStep times one allreduce of all the gradients' elements at once.
func (r *resnetRun) fusedStep() (time.Duration, error) {
	if r.cfg.Check {
		copy(r.fused.buf, r.fused.pristine)
	}
	t0 := time.Now()
	err := r.allreduce(&r.fused)
	dt := time.Since(t0)
	if err == nil && r.cfg.Check {
		r.verify(&r.fused)
	}
	return dt, err
}

// allreduce is hvdd.Allreduce (Average) of t, which waits for it.
func (r *resnetRun) allreduce(t *resnetTensor) error {
	h, err := r.el.allreduceAsync(r.c, t.buf, hvdd.WithOp(tensor.Average), hvdd.WithName(t.name))
	if err != nil {
		return err
	}
	return h.Wait(r.ctx)
}

// verify counts t's wrong elements, and reports the first tensor that has
// any.
func (r *resnetRun) verify(t *resnetTensor) {
	if nb, first := verifyRaw(t.e, t.e.DType, t.buf); nb > 0 {
		if r.bad == 0 {
			fmt.Fprintf(r.errOut, "hvdd bench: rank %d: %s: %d wrong; %s\n", r.c.Rank(), t.name, nb, first)
		}
		r.bad += nb
	}
}

// ClockTicks is the kernel's USER_HZ, the unit of utime and stime in
// /proc/<pid>/stat; 100 on every Linux architecture Go supports.
const ClockTicks = 100

// cpuPct is ticks of CPU time over wall, as % of one core.
func cpuPct(ticks int64, wall time.Duration) float64 {
	return float64(ticks) / ClockTicks / wall.Seconds() * 100
}

// CPUTicks returns utime+stime of process pid (all its threads) in clock
// ticks, from /proc/<pid>/stat.
func CPUTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return ParseStatTicks(string(b))
}

// ParseStatTicks extracts utime+stime (fields 14 and 15) from the contents of
// a /proc/<pid>/stat file. The command name (field 2) may hold spaces and
// parentheses, so fields are counted from the last ')'.
func ParseStatTicks(stat string) (int64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat: no ')'")
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, errors.New("malformed /proc stat: too few fields")
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("malformed /proc stat: %w", err)
	}
	return u + s, nil
}

// idle runs the idle profile: every rank stays connected and does nothing
// for cfg.Duration; rank 0 reports the daemon's CPU use and every client's,
// as % of one core.
func idle(ctx context.Context, c *hvdd.Client, cfg Config, out, errOut io.Writer) error {
	rank := c.Rank()
	pid := 0
	if rank == 0 {
		var err error
		if pid, err = FindDaemon(c.Socket); err != nil {
			fmt.Fprintf(errOut, "hvdd bench: cannot find the daemon's pid (%v); reporting the clients only\n", err)
		}
	}
	if err := c.Barrier(ctx); err != nil {
		return err
	}
	u, err := idleUsage(ctx, cfg.Duration, pid)
	if err != nil {
		return err
	}
	pct := func(ticks int64) float64 { return cpuPct(ticks, u.wall) }
	clients, err := hvdd.Allgather(ctx, c, []float64{pct(u.self)})
	if err != nil {
		return err
	}
	if rank != 0 {
		return nil
	}
	r := Row{Profile: "idle", Ranks: c.Size(), ZeroCopy: cfg.ZeroCopy, DurationS: u.wall.Seconds(), DaemonPID: pid, ClientCPUPct: clients, ClockTicksPerS: ClockTicks}
	var total float64
	for _, v := range clients {
		total += v
	}
	r.ClientsCPUPct = &total
	if pid > 0 && u.daemonErr == nil {
		v := pct(u.daemon)
		r.DaemonCPUPct = &v
	} else if u.daemonErr != nil {
		fmt.Fprintf(errOut, "hvdd bench: reading the daemon's CPU time: %v\n", u.daemonErr)
	}
	printIdle(newPrinter(cfg, out, true), r)
	return nil
}

// cpuUsage is the CPU time a process and the daemon used over a wall time,
// in clock ticks.
type cpuUsage struct {
	wall      time.Duration
	self      int64 // this process
	daemon    int64 // the daemon, unless daemonErr (or no daemon was given)
	daemonErr error
}

// idleUsage sleeps for d (or until ctx is done) and returns the CPU time
// this process and daemon (a pid; 0 for none) used meanwhile.
func idleUsage(ctx context.Context, d time.Duration, daemon int) (cpuUsage, error) {
	var u cpuUsage
	var d0 int64
	if daemon > 0 {
		d0, u.daemonErr = CPUTicks(daemon)
	}
	self := os.Getpid()
	s0, err := CPUTicks(self)
	if err != nil {
		return u, err
	}
	t0 := time.Now()
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return u, ctx.Err()
	}
	u.wall = time.Since(t0)
	var d1 int64
	if daemon > 0 && u.daemonErr == nil {
		d1, u.daemonErr = CPUTicks(daemon)
	}
	s1, err := CPUTicks(self)
	if err != nil {
		return u, err
	}
	u.self, u.daemon = s1-s0, d1-d0
	return u, nil
}

// printIdle prints the idle profile's row: one JSON line, or the table.
func printIdle(p *printer, r Row) {
	if p.cfg.JSON {
		p.json(r)
		return
	}
	p.text("# idle: %d clients connected for %.2f s; CPU as %% of one core (utime+stime from /proc, %d ticks/s)\n", r.Ranks, r.DurationS, ClockTicks)
	if r.DaemonCPUPct != nil {
		p.text("daemon (pid %d)       %8.3f %%\n", r.DaemonPID, *r.DaemonCPUPct)
	} else {
		p.text("daemon               unknown\n")
	}
	for i, v := range r.ClientCPUPct {
		p.text("client rank %-8d %8.3f %%\n", i, v)
	}
	p.text("clients total        %8.3f %%\n", *r.ClientsCPUPct)
}

// FindDaemon returns the pid of the process listening on the Unix socket
// path: $HVDD_BENCH_DAEMON_PID if set; else the holder of the listening
// socket's inode (from /proc/net/unix and /proc/*/fd); else a process whose
// command line has "serve" and the path.
func FindDaemon(socket string) (int, error) {
	if v := os.Getenv("HVDD_BENCH_DAEMON_PID"); v != "" {
		return strconv.Atoi(v)
	}
	if ino, err := listeningInode(socket); err == nil {
		if pid := fdHolder(ino); pid > 0 {
			return pid, nil
		}
	}
	procs, _ := os.ReadDir("/proc")
	for _, d := range procs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		hasServe, hasSock := false, false
		for _, a := range args {
			hasServe = hasServe || a == "serve"
			hasSock = hasSock || a == socket || a == "--socket="+socket
		}
		if hasServe && hasSock {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no process listens on %s", socket)
}

// listeningInode finds the inode of the listening Unix socket bound to path.
func listeningInode(path string) (string, error) {
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		// Num RefCount Protocol Flags Type St Inode Path
		f := strings.Fields(line)
		if len(f) < 8 || f[7] != path {
			continue
		}
		flags, err := strconv.ParseUint(f[3], 16, 32)
		if err == nil && flags&0x10000 != 0 { // __SO_ACCEPTCON: listening
			return f[6], nil
		}
	}
	return "", fmt.Errorf("no listening socket at %s", path)
}

// fdHolder returns a pid that has socket inode ino open, or 0.
func fdHolder(ino string) int {
	want := "socket:[" + ino + "]"
	procs, _ := os.ReadDir("/proc")
	for _, d := range procs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		fds, _ := os.ReadDir("/proc/" + d.Name() + "/fd")
		for _, fd := range fds {
			if l, err := os.Readlink("/proc/" + d.Name() + "/fd/" + fd.Name()); err == nil && l == want {
				return pid
			}
		}
	}
	return 0
}
