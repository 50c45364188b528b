//go:build mpi

package mpi

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/backends/backendtest"
	"github.com/hvdd/hvdd/tensor"
)

// levelEnv makes the ranks ask MPI for a lower thread level, to exercise the
// serialised (SERIALIZED) and funnelled (FUNNELED) paths.
const levelEnv = "HVDD_MPI_TEST_LEVEL"

var le = binary.LittleEndian

// TestMPIConformance runs every collective x dtype x op x count under
// mpirun at 1 to 4 ranks, and at lower thread levels.
func TestMPIConformance(t *testing.T) {
	if underMPI() {
		rankConformance(t)
		return
	}
	cases := []struct {
		name  string
		np    int
		level string
		args  []string
	}{
		{"np=1", 1, "", nil},
		{"np=2", 2, "", nil},
		{"np=3", 3, "", nil},
		{"np=4", 4, "", nil},
		{"np=2,tcp", 2, "", []string{"--mca", "btl", "tcp,self"}},
		{"np=2,serialized", 2, "serialized", nil},
		{"np=3,funneled", 3, "funneled", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if testing.Short() && c.np > 2 {
				t.Skip("short")
			}
			out := mpirun(t, job{np: c.np, run: "TestMPIConformance", mpiArgs: c.args,
				env: []string{levelEnv + "=" + c.level}})
			checkRanks(t, out, c.np)
		})
	}
}

// newPair returns the two backends a daemon holds (control and data).
func newPair(t *testing.T) (ctrl, data *Backend) {
	t.Helper()
	switch os.Getenv(levelEnv) {
	case "serialized":
		wantLevel = levelSerialized
	case "funneled":
		wantLevel = levelFunneled
	}
	var err error
	if ctrl, err = New(Config{}); err != nil {
		t.Fatal(err)
	}
	if data, err = New(Config{Comm: "world"}); err != nil {
		t.Fatal(err)
	}
	if ctrl.ThreadLevel() != wantLevel.String() {
		t.Fatalf("thread level %s, want %s", ctrl.ThreadLevel(), wantLevel)
	}
	return ctrl, data
}

func rankConformance(t *testing.T) {
	ctrl, data := newPair(t)
	checks := &checker{t: t, b: data}
	checks.allreduce(allCounts(data.Size()))
	checks.allgatherv([]int{0, 1, 5, 100, 4096, 100003})
	checks.broadcast([]int{0, 1, 100, 65536, 1<<20 + 7})
	checks.alltoallv([]int{0, 1, 5, 100, 4096, 100003})
	checks.reduceScatter([]int{0, 1, 3, 100, 5000})
	checks.barrier()
	checks.groups()
	checks.concurrent(ctrl)

	// The splitting and fallback paths, with MPI calls capped at 61
	// elements or bytes.
	maxCount = 61
	checks.allreduce([]int{0, 1, 61, 62, 1000})
	checks.allgatherv([]int{0, 30, 100, 4096})
	checks.broadcast([]int{61, 1000})
	checks.alltoallv([]int{0, 30, 100, 4096})
	checks.reduceScatter([]int{0, 20, 100})
	maxCount = 1<<31 - 1

	checks.failures()
	for _, b := range []*Backend{ctrl, data} {
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := data.Barrier(context.Background()); !errors.Is(err, backends.ErrClosed) {
		t.Fatalf("Barrier after Close: %v, want ErrClosed", err)
	}
	if err := Finalize(); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{}); !errors.Is(err, ErrFinalized) {
		t.Fatalf("New after Finalize: %v, want ErrFinalized", err)
	}
	markOK(data, fmt.Sprintf("checks=%d level=%s", checks.n, data.ThreadLevel()))
}

func allCounts(n int) []int { return []int{0, 1, 7, 1000, 7*n + 3} }

var allOps = []tensor.ReduceOp{tensor.Sum, tensor.Min, tensor.Max, tensor.Product}

// checker runs collectives on b; every rank computes every rank's input from
// shared seeds, so each can compute the reference result locally.
type checker struct {
	t    *testing.T
	b    *Backend
	seed uint64
	n    int // checks passed
}

