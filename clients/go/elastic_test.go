package hvdd_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hvdd/hvdd/backends"
	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/daemon/daemontest"
	"github.com/hvdd/hvdd/rendezvous"
)

// ownInit holds worker scenarios that make their own clients (elastic ones
// re-initialise).
var ownInit = map[string]func() int{
	"elastic":     elasticWorker,
	"elasticjoin": elasticJoinWorker,
}

// elasticWorker trains a few steps in an elastic job. The last rank (or
// the one HVDD_TEST_VICTIM names) exits without Close at step 2: the daemon loses it.
// The others see the step fail naming it, Close (Horovod's reset:
// shutdown, then init) and join the job's next epoch, where they check their
// new identity and run the step again at the new size. With
// HVDD_TEST_DESERT=<rank> that survivor exits after the failure instead of
// re-initialising (the others re-form without it); with
// HVDD_TEST_STALL=<rank> it hangs instead (until it is killed), so the epoch
// cannot form.
func elasticWorker() int {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fail := func(format string, args ...any) int {
		fmt.Printf(format+"\n", args...)
		return 1
	}
	c := &hvdd.Client{Elastic: true}
	if err := c.Init(ctx); err != nil {
		return fail("init: %v", err)
	}
	n, rank, job := c.Size(), c.Rank(), c.JobID()
	if c.Epoch() != 0 {
		return fail("first epoch is %d", c.Epoch())
	}
	victim := n - 1
	if v := envRank("HVDD_TEST_VICTIM"); v >= 0 {
		victim = v
	}
	var lost error
	for step := 0; step < 5 && lost == nil; step++ {
		if rank == victim && step == 2 && os.Getenv("HVDD_TEST_VICTIM_HANGS") != "" {
			// Its node is lost under it (the test stops its daemon).
			fmt.Println("VICTIM HANGS")
			select {}
		}
		if rank == victim && step == 2 {
			fmt.Println("VICTIM EXITS")
			os.Exit(3) // no Close: the daemon sees the rank lost
		}
		x := []float32{1}
		lost = hvdd.Allreduce(ctx, c, x, hvdd.WithName(fmt.Sprint("step.", step)), hvdd.WithOp(hvdd.Sum))
		if lost == nil && x[0] != float32(n) {
			return fail("step %d: sum %v, want %d", step, x[0], n)
		}
	}
	if lost == nil {
		return fail("rank %d finished without losing the victim", rank)
	}
	if !errors.Is(lost, hvdd.ErrAborted) || !strings.Contains(lost.Error(), fmt.Sprintf("rank %d (pid", victim)) && !strings.Contains(lost.Error(), fmt.Sprintf("(rank %d) was lost", victim)) {
		return fail("the failed step does not name the lost rank %d: %v", victim, lost)
	}
	c.Close() // Goodbye: this rank survives
	deserter := envRank("HVDD_TEST_DESERT")
	if deserter == rank {
		fmt.Println("DESERTER EXITS")
		return 0
	}
	if envRank("HVDD_TEST_STALL") == rank {
		fmt.Println("STALLING")
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM)
		<-stop // a hung process: the test kills it
		return 5
	}
	// The survivors keep their order: a lost rank's place (the victim's, a
	// deserter's) goes to those after it.
	wantRank, wantSize := rank, n-1
	if victim < rank {
		wantRank--
	}
	if deserter >= 0 {
		wantSize--
		if deserter < rank {
			wantRank--
		}
	}
	c2 := &hvdd.Client{Elastic: true}
	if err := c2.Init(ctx); err != nil {
		fmt.Printf("re-init: %v\n", err)
		return 4
	}
	defer c2.Close()
	if v := envRank("HVDD_TEST_SIZE_AFTER"); v > 0 {
		wantSize = v // other ranks were lost with the victim
	}
	if os.Getenv("HVDD_TEST_ANY_RANK") != "" && c2.Rank() >= 0 && c2.Rank() < wantSize {
		// The nodes' order changed with their coordinator: any rank will do.
		wantRank = c2.Rank()
	}
	wantEpoch := uint64(1)
	if v := envRank("HVDD_TEST_EPOCH_AFTER"); v > 0 {
		wantEpoch = uint64(v) // epochs that could not form came between
	}
	if c2.Size() != wantSize || c2.Rank() != wantRank || c2.Epoch() != wantEpoch || c2.JobID() != job {
		return fail("re-formed identity: rank %d size %d epoch %d job %d; want rank %d size %d epoch %d job %d",
			c2.Rank(), c2.Size(), c2.Epoch(), c2.JobID(), wantRank, wantSize, wantEpoch, job)
	}
	x := []float32{1}
	if err := hvdd.Allreduce(ctx, c2, x, hvdd.WithName("step.2"), hvdd.WithOp(hvdd.Sum)); err != nil || x[0] != float32(wantSize) {
		return fail("epoch 1 step: %v, sum %v, want %d", err, x, wantSize)
	}
	fmt.Printf("REFORMED rank %d of %d\n", c2.Rank(), c2.Size())
	return 0
}

