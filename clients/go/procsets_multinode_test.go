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
	"testing"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/tensor"
)

// TestMultiNodeProcessSets runs process sets whose ranks span nodes (and
// one that lies on node 0 only) on daemons of the tcp engine: 2 nodes of 2
// ranks (sets {1,2}, {0,3}, {0,1}), 3 nodes of 1 rank (set {0,2} leaves
// node 1 out of its collectives) and 1+2 ranks. See setScenario.
func TestMultiNodeProcessSets(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node suite is long")
	}
	for _, slots := range [][]int{{2, 2}, {1, 1, 1}, {1, 2}} {
		t.Run(fmt.Sprint(slots), func(t *testing.T) {
			ss := startNodes(t, slots...)
			for _, scenario := range []string{"setsmulti", "procsets4"} {
				if scenario == "procsets4" && sum(slots) != 4 {
					continue
				}
				for _, node := range spawnNodesEnv(t, ss, scenario, []string{fmt.Sprint("HVDD_TEST_NODE0=", slots[0])}, slots...) {
					for _, w := range node {
						if err := w.Wait(120 * time.Second); err != nil {
							t.Errorf("%s: rank %d: %v\n%s", scenario, w.Rank, err, w.Output())
						}
					}
				}
			}
		})
	}
}

func sum(v []int) int {
	s := 0
	for _, x := range v {
		s += x
	}
	return s
}

func init() {
	scenarios["setsmulti"] = setScenario
	// procSets, the one-node scenario of 4 ranks, as it is.
	scenarios["procsets4"] = procSets
}

// testSets returns the sets setScenario registers for a job of size ranks
// whose node 0 has local ranks: one across the boundary of nodes 0 and 1,
// one of the first and the last rank (across every node between, which
// hold no member when there are three), and node 0's ranks (one node only).
func testSets(size, local0 int) [][]int {
	return [][]int{{local0 - 1, local0}, {0, size - 1}, rangeInts(0, local0)}
}

func rangeInts(lo, hi int) []int {
	var r []int
	for i := lo; i < hi; i++ {
		r = append(r, i)
	}
	return r
}

// setScenario registers testSets and runs every collective in each, then
// the errors: a non-member's op, mismatching and duplicate sets, removing
// an unknown set, an op of a removed set, and a removal that aborts an op
// still waiting in the set.
func setScenario(ctx context.Context, c *hvdd.Client) error {
	rank, size := c.Rank(), c.Size()
	local0, err := strconv.Atoi(os.Getenv("HVDD_TEST_NODE0")) // node 0's ranks
	if err != nil {
		return fmt.Errorf("HVDD_TEST_NODE0: %w", err)
	}
	var sets []*hvdd.ProcessSet
	for _, ranks := range testSets(size, local0) {
		ps, err := c.AddProcessSet(ctx, ranks)
		if err != nil {
			return fmt.Errorf("add %v: %w", ranks, err)
		}
		if !slices.Equal(ps.Ranks, ranks) || ps.ID != int32(len(sets)+1) {
			return fmt.Errorf("add %v gave %+v, want id %d", ranks, ps, len(sets)+1)
		}
		sets = append(sets, ps)
	}
	// Every set's collectives at once, asynchronously, beside the global
	// set's: the nodes run them in the coordinator's order, each on the
	// nodes of its members only.
	var hs []*hvdd.Handle
	var checks []func() error
	for _, ps := range sets {
		if ps.Rank(c) < 0 {
			continue
		}
		x := []float32{float32(rank + 1), 1}
		h, err := hvdd.AllreduceAsync(c, x, hvdd.WithName(fmt.Sprint("async.", ps.ID)), hvdd.WithOp(hvdd.Sum), hvdd.WithProcessSet(ps))
		if err != nil {
			return err
		}
		want := float32(0)
		for _, r := range ps.Ranks {
			want += float32(r + 1)
		}
		hs = append(hs, h)
		checks = append(checks, func() error {
			if x[0] != want || x[1] != float32(len(ps.Ranks)) {
				return fmt.Errorf("set %v: async Sum = %v, want [%v %d]", ps.Ranks, x, want, len(ps.Ranks))
			}
			return nil
		})
	}
	g := []float32{1}
	h, err := hvdd.AllreduceAsync(c, g, hvdd.WithName("async.global"), hvdd.WithOp(hvdd.Sum))
	if err != nil {
		return err
	}
	hs = append(hs, h)
	for _, h := range hs {
		if err := h.Wait(ctx); err != nil {
			return err
		}
	}
	for _, check := range checks {
		if err := check(); err != nil {
			return err
		}
	}
	if g[0] != float32(size) {
		return fmt.Errorf("global Sum beside the sets = %v, want %d", g[0], size)
	}
	for _, ps := range sets {
		if ps.Rank(c) < 0 {
			err := hvdd.Allreduce(ctx, c, []float32{1}, hvdd.WithName(fmt.Sprint("outsider.", ps.ID)), hvdd.WithProcessSet(ps))
			if err := expectErr(fmt.Sprintf("allreduce in %v by rank %d", ps.Ranks, rank), err, hvdd.ErrInvalidArgument,
				fmt.Sprintf("Rank %d is not a member of the provided process set", rank)); err != nil {
				return err
			}
			continue
		}
		if err := setCollectives(ctx, c, ps); err != nil {
			return fmt.Errorf("set %v: %w", ps.Ranks, err)
		}
	}
	return setErrors(ctx, c, sets)
}

