package hvdd_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/daemon/daemontest"
	"github.com/hvdd/hvdd/reduce"
	"github.com/hvdd/hvdd/tensor"
)

// TestMain turns the test binary into a worker when daemontest re-executes it.
func TestMain(m *testing.M) {
	if sc := os.Getenv(daemontest.WorkerEnv); sc != "" {
		os.Exit(worker(sc))
	}
	// The examples talk to a one-slot daemon through HVDD_SOCKET.
	stop, err := daemontest.StartMain(daemon.Config{Slots: 1})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(daemontest.Main(m, stop))
}

var scenarios = map[string]func(ctx context.Context, c *hvdd.Client) error{
	"collectives": collectives,
	"errors":      errorCases,
	"join":        joinScenario,
	"victim":      victim,
	"async":       asyncScenario,
	"procsets":    procSets,
	"adasum":      adasumScenario,
	"bigfused":    bigFused,
}

func worker(name string) int {
	if run := ownInit[name]; run != nil {
		return run()
	}
	f := scenarios[name]
	if f == nil {
		fmt.Println("unknown scenario", name)
		return 2
	}
	// A bound for a hung scenario: 2 minutes, as a whole scenario of checks
	// under the race detector on a loaded 2-core machine took over one.
	// HVDD_TEST_TIMEOUT raises it for the jobs of many nodes (scale_test.go).
	limit := 120 * time.Second
	if d, err := time.ParseDuration(os.Getenv("HVDD_TEST_TIMEOUT")); err == nil {
		limit = d
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	if lr, _ := strconv.Atoi(os.Getenv("HVDD_LOCAL_RANK")); os.Getenv("HVDD_TEST_CHANNEL") == "odd" && lr%2 == 1 {
		os.Setenv("HVDD_CHANNEL", "0")
	}
	c, err := hvdd.Init(ctx)
	if err != nil {
		fmt.Println("init:", err)
		return 1
	}
	want, _ := strconv.Atoi(os.Getenv("HVDD_TEST_SIZE"))
	local, err := strconv.Atoi(os.Getenv("HVDD_TEST_LOCAL_SIZE"))
	if err != nil {
		local = want
	}
	nodes := want / local
	if os.Getenv("HVDD_TEST_HETERO") == "1" {
		// Nodes of different sizes: only the invariants that still hold.
		if c.Size() != want || c.LocalSize() != local || c.IsHomogeneous() {
			fmt.Printf("bad identity: rank %d size %d local %d/%d homogeneous %v\n", c.Rank(), c.Size(), c.LocalRank(), c.LocalSize(), c.IsHomogeneous())
			return 1
		}
	} else if c.Size() != want || c.LocalSize() != local || c.Rank() != c.CrossRank()*local+c.LocalRank() || c.CrossSize() != nodes || !c.IsHomogeneous() {
		fmt.Printf("bad identity: rank %d size %d local %d/%d cross %d/%d\n", c.Rank(), c.Size(), c.LocalRank(), c.LocalSize(), c.CrossRank(), c.CrossSize())
		return 1
	}
	if err := f(ctx, c); err != nil {
		fmt.Printf("rank %d: %v\n", c.Rank(), err)
		return 1
	}
	if err := c.Close(); err != nil {
		fmt.Println("close:", err)
		return 1
	}
	fmt.Println("OK")
	return 0
}

func TestCollectives(t *testing.T) {
	daemontest.RaceCheckedWorkers(t)
	for _, n := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("np%d", n), func(t *testing.T) {
			s := daemontest.Start(t, daemon.Config{Slots: n, FusionThreshold: 1 << 16})
			daemontest.Run(t, s.Socket, "collectives", n, 120*time.Second)
		})
	}
}

func TestAsyncAndFusion(t *testing.T) {
	daemontest.RaceCheckedWorkers(t)
	s := daemontest.Start(t, daemon.Config{Slots: 2})
	// A small ring, so that the burst fills it and the long name overflows it.
	daemontest.Run(t, s.Socket, "async", 2, 60*time.Second, "HVDD_RING_BYTES=4096")
}

// TestProcessSets registers process sets on 4 ranks and runs collectives in
// them (see procSets).
func TestProcessSets(t *testing.T) {
	daemontest.RaceCheckedWorkers(t)
	s := daemontest.Start(t, daemon.Config{Slots: 4})
	daemontest.Run(t, s.Socket, "procsets", 4, 60*time.Second)
}