func (c *checker) rng(rank int) *rand.Rand { return rand.New(rand.NewPCG(c.seed, uint64(rank)+1)) }

func (c *checker) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	c.t.Cleanup(cancel)
	return ctx
}

func (c *checker) do(what string, err error) {
	c.t.Helper()
	if err != nil {
		c.t.Fatalf("rank %d: %s: %v", c.b.Rank(), what, err)
	}
	c.n++
}

func (c *checker) equal(what string, got, want []byte) {
	c.t.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for i < min(len(got), len(want)) && got[i] == want[i] {
			i++
		}
		c.t.Fatalf("rank %d: %s: result differs at byte %d (len %d, want %d): got %x want %x", c.b.Rank(), what, i, len(got), len(want), got[i:min(i+8, len(got))], want[i:min(i+8, len(want))])
	}
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// uneven returns per-rank counts around base (in multiples of unit) with
// every third rank at zero.
func uneven(r *rand.Rand, n, base, unit int) []int {
	c := make([]int, n)
	for i := range c {
		if i%3 != 1 {
			c[i] = (base + r.IntN(base+1)) / unit * unit
		}
	}
	return c
}

func sum(v []int) int {
	s := 0
	for _, x := range v {
		s += x
	}
	return s
}

func (c *checker) allreduce(counts []int) {
	b, n := c.b, c.b.Size()
	for _, dt := range tensor.DTypes() {
		for _, op := range allOps {
			for _, count := range counts {
				c.seed++
				in := make([][]byte, n)
				for r := range in {
					in[r] = backendtest.Fill(c.rng(r), dt, op, count)
				}
				want := backendtest.Reduce(in, dt, op)
				buf := bytes.Clone(in[b.Rank()])
				what := fmt.Sprintf("Allreduce(%v, %v, count=%d)", dt, op, count)
				c.do(what, b.Allreduce(c.ctx(), buf, dt, op))
				c.equal(what, buf, want)
			}
		}
	}
	// One multi-MiB buffer on the bandwidth path.
	for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
		c.seed++
		count := (3<<20 + 5) / dt.Size()
		if maxCount < 1000 {
			count = 5000
		}
		in := make([][]byte, n)
		for r := range in {
			in[r] = backendtest.Fill(c.rng(r), dt, tensor.Sum, count)
		}
		want := backendtest.Reduce(in, dt, tensor.Sum)
		buf := bytes.Clone(in[b.Rank()])
		what := fmt.Sprintf("Allreduce(%v, Sum, count=%d)", dt, count)
		c.do(what, b.Allreduce(c.ctx(), buf, dt, tensor.Sum))
		c.equal(what, buf, want)
	}
}

func (c *checker) allgatherv(bases []int) {
	b, n := c.b, c.b.Size()
	for _, base := range bases {
		c.seed++
		r := c.rng(0)
		counts := uneven(r, n, base, 1)
		in := make([][]byte, n)
		var want []byte
		for k := range in {
			in[k] = randBytes(r, counts[k])
			want = append(want, in[k]...)
		}
		out := make([]byte, len(want))
		what := fmt.Sprintf("Allgatherv(counts=%v)", counts)
		c.do(what, b.Allgatherv(c.ctx(), in[b.Rank()], out, counts))
		c.equal(what, out, want)
	}
}

func (c *checker) broadcast(sizes []int) {
	b, n := c.b, c.b.Size()
	for _, size := range sizes {
		for root := range n {
			c.seed++
			want := randBytes(c.rng(root), size)
			buf := randBytes(c.rng(n+b.Rank()), size)
			if b.Rank() == root {
				buf = bytes.Clone(want)
			}
			what := fmt.Sprintf("Broadcast(%d bytes, root=%d)", size, root)
			c.do(what, b.Broadcast(c.ctx(), buf, root))
			c.equal(what, buf, want)
		}
	}
}