// envRank is the rank an environment variable names, or -1.
func envRank(name string) int {
	r, err := strconv.Atoi(os.Getenv(name))
	if err != nil {
		return -1
	}
	return r
}

// TestElasticReform: in an elastic job a lost rank fails its epoch, and the
// survivors re-initialise into the next one, on the same daemon, at the
// smaller size, with their ranks in order and the job id kept.
func TestElasticReform(t *testing.T) {
	daemontest.RaceCheckedWorkers(t)
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("np%d", n), func(t *testing.T) {
			s := daemontest.Start(t, daemon.Config{Slots: n})
			ws := daemontest.Spawn(t, s.Socket, "elastic", n)
			for _, w := range ws[:n-1] {
				if err := w.Wait(60 * time.Second); err != nil {
					t.Errorf("rank %d: %v\n%s", w.Rank, err, w.Output())
				}
				if !strings.Contains(w.Output(), fmt.Sprintf("REFORMED rank %d of %d", w.Rank, n-1)) {
					t.Errorf("rank %d did not re-form:\n%s", w.Rank, w.Output())
				}
			}
			if err := ws[n-1].Wait(30 * time.Second); err == nil {
				t.Errorf("the victim exited 0:\n%s", ws[n-1].Output())
			}
			s.WaitLog(t, "elastic job re-formed", 10*time.Second)
			if logs := s.Logs(); !strings.Contains(logs, "epoch=1 size="+strconv.Itoa(n-1)) {
				t.Errorf("the daemon's log lacks the new epoch's size:\n%s", logs)
			}
		})
	}
}

// TestElasticDeserter: a survivor that exits instead of re-initialising is
// dropped, and the others form the next epoch without it.
func TestElasticDeserter(t *testing.T) {
	daemontest.RaceCheckedWorkers(t)
	s := daemontest.Start(t, daemon.Config{Slots: 4})
	ws := daemontest.Spawn(t, s.Socket, "elastic", 4, "HVDD_TEST_DESERT=1")
	for _, w := range []*daemontest.Worker{ws[0], ws[2]} {
		if err := w.Wait(60 * time.Second); err != nil || !strings.Contains(w.Output(), fmt.Sprintf("REFORMED rank %d of 2", w.Rank/2)) {
			t.Errorf("rank %d: %v (want it re-formed as rank %d of 2)\n%s", w.Rank, err, w.Rank/2, w.Output())
		}
	}
	if err := ws[1].Wait(30 * time.Second); err != nil || !strings.Contains(ws[1].Output(), "DESERTER EXITS") {
		t.Errorf("rank 1 (the deserter): %v\n%s", err, ws[1].Output())
	}
	ws[3].Wait(30 * time.Second)
	s.WaitLog(t, "exited instead of re-initialising", 10*time.Second)
}