// TestSocketOnly runs clients without the shared-memory channel beside ones
// with it (HVDD_TEST_CHANNEL=odd turns it off on odd local ranks): the socket
// path must give the same results, in the same job.
func TestSocketOnly(t *testing.T) {
	daemontest.RaceCheckedWorkers(t)
	for _, sc := range []string{"collectives", "async"} {
		t.Run(sc, func(t *testing.T) {
			s := daemontest.Start(t, daemon.Config{Slots: 2, FusionThreshold: 1 << 16})
			daemontest.Run(t, s.Socket, sc, 2, 120*time.Second, "HVDD_TEST_CHANNEL=odd")
			// Local rank 0 registered a channel; local rank 1 ran on the
			// socket alone.
			logs := s.Logs()
			if !regexp.MustCompile(`shared-memory channel registered" pid=\d+ local_rank=0\b`).MatchString(logs) {
				t.Errorf("local rank 0 registered no channel; daemon log:\n%s", logs)
			}
			if regexp.MustCompile(`shared-memory channel registered" pid=\d+ local_rank=1\b`).MatchString(logs) {
				t.Errorf("local rank 1 (HVDD_CHANNEL=0) registered a channel; daemon log:\n%s", logs)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	daemontest.RaceCheckedWorkers(t)
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("np%d", n), func(t *testing.T) {
			s := daemontest.Start(t, daemon.Config{Slots: n})
			daemontest.Run(t, s.Socket, "errors", n, 60*time.Second)
		})
	}
}

func TestJoin(t *testing.T) {
	daemontest.RaceCheckedWorkers(t)
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("np%d", n), func(t *testing.T) {
			s := daemontest.Start(t, daemon.Config{Slots: n})
			daemontest.Run(t, s.Socket, "join", n, 60*time.Second)
		})
	}
}

// TestKilledRank kills one rank with SIGKILL while the others wait for it in
// a collective: they must fail promptly with an error naming it, and the
// daemon must then run the next job.
func TestKilledRank(t *testing.T) {
	daemontest.RaceCheckedWorkers(t)
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("np%d", n), func(t *testing.T) {
			s := daemontest.Start(t, daemon.Config{Slots: n})
			ws := daemontest.Spawn(t, s.Socket, "victim", n)
			victim := ws[n-1]
			victim.WaitOutput(t, "VICTIM READY", 30*time.Second)
			for _, w := range ws[:n-1] {
				w.WaitOutput(t, "WAITING", 30*time.Second)
			}
			killed := time.Now()
			victim.Cmd.Process.Signal(syscall.SIGKILL)
			for _, w := range ws[:n-1] {
				if err := w.Wait(30 * time.Second); err != nil {
					t.Errorf("rank %d: %v\n%s", w.Rank, err, w.Output())
				}
				out := w.Output()
				if !strings.Contains(out, fmt.Sprintf("rank %d (pid %d) was lost", n-1, victim.Cmd.Process.Pid)) {
					t.Errorf("rank %d's error does not name the lost rank:\n%s", w.Rank, out)
				}
			}
			t.Logf("survivors exited %v after the kill", time.Since(killed))
			// The daemon takes the next job.
			daemontest.Run(t, s.Socket, "async", n, 60*time.Second)
		})
	}
}

// ---------------------------------------------------------------------------
// scenarios

// val is element i of rank r's input: small integers, exact in every dtype.
func val(r, i int) int64 { return int64((r+1)*(i%7+1))%5 + 1 }

func fromInt[T hvdd.Elem](v int64) T {
	var z T
	switch p := any(&z).(type) {
	case *uint8:
		*p = uint8(v)
	case *int8:
		*p = int8(v)
	case *uint16:
		*p = uint16(v)
	case *int16:
		*p = int16(v)
	case *int32:
		*p = int32(v)
	case *int64:
		*p = v
	case *hvdd.Float16:
		*p = hvdd.Float16(reduce.Float32ToFloat16(float32(v)))
	case *hvdd.BFloat16:
		*p = hvdd.BFloat16(reduce.Float32ToBFloat16(float32(v)))
	case *float32:
		*p = float32(v)
	case *float64:
		*p = float64(v)
	case *bool:
		*p = v%2 == 0
	}
	return z
}

func toFloat[T hvdd.Elem](x T) float64 {
	switch v := any(x).(type) {
	case uint8:
		return float64(v)
	case int8:
		return float64(v)
	case uint16:
		return float64(v)
	case int16:
		return float64(v)
	case int32:
		return float64(v)
	case int64:
		return float64(v)
	case hvdd.Float16:
		return float64(reduce.Float16ToFloat32(uint16(v)))
	case hvdd.BFloat16:
		return float64(reduce.BFloat16ToFloat32(uint16(v)))
	case float32:
		return float64(v)
	case float64:
		return v
	case bool:
		if v {
			return 1
		}
		return 0
	}
	panic("unreachable")
}

func isFloat[T hvdd.Elem]() bool { return hvdd.DTypeOf[T]().IsFloat() }