func (c *checker) alltoallv(bases []int) {
	b, n, me := c.b, c.b.Size(), c.b.Rank()
	for _, base := range bases {
		c.seed++
		r := c.rng(0)
		// send[k][q] is the number of bytes rank k sends to rank q.
		send := make([][]int, n)
		in := make([][]byte, n)
		for k := range send {
			send[k] = uneven(r, n, base, 1)
			if k%2 == 1 && n > 1 {
				send[k][(k+1)%n] = 0
			}
			in[k] = randBytes(r, sum(send[k]))
		}
		recv := make([]int, n)
		var want []byte
		for q := range n {
			recv[q] = send[q][me]
			want = append(want, in[q][sum(send[q][:me]):][:send[q][me]]...)
		}
		out := make([]byte, sum(recv))
		what := fmt.Sprintf("Alltoallv(base=%d, send=%v, recv=%v)", base, send[me], recv)
		c.do(what, b.Alltoallv(c.ctx(), in[me], send[me], out, recv))
		c.equal(what, out, want)
	}
}

func (c *checker) reduceScatter(bases []int) {
	b, n, me := c.b, c.b.Size(), c.b.Rank()
	for _, dt := range tensor.DTypes() {
		for _, op := range allOps {
			for i, base := range bases {
				c.seed++
				counts := uneven(c.rng(0), n, base*dt.Size(), dt.Size())
				if i == 1 && n > 1 {
					counts[n-1] = 0 // a trailing empty block
				}
				total := sum(counts) / dt.Size()
				in := make([][]byte, n)
				for k := range in {
					in[k] = backendtest.Fill(c.rng(k+1), dt, op, total)
				}
				want := backendtest.Reduce(in, dt, op)
				orig := bytes.Clone(in[me])
				out := make([]byte, counts[me])
				what := fmt.Sprintf("ReduceScatter(%v, %v, counts=%v)", dt, op, counts)
				c.do(what, b.ReduceScatter(c.ctx(), in[me], out, counts, dt, op))
				c.equal(what, out, want[sum(counts[:me]):][:counts[me]])
				c.equal(what+" input", in[me], orig)
			}
		}
	}
}

// barrier: no rank leaves a barrier before every rank has entered it. Each
// rank records (wall clock, one machine) when it entered and left; the
// times are exchanged afterwards, and every exit must follow every entry.
// One rank enters late each round so that a broken barrier shows.
func (c *checker) barrier() {
	b, n := c.b, c.b.Size()
	for round := range 4 {
		c.do("Barrier", b.Barrier(c.ctx()))
		if b.Rank() == round%n {
			time.Sleep(30 * time.Millisecond) // arrive late; the check does not depend on how late
		}
		enter := time.Now().UnixNano()
		c.do("Barrier", b.Barrier(c.ctx()))
		exit := time.Now().UnixNano()
		mine := make([]byte, 16)
		binary.LittleEndian.PutUint64(mine, uint64(enter))
		binary.LittleEndian.PutUint64(mine[8:], uint64(exit))
		all := make([]byte, 16*n)
		counts := make([]int, n)
		for i := range counts {
			counts[i] = 16
		}
		c.do("Allgatherv", b.Allgatherv(c.ctx(), mine, all, counts))
		var lastEnter int64
		for r := 0; r < n; r++ {
			lastEnter = max(lastEnter, int64(binary.LittleEndian.Uint64(all[16*r:])))
		}
		for r := 0; r < n; r++ {
			if ex := int64(binary.LittleEndian.Uint64(all[16*r+8:])); ex < lastEnter {
				c.t.Fatalf("barrier %d: rank %d left %v before the last rank entered", round, r, time.Duration(lastEnter-ex))
			}
		}
	}
}

