package daemon_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/hvdd/hvdd/backends"
	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/cluster"
	"github.com/hvdd/hvdd/cluster/clusterpb"
	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/daemon/daemontest"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

// In these tests the test itself is node 0, the coordinator, speaking the
// control protocol by hand to a real node-1 daemon and its real clients, so
// that it can send what a real coordinator sends only by chance of timing.

// pairTransport hands node 1's daemon one end of a socket pair as its
// control stream to node 0.
type pairTransport struct{ conn net.Conn }

func (p pairTransport) Dial(ctx context.Context, node int) (net.Conn, error) {
	if node != 0 {
		return nil, errors.New("only node 0 is reachable")
	}
	return p.conn, nil
}

func (p pairTransport) Accept() (net.Conn, int, error) { return nil, 0, net.ErrClosed }

// stubBackend is node 1's data engine when node 0 is the test: every
// collective returns at once, leaving node 1's buffer as it is (node 0
// contributes nothing). Like the tcp engine it runs small buffers in the
// daemon's loop. An allreduce larger than the loop takes (so on the
// executor) first says so on entered and waits for release, or for Close,
// which fails it as a real engine's Close does, or for an error on fail,
// which it returns (the engine failed by itself).
type stubBackend struct {
	entered, release chan struct{}
	closed           chan struct{}
	fail             chan error
	once             sync.Once
	// closedLost is the rank CloseLost named, +1 (0: closed by Close).
	closedLost atomic.Int32
	// closedErr is what a blocked allreduce returns once the engine is
	// closed; nil: backends.ErrClosed. Set before the daemon starts.
	closedErr error
}

func newStubBackend() *stubBackend {
	return &stubBackend{entered: make(chan struct{}, 1), release: make(chan struct{}), closed: make(chan struct{}), fail: make(chan error)}
}

func (*stubBackend) Name() string { return "stub" }
func (*stubBackend) Rank() int    { return 1 }
func (*stubBackend) Size() int    { return 2 }
func (b *stubBackend) Allreduce(_ context.Context, buf []byte, _ tensor.DType, _ tensor.ReduceOp) error {
	if len(buf) <= 64<<10 {
		return nil
	}
	b.entered <- struct{}{}
	select {
	case <-b.release:
		return nil
	case err := <-b.fail:
		return err
	case <-b.closed:
		if b.closedErr != nil {
			return b.closedErr
		}
		return backends.ErrClosed
	}
}
func (*stubBackend) Allgatherv(context.Context, []byte, []byte, []int) error { return nil }
func (*stubBackend) Broadcast(context.Context, []byte, int) error            { return nil }
func (*stubBackend) Alltoallv(context.Context, []byte, []int, []byte, []int) error {
	return nil
}
func (*stubBackend) ReduceScatter(context.Context, []byte, []byte, []int, tensor.DType, tensor.ReduceOp) error {
	return nil
}
func (*stubBackend) Barrier(context.Context) error { return nil }
func (b *stubBackend) Close() error {
	b.once.Do(func() { close(b.closed) })
	return nil
}
func (b *stubBackend) CloseLost(rank int, _ error) error {
	b.closedLost.Store(int32(rank + 1))
	return b.Close()
}
func (*stubBackend) LoopRunnable() int { return 1 << 20 }

// socketPair returns two connected Unix stream sockets.
func socketPair(t *testing.T) (net.Conn, net.Conn) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "control")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

// controlFrame is one control message as a link frames it.
func controlFrame(t *testing.T, m *clusterpb.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)
}

// coordinator is the test playing node 0 of a 2-node job whose node 1 is a
// real daemon with two real clients.
type coordinator struct {
	t       *testing.T
	server  *daemontest.Server // node 1's daemon
	backend *stubBackend       // and its engine
	link    *cluster.Link
	raw     *os.File // the link's socket, for writing several frames at once
	clients []*hvdd.Client
}

// startAsCoordinator starts node 1's daemon, joins its two clients and
// forms the job with node 0's single (absent) rank.
func startAsCoordinator(t *testing.T) *coordinator { return startWrapped(t, newStubBackend(), nil) }

