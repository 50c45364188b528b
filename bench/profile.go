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

// resnet runs the resnet50 profile: per step, ResNet-50's 161 gradients are
// allreduced (Average) asynchronously and waited for; then one fused
// allreduce of the same total is timed the same way.
func resnet[T hvdd.Elem](ctx context.Context, c *hvdd.Client, cfg Config, out, errOut io.Writer) error {
	n, rank := c.Size(), c.Rank()
	es := cfg.DType.Size()
	var total int64
	for _, s := range ResNet50Sizes {
		total += int64(s)
	}
	bytes := total * int64(es)
	p := newPrinter(cfg, out, rank == 0)
	p.header(fmt.Sprintf("# resnet50: %d tensors, %d %s (%.1f MB), %d ranks, Average, zero-copy %v, warmup %d, iters %d, check %v",
		len(ResNet50Sizes), total, cfg.DType, float64(bytes)/1e6, n, cfg.ZeroCopy, cfg.Warmup, cfg.Iters, cfg.Check),
		"# variant              median_ms     min_ms     max_ms  algbw_GB/s  busbw_GB/s  check")

	type tens struct {
		e        Expect
		buf      []T
		pristine []T
		name     string
	}
	grads := make([]tens, len(ResNet50Sizes))
	for i, s := range ResNet50Sizes {
		b, free, err := buffer[T](c, s, cfg.ZeroCopy)
		if err != nil {
			return err
		}
		defer free()
		clear(b)
		grads[i] = tens{e: Expect{Op: tensor.Allreduce, Reduce: tensor.Average, DType: cfg.DType, Ranks: n, Rank: rank, Count: int64(s)},
			buf: b, name: "resnet50.grad." + strconv.Itoa(i)}
	}
	fb, ffree, err := buffer[T](c, int(total), cfg.ZeroCopy)
	if err != nil {
		return err
	}
	defer ffree()
	clear(fb)
	fused := tens{e: Expect{Op: tensor.Allreduce, Reduce: tensor.Average, DType: cfg.DType, Ranks: n, Rank: rank, Count: total}, buf: fb, name: "resnet50.fused"}
	if cfg.Check {
		for i := range grads {
			grads[i].pristine = make([]T, len(grads[i].buf))
			Fill(grads[i].e, grads[i].pristine)
		}
		fused.pristine = make([]T, total)
		Fill(fused.e, fused.pristine)
	}

	var bad int64
	verify := func(t *tens) {
		if nb, first := Verify(t.e, t.buf); nb > 0 {
			if bad == 0 {
				fmt.Fprintf(errOut, "hvdd bench: rank %d: %s: %d wrong; %s\n", rank, t.name, nb, first)
			}
			bad += nb
		}
	}
	avg := hvdd.WithOp(tensor.Average)
	handles := make([]*hvdd.Handle, len(grads))
	step := func() (time.Duration, error) {
		if cfg.Check {
			for i := range grads {
				copy(grads[i].buf, grads[i].pristine)
			}
		}
		t0 := time.Now()
		for i := range grads {
			h, err := hvdd.AllreduceAsync(c, grads[i].buf, avg, hvdd.WithName(grads[i].name))
			if err != nil {
				return 0, err
			}
			handles[i] = h
		}
		for _, h := range handles {
			if err := h.Wait(ctx); err != nil {
				return 0, err
			}
		}
		dt := time.Since(t0)
		if cfg.Check {
			for i := range grads {
				verify(&grads[i])
			}
		}
		return dt, nil
	}
	one := func() (time.Duration, error) {
		if cfg.Check {
			copy(fused.buf, fused.pristine)
		}
		t0 := time.Now()
		err := hvdd.Allreduce(ctx, c, fused.buf, avg, hvdd.WithName(fused.name))
		dt := time.Since(t0)
		if err == nil && cfg.Check {
			verify(&fused)
		}
		return dt, err
	}
	// The two variants alternate, iteration by iteration, so that a shared
	// machine's drift (this VM's speed moves by tens of percent between
	// seconds) weighs on both alike.
	stepTs := make([]time.Duration, cfg.Iters)
	fusedTs := make([]time.Duration, cfg.Iters)
	for i := -cfg.Warmup; i < cfg.Iters; i++ {
		ts, err := step()
		if err != nil {
			return fmt.Errorf("resnet50 step: %w", err)
		}
		tf, err := one()
		if err != nil {
			return fmt.Errorf("resnet50 fused allreduce: %w", err)
		}
		if i >= 0 {
			stepTs[i], fusedTs[i] = ts, tf
		}
	}
	all, extra, err := maxOverRanks(ctx, c, append(stepTs, fusedTs...), float64(bad))
	if err != nil {
		return err
	}
	check := "off"
	if cfg.Check {
		check = "ok"
		if extra[0] > 0 {
			check = "FAIL"
		}
	}
	rows := []Row{
		{Profile: "resnet50", Variant: fmt.Sprintf("%d_async_waitall", len(grads))},
		{Profile: "resnet50", Variant: "1_fused"},
	}
	for i, ts := range [][]time.Duration{all[:cfg.Iters], all[cfg.Iters:]} {
		r := &rows[i]
		r.Op, r.Bytes, r.Count, r.DType, r.Reduce = "allreduce", bytes, total, cfg.DType.String(), tensor.Average.String()
		r.Ranks, r.ZeroCopy, r.Check = n, cfg.ZeroCopy, check
		r.fillStats(ts, bytes, BusFactor(tensor.Allreduce, n))
	}
	ratio := rows[0].MedianUS / rows[1].MedianUS
	if cfg.JSON {
		rows[0].Ratio = ratio
		p.json(rows[0])
		p.json(rows[1])
	} else {
		for _, r := range rows {
			p.text("%-20s %10.2f %10.2f %10.2f %11.3f %11.3f  %s\n", r.Variant, r.MedianUS/1e3, r.MinUS/1e3, r.MaxUS/1e3, r.AlgBW, r.BusBW, r.Check)
		}
		p.text("ratio step/fused     %10.3f\n", ratio)
	}
	if check == "FAIL" {
		return errCheckFailed
	}
	return nil
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
	self := os.Getpid()
	d0, derr := int64(0), error(nil)
	if pid > 0 {
		d0, derr = CPUTicks(pid)
	}
	s0, err := CPUTicks(self)
	if err != nil {
		return err
	}
	t0 := time.Now()
	select {
	case <-time.After(cfg.Duration):
	case <-ctx.Done():
		return ctx.Err()
	}
	wall := time.Since(t0)
	var d1 int64
	if pid > 0 && derr == nil {
		d1, derr = CPUTicks(pid)
	}
	s1, err := CPUTicks(self)
	if err != nil {
		return err
	}
	pct := func(ticks int64) float64 { return cpuPct(ticks, wall) }
	clients, err := hvdd.Allgather(ctx, c, []float64{pct(s1 - s0)})
	if err != nil {
		return err
	}
	if rank != 0 {
		return nil
	}
	r := Row{Profile: "idle", Ranks: c.Size(), ZeroCopy: cfg.ZeroCopy, DurationS: wall.Seconds(), DaemonPID: pid, ClientCPUPct: clients, ClockTicksPerS: ClockTicks}
	var total float64
	for _, v := range clients {
		total += v
	}
	r.ClientsCPUPct = &total
	if pid > 0 && derr == nil {
		v := pct(d1 - d0)
		r.DaemonCPUPct = &v
	} else if derr != nil {
		fmt.Fprintf(errOut, "hvdd bench: reading the daemon's CPU time: %v\n", derr)
	}
	p := newPrinter(cfg, out, true)
	if cfg.JSON {
		p.json(r)
		return nil
	}
	p.text("# idle: %d clients connected for %.2f s; CPU as %% of one core (utime+stime from /proc, %d ticks/s)\n", r.Ranks, r.DurationS, ClockTicks)
	if r.DaemonCPUPct != nil {
		p.text("daemon (pid %d)       %8.3f %%\n", pid, *r.DaemonCPUPct)
	} else {
		p.text("daemon               unknown\n")
	}
	for i, v := range clients {
		p.text("client rank %-8d %8.3f %%\n", i, v)
	}
	p.text("clients total        %8.3f %%\n", total)
	return nil
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
