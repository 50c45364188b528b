package hvdd_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/daemon/daemontest"
)

func init() {
	scenarios["p2p"] = p2pScenario
	scenarios["p2perrors"] = p2pErrors
	scenarios["p2pvictim"] = p2pVictim
	scenarios["p2pnodes"] = p2pNodes
	scenarios["p2pstall"] = p2pStall
	scenarios["p2pwaiting"] = p2pWaiting
}

// TestSendRecv runs sends and recvs between the ranks of one node: a ring in
// several dtypes, ordering on one channel, tags apart, transfers above the
// loop's inline copy, zero bytes, a process set (see p2pScenario).
func TestSendRecv(t *testing.T) {
	daemontest.RaceCheckedWorkers(t)
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("np%d", n), func(t *testing.T) {
			s := daemontest.Start(t, daemon.Config{Slots: n})
			daemontest.Run(t, s.Socket, "p2p", n, 120*time.Second)
		})
	}
}

// TestSendRecvErrors: mismatched dtype or size fail both sides with
// ErrMismatch, bad peers are refused, and the job goes on (see p2pErrors).
func TestSendRecvErrors(t *testing.T) {
	daemontest.RaceCheckedWorkers(t)
	s := daemontest.Start(t, daemon.Config{Slots: 3})
	daemontest.Run(t, s.Socket, "p2perrors", 3, 60*time.Second)
}

// TestSendRecvKilledPeer kills a rank while its peers wait in a recv from it
// and in a send to it: both must fail promptly naming the lost rank, not
// hang.
func TestSendRecvKilledPeer(t *testing.T) {
	const n = 3
	s := daemontest.Start(t, daemon.Config{Slots: n})
	ws := daemontest.Spawn(t, s.Socket, "p2pvictim", n)
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
		if out := w.Output(); !strings.Contains(out, fmt.Sprintf("rank %d (pid %d) was lost", n-1, victim.Cmd.Process.Pid)) {
			t.Errorf("rank %d's error does not name the lost rank:\n%s", w.Rank, out)
		}
	}
	if d := time.Since(killed); d > 10*time.Second {
		t.Errorf("the survivors took %v to fail after the kill", d)
	}
	// The daemon takes the next job.
	daemontest.Run(t, s.Socket, "p2p", n, 60*time.Second)
}

// TestSendRecvMultiNode runs sends and recvs in jobs across nodes (see
// p2pNodes): 2 nodes of 2 ranks, and 3 nodes of 1 (where each transfer
// leaves a node out).
func TestSendRecvMultiNode(t *testing.T) {
	for _, slots := range [][]int{{2, 2}, {1, 1, 1}} {
		t.Run(fmt.Sprint(slots), func(t *testing.T) {
			ss := startNodes(t, slots...)
			runNodes(t, ss, "p2pnodes", 120*time.Second, slots...)
		})
	}
}

// TestSendRecvMultiNodeKilledPeer kills rank 1 on node 1 while rank 0 on
// node 0 waits in a recv from it: the recv fails promptly naming it.
func TestSendRecvMultiNodeKilledPeer(t *testing.T) {
	ss := startNodes(t, 1, 1)
	ws := spawnNodes(t, ss, "p2pvictim", 1, 1)
	victim := ws[1][0]
	victim.WaitOutput(t, "VICTIM READY", 60*time.Second)
	ws[0][0].WaitOutput(t, "WAITING", 60*time.Second)
	victim.Cmd.Process.Signal(syscall.SIGKILL)
	failsWithin(t, ws[0][0], time.Now(), "rank 1 was killed")
	if err := ws[0][0].Wait(30 * time.Second); err != nil {
		t.Fatalf("survivor: %v\n%s", err, ws[0][0].Output())
	}
	if out := ws[0][0].Output(); !strings.Contains(out, "rank 1 (pid") || !strings.Contains(out, "was lost") {
		t.Errorf("the survivor's error does not name the lost rank:\n%s", out)
	}
}