// TestElasticTimeout: when a survivor neither comes back nor exits, the
// others' Init fails after the elastic timeout with an error that says so,
// and the daemon takes the next job.
func TestElasticTimeout(t *testing.T) {
	s := daemontest.Start(t, daemon.Config{Slots: 3, ElasticTimeout: 2 * time.Second})
	ws := daemontest.Spawn(t, s.Socket, "elastic", 3, "HVDD_TEST_STALL=1")
	// While the next epoch waits for its survivors, a process that is not
	// one of them waits to join the epoch after; when the epoch cannot
	// form, it is refused.
	s.WaitLog(t, "its next epoch waits for the survivors", 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stranger := &hvdd.Client{Socket: s.Socket, Elastic: true}
	if err := stranger.Init(ctx); err == nil || !strings.Contains(err.Error(), "the elastic job this worker was to join has ended") {
		t.Errorf("a stranger's Init during the re-formation = %v, want it to wait to join and be refused when the epoch cannot form", err)
		if err == nil {
			stranger.Close()
		}
	}
	if err := ws[0].Wait(60 * time.Second); err == nil || !strings.Contains(ws[0].Output(), "Timed out waiting for the 2 surviving ranks") {
		t.Errorf("rank 0: %v (want exit 4 after the timeout)\n%s", err, ws[0].Output())
	}
	ws[1].WaitOutput(t, "STALLING", 10*time.Second)
	ws[1].Cmd.Process.Signal(syscall.SIGTERM)
	ws[1].Wait(30 * time.Second)
	ws[2].Wait(30 * time.Second)
	// The daemon is free for another job.
	daemontest.Run(t, s.Socket, "async", 3, 60*time.Second)
}

// TestElasticMustAgree: an elastic and a plain process cannot share a job.
func TestElasticMustAgree(t *testing.T) {
	s := daemontest.Start(t, daemon.Config{Slots: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first := &hvdd.Client{Socket: s.Socket, Elastic: true}
	firstErr := make(chan error, 1)
	go func() { firstErr <- first.Init(ctx) }()
	s.WaitLog(t, "client joined", 10*time.Second)
	zero := 1
	plain := &hvdd.Client{Socket: s.Socket, RequestedLocalRank: &zero}
	if err := plain.Init(ctx); err == nil || !strings.Contains(err.Error(), "every rank of a job must agree on HOROVOD_ELASTIC") {
		t.Errorf("a plain process joining an elastic job: %v", err)
	}
	cancel()
	if err := <-firstErr; err == nil {
		t.Error("the elastic process's Init returned without a job")
		first.Close()
	}
}

// TestElasticAcrossNodes: an elastic job spans several daemons. When a rank
// is lost, or a whole node, the survivors on every node re-initialise into
// the next epoch, formed by node 0 over the nodes that still have ranks, with
// a data engine connected anew among them.
func TestElasticAcrossNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node suite is long")
	}
	for _, tc := range []struct {
		name  string
		slots []int
		// The last rank is lost: it exits, or its node's daemon stops.
		nodeLost bool
		want     string // the re-formed epoch, as logged by node 0
	}{
		{"rank of a node that keeps one", []int{2, 2}, false, "size=3 node=0 nodes=2"},
		{"last rank of a node", []int{1, 1, 1}, false, "size=2 node=0 nodes=2"},
		{"down to one node", []int{1, 1}, false, "size=1 node=0 nodes=1"},
		{"whole node", []int{1, 2, 1}, true, "size=3 node=0 nodes=2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ss := startNodes(t, tc.slots...)
			var env []string
			if tc.nodeLost {
				env = append(env, "HVDD_TEST_VICTIM_HANGS=1")
			}
			ws := spawnNodesEnv(t, ss, "elastic", env, tc.slots...)
			last := len(ss) - 1
			victim := ws[last][len(ws[last])-1]
			if tc.nodeLost {
				victim.WaitOutput(t, "VICTIM HANGS", 60*time.Second)
				ss[last].Stop(t)
				victim.Cmd.Process.Kill()
			}
			n := 0
			for _, s := range tc.slots {
				n += s
			}
			for _, node := range ws {
				for _, w := range node {
					if w == victim {
						continue
					}
					if err := w.Wait(60 * time.Second); err != nil {
						t.Errorf("a survivor: %v\n%s", err, w.Output())
					} else if !strings.Contains(w.Output(), fmt.Sprintf(" of %d\n", n-1)) {
						t.Errorf("a survivor did not re-form at size %d:\n%s", n-1, w.Output())
					}
				}
			}
			if err := victim.Wait(30 * time.Second); err == nil {
				t.Errorf("the victim exited 0:\n%s", victim.Output())
			}
			ss[0].WaitLog(t, "elastic job re-formed", 10*time.Second)
			if logs := ss[0].Logs(); !strings.Contains(logs, "epoch=1 size="+strconv.Itoa(n-1)) || !strings.Contains(logs, tc.want) {
				t.Errorf("node 0's log lacks the new epoch (%s):\n%s", tc.want, logs)
			}
		})
	}
}

