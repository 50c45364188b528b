package tcp

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/tensor"
)

// fastFailure shortens the failure detector for tests.
func fastFailure(c *Config) {
	c.Heartbeat = 100 * time.Millisecond
	c.PeerTimeout = time.Second
}

// loop runs allreduces on every rank but skip until each fails, and returns
// the errors and when they happened. started is closed after every rank has
// completed a few collectives.
func loop(g []*Backend, skip int, started chan<- struct{}) ([]error, []time.Time) {
	n := len(g)
	errs, when := make([]error, n), make([]time.Time, n)
	var wg, warm sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for k, b := range g {
		if k == skip {
			continue
		}
		wg.Add(1)
		warm.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1<<20)
			for i := 0; ; i++ {
				if i == 3 {
					warm.Done()
				}
				if err := b.Allreduce(ctx, buf, tensor.Float32, tensor.Sum); err != nil {
					if i < 3 {
						warm.Done()
					}
					errs[k], when[k] = err, time.Now()
					return
				}
			}
		}()
	}
	go func() { warm.Wait(); close(started) }()
	wg.Wait()
	return errs, when
}

// TestPeerKilled closes a rank's sockets without a goodbye, as a crashed
// process does, in the middle of a stream of allreduces.
func TestPeerKilled(t *testing.T) {
	g := group(t, 4, fastFailure)
	const victim = 2
	started := make(chan struct{})
	var killed time.Time
	go func() {
		<-started
		killed = time.Now()
		g[victim].kill()
	}()
	errs, when := loop(g, -1, started)
	for k, err := range errs {
		if k == victim {
			continue
		}
		if r, ok := backends.LostRank(err); !ok || r != victim {
			t.Errorf("rank %d: got %v, want a PeerError naming rank %d", k, err, victim)
		}
		if d := when[k].Sub(killed); d > g[k].cfg.PeerTimeout {
			t.Errorf("rank %d noticed after %v, more than the peer timeout", k, d)
		}
	}
}

// TestPeerHung stops a rank's heartbeats and keeps it out of the collective,
// as a hung host would: nothing closes, only the silence tells.
func TestPeerHung(t *testing.T) {
	g := group(t, 3, fastFailure)
	const victim = 1
	close(g[victim].noBeat)
	start := time.Now()
	errs, when := loop(g, victim, make(chan struct{}))
	for k, err := range errs {
		if k == victim {
			continue
		}
		if r, ok := backends.LostRank(err); !ok || r != victim {
			t.Errorf("rank %d: got %v, want a PeerError naming rank %d", k, err, victim)
		}
		// Heartbeats stop at most one interval before start.
		if d := when[k].Sub(start); d > g[k].cfg.PeerTimeout+g[k].cfg.Heartbeat+g[k].verdictWait {
			t.Errorf("rank %d noticed after %v", k, d)
		}
		// Later calls fail the same way.
		if r, ok := backends.LostRank(g[k].Barrier(context.Background())); !ok || r != victim {
			t.Errorf("rank %d: a later call did not fail with the same PeerError", k)
		}
	}
}