// TestSendRecvMultiNodeNoStallShutdown: a recv across nodes that waits
// past the stall shutdown time is no stall that stops the job; an
// allreduce that only rank 0 submits, after it, is (see p2pStall).
func TestSendRecvMultiNodeNoStallShutdown(t *testing.T) {
	ss := startNodesCfg(t, func(_ int, cfg *daemon.Config) {
		cfg.StallCheck, cfg.StallShutdown = 300*time.Millisecond, time.Second
	}, 1, 1)
	runNodes(t, ss, "p2pstall", 60*time.Second, 1, 1)
}

// p2pStall runs on 2 nodes of 1 rank.
func p2pStall(ctx context.Context, c *hvdd.Client) error {
	var err error
	if c.Rank() == 0 {
		rh, rerr := hvdd.RecvAsync(c, make([]float32, 2), 1)
		if rerr != nil {
			return rerr
		}
		err = hvdd.Allreduce(ctx, c, []float32{1}, hvdd.WithName("lonely"))
		if rerr := rh.Wait(ctx); !errors.Is(rerr, hvdd.ErrAborted) {
			return fmt.Errorf("the recv: %v, want it failed with the job", rerr)
		}
	} else {
		// Never met: rank 0 is in "lonely". (This node hears of the
		// coordinator's stall shutdown as the loss of node 0.)
		if err := c.Barrier(ctx); !errors.Is(err, hvdd.ErrAborted) {
			return fmt.Errorf("rank 1: %v, want the job aborted", err)
		}
		return nil
	}
	if !errors.Is(err, hvdd.ErrAborted) || !strings.Contains(err.Error(), "stall") {
		return fmt.Errorf("rank 0: %v, want the stall shutdown", err)
	}
	if !strings.Contains(err.Error(), `"lonely"`) || strings.Contains(err.Error(), "send/recv") {
		return fmt.Errorf("the stall shutdown must name the allreduce, not the recv that waits: %v", err)
	}
	return nil
}

// p2pFill is rank r's message number k, element i.
func p2pFill(r, k, i int) int64 { return int64((r*31+k*7+i)%97) + 1 }

// ringOf sends a slice of T to the next rank and receives one from the
// previous, both posted before either is waited for.
func ringOf[T hvdd.Elem](ctx context.Context, c *hvdd.Client, n int, conv func(int64) T, opts ...hvdd.Option) error {
	rank, size := c.Rank(), c.Size()
	next, prev := (rank+1)%size, (rank+size-1)%size
	out := make([]T, n)
	for i := range out {
		out[i] = conv(p2pFill(rank, 0, i))
	}
	in := make([]T, n)
	rh, err := hvdd.RecvAsync(c, in, prev, opts...)
	if err != nil {
		return err
	}
	sh, err := hvdd.SendAsync(c, out, next, opts...)
	if err != nil {
		return err
	}
	if err := sh.Wait(ctx); err != nil {
		return fmt.Errorf("send of %T to %d: %w", out, next, err)
	}
	if err := rh.Wait(ctx); err != nil {
		return fmt.Errorf("recv of %T from %d: %w", in, prev, err)
	}
	for i := range in {
		if want := conv(p2pFill(prev, 0, i)); in[i] != want {
			return fmt.Errorf("recv of %T from %d: element %d is %v, want %v", in, prev, i, in[i], want)
		}
	}
	return nil
}