// startWrapped is startAsCoordinator with backend as node 1's engine and
// node 1's end of the control stream passed through wrap, if set.
func startWrapped(t *testing.T, backend *stubBackend, wrap func(net.Conn) net.Conn) *coordinator {
	secret := []byte("fake coordinator secret, 32 B...")
	mine, theirs := socketPair(t)
	if wrap != nil {
		theirs = wrap(theirs)
	}
	raw, err := mine.(*net.UnixConn).File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	// No heartbeats: nothing but the messages under test wakes node 1.
	ccfg := cluster.Config{Secret: secret, Heartbeat: time.Hour, PeerTimeout: 2 * time.Hour}
	s := daemontest.Start(t, daemon.Config{
		Slots: 2, Nodes: 2, NodeRank: 1, Secret: secret, Control: pairTransport{theirs},
		NewBackend: func(context.Context, daemon.MultiNodeJob) (backends.Backend, error) { return backend, nil },
		Heartbeat:  time.Hour, PeerTimeout: 2 * time.Hour, StartTimeout: 30 * time.Second,
	})
	// Node 0's side on its own goroutine: node 1 joins once its clients
	// are in Init, which returns once the job has formed.
	formed := make(chan error, 1)
	var link *cluster.Link
	go func() {
		var err error
		link, err = formJob(mine, ccfg)
		formed <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clients := daemontest.InitClients(t, ctx, s.Socket, 2)
	if err := <-formed; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range clients {
			c.Close()
		}
		link.Close()
	})
	return &coordinator{t: t, server: s, backend: backend, link: link, raw: raw, clients: clients}
}

// formJob answers node 1's Join on conn with the layout of 1 + 2 slots.
func formJob(conn net.Conn, cfg cluster.Config) (*cluster.Link, error) {
	link, _, err := cluster.ServerHandshake(conn, "node 1", cfg)
	if err != nil {
		return nil, err
	}
	m, err := link.Recv()
	if err != nil || m.GetJoin().GetSlots() != 2 {
		link.Close()
		return nil, fmt.Errorf("node 1 joined with %v, %v; want 2 slots", m, err)
	}
	err = link.Send(&clusterpb.Message{Msg: &clusterpb.Message_Layout{Layout: &clusterpb.Layout{
		Generation: 1, Slots: []int32{1, 2}}}})
	if err != nil {
		link.Close()
		return nil, err
	}
	return link, nil
}

// submit starts an async float32 sum of n elements named name on both
// clients (rank r+1 gives r+1, base, base, ...), and returns their handles
// and buffers.
func (co *coordinator) submit(name string, n int, base float32) ([]*hvdd.Handle, [][]float32) {
	var hs []*hvdd.Handle
	var xs [][]float32
	for r, c := range co.clients {
		x := make([]float32, n)
		x[0] = float32(r + 1)
		for i := 1; i < n; i++ {
			x[i] = base
		}
		h, err := hvdd.AllreduceAsync(c, x, hvdd.WithName(name), hvdd.WithOp(tensor.Sum))
		if err != nil {
			co.t.Fatal(err)
		}
		hs, xs = append(hs, h), append(xs, x)
	}
	return hs, xs
}

// planRunning submits name (256 KiB a rank: the executor's, where the stub
// engine blocks) on both ranks, sends its plan once node 1 forwards it, and
// returns when node 1's engine has entered the allreduce.
func (co *coordinator) planRunning(t *testing.T, name string) ([]*hvdd.Handle, [][]float32) {
	t.Helper()
	hs, xs := co.submit(name, 64<<10, 10)
	reqs := co.awaitReady(name)
	co.write(co.planFrame(1, reqs[name]))
	select {
	case <-co.backend.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("node 1 did not start the plan")
	}
	return hs, xs
}

// awaitReady reads node 1's Ready messages until both its ranks' requests
// for every name have come, and returns one request per name.
func (co *coordinator) awaitReady(names ...string) map[string]*clusterpb.Request {
	got := map[string][]*clusterpb.Request{}
	for _, n := range names {
		for len(got[n]) < 2 {
			m, err := co.link.Recv()
			if err != nil {
				co.t.Fatal(err)
			}
			for _, r := range m.GetReady().GetRequests() {
				got[r.GetName()] = append(got[r.GetName()], r)
			}
		}
	}
	one := map[string]*clusterpb.Request{}
	for n, rs := range got {
		one[n] = rs[0]
	}
	return one
}