// expectAllreduce is the reference for element i over size ranks.
func expectAllreduce[T hvdd.Elem](op tensor.ReduceOp, size, i int, pre, post float64) T {
	dt := hvdd.DTypeOf[T]()
	if dt == tensor.Bool {
		acc := fromInt[T](val(0, i))
		b := any(acc).(bool)
		for r := 1; r < size; r++ {
			v := any(fromInt[T](val(r, i))).(bool)
			if op == tensor.Sum || op == tensor.Max {
				b = b || v
			} else {
				b = b && v
			}
		}
		return any(b).(T)
	}
	if isFloat[T]() {
		acc := toFloat(fromInt[T](val(0, i))) * pre
		for r := 1; r < size; r++ {
			v := toFloat(fromInt[T](val(r, i))) * pre
			switch op {
			case tensor.Sum, tensor.Average:
				acc += v
			case tensor.Min:
				acc = math.Min(acc, v)
			case tensor.Max:
				acc = math.Max(acc, v)
			case tensor.Product:
				acc *= v
			}
		}
		if op == tensor.Average {
			acc /= float64(size)
		}
		return fromFloat[T](acc * post)
	}
	// Integers: scale each input in float64 and truncate, reduce with the
	// type's wrap-around, then scale the result (Horovod's rule).
	scale := func(x T, f float64) T {
		if f == 1 {
			return x
		}
		return fromInt[T](int64(toFloat(x) * f))
	}
	acc := scale(fromInt[T](val(0, i)), pre)
	for r := 1; r < size; r++ {
		v := scale(fromInt[T](val(r, i)), pre)
		acc = intOp(op, acc, v)
	}
	if op == tensor.Average {
		post /= float64(size)
	}
	if post != 1 {
		return fromInt[T](int64(toFloat(acc) * post))
	}
	return acc
}

func fromFloat[T hvdd.Elem](f float64) T {
	var z T
	switch p := any(&z).(type) {
	case *hvdd.Float16:
		*p = hvdd.Float16(reduce.Float32ToFloat16(float32(f)))
	case *hvdd.BFloat16:
		*p = hvdd.BFloat16(reduce.Float32ToBFloat16(float32(f)))
	case *float32:
		*p = float32(f)
	case *float64:
		*p = f
	}
	return z
}

func intOp[T hvdd.Elem](op tensor.ReduceOp, a, b T) T {
	switch x := any(a).(type) {
	case uint8:
		return any(intOp2(op, x, any(b).(uint8))).(T)
	case int8:
		return any(intOp2(op, x, any(b).(int8))).(T)
	case uint16:
		return any(intOp2(op, x, any(b).(uint16))).(T)
	case int16:
		return any(intOp2(op, x, any(b).(int16))).(T)
	case int32:
		return any(intOp2(op, x, any(b).(int32))).(T)
	case int64:
		return any(intOp2(op, x, any(b).(int64))).(T)
	}
	panic("not an integer")
}

func intOp2[T uint8 | int8 | uint16 | int16 | int32 | int64](op tensor.ReduceOp, a, b T) T {
	switch op {
	case tensor.Min:
		return min(a, b)
	case tensor.Max:
		return max(a, b)
	case tensor.Product:
		return a * b
	}
	return a + b
}

func close2[T hvdd.Elem](got, want T) bool {
	if !isFloat[T]() {
		return got == want
	}
	g, w := toFloat(got), toFloat(want)
	if g == w || math.IsNaN(g) && math.IsNaN(w) {
		// Also the infinities a product of many ranks overflows to.
		return true
	}
	tol := 1e-6
	if hvdd.DTypeOf[T]().Size() == 2 {
		tol = 1e-2
	}
	return math.Abs(g-w) <= tol*math.Max(1, math.Abs(w))
}

func input[T hvdd.Elem](rank, n int) []T {
	x := make([]T, n)
	for i := range x {
		x[i] = fromInt[T](val(rank, i))
	}
	return x
}