// TestCloseUnblocks closes a backend while its call waits for a peer.
func TestCloseUnblocks(t *testing.T) {
	g := group(t, 2, nil)
	errc := make(chan error, 1)
	go func() { errc <- g[0].Allreduce(context.Background(), make([]byte, 1<<20), tensor.Float32, tensor.Sum) }()
	// Close while the call is in progress (it waits for rank 1 forever).
	if !waitFor(func() bool { return g[0].peers[1].active.Load() != 0 }) {
		t.Fatal("the Allreduce never started")
	}
	g[0].Close()
	select {
	case err := <-errc:
		if !errors.Is(err, backends.ErrClosed) {
			t.Errorf("got %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock the call")
	}
	// Rank 1, between collectives, fails its next one naming rank 0, once
	// it has read rank 0's bye. (Started before, a mismatched Barrier could
	// take a byte of rank 0's Allreduce for its token; the daemon never runs
	// different collectives on different ranks.)
	waitBye(t, g[1], 0)
	err := g[1].Barrier(context.Background())
	if r, ok := backends.LostRank(err); !ok || r != 0 {
		t.Errorf("rank 1: got %v, want a PeerError naming rank 0", err)
	}
}

// TestCloseLostBlamesTheLostRank: a rank that closes because another was
// lost (CloseLost) makes a peer blocked in a collective, waiting for its
// bytes, fail naming the lost rank, not the closing one (the daemons close
// their engines when a node is lost; the first to close must not be taken
// for it). Calls on the closing rank return both ErrClosed and a PeerError
// naming the lost rank.
func TestCloseLostBlamesTheLostRank(t *testing.T) {
	g := group(t, 3, nil)
	const lost, closer, waiter = 2, 1, 0
	errs := make(chan error, 2)
	for _, k := range []int{waiter, closer} {
		go func() {
			errs <- g[k].Allreduce(context.Background(), make([]byte, 1<<20), tensor.Float32, tensor.Sum)
		}()
	}
	// Both wait for rank 2, which never calls; rank 1 then closes for it.
	if !waitFor(func() bool {
		return g[waiter].peers[closer].active.Load() != 0 && g[closer].peers[waiter].active.Load() != 0
	}) {
		t.Fatal("the Allreduces never started")
	}
	g[closer].CloseLost(lost, errors.New("its control link broke"))
	for range 2 {
		select {
		case err := <-errs:
			if r, ok := backends.LostRank(err); !ok || r != lost {
				t.Errorf("got %v, want a PeerError naming rank %d", err, lost)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("CloseLost did not unblock the calls")
		}
	}
	if err := g[closer].Barrier(context.Background()); !errors.Is(err, backends.ErrClosed) {
		t.Errorf("a call on the closed rank: got %v, want ErrClosed", err)
	}
	if err := g[waiter].failure(); err == nil || !strings.Contains(err.Error(), "reported lost by rank 1") {
		t.Errorf("the waiter's failure %v does not say who reported the loss", err)
	}
}

// TestOrderlyCloseBetweenCollectives: a rank that closes after the last
// collective fails nobody who finished it too, and so tells nobody still
// finishing it that it was lost; only a later collective fails, naming it.
func TestOrderlyCloseBetweenCollectives(t *testing.T) {
	g := group(t, 3, nil)
	ctx := context.Background()
	var wg sync.WaitGroup
	for _, b := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.Allreduce(ctx, make([]byte, 64), tensor.Float32, tensor.Sum); err != nil {
				t.Errorf("rank %d: %v", b.rank, err)
			}
		}()
	}
	wg.Wait()
	g[0].Close()
	// Wait until ranks 1 and 2 have read rank 0's bye.
	for _, b := range g[1:] {
		waitBye(t, b, 0)
		if err := b.failure(); err != nil {
			t.Errorf("rank %d failed between collectives: %v", b.rank, err)
		}
	}
	if r, ok := backends.LostRank(g[1].Barrier(ctx)); !ok || r != 0 {
		t.Errorf("rank 1's next collective: want a PeerError naming rank 0")
	}
}

// TestBadArguments: invalid arguments fail the call and the backend, and the
// peers learn of it rather than hang.
func TestBadArguments(t *testing.T) {
	g := group(t, 2, nil)
	ctx := context.Background()
	if err := g[0].Allreduce(ctx, make([]byte, 3), tensor.Float32, tensor.Sum); err == nil {
		t.Error("3-byte float32 buffer accepted")
	}
	if r, ok := backends.LostRank(g[1].Barrier(ctx)); !ok || r != 0 {
		t.Error("rank 1 was not told that rank 0 failed")
	}
}

// waitBye waits until b has read the orderly bye of rank from.
func waitBye(t *testing.T, b *Backend, from int) {
	t.Helper()
	if !waitFor(func() bool { return b.peers[from].doneAt.Load() >= 0 }) {
		t.Fatalf("rank %d never read rank %d's bye", b.rank, from)
	}
}