// setCollectives runs every collective in ps (this rank is a member) and
// checks the results against the values every member computes alike.
func setCollectives(ctx context.Context, c *hvdd.Client, ps *hvdd.ProcessSet) error {
	rank, me, k := c.Rank(), ps.Rank(c), len(ps.Ranks)
	name := func(s string) hvdd.Option { return hvdd.WithName(fmt.Sprintf("%s.%d", s, ps.ID)) }
	in := hvdd.WithProcessSet(ps)
	sumRanks := 0
	for _, r := range ps.Ranks {
		sumRanks += r
	}
	// Allreduce: Sum, Average (divided by the set's size), Max, and the
	// scale factors.
	x := []float64{float64(rank), 1}
	if err := hvdd.Allreduce(ctx, c, x, name("sum"), hvdd.WithOp(hvdd.Sum), in); err != nil {
		return err
	}
	if x[0] != float64(sumRanks) || x[1] != float64(k) {
		return fmt.Errorf("Sum = %v, want [%d %d]", x, sumRanks, k)
	}
	y := []float32{float32(rank)}
	if err := hvdd.Allreduce(ctx, c, y, name("avg"), in); err != nil {
		return err
	}
	if want := float32(sumRanks) / float32(k); math.Abs(float64(y[0]-want)) > 1e-6 {
		return fmt.Errorf("Average = %v, want %v", y[0], want)
	}
	z := []int32{int32(rank)}
	if err := hvdd.Allreduce(ctx, c, z, name("max"), hvdd.WithOp(hvdd.Max), in); err != nil {
		return err
	}
	if z[0] != int32(ps.Ranks[k-1]) {
		return fmt.Errorf("Max = %v, want %d", z[0], ps.Ranks[k-1])
	}
	s := []float64{float64(rank + 1)}
	if err := hvdd.Allreduce(ctx, c, s, name("scaled"), hvdd.WithOp(hvdd.Sum), hvdd.WithPrescale(2), hvdd.WithPostscale(0.5), in); err != nil {
		return err
	}
	if want := float64(sumRanks + k); s[0] != want {
		return fmt.Errorf("Sum with prescale 2, postscale 0.5 = %v, want %v", s[0], want)
	}
	// A large one, through the engine's pipelined algorithms.
	big := make([]float32, 1<<19)
	for i := range big {
		big[i] = float32(i%7 + rank)
	}
	if err := hvdd.Allreduce(ctx, c, big, name("big"), hvdd.WithOp(hvdd.Sum), in); err != nil {
		return err
	}
	for i, v := range big {
		if v != float32(k*(i%7)+sumRanks) {
			return fmt.Errorf("large Sum [%d] = %v, want %d", i, v, k*(i%7)+sumRanks)
		}
	}
	// Grouped allreduce: two tensors negotiated as one.
	ga, gb := []float32{float32(rank)}, []float32{1, 2}
	if err := hvdd.GroupedAllreduce(ctx, c, [][]float32{ga, gb}, name("grouped"), hvdd.WithOp(hvdd.Sum), in); err != nil {
		return err
	}
	if ga[0] != float32(sumRanks) || gb[0] != float32(k) || gb[1] != float32(2*k) {
		return fmt.Errorf("grouped Sum = %v %v", ga, gb)
	}
	// Allgather: member m sends m+1 rows of 2, in set order.
	rows := make([]int32, 2*(me+1))
	for i := range rows {
		rows[i] = int32(rank)
	}
	got, err := hvdd.Allgather(ctx, c, rows, hvdd.WithShape(int64(me+1), 2), name("ag"), in)
	if err != nil {
		return err
	}
	var want []int32
	for m, r := range ps.Ranks {
		for range 2 * (m + 1) {
			want = append(want, int32(r))
		}
	}
	if !slices.Equal(got, want) {
		return fmt.Errorf("allgather = %v, want %v", got, want)
	}
	// Broadcast from each member (a global rank).
	for _, root := range ps.Ranks {
		b := []int64{int64(rank * 10), 7}
		if err := hvdd.Broadcast(ctx, c, b, root, hvdd.WithName(fmt.Sprintf("bc.%d.%d", ps.ID, root)), in); err != nil {
			return err
		}
		if b[0] != int64(root*10) || b[1] != 7 {
			return fmt.Errorf("broadcast from %d = %v", root, b)
		}
	}
	// Alltoall: member m sends m+d+1 rows of one element to member d.
	splits := make([]int32, k)
	var send []float32
	for d := range k {
		splits[d] = int32(me + d + 1)
		for range me + d + 1 {
			send = append(send, float32(rank*100+d))
		}
	}
	out, recv, err := hvdd.Alltoall(ctx, c, send, splits, name("a2a"), in)
	if err != nil {
		return err
	}
	var wantOut []float32
	for m, r := range ps.Ranks {
		if recv[m] != int32(m+me+1) {
			return fmt.Errorf("alltoall received splits %v", recv)
		}
		for range m + me + 1 {
			wantOut = append(wantOut, float32(r*100+me))
		}
	}
	if !slices.Equal(out, wantOut) {
		return fmt.Errorf("alltoall = %v, want %v", out, wantOut)
	}
	// Reducescatter: 2k+1 rows of 2; member m gets its block (the first
	// gets a row more), Sum and Average.
	d0 := 2*k + 1
	for _, op := range []tensor.ReduceOp{hvdd.Sum, hvdd.Average} {
		data := make([]float64, 2*d0)
		for i := range data {
			data[i] = float64(i + rank)
		}
		blk, err := hvdd.Reducescatter(ctx, c, data, hvdd.WithShape(int64(d0), 2), hvdd.WithOp(op), hvdd.WithName(fmt.Sprintf("rs.%d.%v", ps.ID, op)), in)
		if err != nil {
			return err
		}
		first := 0
		for m := range me {
			first += d0 / k
			if m < d0%k {
				first++
			}
		}
		n := d0 / k
		if me < d0%k {
			n++
		}
		if len(blk) != 2*n {
			return fmt.Errorf("reducescatter %v: %d elements, want %d", op, len(blk), 2*n)
		}
		for i, v := range blk {
			w := float64(k*(2*first+i) + sumRanks)
			if op == hvdd.Average {
				w /= float64(k)
			}
			if math.Abs(v-w) > 1e-9 {
				return fmt.Errorf("reducescatter %v [%d] = %v, want %v", op, i, v, w)
			}
		}
	}
	// Adasum over a power-of-two set: orthogonal vectors add up.
	if k&(k-1) == 0 {
		a := make([]float32, k)
		a[me] = float32(me + 1)
		if err := hvdd.Allreduce(ctx, c, a, name("adasum"), hvdd.WithOp(hvdd.Adasum), in); err != nil {
			return err
		}
		for i, v := range a {
			if v != float32(i+1) {
				return fmt.Errorf("Adasum of orthogonal vectors = %v", a)
			}
		}
	}
	return c.Barrier(ctx, in)
}