func checkType[T hvdd.Elem](ctx context.Context, c *hvdd.Client) error {
	dt := hvdd.DTypeOf[T]()
	size, rank := c.Size(), c.Rank()
	ops := []tensor.ReduceOp{tensor.Sum, tensor.Min, tensor.Max, tensor.Product, tensor.Average}
	if dt == tensor.Bool {
		ops = ops[:4]
	}
	for _, n := range []int{0, 1, 17, 1000, 70001} {
		for _, op := range ops {
			for _, sc := range [][2]float64{{1, 1}, {2, 0.25}} {
				if dt == tensor.Bool && sc[0] != 1 {
					continue
				}
				for _, shared := range []bool{false, true} {
					name := fmt.Sprintf("ar.%v.%d.%v.%v.%v", dt, n, op, sc, shared)
					x := input[T](rank, n)
					if shared {
						s, err := hvdd.Alloc[T](c, n)
						if err != nil {
							return err
						}
						copy(s, x)
						x = s
					}
					err := hvdd.Allreduce(ctx, c, x, hvdd.WithName(name), hvdd.WithOp(op), hvdd.WithPrescale(sc[0]), hvdd.WithPostscale(sc[1]))
					if err != nil {
						return fmt.Errorf("%s: %w", name, err)
					}
					for i := range x {
						if want := expectAllreduce[T](op, size, i, sc[0], sc[1]); !close2(x[i], want) {
							return fmt.Errorf("%s: element %d = %v, want %v", name, i, x[i], want)
						}
					}
					if shared {
						if err := hvdd.Free(c, x); err != nil {
							return err
						}
					}
				}
			}
		}
		// Broadcast from every root.
		for root := 0; root < size; root++ {
			x := input[T](rank, n)
			if err := hvdd.Broadcast(ctx, c, x, root, hvdd.WithName(fmt.Sprintf("bc.%v.%d.%d", dt, n, root))); err != nil {
				return err
			}
			want := input[T](root, n)
			for i := range x {
				if x[i] != want[i] {
					return fmt.Errorf("broadcast %v n=%d root %d: element %d = %v, want %v", dt, n, root, i, x[i], want[i])
				}
			}
		}
	}
	// Allgather: rank r contributes r+1 rows of 3.
	const cols = 3
	x := input[T](rank, (rank+1)*cols)
	got, err := hvdd.Allgather(ctx, c, x, hvdd.WithShape(int64(rank+1), cols), hvdd.WithName("ag."+dt.String()))
	if err != nil {
		return err
	}
	var want []T
	for r := 0; r < size; r++ {
		want = append(want, input[T](r, (r+1)*cols)...)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Errorf("allgather %v: got %v, want %v", dt, got, want)
	}
	// Alltoall: rank s sends s+d+1 rows of 2 to rank d.
	var splits []int32
	rows := 0
	for d := 0; d < size; d++ {
		splits = append(splits, int32(rank+d+1))
		rows += rank + d + 1
	}
	x = input[T](rank, rows*2)
	out, recv, err := hvdd.Alltoall(ctx, c, x, splits, hvdd.WithShape(int64(rows), 2), hvdd.WithName("a2a."+dt.String()))
	if err != nil {
		return err
	}
	// From rank s we get its piece for us: rows [sum_{d<rank}(s+d+1), +s+rank+1)
	// of its (s*size + size*(size+1)/2) rows.
	want = nil
	for s := 0; s < size; s++ {
		total, start := 0, 0
		for d := 0; d < size; d++ {
			if d < rank {
				start += s + d + 1
			}
			total += s + d + 1
		}
		src := input[T](s, total*2)
		want = append(want, src[start*2:(start+s+rank+1)*2]...)
		if int(recv[s]) != s+rank+1 {
			return fmt.Errorf("alltoall %v: received splits %v, want %d from rank %d", dt, recv, s+rank+1, s)
		}
	}
	if fmt.Sprint(out) != fmt.Sprint(want) {
		return fmt.Errorf("alltoall %v: got %v, want %v", dt, out, want)
	}
	// Reducescatter (Sum, and Average for numbers): d0 = 2*size+1 rows of 2.
	if dt != tensor.Bool {
		d0 := 2*size + 1
		for _, op := range []tensor.ReduceOp{tensor.Sum, tensor.Average} {
			x = input[T](rank, d0*2)
			got, err := hvdd.Reducescatter(ctx, c, x, hvdd.WithShape(int64(d0), 2), hvdd.WithOp(op), hvdd.WithName(fmt.Sprintf("rs.%v.%v", dt, op)))
			if err != nil {
				return err
			}
			myRows := d0 / size
			start := rank*myRows + min(rank, d0%size)
			if rank < d0%size {
				myRows++
			}
			if len(got) != myRows*2 {
				return fmt.Errorf("reducescatter %v: %d elements, want %d", dt, len(got), myRows*2)
			}
			for i := range got {
				if w := expectAllreduce[T](op, size, start*2+i, 1, 1); !close2(got[i], w) {
					return fmt.Errorf("reducescatter %v %v: element %d = %v, want %v", dt, op, i, got[i], w)
				}
			}
		}
	}
	return nil
}

func collectives(ctx context.Context, c *hvdd.Client) error {
	for _, f := range []func(context.Context, *hvdd.Client) error{
		checkType[uint8], checkType[int8], checkType[uint16], checkType[int16], checkType[int32], checkType[int64],
		checkType[hvdd.Float16], checkType[hvdd.BFloat16], checkType[float32], checkType[float64], checkType[bool],
	} {
		if err := f(ctx, c); err != nil {
			return err
		}
	}
	// Unnamed ops match by call order; grouped allreduce; barrier.
	a, b := input[float32](c.Rank(), 5), input[float32](c.Rank(), 9)
	if err := hvdd.GroupedAllreduce(ctx, c, [][]float32{a, b}, hvdd.WithOp(hvdd.Sum)); err != nil {
		return fmt.Errorf("grouped: %w", err)
	}
	for i := range b {
		if w := expectAllreduce[float32](tensor.Sum, c.Size(), i, 1, 1); b[i] != w {
			return fmt.Errorf("grouped: element %d = %v, want %v", i, b[i], w)
		}
	}
	for i := 0; i < 3; i++ {
		if err := c.Barrier(ctx); err != nil {
			return fmt.Errorf("barrier: %w", err)
		}
	}
	return nil
}