func p2pScenario(ctx context.Context, c *hvdd.Client) error {
	rank, size := c.Rank(), c.Size()
	// A ring in every dtype family.
	for _, err := range []error{
		ringOf(ctx, c, 17, func(v int64) float32 { return float32(v) / 4 }),
		ringOf(ctx, c, 5, func(v int64) float64 { return float64(v) / 8 }),
		ringOf(ctx, c, 9, func(v int64) int64 { return -v << 40 }),
		ringOf(ctx, c, 3, func(v int64) int32 { return int32(v) }),
		ringOf(ctx, c, 11, func(v int64) uint8 { return uint8(v) }),
		ringOf(ctx, c, 6, func(v int64) int8 { return int8(-v) }),
		ringOf(ctx, c, 7, func(v int64) hvdd.BFloat16 { return hvdd.BFloat16(0x3f80 + v) }),
		ringOf(ctx, c, 7, func(v int64) hvdd.Float16 { return hvdd.Float16(0x3c00 + v) }),
		ringOf(ctx, c, 4, func(v int64) bool { return v%2 == 0 }),
		// Zero bytes: nothing to copy, both still answered.
		ringOf(ctx, c, 0, func(v int64) float32 { return float32(v) }),
		// Above the loop's inline copy (1 MiB): copied off the loop.
		ringOf(ctx, c, 3<<18+5, func(v int64) float32 { return float32(v) }),
		// A tag: a channel of its own.
		ringOf(ctx, c, 4, func(v int64) int32 { return int32(v) }, hvdd.WithTag(99)),
	} {
		if err != nil {
			return err
		}
	}

	// Shared memory, no staging: a slice from Alloc, large.
	{
		next, prev := (rank+1)%size, (rank+size-1)%size
		const n = 1<<19 + 3
		out, err := hvdd.Alloc[float32](c, n)
		if err != nil {
			return err
		}
		in, err := hvdd.Alloc[float32](c, n)
		if err != nil {
			return err
		}
		for i := range out {
			out[i] = float32(p2pFill(rank, 1, i))
		}
		rh, err := hvdd.RecvAsync(c, in, prev)
		if err != nil {
			return err
		}
		if err := hvdd.Send(ctx, c, out, next); err != nil {
			return err
		}
		if err := rh.Wait(ctx); err != nil {
			return err
		}
		for i := range in {
			if want := float32(p2pFill(prev, 1, i)); in[i] != want {
				return fmt.Errorf("recv into Alloc'd memory from %d: element %d is %v, want %v", prev, i, in[i], want)
			}
		}
		if err := errors.Join(hvdd.Free(c, out), hvdd.Free(c, in)); err != nil {
			return err
		}
	}

	// Ordering: several sends on one channel match the recvs in order, the
	// recvs posted before the sends exist, then the sends before the recvs.
	const k = 6
	switch rank {
	case 0:
		for k0 := 0; k0 < k; k0++ {
			// Each waited for in turn, so the second half waits in the
			// table until rank 1 posts its recvs.
			hs := make([]*hvdd.Handle, 0, k)
			for m := 0; m < k; m++ {
				h, err := hvdd.SendAsync(c, []int64{p2pFill(0, m, 0), int64(m)}, 1)
				if err != nil {
					return err
				}
				hs = append(hs, h)
			}
			for _, h := range hs {
				if err := h.Wait(ctx); err != nil {
					return err
				}
			}
		}
	case 1:
		for k0 := 0; k0 < k; k0++ {
			bufs := make([][]int64, k)
			hs := make([]*hvdd.Handle, k)
			for m := range bufs {
				bufs[m] = make([]int64, 2)
				h, err := hvdd.RecvAsync(c, bufs[m], 0)
				if err != nil {
					return err
				}
				hs[m] = h
			}
			for m, h := range hs {
				if err := h.Wait(ctx); err != nil {
					return err
				}
				if want := []int64{p2pFill(0, m, 0), int64(m)}; !slices.Equal(bufs[m], want) {
					return fmt.Errorf("recv %d of round %d from rank 0: %v, want %v (out of order?)", m, k0, bufs[m], want)
				}
			}
		}
	}

	// Tags apart: rank 0 sends tag 1 then tag 2; rank 1 receives tag 2
	// first, then tag 1 (rank 0 waits for neither before sending both).
	switch rank {
	case 0:
		h1, err := hvdd.SendAsync(c, []int32{1, 1}, 1, hvdd.WithTag(1))
		if err != nil {
			return err
		}
		h2, err := hvdd.SendAsync(c, []int32{2, 2}, 1, hvdd.WithTag(2))
		if err != nil {
			return err
		}
		if err := errors.Join(h2.Wait(ctx), h1.Wait(ctx)); err != nil {
			return err
		}
	case 1:
		b2, b1 := make([]int32, 2), make([]int32, 2)
		if err := hvdd.Recv(ctx, c, b2, 0, hvdd.WithTag(2)); err != nil {
			return err
		}
		if err := hvdd.Recv(ctx, c, b1, 0, hvdd.WithTag(1)); err != nil {
			return err
		}
		if !slices.Equal(b2, []int32{2, 2}) || !slices.Equal(b1, []int32{1, 1}) {
			return fmt.Errorf("tags mixed up: tag 2 got %v, tag 1 got %v", b2, b1)
		}
	}

	// A process set of the first and the last rank: a channel apart from
	// the same ranks' transfers outside it. Ranks stay global.
	last := size - 1
	ps, err := c.AddProcessSet(ctx, []int{0, last})
	if err != nil {
		return err
	}
	switch rank {
	case 0:
		hs, err := hvdd.SendAsync(c, []float32{7}, last, hvdd.WithProcessSet(ps))
		if err != nil {
			return err
		}
		hg, err := hvdd.SendAsync(c, []float32{8}, last)
		if err != nil {
			return err
		}
		if err := errors.Join(hs.Wait(ctx), hg.Wait(ctx)); err != nil {
			return err
		}
	case last:
		g, s := make([]float32, 1), make([]float32, 1)
		// The global channel first: it must not take the set's send.
		if err := hvdd.Recv(ctx, c, g, 0); err != nil {
			return err
		}
		if err := hvdd.Recv(ctx, c, s, 0, hvdd.WithProcessSet(ps)); err != nil {
			return err
		}
		if g[0] != 8 || s[0] != 7 {
			return fmt.Errorf("process set channel: global recv got %v (want 8), the set's %v (want 7)", g[0], s[0])
		}
	}
	if size > 2 && rank == 1 {
		// Not a member of the set.
		err := hvdd.Send(ctx, c, []float32{1}, 0, hvdd.WithProcessSet(ps))
		if !errors.Is(err, hvdd.ErrInvalidArgument) || !strings.Contains(err.Error(), "member") {
			return fmt.Errorf("send in a set this rank is not in: want ErrInvalidArgument naming membership, got %v", err)
		}
	}
	if err := c.RemoveProcessSet(ctx, ps); err != nil {
		return err
	}
	return c.Barrier(ctx)
}