// planFrame is the framed Plan seq that runs req's (float32) tensor on all
// 3 ranks.
func (co *coordinator) planFrame(seq uint64, req *clusterpb.Request) []byte {
	bytes := int64(4)
	for _, d := range req.GetShape() {
		bytes *= d
	}
	resp := &clusterpb.Response{
		Op: req.GetOp(), Dtype: req.GetDtype(), ReduceOp: req.GetReduceOp(), Prescale: 1, Postscale: 1, Bytes: bytes,
		Tensors: []*clusterpb.Tensor{{Name: req.GetName(), Shape: req.GetShape(), Ranks: []int32{0, 1, 2}}},
	}
	return controlFrame(co.t, &clusterpb.Message{Msg: &clusterpb.Message_Plan{Plan: &clusterpb.Plan{
		Seq: seq, Responses: []*clusterpb.Response{resp}}}})
}

// write sends frames to node 1 in one write, so that it reads them together.
func (co *coordinator) write(frames ...[]byte) {
	var b []byte
	for _, f := range frames {
		b = append(b, f...)
	}
	if _, err := co.raw.Write(b); err != nil {
		co.t.Fatal(err)
	}
}

// expectSum waits for handles and checks that each rank's buffer holds node
// 1's sum (node 0, the test, adds nothing): [3, 2*base, 2*base, ...].
func (co *coordinator) expectSum(what string, hs []*hvdd.Handle, xs [][]float32, base float32) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for r, h := range hs {
		if err := h.Wait(ctx); err != nil {
			co.t.Fatalf("rank %d, %s: %v", r+1, what, err)
		}
		got := xs[r]
		ok := got[0] == 3
		for _, v := range got[1:] {
			ok = ok && v == 2*base
		}
		if !ok {
			co.t.Errorf("rank %d, %s: got %v..., want [3 %v ...]", r+1, what, got[:2], 2*base)
		}
	}
}

// TestPlansInOneRead: node 1 gets two plans in one read of its control link,
// and each runs in the daemon's loop (small buffers). Both must run: the
// ranks waiting for the second send nothing that would bring the loop back
// to it, and no heartbeat comes to the rescue here.
func TestPlansInOneRead(t *testing.T) {
	co := startAsCoordinator(t)
	h1, x1 := co.submit("first", 2, 10)
	h2, x2 := co.submit("second", 2, 20)
	reqs := co.awaitReady("first", "second")
	co.write(co.planFrame(1, reqs["first"]), co.planFrame(2, reqs["second"]))
	co.expectSum("plan 1", h1, x1, 10)
	co.expectSum("plan 2", h2, x2, 20)
}

// shutdownFrame is node 0's Abort for a rank that shut down.
func shutdownFrame(t *testing.T) []byte {
	const why = "Horovod has been shut down: rank 0 (pid 1 on node 0) called shutdown() or exited while other ranks still had collectives to run; every rank must run the same collectives"
	return controlFrame(t, &clusterpb.Message{Msg: &clusterpb.Message_Abort{Abort: &clusterpb.Abort{
		Code: int32(ipcpb.Code_CODE_SHUT_DOWN), Msg: why}}})
}

// expectShutdown checks that a collective now fails with the shutdown.
func (co *coordinator) expectShutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := hvdd.Allreduce(ctx, co.clients[0], []float32{1}, hvdd.WithName("after"))
	var herr *hvdd.Error
	if !errors.As(err, &herr) || herr.Code != ipcpb.Code_CODE_SHUT_DOWN || !strings.Contains(herr.Msg, "called shutdown()") {
		co.t.Fatalf("a collective after the shutdown returned %v; want CODE_SHUT_DOWN naming the shutdown", err)
	}
}

// TestShutdownAfterPlan: node 0's rank finished the last collective and shut
// down; node 1 reads that plan and the shutdown together. The plan still
// runs on node 1, so its ranks get their results, and only later
// collectives fail with Horovod's shutdown error.
func TestShutdownAfterPlan(t *testing.T) {
	co := startAsCoordinator(t)
	h, x := co.submit("last", 2, 10)
	reqs := co.awaitReady("last")
	co.write(co.planFrame(1, reqs["last"]), shutdownFrame(t))
	co.expectSum("the last plan", h, x, 10)
	co.expectShutdown()
}