// concurrent drives the control and data backends from two goroutines at
// once, as the daemon does; ranks interleave the two streams differently.
func (c *checker) concurrent(ctrl *Backend) {
	b, n := c.b, c.b.Size()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Go(func() {
		for i := range 300 {
			buf := make([]byte, 8)
			le.PutUint64(buf, uint64(ctrl.Rank()+i))
			if err := ctrl.Allreduce(context.Background(), buf, tensor.Int64, tensor.Sum); err != nil {
				errs <- fmt.Errorf("control %d: %w", i, err)
				return
			}
			if got, want := le.Uint64(buf), uint64(n*(n-1)/2+n*i); got != want {
				errs <- fmt.Errorf("control %d: got %d, want %d", i, got, want)
				return
			}
			if i%50 == 0 {
				if err := ctrl.Barrier(context.Background()); err != nil {
					errs <- err
					return
				}
			}
		}
	})
	wg.Go(func() {
		const count = 50000
		for i := range 30 {
			buf := make([]byte, 4*count)
			for k := range count {
				le.PutUint32(buf[4*k:], uint32(i+k+b.Rank()))
			}
			if err := b.Allreduce(context.Background(), buf, tensor.Int32, tensor.Sum); err != nil {
				errs <- fmt.Errorf("data %d: %w", i, err)
				return
			}
			for k := range count {
				if got, want := le.Uint32(buf[4*k:]), uint32(n*(i+k)+n*(n-1)/2); got != want {
					errs <- fmt.Errorf("data %d element %d: got %d, want %d", i, k, got, want)
					return
				}
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		c.t.Fatalf("rank %d: concurrent backends: %v", b.Rank(), err)
	}
	c.n += 330
}

// failures checks the failure paths on a third backend; every rank makes the
// same failing calls, so none is left waiting in a collective.
func (c *checker) failures() {
	t := c.t
	b, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := New(Config{Comm: "self"}); err == nil {
		t.Fatal("New(Comm: self) succeeded")
	}

	// An MPI error: MPI_DATATYPE_NULL is refused by the library's
	// argument checks, before any communication.
	err = b.run("MPI_Allreduce", func(req *request) int {
		return b.comm.allreduce(nil, 1, int(tensor.Invalid), int(tensor.Sum), req)
	})
	var me *Error
	if !errors.As(err, &me) || me.Code == 0 || !strings.Contains(err.Error(), "MPI_Allreduce") || me.Msg == "" {
		t.Fatalf("allreduce on MPI_DATATYPE_NULL: %v (%#v), want an *Error", err, me)
	}
	if _, ok := backends.LostRank(err); ok {
		t.Fatalf("argument error %v reported as a lost peer", err)
	}
	c.n++

	// Invalid arguments fail the call and, from then on, the backend.
	if err := b.Allreduce(c.ctx(), make([]byte, 3), tensor.Float32, tensor.Sum); err == nil {
		t.Fatal("Allreduce of 3 bytes of float32 succeeded")
	}
	if err := b.Barrier(c.ctx()); err == nil {
		t.Fatal("Barrier on a failed backend succeeded")
	}
	c.n++

	// A done ctx fails the call before MPI and the backend after it.
	b2, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b2.Barrier(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Barrier with a cancelled ctx: %v", err)
	}
	if err := b2.Barrier(context.Background()); !errors.Is(err, context.Canceled) {
		t.Fatalf("Barrier after a cancelled one: %v, want the same error", err)
	}
	for _, op := range []tensor.ReduceOp{tensor.Average, tensor.Adasum} {
		if err := checkReduce("x", tensor.Float32, op); err == nil {
			t.Fatalf("op %v accepted", op)
		}
	}
	c.n++
}

// TestMPIMultiHost launches two ranks on two "hosts" that mpirun does not
// know, so it starts an orted for each through the rsh agent; the agent
// runs the command on this machine. Each rank must then be alone on its
// node.
func TestMPIMultiHost(t *testing.T) {
	if underMPI() {
		b, err := New(Config{})
		if err != nil {
			t.Fatal(err)
		}
		if ls := os.Getenv("OMPI_COMM_WORLD_LOCAL_SIZE"); ls != "1" {
			t.Fatalf("OMPI_COMM_WORLD_LOCAL_SIZE = %q, want 1 (one rank per host)", ls)
		}
		c := &checker{t: t, b: b}
		c.allreduce([]int{0, 1, 1000})
		c.allgatherv([]int{0, 100, 4096})
		c.alltoallv([]int{100})
		b.Close()
		Finalize()
		markOK(b, "host="+os.Getenv("HVDD_MPI_TEST_HOST"))
		return
	}
	dir := t.TempDir()
	agent, log := filepath.Join(dir, "rsh-agent"), filepath.Join(dir, "agent.log")
	// Open MPI calls "<agent> <host> <command...>", the command being a
	// shell command line for the remote shell (ssh-style).
	script := "#!/bin/sh\n" +
		"host=$1; shift\n" +
		"echo \"$host\" >> " + log + "\n" +
		"HVDD_MPI_TEST_HOST=$host; export HVDD_MPI_TEST_HOST\n" +
		// Both "hosts" are this machine: a session directory each, or
		// two orteds creating the shared one at once can fail (EEXIST).
		"OMPI_MCA_orte_tmpdir_base=" + dir + "/ompi-$host; export OMPI_MCA_orte_tmpdir_base\n" +
		"mkdir -p \"$OMPI_MCA_orte_tmpdir_base\"\n" +
		"exec /bin/sh -c \"$*\"\n"
	if err := os.WriteFile(agent, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	out := mpirun(t, job{np: 2, run: "TestMPIMultiHost", mpiArgs: []string{
		"--host", "hvdd-node-a,hvdd-node-b", "--mca", "plm_rsh_agent", agent,
		"--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo",
	}})
	checkRanks(t, out, 2)
	hosts, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"hvdd-node-a", "hvdd-node-b"} {
		if !strings.Contains(string(hosts), h) || !strings.Contains(out, "host="+h) {
			t.Fatalf("no rank started through the agent on %s: agent log %q, output:\n%s", h, hosts, out)
		}
	}
}

// groups runs collectives over groups of the ranks (Group,
// MPI_Comm_create_group): each rank walks one sequence of groups and takes
// part in those it belongs to, the others skip them, as the daemon runs a
// process set on its members' nodes only. Below MPI_THREAD_MULTIPLE Group
// must refuse.
func (c *checker) groups() {
	b, n := c.b, c.b.Size()
	if b.level != levelMultiple {
		if _, err := b.Group([]int{b.Rank()}); err == nil {
			c.t.Fatalf("Group at %v succeeded, want a refusal", b.level)
		}
		return
	}
	var evens, odds, all []int
	for r := range n {
		if r%2 == 0 {
			evens = append(evens, r)
		} else {
			odds = append(odds, r)
		}
		all = append(all, r)
	}
	seq := [][]int{evens, odds, slices.Compact([]int{0, n - 1}), all, {n - 1}, evens, odds}
	for pass := range 2 {
		for i, set := range seq {
			m := slices.Index(set, b.Rank())
			if len(set) == 0 || m < 0 {
				continue
			}
			g, err := b.Group(set)
			c.do("Group", err)
			if g.Rank() != m || g.Size() != len(set) {
				c.t.Fatalf("Group(%v) is rank %d of %d, want %d of %d", set, g.Rank(), g.Size(), m, len(set))
			}
			x := make([]byte, 8)
			le.PutUint64(x, uint64(b.Rank()+1))
			c.do("group Allreduce", g.Allreduce(c.ctx(), x, tensor.Int64, tensor.Sum))
			want := 0
			for _, r := range set {
				want += r + 1
			}
			if got := int(le.Uint64(x)); got != want {
				c.t.Fatalf("pass %d, step %d: Allreduce over %v = %d, want %d", pass, i, set, got, want)
			}
			out := make([]byte, len(set))
			c.do("group Allgatherv", g.Allgatherv(c.ctx(), []byte{byte(b.Rank())}, out, repeatInts(1, len(set))))
			for k, r := range set {
				if out[k] != byte(r) {
					c.t.Fatalf("Allgatherv over %v = %v", set, out)
				}
			}
			c.do("group Barrier", g.Barrier(c.ctx()))
		}
	}
	if g, err := b.Group([]int{b.Rank()}); err == nil && g == nil {
		c.t.Fatal("Group returned no Backend")
	}
}

func repeatInts(x, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = x
	}
	return out
}