// TestElasticEpochNotFormed: an epoch of an elastic job that is laid out
// across nodes but cannot form does not fail the ranks waiting in their
// re-initialisation: the daemons form the next epoch from them, without the
// node that is gone. Epoch 1 (after rank 3 on node 1 is lost) either cannot
// connect its data engine, or loses node 1 (hvdd run's driver stops its
// daemon) while its engine connects; epoch 2 forms.
func TestElasticEpochNotFormed(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node suite is long")
	}
	for _, tc := range []struct {
		name     string
		nodeLost bool
	}{
		{"engine does not connect", false},
		{"node lost while the engine connects", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reached, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			var inside atomic.Int32 // nodes inside epoch 1's engine
			ss := startNodesCfg(t, func(n int, c *daemon.Config) {
				var calls atomic.Int32
				c.NewBackend = func(ctx context.Context, j daemon.MultiNodeJob) (backends.Backend, error) {
					// An engine that waits for a peer that has gone away
					// gives up when the test ends.
					ctx, cancel := context.WithCancel(ctx)
					defer cancel()
					go func() {
						select {
						case <-ctx.Done():
						case <-release:
							cancel()
						}
					}()
					// Node 0's second engine is epoch 1's. (Node 1 may
					// start epoch 2's before epoch 1's gives up.)
					if calls.Add(1) != 2 || n == 1 && !tc.nodeLost {
						return tcpFactory(ctx, j)
					}
					if !tc.nodeLost {
						return nil, errors.New("injected: the data engine does not connect")
					}
					// Node 1 goes once both nodes are inside epoch 1's
					// engine: were node 0 not there yet, epoch 1 would
					// fail before its engine, and node 0's second engine
					// would be epoch 2's.
					if inside.Add(1) == 2 {
						once.Do(func() { close(reached) })
					}
					<-ctx.Done()
					return nil, errors.New("injected: the data engine did not connect")
				}
			}, 2, 2)
			t.Cleanup(func() { close(release) }) // before the daemons stop
			env := []string{"HVDD_TEST_EPOCH_AFTER=2"}
			size := 3
			if tc.nodeLost {
				size = 2
				env = append(env, "HVDD_TEST_SIZE_AFTER=2")
			}
			ws := spawnNodesEnv(t, ss, "elastic", env, 2, 2)
			survivors := []*daemontest.Worker{ws[0][0], ws[0][1], ws[1][0]}
			if tc.nodeLost {
				select {
				case <-reached:
				case <-time.After(60 * time.Second):
					t.Fatal("the nodes never both reached epoch 1's engine")
				}
				ss[1].Stop(t)
				ws[1][0].Cmd.Process.Kill()
				survivors = survivors[:2]
			}
			for _, w := range survivors {
				if err := w.Wait(60 * time.Second); err != nil {
					t.Errorf("a survivor: %v\n%s", err, w.Output())
				} else if !strings.Contains(w.Output(), fmt.Sprintf(" of %d\n", size)) {
					t.Errorf("a survivor did not re-form at size %d:\n%s", size, w.Output())
				}
			}
			if err := ws[1][1].Wait(30 * time.Second); err == nil {
				t.Errorf("the victim exited 0:\n%s", ws[1][1].Output())
			}
			logs := ss[0].Logs()
			for _, want := range []string{"its epoch could not form across the nodes", "epoch=2 size=" + strconv.Itoa(size)} {
				if !strings.Contains(logs, want) {
					t.Errorf("node 0's log lacks %q:\n%s", want, logs)
				}
			}
		})
	}
}

// TestElasticAcrossNodesCoordinatorLost: node 0 coordinates every epoch of
// an elastic job across nodes; when it has no rank left, the survivors on
// the other nodes are told so in their re-initialisation instead of waiting.
func TestElasticAcrossNodesCoordinatorLost(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node suite is long")
	}
	ss := startNodes(t, 1, 2)
	ws := spawnNodesEnv(t, ss, "elastic", []string{"HVDD_TEST_VICTIM=0"}, 1, 2)
	if err := ws[0][0].Wait(60 * time.Second); err == nil {
		t.Errorf("the victim exited 0:\n%s", ws[0][0].Output())
	}
	for _, w := range ws[1] {
		err := w.Wait(60 * time.Second)
		if err == nil || !strings.Contains(w.Output(), "re-init: the elastic job cannot form epoch 1: node 0 (the coordinator) has no surviving ranks") {
			t.Errorf("a survivor on node 1: %v (want its re-init to fail naming node 0)\n%s", err, w.Output())
		}
	}
}