// p2pErrors runs on 3 ranks.
func p2pErrors(ctx context.Context, c *hvdd.Client) error {
	rank := c.Rank()
	// Bad peers, refused at once and on this rank alone.
	for _, bad := range []struct {
		peer int
		recv bool
		want error
		msg  string
	}{
		{rank, false, hvdd.ErrInvalidArgument, "itself"},
		{rank, true, hvdd.ErrInvalidArgument, "itself"},
		{c.Size(), false, hvdd.ErrInvalidArgument, "not in the job"},
		{c.Size() + 5, true, hvdd.ErrInvalidArgument, "not in the job"},
		{-1, true, hvdd.ErrUnimplemented, "any source"},
	} {
		var err error
		if bad.recv {
			err = hvdd.Recv(ctx, c, []float32{0}, bad.peer)
		} else {
			err = hvdd.Send(ctx, c, []float32{0}, bad.peer)
		}
		if !errors.Is(err, bad.want) || !strings.Contains(err.Error(), bad.msg) {
			return fmt.Errorf("peer %d (recv %v): want %v containing %q, got %v", bad.peer, bad.recv, bad.want, bad.msg, err)
		}
	}
	// Mismatches between ranks 0 and 1: both sides get ErrMismatch naming
	// the problem. Rank 2 runs the same between itself and rank 0 on tag 5
	// meanwhile, which must not be disturbed.
	mismatch := func(err error, what string) error {
		if !errors.Is(err, hvdd.ErrMismatch) || !strings.Contains(err.Error(), what) {
			return fmt.Errorf("want ErrMismatch containing %q, got %v", what, err)
		}
		return nil
	}
	switch rank {
	case 0:
		if err := mismatch(hvdd.Send(ctx, c, make([]float32, 4), 1), "same size"); err != nil {
			return fmt.Errorf("send of 16 bytes to a recv of 32: %w", err)
		}
		if err := mismatch(hvdd.Send(ctx, c, make([]float32, 4), 1, hvdd.WithTag(3)), "same dtype"); err != nil {
			return fmt.Errorf("send of float32 to a recv of int32: %w", err)
		}
		in := make([]int64, 3)
		if err := hvdd.Recv(ctx, c, in, 2, hvdd.WithTag(5)); err != nil {
			return err
		}
		if !slices.Equal(in, []int64{5, 6, 7}) {
			return fmt.Errorf("recv beside the mismatches: %v", in)
		}
	case 1:
		if err := mismatch(hvdd.Recv(ctx, c, make([]float32, 8), 0), "same size"); err != nil {
			return fmt.Errorf("recv of 32 bytes from a send of 16: %w", err)
		}
		if err := mismatch(hvdd.Recv(ctx, c, make([]int32, 4), 0, hvdd.WithTag(3)), "same dtype"); err != nil {
			return fmt.Errorf("recv of int32 from a send of float32: %w", err)
		}
	case 2:
		if err := hvdd.Send(ctx, c, []int64{5, 6, 7}, 0, hvdd.WithTag(5)); err != nil {
			return err
		}
	}
	// The job goes on: a mismatch fails the transfer, not the job.
	v := []float32{float32(rank)}
	if err := hvdd.Allreduce(ctx, c, v, hvdd.WithOp(hvdd.Sum)); err != nil {
		return err
	}
	if v[0] != 3 {
		return fmt.Errorf("allreduce after the mismatches: %v, want 3", v[0])
	}
	return nil
}