func asyncScenario(ctx context.Context, c *hvdd.Client) error {
	// An abandoned Wait must leave the client usable: rank 0 gives up on an
	// op the others have not submitted yet, then waits for it again.
	var late *hvdd.Handle
	lateBuf := []float32{1}
	if c.Rank() == 0 {
		h, err := hvdd.AllreduceAsync(c, lateBuf, hvdd.WithName("late"), hvdd.WithOp(hvdd.Sum))
		if err != nil {
			return err
		}
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		err = h.Wait(short)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("wait on an op the others lack: %v, want a deadline error", err)
		}
		late = h
	}
	if err := c.Barrier(ctx); err != nil {
		return err
	}
	if c.Rank() != 0 {
		if err := hvdd.Allreduce(ctx, c, lateBuf, hvdd.WithName("late"), hvdd.WithOp(hvdd.Sum)); err != nil {
			return err
		}
	} else if err := late.Wait(ctx); err != nil {
		return fmt.Errorf("second wait: %w", err)
	}
	if lateBuf[0] != float32(c.Size()) {
		return fmt.Errorf("late = %v, want %d", lateBuf[0], c.Size())
	}
	// A burst of more requests than the daemon reads per wake-up, and than
	// the channel's ring holds (the client waits for room), with one whose
	// frame is too large for the ring: it goes on the socket, in order.
	const k = 3000
	bufs := make([][]float32, k)
	hs := make([]*hvdd.Handle, k)
	for i := range bufs {
		bufs[i] = input[float32](c.Rank(), 1+i%200)
		name := fmt.Sprintf("grad.%d", i)
		if i == k/2 {
			name += strings.Repeat("x", 70000)
		}
		h, err := hvdd.AllreduceAsync(c, bufs[i], hvdd.WithName(name), hvdd.WithOp(hvdd.Sum))
		if err != nil {
			return err
		}
		hs[i] = h
	}
	for i, h := range hs {
		if err := h.Wait(ctx); err != nil {
			return err
		}
		if !h.Poll() {
			return errors.New("Poll false after Wait")
		}
		for j, v := range bufs[i] {
			if w := expectAllreduce[float32](tensor.Sum, c.Size(), j, 1, 1); v != w {
				return fmt.Errorf("grad.%d[%d] = %v, want %v", i, j, v, w)
			}
		}
	}
	return nil
}

// expectErr runs f and checks that it fails with kind and mentions each of subs.
func expectErr(what string, err error, kind error, subs ...string) error {
	if err == nil {
		return fmt.Errorf("%s: succeeded, want an error", what)
	}
	if !errors.Is(err, kind) {
		return fmt.Errorf("%s: error %q is not %v", what, err, kind)
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			return fmt.Errorf("%s: error %q lacks %q", what, err, s)
		}
	}
	return nil
}

// adasumCases: Adasum runs over a power-of-two number of ranks, on one node
// or across nodes, on floats; elsewhere every rank gets the same refusal.
// (TestAdasum and TestMultiNodeAdasum check its bits.)
func adasumCases(ctx context.Context, c *hvdd.Client) error {
	rank, size := c.Rank(), c.Size()
	// Rank r sends (r+1)·e_r: orthogonal vectors, whose Adasum is their sum.
	x := make([]float32, size)
	x[rank] = float32(rank + 1)
	err := hvdd.Allreduce(ctx, c, x, hvdd.WithName("ada"), hvdd.WithOp(hvdd.Adasum))
	switch {
	case size&(size-1) != 0:
		return expectErr("adasum on a non-power-of-two job", err, hvdd.ErrUnimplemented,
			"Running Adasum with non-power-of-two ranks is not supported yet.")
	case err != nil:
		return fmt.Errorf("adasum: %w", err)
	}
	for i, v := range x {
		if v != float32(i+1) {
			return fmt.Errorf("adasum of orthogonal vectors = %v, want their sum", x)
		}
	}
	// Equal vectors: Adasum averages them; postscale applies after.
	y := []float64{1, -2, 3}
	if err := hvdd.Allreduce(ctx, c, y, hvdd.WithName("ada.eq"), hvdd.WithOp(hvdd.Adasum), hvdd.WithPostscale(2)); err != nil {
		return fmt.Errorf("adasum of equal vectors: %w", err)
	}
	if y[0] != 2 || y[1] != -4 || y[2] != 6 {
		return fmt.Errorf("adasum of equal vectors with postscale 2 = %v, want [2 -4 6]", y)
	}
	err = hvdd.Allreduce(ctx, c, make([]int32, 4), hvdd.WithName("ada.int"), hvdd.WithOp(hvdd.Adasum))
	return expectErr("adasum of int32", err, hvdd.ErrInvalidArgument, "Unsupported data type", "int32")
}