// TestElasticCoordinatorMoves: with a rendezvous that another process
// serves (hvdd run's elastic driver, hvdd rendezvous), losing node 0, the
// coordinator, does not end an elastic job: the survivors' nodes choose
// another coordinator at the rendezvous and the job goes on.
func TestElasticCoordinatorMoves(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node suite is long")
	}
	for _, tc := range []struct {
		name  string
		slots []int
		// Rank 0 is lost: it exits, or node 0's daemon stops under it.
		daemonLost bool
	}{
		{"node 0 keeps no rank", []int{1, 2}, false},
		{"node 0 keeps no rank, two nodes left", []int{1, 1, 1}, false},
		{"node 0's daemon lost", []int{1, 1, 1}, true},
		{"node 0's daemon lost, one node left", []int{1, 2}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ss := startNodesCfg(t, func(n int, c *daemon.Config) {
				c.Elastic, c.ExternalRendezvous = true, true
				if n == 0 {
					serveRendezvous(t, c.Rendezvous)
				}
			}, tc.slots...)
			env := []string{"HVDD_TEST_VICTIM=0", "HVDD_TEST_ANY_RANK=1"}
			if tc.daemonLost {
				env = append(env, "HVDD_TEST_VICTIM_HANGS=1")
			}
			ws := spawnNodesEnv(t, ss, "elastic", env, tc.slots...)
			victim := ws[0][0]
			if tc.daemonLost {
				victim.WaitOutput(t, "VICTIM HANGS", 60*time.Second)
				ss[0].Stop(t)
				victim.Cmd.Process.Kill()
			}
			survivors := slices.Concat(ws...)[1:]
			if tc.daemonLost {
				survivors = slices.Concat(ws[1:]...)
			}
			for _, w := range survivors {
				if err := w.Wait(60 * time.Second); err != nil {
					t.Errorf("a survivor: %v\n%s", err, w.Output())
				} else if !strings.Contains(w.Output(), fmt.Sprintf(" of %d\n", len(survivors))) {
					t.Errorf("a survivor did not re-form at size %d:\n%s", len(survivors), w.Output())
				}
			}
			if err := victim.Wait(30 * time.Second); err == nil {
				t.Errorf("the victim exited 0:\n%s", victim.Output())
			}
			took := 0
			for _, s := range ss[1:] {
				if strings.Contains(s.Logs(), "this node coordinates the job from now on") {
					took++
				}
			}
			if took != 1 {
				t.Errorf("%d nodes took over the coordination, want 1", took)
			}
			if tc.daemonLost || t.Failed() {
				return
			}
			// Once the job is over, node 0 coordinates the daemons' next
			// job again.
			for _, s := range ss[1:] {
				s.WaitLog(t, "the elastic job is over", 30*time.Second)
			}
			for _, node := range spawnNodes(t, ss, "async", tc.slots...) {
				for _, w := range node {
					if err := w.Wait(60 * time.Second); err != nil {
						t.Errorf("a rank of the next job: %v\n%s", err, w.Output())
					}
				}
			}
			ss[0].WaitLog(t, "this node coordinates again", 10*time.Second)
		})
	}
}