// p2pVictim: the last rank waits to be killed; rank 0 waits in a recv from
// it, the others in a send to it.
func p2pVictim(ctx context.Context, c *hvdd.Client) error {
	last := c.Size() - 1
	if c.Rank() == last {
		fmt.Println("VICTIM READY")
		select {} // wait for SIGKILL
	}
	var h *hvdd.Handle
	var err error
	if c.Rank() == 0 {
		h, err = hvdd.RecvAsync(c, make([]float32, 4), last)
	} else {
		h, err = hvdd.SendAsync(c, make([]float32, 4), last)
	}
	if err != nil {
		return err
	}
	return waitAborted(ctx, h)
}

// p2pNodes runs on 2 nodes of 2 ranks (ranks 0, 1 on node 0; 2, 3 on node
// 1) or 3 nodes of 1.
func p2pNodes(ctx context.Context, c *hvdd.Client) error {
	rank, size := c.Rank(), c.Size()
	local := c.LocalSize()
	if local > 1 {
		// The other rank of this node, beside the transfers across nodes.
		mate := rank ^ 1
		in := make([]float32, 5)
		rh, err := hvdd.RecvAsync(c, in, mate)
		if err != nil {
			return err
		}
		if err := hvdd.Send(ctx, c, []float32{float32(rank), 1, 2, 3, 4}, mate); err != nil {
			return fmt.Errorf("send to rank %d on this node: %w", mate, err)
		}
		if err := rh.Wait(ctx); err != nil {
			return fmt.Errorf("recv from rank %d on this node: %w", mate, err)
		}
		if in[0] != float32(mate) || in[4] != 4 {
			return fmt.Errorf("recv from rank %d on this node: %v", mate, in)
		}
	}
	// A ring over the nodes, a step of one node: in several dtypes, empty,
	// above 1 MiB, with a tag.
	step := func(err error) error {
		if err != nil {
			return fmt.Errorf("ring across nodes: %w", err)
		}
		return nil
	}
	ringAcross := func(n int) error {
		// ringOf's ring is rank+1; across nodes with local > 1 it is
		// rank+local: rotate by sending to rank+local and receiving from
		// rank-local.
		next, prev := (rank+local)%size, (rank+size-local)%size
		out := make([]int64, n)
		for i := range out {
			out[i] = p2pFill(rank, 2, i)
		}
		in := make([]int64, n)
		rh, err := hvdd.RecvAsync(c, in, prev, hvdd.WithTag(int64(n)))
		if err != nil {
			return err
		}
		if err := hvdd.Send(ctx, c, out, next, hvdd.WithTag(int64(n))); err != nil {
			return fmt.Errorf("send of %d to rank %d: %w", n, next, err)
		}
		if err := rh.Wait(ctx); err != nil {
			return fmt.Errorf("recv of %d from rank %d: %w", n, prev, err)
		}
		for i := range in {
			if in[i] != p2pFill(prev, 2, i) {
				return fmt.Errorf("recv of %d from rank %d: element %d is %d, want %d", n, prev, i, in[i], p2pFill(prev, 2, i))
			}
		}
		return nil
	}
	for _, n := range []int{3, 0, 1<<17 + 3} {
		if err := step(ringAcross(n)); err != nil {
			return err
		}
	}
	if local == 1 {
		for _, err := range []error{
			ringOf(ctx, c, 7, func(v int64) hvdd.BFloat16 { return hvdd.BFloat16(0x3f80 + v) }),
			ringOf(ctx, c, 5, func(v int64) float64 { return float64(v) / 8 }),
		} {
			if err := step(err); err != nil {
				return err
			}
		}
	}

	// Between the first and the last rank (on the first and last nodes):
	// order on one channel, tags apart, a process set, mismatches. The
	// other ranks run none of it (with 3 nodes, node 1 is left out).
	last := size - 1
	ps, err := c.AddProcessSet(ctx, []int{0, last})
	if err != nil {
		return err
	}
	mismatch := func(err error, what string) error {
		if !errors.Is(err, hvdd.ErrMismatch) || !strings.Contains(err.Error(), what) {
			return fmt.Errorf("across nodes: want ErrMismatch containing %q, got %v", what, err)
		}
		return nil
	}
	switch rank {
	case 0:
		var hs []*hvdd.Handle
		for m := 0; m < 4; m++ {
			h, err := hvdd.SendAsync(c, []int32{int32(m), 7}, last)
			if err != nil {
				return err
			}
			hs = append(hs, h)
		}
		h1, err := hvdd.SendAsync(c, []float32{1}, last, hvdd.WithTag(1))
		if err != nil {
			return err
		}
		h2, err := hvdd.SendAsync(c, []float32{2}, last, hvdd.WithTag(2))
		if err != nil {
			return err
		}
		hp, err := hvdd.SendAsync(c, []float32{3}, last, hvdd.WithProcessSet(ps))
		if err != nil {
			return err
		}
		for _, h := range append(hs, h1, h2, hp) {
			if err := h.Wait(ctx); err != nil {
				return err
			}
		}
		if err := mismatch(hvdd.Send(ctx, c, make([]float32, 4), last, hvdd.WithTag(8)), "the send has 4 elements, the recv 8 elements (the two tensors must have the same size)"); err != nil {
			return fmt.Errorf("send of 4 elements to a recv of 8: %w", err)
		}
		if err := mismatch(hvdd.Send(ctx, c, make([]float32, 4), last, hvdd.WithTag(9)), "the send has float32, the recv int32 (the two tensors must have the same dtype)"); err != nil {
			return fmt.Errorf("send of float32 to a recv of int32: %w", err)
		}
	case last:
		// The set's channel and the tags first: they must not take the
		// untagged sends, which then come in their order.
		p, t2, t1 := make([]float32, 1), make([]float32, 1), make([]float32, 1)
		if err := hvdd.Recv(ctx, c, p, 0, hvdd.WithProcessSet(ps)); err != nil {
			return err
		}
		if err := hvdd.Recv(ctx, c, t2, 0, hvdd.WithTag(2)); err != nil {
			return err
		}
		if err := hvdd.Recv(ctx, c, t1, 0, hvdd.WithTag(1)); err != nil {
			return err
		}
		if p[0] != 3 || t2[0] != 2 || t1[0] != 1 {
			return fmt.Errorf("across nodes: the set's recv got %v (want 3), tag 2 %v, tag 1 %v", p[0], t2[0], t1[0])
		}
		for m := 0; m < 4; m++ {
			b := make([]int32, 2)
			if err := hvdd.Recv(ctx, c, b, 0); err != nil {
				return err
			}
			if b[0] != int32(m) || b[1] != 7 {
				return fmt.Errorf("across nodes: recv %d from rank 0 got %v, want [%d 7] (out of order?)", m, b, m)
			}
		}
		if err := mismatch(hvdd.Recv(ctx, c, make([]float32, 8), 0, hvdd.WithTag(8)), "same size"); err != nil {
			return fmt.Errorf("recv of 8 elements from a send of 4: %w", err)
		}
		if err := mismatch(hvdd.Recv(ctx, c, make([]int32, 4), 0, hvdd.WithTag(9)), "same dtype"); err != nil {
			return fmt.Errorf("recv of int32 from a send of float32: %w", err)
		}
	}
	if err := c.RemoveProcessSet(ctx, ps); err != nil {
		return err
	}
	// The job goes on, and the same ranks' set registers anew (a pair's
	// set is no registered set).
	ps, err = c.AddProcessSet(ctx, []int{0, last})
	if err != nil {
		return fmt.Errorf("the set of the two ranks after their transfers: %w", err)
	}
	v := []float32{1}
	if err := hvdd.Allreduce(ctx, c, v, hvdd.WithOp(hvdd.Sum)); err != nil {
		return err
	}
	if v[0] != float32(size) {
		return fmt.Errorf("allreduce after the transfers: %v, want %d", v[0], size)
	}
	return c.RemoveProcessSet(ctx, ps)
}