func errorCases(ctx context.Context, c *hvdd.Client) error {
	rank := c.Rank()
	last := c.Size() - 1
	good := func(tag string) error {
		x := []float32{1, 2}
		if err := hvdd.Allreduce(ctx, c, x, hvdd.WithName("good."+tag), hvdd.WithOp(hvdd.Sum)); err != nil {
			return fmt.Errorf("allreduce after %s: %w", tag, err)
		}
		if x[0] != float32(c.Size()) {
			return fmt.Errorf("allreduce after %s: %v", tag, x)
		}
		return nil
	}
	// Shape mismatch: the last rank sends a longer tensor.
	n := 4
	if rank == last {
		n = 5
	}
	err := hvdd.Allreduce(ctx, c, make([]float32, n), hvdd.WithName("w"))
	// The error names the tensor as the client named it, and the rank that
	// sent the other shape.
	if e := expectErr("shape mismatch", err, hvdd.ErrMismatch, "Mismatched ALLREDUCE tensor shapes", `"w"`, fmt.Sprintf("ranks [%d]", last)); e != nil {
		return e
	}
	if err := good("shape"); err != nil {
		return err
	}
	// Dtype mismatch.
	if rank == last {
		err = hvdd.Allreduce(ctx, c, make([]int32, 4), hvdd.WithName("d"))
	} else {
		err = hvdd.Allreduce(ctx, c, make([]float32, 4), hvdd.WithName("d"))
	}
	if e := expectErr("dtype mismatch", err, hvdd.ErrMismatch, "Mismatched data types", "float32", "int32"); e != nil {
		return e
	}
	// Op mismatch: allreduce against allgather.
	if rank == last {
		_, err = hvdd.Allgather(ctx, c, make([]float32, 4), hvdd.WithName("o"))
	} else {
		err = hvdd.Allreduce(ctx, c, make([]float32, 4), hvdd.WithName("o"))
	}
	if e := expectErr("op mismatch", err, hvdd.ErrMismatch, "Mismatched operations"); e != nil {
		return e
	}
	// Root mismatch.
	root := 0
	if rank == last {
		root = 1
	}
	err = hvdd.Broadcast(ctx, c, make([]float32, 4), root, hvdd.WithName("r"))
	if e := expectErr("root mismatch", err, hvdd.ErrMismatch, "Mismatched BROADCAST root ranks"); e != nil {
		return e
	}
	// Reduce-op mismatch.
	op := hvdd.Sum
	if rank == last {
		op = hvdd.Max
	}
	err = hvdd.Allreduce(ctx, c, make([]float32, 4), hvdd.WithName("ro"), hvdd.WithOp(op))
	if e := expectErr("reduce op mismatch", err, hvdd.ErrMismatch, "Mismatched reduction operation"); e != nil {
		return e
	}
	// Alltoall splits that add up to more rows than the tensor has.
	splits := make([]int32, c.Size())
	splits[0] = 100
	_, _, err = hvdd.Alltoall(ctx, c, make([]float32, 4), splits, hvdd.WithName("sp"))
	if e := expectErr("bad splits", err, hvdd.ErrInvalidArgument); e != nil {
		return e
	}
	// Reducescatter supports only Average and Sum.
	_, err = hvdd.Reducescatter(ctx, c, make([]float32, 4*c.Size()), hvdd.WithName("rsmin"), hvdd.WithOp(hvdd.Min))
	if err == nil {
		return errors.New("reducescatter with Min succeeded")
	}
	if err := adasumCases(ctx, c); err != nil {
		return err
	}
	if err := good("invalid"); err != nil {
		return err
	}
	// Duplicate name in flight: the second is refused at once.
	h, err := hvdd.AllreduceAsync(c, make([]float32, 4), hvdd.WithName("dup"))
	if err != nil {
		return err
	}
	_, err = hvdd.AllreduceAsync(c, make([]float32, 4), hvdd.WithName("dup"))
	if e := expectErr("duplicate", err, hvdd.ErrDuplicateName, "dup"); e != nil {
		return e
	}
	if err := h.Wait(ctx); err != nil {
		return err
	}
	if err := good("duplicate"); err != nil {
		return err
	}
	if c.Size() != c.LocalSize() {
		// Across nodes too, a set of the first and the last rank
		// (TestMultiNodeProcessSets runs every collective in sets).
		ps, err := c.AddProcessSet(ctx, []int{0, last})
		if err != nil {
			return fmt.Errorf("process set across nodes: %w", err)
		}
		if ps.Rank(c) >= 0 {
			x := []float32{1}
			if err := hvdd.Allreduce(ctx, c, x, hvdd.WithName("in.set"), hvdd.WithOp(hvdd.Sum), hvdd.WithProcessSet(ps)); err != nil || x[0] != 2 {
				return fmt.Errorf("allreduce in a set across nodes: %v %v", x, err)
			}
		}
		if err := c.RemoveProcessSet(ctx, ps); err != nil {
			return err
		}
		return good("after the process set")
	}
	return nil
}