// TestElasticCoordinatorMovesTwoLost: node 0 and node 2 are lost together;
// node 1, the only survivor, ends up coordinating (first claim, or a later
// round when node 2 won and vanished), stops waiting for the lost nodes
// after the peer timeout, and goes on alone.
func TestElasticCoordinatorMovesTwoLost(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node suite is long")
	}
	ss := startNodesCfg(t, func(n int, c *daemon.Config) {
		c.Elastic, c.ExternalRendezvous = true, true
		if n == 0 {
			serveRendezvous(t, c.Rendezvous)
		}
	}, 1, 1, 1)
	ws := spawnNodesEnv(t, ss, "elastic", []string{"HVDD_TEST_VICTIM=0", "HVDD_TEST_ANY_RANK=1", "HVDD_TEST_VICTIM_HANGS=1", "HVDD_TEST_SIZE_AFTER=1"}, 1, 1, 1)
	ws[0][0].WaitOutput(t, "VICTIM HANGS", 60*time.Second)
	ss[0].Stop(t)
	ss[2].Stop(t)
	ws[0][0].Cmd.Process.Kill()
	ws[2][0].Cmd.Process.Kill()
	if err := ws[1][0].Wait(60 * time.Second); err != nil || !strings.Contains(ws[1][0].Output(), "REFORMED rank 0 of 1\n") {
		t.Errorf("node 1's rank: %v (want it re-formed alone)\n%s", err, ws[1][0].Output())
	}
	if logs := ss[1].Logs(); !strings.Contains(logs, "this node coordinates the job from now on") {
		t.Errorf("node 1 did not take over the coordination:\n%s", logs)
	}
}

// serveRendezvous serves a rendezvous store at addr for the test's daemons.
func serveRendezvous(t *testing.T, addr string) *rendezvous.Server {
	t.Helper()
	srv, err := rendezvous.NewServer(rendezvous.ServerConfig{Addr: addr, Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(context.Background())
	t.Cleanup(func() { srv.Close() })
	return srv
}

// TestElasticHostRemoved: hvdd run's elastic driver removes a host by
// setting its node's key in the rendezvous store it serves. Global rank 0
// hears of a removal (HostUpdateResult.removed), every rank resets at the
// same step without any error, the removed node's ranks are refused in
// their re-initialisation with Horovod's message, and the others go on at
// the smaller size, without that node (node 0 included: the coordination
// then moves).
func TestElasticHostRemoved(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node suite is long")
	}
	for _, tc := range []struct {
		name    string
		slots   []int
		removed int // the node removed
	}{
		{"node 1", []int{2, 1}, 1},
		{"node 0", []int{1, 2}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var srv *rendezvous.Server
			ss := startNodesCfg(t, func(n int, c *daemon.Config) {
				c.Elastic, c.ExternalRendezvous = true, true
				if n == 0 {
					srv = serveRendezvous(t, c.Rendezvous)
				}
			}, tc.slots...)
			left := 0
			for n, s := range tc.slots {
				if n != tc.removed {
					left += s
				}
			}
			ws := spawnNodesEnv(t, ss, "elasticjoin", []string{"HVDD_TEST_GROWN=" + strconv.Itoa(left)}, tc.slots...)
			ws[0][0].WaitOutput(t, "TRAINING", 60*time.Second)
			host := fmt.Sprintf("host%d.example", tc.removed)
			if err := srv.Store().Set(context.Background(), "elastic/removed/"+strconv.Itoa(tc.removed), []byte(host)); err != nil {
				t.Fatal(err)
			}
			for n, node := range ws {
				for _, w := range node {
					err := w.Wait(60 * time.Second)
					out := w.Output()
					switch {
					case err != nil:
						t.Errorf("a rank of node %d: %v\n%s", n, err, out)
					case n == tc.removed && !strings.Contains(out, "REMOVED ") || n == tc.removed && !strings.Contains(out, host+"["):
						t.Errorf("a rank of the removed node %d was not refused as removed:\n%s", n, out)
					case n != tc.removed && !strings.Contains(out, fmt.Sprintf("GROWN rank %d of %d", 0, left)) && !strings.Contains(out, fmt.Sprintf(" of %d\n", left)):
						t.Errorf("a rank of node %d did not go on at size %d:\n%s", n, left, out)
					}
				}
			}
			// Rank 0 heard of a removal only (1), not a failure.
			if out := ws[0][0].Output(); !strings.Contains(out, "NOTIFIED 1\n") {
				t.Errorf("rank 0 was not notified of a removal alone:\n%s", out)
			}
		})
	}
}