// setErrors checks Horovod's process set errors across nodes, then removes
// the sets.
func setErrors(ctx context.Context, c *hvdd.Client, sets []*hvdd.ProcessSet) error {
	rank, size := c.Rank(), c.Size()
	// The last rank asks for another set than the others: every rank hears.
	want := []int{0, 1}
	if rank == size-1 {
		want = []int{1, size - 1}
	}
	_, err := c.AddProcessSet(ctx, want)
	if err := expectErr("mismatching sets", err, hvdd.ErrInvalidArgument, "mismatching process sets"); err != nil {
		return err
	}
	_, err = c.AddProcessSet(ctx, sets[1].Ranks)
	if err := expectErr("duplicate set", err, hvdd.ErrInvalidArgument, "Attempted to add a duplicate process set"); err != nil {
		return err
	}
	err = c.RemoveProcessSet(ctx, &hvdd.ProcessSet{ID: 99})
	if err := expectErr("removing an unknown set", err, hvdd.ErrInvalidArgument, "not a registered set"); err != nil {
		return err
	}
	// A collective that waits in a set when the set is removed fails: the
	// set's first member submits it, the others never do.
	ends := sets[1]
	var orphan *hvdd.Handle
	if rank == ends.Ranks[0] {
		if orphan, err = hvdd.AllreduceAsync(c, []float32{1}, hvdd.WithName("orphan"), hvdd.WithProcessSet(ends)); err != nil {
			return err
		}
	}
	for _, ps := range sets {
		if err := c.RemoveProcessSet(ctx, ps); err != nil {
			return fmt.Errorf("remove %v: %w", ps.Ranks, err)
		}
	}
	if orphan != nil {
		err := orphan.Wait(ctx)
		if e := expectErr("op waiting in a removed set", err, hvdd.ErrAborted, "was removed"); e != nil {
			return e
		}
	}
	for _, ps := range sets {
		if ps.Rank(c) >= 0 {
			err := hvdd.Allreduce(ctx, c, []float32{1}, hvdd.WithName(fmt.Sprint("removed.", ps.ID)), hvdd.WithProcessSet(ps))
			if err := expectErr("allreduce in a removed set", err, hvdd.ErrInvalidArgument, "Process set provided does not exist"); err != nil {
				return err
			}
		}
	}
	// Ids keep counting after removals; the job goes on.
	ps, err := c.AddProcessSet(ctx, sets[0].Ranks)
	if err != nil {
		return err
	}
	if ps.ID != int32(len(sets)+1) {
		return fmt.Errorf("set added after the removals has id %d, want %d", ps.ID, len(sets)+1)
	}
	if ps.Rank(c) >= 0 {
		x := []float32{1}
		if err := hvdd.Allreduce(ctx, c, x, hvdd.WithName("again"), hvdd.WithOp(hvdd.Sum), hvdd.WithProcessSet(ps)); err != nil || x[0] != float32(len(ps.Ranks)) {
			return fmt.Errorf("allreduce in the set added again: %v %v", x, errors.Join(err))
		}
	}
	return c.Barrier(ctx)
}