// TestOrderlyCloseAfterGroup: collectives are counted per pair of ranks, so
// a rank that closes after a group's collective fails nobody of the group
// who finished it too, while a rank outside the group, which shared no
// collective with it, fails its next one at the start, naming it.
func TestOrderlyCloseAfterGroup(t *testing.T) {
	g := group(t, 3, nil)
	ctx := context.Background()
	var wg sync.WaitGroup
	for _, b := range g[:2] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub, err := b.Group([]int{0, 1})
			if err == nil {
				err = sub.Allreduce(ctx, make([]byte, 64), tensor.Float32, tensor.Sum)
			}
			if err != nil {
				t.Errorf("rank %d: %v", b.rank, err)
			}
		}()
	}
	wg.Wait()
	if got := g[1].peers[0].completed.Load(); got != 1 {
		t.Fatalf("rank 1 counts %d collectives with rank 0, want 1", got)
	}
	if got := g[2].peers[0].completed.Load(); got != 0 {
		t.Fatalf("rank 2 counts %d collectives with rank 0, want 0", got)
	}
	g[0].Close()
	for _, b := range g[1:] {
		waitBye(t, b, 0)
	}
	if err := g[1].failure(); err != nil {
		t.Errorf("rank 1 failed between collectives: %v", err)
	}
	if r, ok := backends.LostRank(g[2].Barrier(ctx)); !ok || r != 0 {
		t.Errorf("rank 2's next collective: want a PeerError naming rank 0")
	}
}

// TestCloseWaitsForTheByes is run 13's failure of the test command
// (clients/go's TestScaleNetns8Failures/coordinator-cut, 8 nodes in
// network namespaces): node 1 missed node 0's heartbeats and failed naming
// it; while it was still sending its byes, its daemon closed the engine
// (CloseLost), which closed the control connections under them, and node 2
// read an EOF where the bye would have been: it blamed node 1, not node 0.
// Here rank 1 fails having lost rank 2 and its byes are held; a
// CloseLost meanwhile must not close the connections before that bye has
// gone, and rank 0 must fail naming rank 2.
func TestCloseWaitsForTheByes(t *testing.T) {
	g := group(t, 3, nil)
	const waiter, closer, lost = 0, 1, 2
	held, release := make(chan struct{}), make(chan struct{})
	var entered sync.WaitGroup
	entered.Add(2)
	g[closer].byeHold = func(peer int) {
		entered.Done()
		<-release
	}
	go func() { entered.Wait(); close(held) }()
	go g[closer].fail(&backends.PeerError{Rank: lost, Err: errors.New("no heartbeat for 3s")})
	<-held
	closed := make(chan struct{})
	go func() {
		g[closer].CloseLost(lost, errors.New("its control link broke"))
		close(closed)
	}()
	select {
	case <-closed:
		t.Error("CloseLost returned while a bye of the failure before it was still unsent")
	case <-g[waiter].failed:
		t.Errorf("rank %d failed before the bye came: %v", waiter, g[waiter].failure())
	case <-time.After(300 * time.Millisecond): // the window the bug needs
	}
	close(release)
	select {
	case <-g[waiter].failed:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter never failed")
	}
	if r, ok := backends.LostRank(g[waiter].failure()); !ok || r != lost {
		t.Errorf("the waiter's failure is %v, want a PeerError naming rank %d", g[waiter].failure(), lost)
	}
	<-closed
}

// TestDroppedRankNamesWhoDroppedIt is run 15's failure of the test command
// (TestCloseLostBlamesTheLostRank under -race): rank 1 declares rank 2
// lost, and rank 2's own bye, saying it was dropped, reaches rank 0 before
// rank 1's does. Rank 0 must blame rank 2 for the same reason either way:
// reported lost by rank 1 (rank 2's bye once said only that it aborted).
// Here rank 1's bye to rank 0 is held until rank 0 has failed.
func TestDroppedRankNamesWhoDroppedIt(t *testing.T) {
	g := group(t, 3, nil)
	const waiter, closer, lost = 0, 1, 2
	release := make(chan struct{})
	g[closer].byeHold = func(peer int) {
		if peer == waiter {
			<-release
		}
	}
	defer close(release)
	go g[closer].CloseLost(lost, errors.New("its control link broke"))
	select {
	case <-g[waiter].failed:
	case <-time.After(10 * time.Second):
		t.Fatal("rank 0 never heard of rank 2's loss from rank 2")
	}
	err := g[waiter].failure()
	if r, ok := backends.LostRank(err); !ok || r != lost || !strings.Contains(err.Error(), "reported lost by rank 1") {
		t.Errorf("rank 0 failed with %v; want rank %d named, reported lost by rank %d", err, lost, closer)
	}
}