// TestShutdownDuringPlan: node 1 runs the last plan on its executor (too
// large for the loop) when node 0's shutdown comes. The shutdown waits for
// the plan instead of closing the engine under it.
func TestShutdownDuringPlan(t *testing.T) {
	co := startAsCoordinator(t)
	h, x := co.planRunning(t, "last")
	co.write(shutdownFrame(t))
	co.server.WaitLog(t, "shutdown waits for the plans before it", 10*time.Second)
	select {
	case <-co.backend.closed:
		t.Fatal("node 1 closed its engine under the running plan")
	default:
	}
	close(co.backend.release)
	co.expectSum("the last plan", h, x, 10)
	co.expectShutdown()
}

// expectRecorder is a control stream that records what node 1's link tells
// it through cluster.Expecter, as the MPI bridge would hear it.
type expectRecorder struct {
	*net.UnixConn
	told chan bool
}

func (e *expectRecorder) Expect(on bool) { e.told <- on }

// TestLinksExpectWhilePending: node 1 tells its control link that it awaits
// messages once a local request is pending, and that it no longer does once
// the request is done (over MPI the bridge probes often only in between).
func TestLinksExpectWhilePending(t *testing.T) {
	rec := &expectRecorder{told: make(chan bool, 16)}
	co := startWrapped(t, newStubBackend(), func(c net.Conn) net.Conn {
		rec.UnixConn = c.(*net.UnixConn)
		return rec
	})
	next := func(what string) bool {
		select {
		case on := <-rec.told:
			return on
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the link was told nothing in 10 s", what)
			return false
		}
	}
	if len(rec.told) != 0 {
		t.Fatalf("told %v with nothing pending", <-rec.told)
	}
	for step, name := range []string{"a", "b"} {
		hs, xs := co.submit(name, 2, 10)
		if !next("submitted") {
			t.Fatalf("step %d: told false once a request was pending", step)
		}
		reqs := co.awaitReady(name)
		co.write(co.planFrame(uint64(step+1), reqs[name]))
		co.expectSum(name, hs, xs, 10)
		if next("done") {
			t.Fatalf("step %d: told true again once the request was done", step)
		}
	}
}

// TestAbortDuringPlan: node 1 runs a plan on its executor when node 0's
// Abort comes (another node was lost). Node 1 closes its engine so that
// the collective returns; the ranks waiting in it must hear the Abort's
// reason, not that the engine was closed (at 8 nodes a node behind the
// lost one's ring neighbours often hears of the loss from the coordinator
// first, and its ranks got "backends: closed").
func TestAbortDuringPlan(t *testing.T) {
	co := startAsCoordinator(t)
	hs, _ := co.planRunning(t, "running")
	const why = "node 2 (rank 3) was lost: cluster: 10.0.0.3:4242 closed the connection"
	abortRunning(t, co, hs, why)
}