// TestMultiNodeSetTraffic checks that a node holding no member of a set
// moves none of its bytes: on 3 nodes of 1 rank, ranks 0 and 2 allreduce
// 8 MiB in the set {0, 2}; node 1's engine exchanges only the global
// barrier's few bytes, and node 0's sends node 2 at least the set's share.
func TestMultiNodeSetTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node suite is long")
	}
	ss := startNodes(t, 1, 1, 1)
	runNodes(t, ss, "settraffic", 120*time.Second, 1, 1, 1)
	if t.Failed() {
		return
	}
	bytesOf := func(n int) (sent, recv []int64) {
		ss[n].WaitLog(t, "cross-node bytes of the job", 30*time.Second)
		m := regexp.MustCompile(`cross-node bytes of the job.* sent="\[([0-9 ]*)\]" received="\[([0-9 ]*)\]"`).FindStringSubmatch(ss[n].Logs())
		if m == nil {
			t.Fatalf("node %d logged no byte counts:\n%s", n, ss[n].Logs())
		}
		parse := func(s string) []int64 {
			var out []int64
			for _, f := range strings.Fields(s) {
				v, _ := strconv.ParseInt(f, 10, 64)
				out = append(out, v)
			}
			return out
		}
		return parse(m[1]), parse(m[2])
	}
	sent1, recv1 := bytesOf(1)
	for _, v := range append(sent1, recv1...) {
		if v > 64<<10 {
			t.Errorf("node 1, which holds no member of the set, exchanged sent=%v received=%v bytes", sent1, recv1)
			break
		}
	}
	if sent0, _ := bytesOf(0); sent0[2] < 4<<20 {
		t.Errorf("node 0 sent node 2 %d bytes, want the set's 8 MiB allreduce's share (>= 4 MiB)", sent0[2])
	}
}