// elasticJoinWorker trains in an elastic job that grows. The first ranks
// sum a flag every step; rank 0 sets it once the daemons told it that
// workers wait to join (HostsUpdates), so that every rank sees it at the same
// step, as Horovod's check_host_updates broadcasts rank 0's view. They then
// re-initialise together (CloseToReset) and check the grown job
// ($HVDD_TEST_GROWN ranks). A joiner ($HVDD_TEST_JOINER=1) waits in Init
// until that epoch forms.
func elasticJoinWorker() int {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fail := func(format string, args ...any) int {
		fmt.Printf(format+"\n", args...)
		return 1
	}
	grown := envRank("HVDD_TEST_GROWN")
	// With $HVDD_TEST_HOLD set, rank 0 looks at its notifications only once
	// that file exists.
	held := func() bool {
		hold := os.Getenv("HVDD_TEST_HOLD")
		if hold == "" {
			return true
		}
		_, err := os.Stat(hold)
		return err == nil
	}
	c := &hvdd.Client{Elastic: true}
	if err := c.Init(ctx); err != nil {
		return fail("init: %v", err)
	}
	if os.Getenv("HVDD_TEST_JOINER") == "" {
		notified := false
		for step := 0; !notified; step++ {
			flag := []float32{0}
			if c.Rank() == 0 && held() {
				for _, u := range c.HostsUpdates() {
					// Sum the results: 2 (added) or 1 (removed).
					flag[0] += float32(u.Result)
				}
			}
			if err := hvdd.Allreduce(ctx, c, flag, hvdd.WithName(fmt.Sprint("step.", step)), hvdd.WithOp(hvdd.Sum)); err != nil {
				return fail("step %d: %v", step, err)
			}
			notified = flag[0] > 0
			if step == 1 && c.Rank() == 0 {
				fmt.Println("TRAINING")
			}
			if notified {
				fmt.Printf("NOTIFIED %v\n", flag[0])
			}
		}
		c.CloseToReset()
		c = &hvdd.Client{Elastic: true}
		if err := c.Init(ctx); err != nil {
			if strings.Contains(err.Error(), "has been removed from elastic job") {
				// Its host was removed (HVDD_TEST_GROWN is then the smaller size).
				fmt.Printf("REMOVED %v\n", err)
				return 0
			}
			return fail("re-init: %v", err)
		}
	}
	defer c.Close()
	x := []float32{1}
	if err := hvdd.Allreduce(ctx, c, x, hvdd.WithName("grown"), hvdd.WithOp(hvdd.Sum)); err != nil || c.Size() != grown || x[0] != float32(grown) || c.Epoch() != 1 {
		return fail("grown job: %v; rank %d size %d epoch %d sum %v, want size and sum %d at epoch 1", err, c.Rank(), c.Size(), c.Epoch(), x[0], grown)
	}
	fmt.Printf("GROWN rank %d of %d\n", c.Rank(), c.Size())
	return 0
}

// TestElasticJoin: workers started while an elastic job runs wait in Init;
// the daemons tell global rank 0, every rank re-initialises at the same step
// and the next epoch takes them in, after the old ranks: on one node, on
// an existing node of a multi-node job, and on a node that joins the job.
func TestElasticJoin(t *testing.T) {
	daemontest.RaceCheckedWorkers(t)
	for _, tc := range []struct {
		name    string
		slots   []int // the nodes at the start
		joinAt  int   // the node the joiner starts on (len(slots): a new node)
		wantLog string
	}{
		{"one node", []int{2}, 0, "size=3"},
		{"existing node", []int{1, 1}, 1, "size=3 node=0 nodes=2"},
		{"new node", []int{1, 1}, 2, "size=3 node=0 nodes=3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			grown := 1
			for _, n := range tc.slots {
				grown += n
			}
			env := []string{fmt.Sprint("HVDD_TEST_GROWN=", grown)}
			var ss []*daemontest.Server
			var sockets []string
			if len(tc.slots) == 1 {
				ss = []*daemontest.Server{daemontest.Start(t, daemon.Config{Slots: tc.slots[0]})}
			} else {
				// A node that joins later is one more (--nodes K+1
				// --node-rank K); the others form the job without it.
				all := tc.slots
				if tc.joinAt == len(tc.slots) {
					all = append(slices.Clone(tc.slots), 1)
				}
				ss = startNodesCfg(t, func(n int, c *daemon.Config) {
					c.Elastic = true
					c.Nodes = max(len(tc.slots), n+1)
				}, all...)
			}
			for _, s := range ss {
				sockets = append(sockets, s.Socket)
			}
			first := spawnSocketsEnv(t, sockets[:len(tc.slots)], "elasticjoin", env, tc.slots...)
			first[0][0].WaitOutput(t, "TRAINING", 60*time.Second)
			joiner := daemontest.Spawn(t, sockets[tc.joinAt], "elasticjoin", 1, append(env, "HVDD_TEST_JOINER=1")...)[0]
			want := map[string]bool{}
			for r := range grown {
				want[fmt.Sprintf("GROWN rank %d of %d", r, grown)] = true
			}
			for _, w := range append(slices.Concat(first...), joiner) {
				if err := w.Wait(60 * time.Second); err != nil {
					t.Errorf("a rank: %v\n%s", err, w.Output())
				}
				for line := range want {
					if strings.Contains(w.Output(), line) {
						delete(want, line)
					}
				}
			}
			if !strings.Contains(joiner.Output(), fmt.Sprintf("GROWN rank %d of %d", grown-1, grown)) {
				t.Errorf("the joiner is not the last rank:\n%s", joiner.Output())
			}
			if len(want) > 0 {
				t.Errorf("no rank printed %v", want)
			}
			ss[0].WaitLog(t, "elastic job re-formed", 10*time.Second)
			if logs := ss[0].Logs(); !strings.Contains(logs, tc.wantLog) || !strings.Contains(logs, "epoch=1") {
				t.Errorf("node 0's log lacks the grown epoch (%s):\n%s", tc.wantLog, logs)
			}
		})
	}
}