// abortRunning sends node 1 the coordinator's Abort for why while hs run,
// and checks that each fails with CODE_ABORTED and why.
func abortRunning(t *testing.T, co *coordinator, hs []*hvdd.Handle, why string) {
	t.Helper()
	co.write(controlFrame(t, &clusterpb.Message{Msg: &clusterpb.Message_Abort{Abort: &clusterpb.Abort{
		Code: int32(ipcpb.Code_CODE_ABORTED), Msg: why}}}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for r, h := range hs {
		err := h.Wait(ctx)
		var herr *hvdd.Error
		if !errors.As(err, &herr) || herr.Code != ipcpb.Code_CODE_ABORTED || !strings.Contains(herr.Msg, why) {
			t.Errorf("rank %d's collective under the abort: %v; want CODE_ABORTED with the abort's reason %q", r+1, err, why)
		}
	}
}

// TestAbortDuringPlanAfterAPeersClose is TestAbortDuringPlan where node
// 1's engine, as node 1 closes it for the Abort, has already failed from a
// peer's close: the coordinator's, which relayed the Abort and closed its
// engine, and whose bye reached node 1's engine before the Abort reached
// node 1's loop. The engine's error names that survivor as lost; the ranks
// must hear the Abort's reason, the job's first cause, all the same
// (TestScaleNetns8Failures/daemon-killed: node 6's rank said "node 0
// (rank 0) was lost during ALLREDUCE: tcp: Allreduce: node rank 0 lost:
// peer closed its backend", though its daemon's job failed for node 5).
func TestAbortDuringPlanAfterAPeersClose(t *testing.T) {
	backend := newStubBackend()
	backend.closedErr = fmt.Errorf("tcp: Allreduce: %w", &backends.PeerError{Rank: 0, Err: errors.New("peer closed its backend")})
	co := startWrapped(t, backend, nil)
	hs, _ := co.planRunning(t, "running")
	const why = "node 5 (rank 5) was lost during ALLREDUCE: tcp: Allreduce: node rank 5 lost: control connection: EOF"
	abortRunning(t, co, hs, why)
}

// TestEngineLossNamesLostNode: node 1's engine fails by itself in a
// collective, naming the node it lost (a *backends.PeerError). The Abort
// node 1 sends names that node (lost_node), and node 1 closes its engine
// naming it (backends.LostCloser), as for a lost control link: the
// coordinator, relaying the Abort, then closes its own engine naming the
// lost node too, so that a node still in the collective is not told that
// the coordinator closed (a survivor) before it hears the Abort.
func TestEngineLossNamesLostNode(t *testing.T) {
	co := startAsCoordinator(t)
	hs, _ := co.planRunning(t, "running")
	aborts := make(chan *clusterpb.Abort, 1)
	go func() {
		defer close(aborts)
		for {
			m, err := co.link.Recv()
			if err != nil {
				return
			}
			if a := m.GetAbort(); a != nil {
				aborts <- a
				return
			}
		}
	}()
	co.backend.fail <- fmt.Errorf("tcp: Allreduce: %w", &backends.PeerError{Rank: 0, Err: errors.New("control connection: EOF")})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for r, h := range hs {
		err := h.Wait(ctx)
		var herr *hvdd.Error
		if !errors.As(err, &herr) || herr.Code != ipcpb.Code_CODE_ABORTED || !strings.Contains(herr.Msg, "node 0 (rank 0) was lost during ALLREDUCE") {
			t.Errorf("rank %d's collective: %v; want CODE_ABORTED naming node 0", r+1, err)
		}
	}
	select {
	case a := <-aborts:
		if a == nil {
			t.Fatal("node 1's link closed without an Abort")
		}
		if a.LostNode == nil || a.GetLostNode() != 0 {
			t.Errorf("node 1's Abort names lost node %v, want 0 (%q)", a.LostNode, a.GetMsg())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("node 1 sent no Abort")
	}
	select {
	case <-co.backend.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("node 1 did not close its engine")
	}
	if got := co.backend.closedLost.Load(); got != 1 {
		t.Errorf("the engine was closed naming rank %d (+1; 0: Close), want node 0's (1)", got)
	}
}

// TestAbortNamesLostNode: an Abort that names the node whose loss fails the
// job (lost_node) makes node 1 close its engine naming that node
// (backends.LostCloser), so that the tcp engine's byes tell a peer still in
// a collective which node was lost, rather than that node 1 closed; an
// Abort with another cause, or naming a node outside the job, closes it
// plainly.
func TestAbortNamesLostNode(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lost     *int32
		wantLost int32 // the rank CloseLost got, +1; 0: Close
	}{
		{"lost node 0", proto.Int32(0), 1},
		{"no lost node", nil, 0},
		{"lost node outside the job", proto.Int32(5), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			co := startAsCoordinator(t)
			hs, _ := co.planRunning(t, "running")
			co.write(controlFrame(t, &clusterpb.Message{Msg: &clusterpb.Message_Abort{Abort: &clusterpb.Abort{
				Code: int32(ipcpb.Code_CODE_ABORTED), Msg: "node 0 (rank 0) was lost: test", LostNode: tc.lost}}}))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, h := range hs {
				if err := h.Wait(ctx); !errors.Is(err, hvdd.ErrAborted) {
					t.Fatalf("a collective under the abort: %v", err)
				}
			}
			if got := co.backend.closedLost.Load(); got != tc.wantLost {
				t.Errorf("the engine was closed naming rank %d (+1; 0: Close), want %d", got, tc.wantLost)
			}
		})
	}
}