func joinScenario(ctx context.Context, c *hvdd.Client) error {
	// Rank r runs r+1 steps, then joins; a joined rank contributes zeros.
	size, rank := c.Size(), c.Rank()
	for step := 0; step <= rank; step++ {
		x := []float32{1, float32(rank)}
		if err := hvdd.Allreduce(ctx, c, x, hvdd.WithName(fmt.Sprint("step.", step)), hvdd.WithOp(hvdd.Sum)); err != nil {
			return err
		}
		active := size - step // ranks >= step are still stepping
		var sumRanks float32
		for r := step; r < size; r++ {
			sumRanks += float32(r)
		}
		if x[0] != float32(active) || x[1] != sumRanks {
			return fmt.Errorf("step %d: got %v, want [%d %v]", step, x, active, sumRanks)
		}
	}
	last, err := c.Join(ctx)
	if err != nil {
		return err
	}
	if last != size-1 {
		return fmt.Errorf("join returned %d, want %d (the last rank to join)", last, size-1)
	}
	// After everyone joined, the job goes on normally.
	x := []float32{1}
	if err := hvdd.Allreduce(ctx, c, x, hvdd.WithName("after"), hvdd.WithOp(hvdd.Sum)); err != nil || x[0] != float32(size) {
		return fmt.Errorf("allreduce after join: %v %v", x, err)
	}
	return nil
}

// bigFused: grouped allreduces whose fused buffer is large enough for the
// daemon to pipeline it across nodes in chunks (daemon/internal/exec/host,
// PipeChunk), with tensor boundaries inside chunks, for three element
// sizes, Sum and a prescaled, postscaled Average; then the same while the
// last node's ranks have joined (their node contributes the neutral
// element, chunk by chunk).
func bigFused(ctx context.Context, c *hvdd.Client) error {
	if err := bigFusedType[float32](ctx, c, []int{1_000_003, 7, 2_222_221, 513}); err != nil {
		return err
	}
	if err := bigFusedType[hvdd.Float16](ctx, c, []int{3_000_001, 1_700_003, 99}); err != nil {
		return err
	}
	if err := bigFusedType[float64](ctx, c, []int{11, 1_300_001, 17}); err != nil {
		return err
	}
	size, rank := c.Size(), c.Rank()
	lastNode := c.CrossRank() == c.CrossSize()-1
	if !lastNode {
		sizes := []int{2_000_001, 3, 1_100_000}
		data := make([][]float32, len(sizes))
		for k, n := range sizes {
			data[k] = input[float32](rank, n)
		}
		if err := hvdd.GroupedAllreduce(ctx, c, data, hvdd.WithName("bigfused.joined"), hvdd.WithOp(hvdd.Sum)); err != nil {
			return fmt.Errorf("with a node joined: %w", err)
		}
		for k, x := range data {
			for i := range x {
				var want float32 // the ranks before the last node's (node-major)
				for r := 0; r < size-c.LocalSize(); r++ {
					want += float32(val(r, i))
				}
				if x[i] != want {
					return fmt.Errorf("with a node joined: tensor %d element %d = %v, want %v", k, i, x[i], want)
				}
			}
		}
	}
	if _, err := c.Join(ctx); err != nil {
		return err
	}
	return nil
}

func bigFusedType[T hvdd.Elem](ctx context.Context, c *hvdd.Client, sizes []int) error {
	dt := hvdd.DTypeOf[T]()
	for _, tc := range []struct {
		op        tensor.ReduceOp
		pre, post float64
	}{{tensor.Sum, 1, 1}, {tensor.Average, 2, 0.25}} {
		data := make([][]T, len(sizes))
		for k, n := range sizes {
			data[k] = input[T](c.Rank(), n)
		}
		name := fmt.Sprintf("bigfused.%v.%v", dt, tc.op)
		if err := hvdd.GroupedAllreduce(ctx, c, data, hvdd.WithName(name), hvdd.WithOp(tc.op), hvdd.WithPrescale(tc.pre), hvdd.WithPostscale(tc.post)); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		for k, x := range data {
			for i := range x {
				if want := expectAllreduce[T](tc.op, c.Size(), i, tc.pre, tc.post); !close2(x[i], want) {
					return fmt.Errorf("%s: tensor %d element %d = %v, want %v", name, k, i, x[i], want)
				}
			}
		}
	}
	return nil
}

func victim(ctx context.Context, c *hvdd.Client) error {
	if c.Rank() == c.Size()-1 {
		fmt.Println("VICTIM READY")
		select {} // wait for SIGKILL
	}
	h, err := hvdd.AllreduceAsync(c, []float32{1}, hvdd.WithName("never"))
	if err != nil {
		return err
	}
	if err := waitAborted(ctx, h); err != nil {
		return err
	}
	// Later ops fail at once the same way.
	err = hvdd.Allreduce(ctx, c, []float32{1}, hvdd.WithName("later"))
	if !errors.Is(err, hvdd.ErrAborted) {
		return fmt.Errorf("later op: want ErrAborted, got %v", err)
	}
	return nil
}