func init() {
	scenarios["settraffic"] = func(ctx context.Context, c *hvdd.Client) error {
		ps, err := c.AddProcessSet(ctx, []int{0, 2})
		if err != nil {
			return err
		}
		if ps.Rank(c) >= 0 {
			x := make([]float32, 2<<20)
			for i := range x {
				x[i] = 1
			}
			if err := hvdd.Allreduce(ctx, c, x, hvdd.WithName("big"), hvdd.WithOp(hvdd.Sum), hvdd.WithProcessSet(ps)); err != nil {
				return err
			}
			if x[0] != 2 || x[len(x)-1] != 2 {
				return fmt.Errorf("set allreduce = %v ... %v, want 2", x[0], x[len(x)-1])
			}
		}
		return c.Barrier(ctx)
	}
}

// TestElasticProcessSetsForgotten: an elastic job's next epoch forgets its
// process sets, as Horovod's reset (shutdown, then init) does: on 2 nodes
// of 1 rank, a set registered in epoch 0 is unknown in epoch 1 on both
// nodes (the coordinator's and the other), and ids count from 1 again.
func TestElasticProcessSetsForgotten(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node suite is long")
	}
	ss := startNodes(t, 1, 1)
	for _, node := range spawnNodes(t, ss, "elasticsets", 1, 1) {
		for _, w := range node {
			if err := w.Wait(60 * time.Second); err != nil || !strings.Contains(w.Output(), "OK") {
				t.Errorf("rank %d: %v\n%s", w.Rank, err, w.Output())
			}
		}
	}
}

func init() {
	ownInit["elasticsets"] = func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		fail := func(format string, args ...any) int {
			fmt.Printf(format+"\n", args...)
			return 1
		}
		inSet := func(c *hvdd.Client, ps *hvdd.ProcessSet, name string) error {
			x := []float32{1}
			if err := hvdd.Allreduce(ctx, c, x, hvdd.WithName(name), hvdd.WithOp(hvdd.Sum), hvdd.WithProcessSet(ps)); err != nil {
				return err
			}
			if x[0] != 2 {
				return fmt.Errorf("allreduce in %v = %v, want 2", ps.Ranks, x[0])
			}
			return nil
		}
		c := &hvdd.Client{Elastic: true}
		if err := c.Init(ctx); err != nil {
			return fail("init: %v", err)
		}
		ps, err := c.AddProcessSet(ctx, []int{0, 1})
		if err != nil || ps.ID != 1 {
			return fail("epoch 0: add: %+v %v", ps, err)
		}
		if err := inSet(c, ps, "e0"); err != nil {
			return fail("epoch 0: %v", err)
		}
		c.CloseToReset() // every rank resets: the next epoch holds them all
		c2 := &hvdd.Client{Elastic: true}
		if err := c2.Init(ctx); err != nil {
			return fail("re-init: %v", err)
		}
		defer c2.Close()
		if c2.Epoch() != 1 {
			return fail("re-initialised into epoch %d, want 1", c2.Epoch())
		}
		err = hvdd.Allreduce(ctx, c2, []float32{1}, hvdd.WithName("stale"), hvdd.WithProcessSet(ps))
		if e := expectErr("epoch 1: the set of epoch 0", err, hvdd.ErrInvalidArgument, "Process set provided does not exist"); e != nil {
			return fail("rank %d: %v", c2.Rank(), e)
		}
		ps2, err := c2.AddProcessSet(ctx, []int{0, 1})
		if err != nil || ps2.ID != 1 {
			return fail("epoch 1: add: %+v %v (want id 1 again)", ps2, err)
		}
		if err := inSet(c2, ps2, "e1"); err != nil {
			return fail("epoch 1: %v", err)
		}
		fmt.Println("OK")
		return 0
	}
}