// TestElasticLinkCut: two nodes in network namespaces; the link to node 1
// is cut while the job waits for its rank (no FIN, no RST: packets stop).
// Node 0 declares node 1 lost after its peer timeout, and its rank goes on
// alone in the next epoch.
func TestElasticLinkCut(t *testing.T) {
	hosts := daemontest.Hosts(t, 2)
	ds := twoNodes(t, hosts, secretA, secretA)
	var ws []*daemontest.Worker
	for _, d := range ds {
		ws = append(ws, daemontest.Spawn(t, d.socket, "elastic", 1, "HVDD_TEST_VICTIM_HANGS=1")...)
	}
	ws[1].WaitOutput(t, "VICTIM HANGS", 60*time.Second)
	cut := time.Now()
	hosts[1].SetLink(t, false)
	if err := ws[0].Wait(60 * time.Second); err != nil || !strings.Contains(ws[0].Output(), "REFORMED rank 0 of 1") {
		t.Fatalf("rank 0: %v (want it re-formed alone)\n%s", err, ws[0].Output())
	}
	t.Logf("rank 0 re-formed and ran a step %v after the cut", time.Since(cut).Round(time.Millisecond))
	ws[1].Cmd.Process.Kill()
}

// TestElasticJoinerNodeLost: a node that waits to join a running elastic
// job is lost before the job resets (its daemon stops): node 0 drops it, and
// the next epoch forms without it instead of waiting for its data engine.
func TestElasticJoinerNodeLost(t *testing.T) {
	hold := filepath.Join(t.TempDir(), "hold")
	env := []string{"HVDD_TEST_GROWN=2", "HVDD_TEST_HOLD=" + hold}
	ss := startNodesCfg(t, func(n int, c *daemon.Config) {
		c.Elastic = true
		c.Nodes = max(2, n+1)
	}, 1, 1, 1)
	first := spawnSocketsEnv(t, []string{ss[0].Socket, ss[1].Socket}, "elasticjoin", env, 1, 1)
	first[0][0].WaitOutput(t, "TRAINING", 60*time.Second)
	joiner := daemontest.Spawn(t, ss[2].Socket, "elasticjoin", 1, append(env, "HVDD_TEST_JOINER=1")...)[0]
	ss[0].WaitLog(t, "a node waits to join the elastic job at its next epoch", 60*time.Second)
	ss[2].Stop(t)
	ss[0].WaitLog(t, "a node waiting to join the elastic job was lost", 30*time.Second)
	if err := joiner.Wait(30 * time.Second); err == nil {
		t.Errorf("the joiner of the lost node exited 0:\n%s", joiner.Output())
	}
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, w := range slices.Concat(first...) {
		if err := w.Wait(60 * time.Second); err != nil || !strings.Contains(w.Output(), "GROWN rank") || !strings.Contains(w.Output(), " of 2") {
			t.Errorf("a rank: %v (want it re-formed at size 2)\n%s", err, w.Output())
		}
	}
}