// waitAborted is the victim scenarios' waiting rank: it says WAITING (the
// test then kills the victim), and h must fail with ErrAborted, which it
// prints as "error: ...".
func waitAborted(ctx context.Context, h *hvdd.Handle) error {
	fmt.Println("WAITING")
	err := h.Wait(ctx)
	if !errors.Is(err, hvdd.ErrAborted) {
		return fmt.Errorf("want ErrAborted, got %v", err)
	}
	fmt.Println("error:", err)
	return nil
}

// procSets: sets [0 2] and [1 2 3]; each member allreduces (Sum, Average over
// the set's size), allgathers and broadcasts from a global root in its sets;
// a non-member is refused; ranks that disagree about a set get an error; a
// removed set is gone.
func procSets(ctx context.Context, c *hvdd.Client) error {
	rank := c.Rank()
	a, err := c.AddProcessSet(ctx, []int{2, 0})
	if err != nil {
		return err
	}
	b, err := c.AddProcessSet(ctx, []int{1, 2, 3})
	if err != nil {
		return err
	}
	if a.ID == 0 || b.ID == 0 || a.ID == b.ID || !slices.Equal(a.Ranks, []int{0, 2}) {
		return fmt.Errorf("sets %+v %+v", a, b)
	}
	for _, ps := range []*hvdd.ProcessSet{a, b} {
		me := ps.Rank(c)
		if me < 0 {
			x := []float32{1}
			err := hvdd.Allreduce(ctx, c, x, hvdd.WithName(fmt.Sprintf("outsider.%d", ps.ID)), hvdd.WithProcessSet(ps))
			if err := expectErr("allreduce by a non-member", err, hvdd.ErrInvalidArgument, "not a member"); err != nil {
				return err
			}
			continue
		}
		k := len(ps.Ranks)
		sum := 0
		for _, r := range ps.Ranks {
			sum += r + 1
		}
		x := []float32{float32(rank + 1), 2}
		if err := hvdd.Allreduce(ctx, c, x, hvdd.WithName(fmt.Sprintf("sum.%d", ps.ID)), hvdd.WithOp(hvdd.Sum), hvdd.WithProcessSet(ps)); err != nil {
			return err
		}
		if x[0] != float32(sum) || x[1] != float32(2*k) {
			return fmt.Errorf("set %v: Sum = %v, want [%d %d]", ps.Ranks, x, sum, 2*k)
		}
		y := []float64{float64(rank)}
		if err := hvdd.Allreduce(ctx, c, y, hvdd.WithName(fmt.Sprintf("avg.%d", ps.ID)), hvdd.WithProcessSet(ps)); err != nil {
			return err
		}
		if want := float64(sum-k) / float64(k); math.Abs(y[0]-want) > 1e-12 {
			return fmt.Errorf("set %v: Average = %v, want %v", ps.Ranks, y[0], want)
		}
		g, err := hvdd.Allgather(ctx, c, []int32{int32(rank)}, hvdd.WithName(fmt.Sprintf("ag.%d", ps.ID)), hvdd.WithProcessSet(ps))
		if err != nil {
			return err
		}
		for i, r := range ps.Ranks {
			if int(g[i]) != r {
				return fmt.Errorf("set %v: allgather %v", ps.Ranks, g)
			}
		}
		root := ps.Ranks[k-1]
		z := []int64{int64(rank * 10)}
		if err := hvdd.Broadcast(ctx, c, z, root, hvdd.WithName(fmt.Sprintf("bc.%d", ps.ID)), hvdd.WithProcessSet(ps)); err != nil {
			return err
		}
		if z[0] != int64(root*10) {
			return fmt.Errorf("set %v: broadcast from %d gave %d", ps.Ranks, root, z[0])
		}
		if err := c.Barrier(ctx, hvdd.WithProcessSet(ps)); err != nil {
			return err
		}
	}
	want := []int{0, 1}
	if rank == 3 {
		want = []int{0, 3}
	}
	_, err = c.AddProcessSet(ctx, want)
	if err := expectErr("mismatching sets", err, hvdd.ErrInvalidArgument, "mismatching"); err != nil {
		return err
	}
	_, err = c.AddProcessSet(ctx, []int{1, 2, 3})
	if err := expectErr("duplicate set", err, hvdd.ErrInvalidArgument, "duplicate"); err != nil {
		return err
	}
	err = c.RemoveProcessSet(ctx, &hvdd.ProcessSet{ID: 99})
	if err := expectErr("removing an unknown set", err, hvdd.ErrInvalidArgument, "not a registered set"); err != nil {
		return err
	}
	if err := c.RemoveProcessSet(ctx, b); err != nil {
		return err
	}
	if slices.Contains(b.Ranks, rank) {
		err := hvdd.Allreduce(ctx, c, []float32{1}, hvdd.WithName("removed"), hvdd.WithProcessSet(b))
		if err := expectErr("allreduce in a removed set", err, hvdd.ErrInvalidArgument, "does not exist"); err != nil {
			return err
		}
	}
	return c.Barrier(ctx)
}