// TestSendRecvWaitingShown: a send on one node whose recv has not come is
// in hvdd status (named by its channel, the waiting rank submitted, the
// other missing) and in the stall warning, and stops no job: the recv
// that comes after both completes it (see p2pWaiting).
func TestSendRecvWaitingShown(t *testing.T) {
	s := daemontest.Start(t, daemon.Config{Slots: 2, StallCheck: 200 * time.Millisecond, StallShutdown: time.Second})
	goFile := filepath.Join(t.TempDir(), "go")
	ws := daemontest.Spawn(t, s.Socket, "p2pwaiting", 2, "HVDD_TEST_GO="+goFile)
	const name = "send rank 0 to rank 1, tag 3"
	s.WaitLog(t, name, 30*time.Second) // the stall warning
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sc, err := hvdd.DialStatus(ctx, s.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	st, err := sc.Status(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, j := range st.GetJobs() {
		for _, p := range j.GetPending() {
			if p.GetName() == name {
				found = true
				if !slices.Equal(p.GetSubmitted(), []int32{0}) || !slices.Equal(p.GetMissing(), []int32{1}) || p.GetWaitingMs() < 200 {
					t.Errorf("status lists %v, want rank 0 submitted, rank 1 missing, waiting 200 ms or more", p)
				}
			}
		}
	}
	if !found {
		t.Errorf("status does not list the waiting send %q: %v", name, st.GetJobs())
	}
	// Past the stall shutdown, the job still runs: the recv completes it.
	if err := os.WriteFile(goFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if err := w.Wait(60 * time.Second); err != nil {
			t.Errorf("rank %d: %v\n%s", w.Rank, err, w.Output())
		}
	}
}

// p2pWaiting: rank 0 sends to rank 1 on tag 3; rank 1 receives only once
// the test has seen the send waiting (the file $HVDD_TEST_GO exists).
func p2pWaiting(ctx context.Context, c *hvdd.Client) error {
	if c.Rank() == 0 {
		return hvdd.Send(ctx, c, []float32{1, 2}, 1, hvdd.WithTag(3))
	}
	for {
		if _, err := os.Stat(os.Getenv("HVDD_TEST_GO")); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	got := make([]float32, 2)
	if err := hvdd.Recv(ctx, c, got, 0, hvdd.WithTag(3)); err != nil {
		return err
	}
	if got[0] != 1 || got[1] != 2 {
		return fmt.Errorf("received %v, want [1 2]", got)
	}
	return nil
}
