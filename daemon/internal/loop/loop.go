package loop

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hvdd/hvdd/daemon/internal/exec"
	"github.com/hvdd/hvdd/daemon/internal/exec/device"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/internal/poll"
	"github.com/hvdd/hvdd/daemon/metrics"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/daemon/timeline"
	"github.com/hvdd/hvdd/ipc"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

// Messages other goroutines post to the loop through its poller.
type (
	msgConn  struct{ c *client } // accepted connection
	msgStall struct{}            // the stall timer fired
	msgCycle struct{}            // the cycle timer fired
	MsgQuit  struct{}            // Close was called
	// msgOpened: the IPC handles of op o, which client c enqueued with e,
	// have been opened (or failed to, err).
	msgOpened struct {
		c   *client
		o   *job.Op
		e   *ipcpb.Enqueue
		err error
	}
)

// Loop owns the daemon's job state and every client's read side; only its
// goroutine touches them.
type Loop struct {
	tlGen   uint32 // timelines started (tracer.gen)
	s       Server
	cfg     Config
	mapped  shmMapped     // shared memory mapped, for the metrics (metrics.go)
	done    chan struct{} // closed when run has returned
	p       *poll.Poller
	epoch   time.Time
	clients map[int]*client // by socket fd
	lanes   map[laneKey]*lane
	order   []*lane // the lanes, oldest first (lanes.go)
	rr      int     // where dispatch starts: the lane after the last to get the executor
	nextJob uint64

	x        *exec.Executor
	execBusy bool
	dead     []*client // closed clients whose outputs wait for an idle executor

	nodes job.Formation // how jobs form: on this node alone, or across nodes
	// across is nodes' part across nodes, probed once in New: nil on one
	// node.
	across job.FormationAcross
	again  []*client // clients with frames left over from the last pass
	chans  []*client // clients with a shared-memory channel

	stall        *time.Timer
	cycle        *time.Timer
	lastDispatch time.Time
	spinUntil    time.Time
	quit         bool

	// The settings the autotuner may change (autotune.go): Config's
	// CycleTime and Spin at first.
	cycleTime, spin time.Duration

	errs []*ipcpb.StatusError // the last errors, for hvdd status (status.go)

	tl        *tracer        // Horovod's timeline; nil when off (tracing.go)
	tlClosing sync.WaitGroup // timelines whose files are still being completed

	// What service.go keeps: Shutdown's drain, and the status last
	// reported to Config.OnStatus.
	draining, drained      bool
	reported, lastDraining bool
	lastJobs               []JobStatus
}

// DaemonVersion is the daemon's version string (Welcome, hvdd status).
const DaemonVersion = "0.1.0"

// Config is what the loop takes of the daemon's configuration: the
// fields of Config of the same names, which say what they mean, and what
// the Server made from it.
type Config struct {
	Slots                     int
	FusionThreshold           int64
	CycleTime, Spin           time.Duration
	StallCheck, StallShutdown time.Duration
	OutputRegion              int64
	Nodes, NodeRank           int
	// MultiNode says that the daemon runs one job at a time, formed across
	// nodes (Nodes > 1 or Elastic).
	MultiNode      bool
	ElasticTimeout time.Duration
	ExitAfterJob   bool
	Autotune       AutotuneConfig
	OnStatus       func(Status)
	Metrics        *metrics.Metrics
	AllowGIDs      []uint32

	Log  *slog.Logger
	UID  uint32       // the daemon's uid: its own processes and root may connect
	GPUs *device.GPUs // the node's GPUs; nil when CPU-only
}

// Server is what the loop asks of the Server that runs it.
type Server interface {
	// ConnClosed is told that a client connection closed (the idle exit
	// counts them).
	ConnClosed()
	// ShutdownNote is what clients are told when the daemon stops.
	ShutdownNote() string
	// Close stops the daemon (--exit-after-job).
	Close() error
	// GPUStatus fills st's GPU fields (gpus, gpus_sampled_ms,
	// gpu_sampling_error) from the Server's last sampling round, for hvdd
	// status. It returns at once: the loop never waits for NVML.
	GPUStatus(st *ipcpb.Status)
}

// New returns the loop, its executor x and its formation made by
// newFormation, which gets the loop as the formation's hooks.
func New(cfg Config, s Server, p *poll.Poller, x *exec.Executor, newFormation func(job.LoopHooks) (job.Formation, error)) (*Loop, error) {
	l := &Loop{s: s, cfg: cfg, p: p, x: x, done: make(chan struct{}), epoch: time.Now(), clients: make(map[int]*client), lanes: make(map[laneKey]*lane),
		cycleTime: cfg.CycleTime, spin: cfg.Spin}
	f, err := newFormation(l)
	if err != nil {
		return nil, err
	}
	l.nodes = f
	l.across, _ = f.(job.FormationAcross)
	return l, nil
}

// OneNodeFormation is the formation of a daemon that forms its jobs alone.
func OneNodeFormation(fusionThreshold int64) func(job.LoopHooks) (job.Formation, error) {
	return func(h job.LoopHooks) (job.Formation, error) {
		return &oneNode{hooks: h, fusionThreshold: fusionThreshold}, nil
	}
}

// Now is the plan's logical clock: milliseconds since the loop started.
func (l *Loop) Now() int64 { return time.Since(l.epoch).Milliseconds() }

// yieldEvery is how often at most the loop yields its P (runtime.Gosched)
// before it blocks in epoll_wait, when its previous wait lasted over a
// millisecond (ops that come apart, not a busy job). Go's sysmon takes the P
// of a goroutine that has held one scheduling tick for 10 ms, even while it
// waits in a system call, and then restarts its own polling at 20 µs
// intervals for a millisecond or more. The loop never gives up its tick by
// itself, so in a job whose ops come a few ms apart (a training step's
// compute between them) that polling cost the daemon more CPU than its
// work. At 10 ms gaps (bench/gapcpu.sh) the daemon took 7-8 % of a core
// without the yield, 2.5-3.5 % with it.
const yieldEvery = 5 * time.Millisecond

// Run is the daemon's event loop. It waits in epoll for client frames and
// posted messages; after any activity it keeps polling without blocking for
// cfg.Spin, so that the next request of a busy job is picked up without the
// cost of a wake-up, then blocks again. An idle daemon sleeps in epoll_wait.
func (l *Loop) Run() {
	defer close(l.done)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	go l.x.Run()
	defer l.shutdown()
	sl := sleeper{spin: l.spin}
	l.afterPass()
	for !l.quit {
		events, slept, err := l.wait(&sl)
		if err != nil {
			l.cfg.Log.Error("event loop failed", "err", err)
			return
		}
		active := len(events) > 0
		l.serveEvents(events)
		if l.serveChannels() {
			active = true
		}
		if !active {
			if !slept {
				unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			}
			continue
		}
		l.endPass()
		if l.spin > 0 {
			l.spinUntil = time.Now().Add(sl.spin)
		}
	}
}

// sleeper is what the loop remembers of its waits: its adaptive spin
// window, when it last yielded its P, and how long its last blocking wait
// took.
type sleeper struct {
	spin      time.Duration
	yielded   time.Time
	lastSleep time.Duration
}

// wait waits for events: it polls while the spin window lasts, else sleeps
// in epoll (telling the channels' clients to ring the doorbell) until
// something happens. slept reports a blocking wait.
func (l *Loop) wait(sl *sleeper) (events []unix.EpollEvent, slept bool, err error) {
	timeout := 0
	if l.spin <= 0 || !time.Now().Before(l.spinUntil) {
		// Going to sleep: tell the channels' clients to ring the
		// doorbell, unless something arrived meanwhile.
		if !l.setAsleep(true) {
			timeout = -1
			if l.outWaiting() {
				// A client's frames wait for room in its ring, and
				// nothing tells us when it makes room: look again soon.
				timeout = 1
			}
		}
	}
	var start time.Time
	if timeout != 0 {
		start = time.Now()
		if sl.lastSleep > time.Millisecond && start.Sub(sl.yielded) > yieldEvery {
			// See yieldEvery.
			runtime.Gosched()
			sl.yielded = start
		}
	}
	events, err = l.p.Wait(timeout)
	if timeout != 0 {
		l.setAsleep(false)
		sl.lastSleep = time.Since(start)
		sl.spin = ipc.AdaptSpin(sl.spin, l.spin, sl.lastSleep)
	}
	return events, timeout != 0, err
}

// serveEvents handles what epoll reported: the mailbox's messages, the
// clients' sockets, the formation's control links.
func (l *Loop) serveEvents(events []unix.EpollEvent) {
	for _, ev := range events {
		fd := int(ev.Fd)
		if fd == l.p.Evfd {
			for _, m := range l.p.Drain() {
				l.message(m)
			}
			continue
		}
		c := l.clients[fd]
		if c == nil {
			if l.across != nil {
				l.across.Readable(fd)
			}
			continue
		}
		l.serveClient(c, ev.Events&(unix.EPOLLHUP|unix.EPOLLERR) != 0, true)
	}
}

// serveChannels reads the clients' shared-memory channels, which epoll
// does not see, and flushes the frames that waited for room in them. It
// reports whether a channel had frames.
func (l *Loop) serveChannels() (active bool) {
	for _, c := range l.chans {
		if !c.dropped && c.ch.Pending() {
			l.serveClient(c, false, false)
			active = true
		}
		if !c.dropped && c.hasOut.Load() {
			if err := c.flushOut(); err != nil {
				l.drop(c, err)
			}
		}
	}
	return active
}

// endPass ends an active pass: it serves again the clients cut off by the
// per-wake frame limit, sends what became ready to the other nodes,
// dispatches, and arms the stall timer.
func (l *Loop) endPass() {
	// Clients cut off by the per-wake frame limit still hold frames in
	// user space, which epoll cannot see: serve them again.
	for len(l.again) > 0 {
		again := l.again
		l.again = nil
		for _, c := range again {
			if !c.dropped {
				l.serveClient(c, false, true)
			}
		}
	}
	if l.tl != nil && l.tl.markCycles {
		l.tl.w.Mark("CYCLE_START")
	}
	for _, j := range l.jobs() {
		if j.Across != nil {
			j.Across.Flush()
		}
	}
	l.dispatch()
	for _, j := range l.jobs() {
		if j.Across != nil {
			j.Across.Expect(len(j.Pending) > 0)
		}
	}
	l.armStallTimer()
	l.afterPass()
}

// outWaiting reports whether some client has frames waiting for room in its
// channel's ring.
func (l *Loop) outWaiting() bool {
	for _, c := range l.chans {
		if !c.dropped && c.hasOut.Load() {
			return true
		}
	}
	return false
}

// setAsleep sets the asleep flag of every channel. Setting it, it reports
// whether a ring holds frames after all (then the flags are cleared again and
// the loop must not sleep).
func (l *Loop) setAsleep(v bool) (pending bool) {
	for _, c := range l.chans {
		c.ch.SetAsleep(v)
	}
	if !v {
		return false
	}
	for _, c := range l.chans {
		if c.ch.Pending() {
			l.setAsleep(false)
			return true
		}
	}
	return false
}

// serveClient handles what a client sent; hup reports a hung-up socket, sock
// a readable one.
func (l *Loop) serveClient(c *client, hup, sock bool) {
	more, err := l.readable(c, sock)
	if err != nil || hup && !c.ic.Buffered() {
		if err == nil {
			err = ipc.ErrClosed
		}
		l.drop(c, err)
		return
	}
	if more {
		l.again = append(l.again, c)
	}
}

func (l *Loop) message(m any) {
	switch m := m.(type) {
	case msgConn:
		c := m.c
		fd := c.ic.FD()
		if err := l.p.Add(fd); err != nil {
			l.cfg.Log.Error("cannot watch client connection", "pid", c.pid, "err", err)
			c.ic.Close()
			l.s.ConnClosed()
			return
		}
		c.fd = fd
		l.clients[fd] = c
	case job.MsgExecIdle:
		l.execBusy = false
		for _, j := range l.jobs() {
			if j.Across != nil {
				j.Across.TraceSent()
			}
		}
		l.closeDead()
	case msgOpened:
		l.opened(m)
	case msgP2PDone:
		l.p2pDone(m)
	case msgStall:
		l.stall = nil
		l.checkStalls()
	case msgCycle:
		l.cycle = nil
	case MsgQuit:
		l.quit = true
	case msgProbe:
		m.reply <- l.serviceStatus()
	case MsgDrain:
		l.drain()
	case msgReformTimeout:
		l.reformTimeout(m.r)
	case msgReformCheck:
		l.reformCheck(m.r)
	case msgMetrics:
		l.fillSnapshot(m)
	case job.MsgExecErr:
		l.execErr(m)
	default:
		if l.across == nil || !l.across.Message(m) {
			l.cfg.Log.Error("unknown message to the loop", "type", fmt.Sprintf("%T", m))
		}
	}
}

// execErr answers the ops of a collective across nodes that failed, and
// fails the job with the engine's error unless it failed before.
//
// A job that failed first (a node lost, an abort from another node) had
// its engine closed for it, here and on the other nodes: the collective's
// error is then an echo of that failure, and the ranks hear its cause, as
// its pending ops did. The echo is this node's own close
// (backends.ErrClosed), or a peer's close that the engine saw first, and
// which names that peer, a survivor, as lost (the tcp engine's "peer
// closed its backend"): an 8-node job's ranks behind the lost node's ring
// neighbours hear of the loss from the coordinator, whose close may reach
// their engine before their own.
func (l *Loop) execErr(m job.MsgExecErr) {
	j := m.Job
	if f := j.Failed; f != nil && f.GetCode() == ipcpb.Code_CODE_ABORTED {
		if !m.Closed {
			l.cfg.Log.Debug("a collective failed after its job: its ranks get the job's failure", "job", j.ID, "err", m.Err, "job_err", f.GetError())
		}
		job.FinishRows(m.Ops, f)
		return
	}
	job.FinishRows(m.Ops, &ipcpb.Done{Code: ipcpb.Code_CODE_ABORTED, Error: m.Err.Error()})
	if !l.Current(j) || j.Failed != nil {
		return
	}
	if m.Lost > 0 && j.Across != nil {
		// The engine named the node it lost: the Abort names it too, so
		// that every node closes its engine naming it (see
		// CoordinationAcross.Lost).
		j.Across.Lost(m.Lost - 1)
	}
	l.Abort(j, ipcpb.Code_CODE_ABORTED, m.Err.Error(), true)
}

// opened goes on with an op whose device tensor's handles were opened off
// the loop: it joins the negotiation, or is refused for a failed open, or
// is dropped with its client.
func (l *Loop) opened(m msgOpened) {
	switch {
	case m.c.dropped:
		m.o.Release()
	case m.err != nil:
		m.o.Release()
		l.refuseOp(m.c, m.o.ID, m.e, m.err)
	default:
		l.enqueue(m.o)
	}
}

// refuseOp answers an Enqueue the daemon cannot take with why.
func (l *Loop) refuseOp(c *client, id uint32, e *ipcpb.Enqueue, err error) {
	l.refusedOp(c, e)
	code := ipcpb.Code_CODE_INVALID_ARGUMENT
	if errors.Is(err, device.ErrGPUOpen) || errors.Is(err, device.ErrGPULost) { // the GPU failed, not the request
		code = ipcpb.Code_CODE_INTERNAL
	}
	c.Reply(id, &ipcpb.Done{Code: code, Error: err.Error()})
}

// drop closes a client's connection after an error or its close, telling it
// why when the error is the client's fault.
func (l *Loop) drop(c *client, err error) {
	if c.dropped {
		return
	}
	c.dropped = true
	if ipc.IsProtocol(err) {
		l.cfg.Log.Warn("closing client connection: protocol error", "pid", c.pid, "err", err)
		c.fatal(ipcpb.Code_CODE_PROTOCOL, err.Error())
	} else if err != nil && !errors.Is(err, ipc.ErrClosed) {
		l.cfg.Log.Warn("closing client connection", "pid", c.pid, "err", err)
	}
	l.p.Del(c.fd)
	delete(l.clients, c.fd)
	for i, x := range l.chans {
		if x == c {
			l.chans = append(l.chans[:i], l.chans[i+1:]...)
			break
		}
	}
	c.ic.Close()
	c.releaseConn()
	l.s.ConnClosed()
	l.closed(c, c.bye, err)
}

// closeDead releases the output regions of closed clients once the executor
// can no longer be writing into them.
func (l *Loop) closeDead() {
	if l.execBusy {
		return
	}
	for _, c := range l.dead {
		c.out.Close()
	}
	l.dead = nil
}

// shutdown fails the running jobs and closes every connection.
func (l *Loop) shutdown() {
	for _, j := range l.jobs() {
		if j.Formed && j.Failed == nil && j.Members.Nodes() > 1 && j.Across != nil {
			// To the other nodes this node is lost: their ranks cannot go
			// on with its ranks gone (an elastic job re-forms without it).
			j.Across.Abort(ipcpb.Code_CODE_ABORTED, fmt.Sprintf("node %d%s was lost: its hvdd daemon is shutting down",
				l.cfg.NodeRank, j.Members.RankRange(j.Members.Node)), true)
		}
		l.fail(j, ipcpb.Code_CODE_SHUT_DOWN, l.s.ShutdownNote())
	}
	for _, c := range l.clients {
		l.drop(c, nil)
	}
	for _, ln := range l.order {
		for _, c := range ln.waiting {
			c.out.Close()
		}
		if ln.reform != nil {
			ln.reform.stop()
		}
	}
	close(l.x.Work)
	<-l.x.Stopped
	l.execBusy = false
	l.closeDead()
	l.cfg.GPUs.Close()
	if l.stall != nil {
		l.stall.Stop()
	}
	if l.cycle != nil {
		l.cycle.Stop()
	}
	l.stopTimeline(nil, nil)
	l.tlClosing.Wait()
	l.nodes.Close()
	l.p.Close()
}

func (l *Loop) hello(c *client, h *ipcpb.Hello) {
	c.helloMsg = h
	if l.refuseDraining(c) {
		return
	}
	ln, why := l.laneFor(c, h)
	if ln == nil {
		l.refuse(c, why)
		return
	}
	c.lane = ln
	j := ln.job
	if j != nil && (j.Failed != nil || j.Formed) {
		// A rank of the elastic job that re-initialises (its old connection
		// may not have closed yet here) waits for the next epoch.
		member := j.Elastic && slices.ContainsFunc(j.Slots, func(x job.Conn) bool { return x != nil && x.PID() == c.pid })
		if !member && h.GetElastic() && j.Elastic && (j.Failed == nil || j.Failed.GetCode() == ipcpb.Code_CODE_ABORTED) {
			// A worker that joins the running (or failing) elastic job.
			l.addJoiner(c, j)
			return
		}
		if j.Failed != nil || member {
			// The last job is failing; its clients are on their way out.
			ln.waiting = append(ln.waiting, c)
			return
		}
		l.refuse(c, fmt.Sprintf("this daemon is running job %s of %d ranks (pids %s); wait for it to end, give this job another name (hvdd run --job NAME, or HVDD_JOB), or start another daemon with a different --socket",
			ln.name(), len(j.Slots), j.PIDs()))
		return
	}
	lr := int(h.GetLocalRank())
	if ln.reform != nil {
		var why string
		if lr, why = l.reformRank(ln, c, h); why != "" {
			l.refuse(c, why)
			return
		}
		if lr == joinLater {
			return
		}
	}
	if j == nil {
		j = l.openJob(ln, h.GetElastic())
	}
	switch {
	case h.GetElastic() != j.Elastic:
		l.refuse(c, fmt.Sprintf("every rank of a job must agree on HOROVOD_ELASTIC: job %d is elastic=%v, this process elastic=%v", j.ID, j.Elastic, h.GetElastic()))
		return
	case int(h.GetLocalSize()) != 0 && int(h.GetLocalSize()) != ln.size && !l.cfg.MultiNode:
		l.refuse(c, fmt.Sprintf("job %s has %d processes on this node, this process says %d (HVDD_LOCAL_SIZE): every process of a job must agree", ln.name(), ln.size, h.GetLocalSize()))
		return
	case lr >= len(j.Slots):
		l.refuse(c, fmt.Sprintf("local rank %d is out of range: job %s has %d processes on this node (local ranks 0..%d)", lr, ln.name(), len(j.Slots), len(j.Slots)-1))
		return
	case lr >= 0 && j.Slots[lr] != nil:
		l.refuse(c, fmt.Sprintf("local rank %d is already taken by pid %d", lr, j.Slots[lr].PID()))
		return
	case lr < 0:
		for i, s := range j.Slots {
			if s == nil {
				lr = i
				break
			}
		}
	}
	j.Slots[lr] = c
	j.Joined++
	j.Open++
	c.job, c.localRank, c.rank = j, lr, lr
	c.groups = make(map[uint64][]*job.Op)
	l.cfg.Log.Debug("client joined", "pid", c.pid, "local_rank", lr, "job", j.ID, "name", ln.key.name, "uid", ln.key.uid, "have", j.Joined, "want", len(j.Slots))
	if j.Joined < len(j.Slots) {
		return
	}
	// Every local client is here: the job forms, alone or with the other
	// nodes.
	l.nodes.Complete(j)
}

// openJob makes the job the next hellos of ln join: the forming epoch of an
// elastic job (elastic.go), else a fresh job of the lane's size.
func (l *Loop) openJob(ln *lane, elastic bool) *job.Job {
	j := &job.Job{Pending: make(map[job.OpKey]*job.Op), Elastic: elastic, UID: ln.key.uid, Name: ln.key.name, M: ln.m}
	if r := ln.reform; r != nil && r.dead == "" {
		j.ID, j.Epoch, j.Slots = r.id, r.epoch, make([]job.Conn, len(r.survivors))
	} else {
		l.nextJob++
		j.ID, j.Slots = l.nextJob, make([]job.Conn, ln.size)
	}
	ln.job = j
	return j
}

// Start begins a formed job (loopHooks), whose coordination its formation
// set (Job.SetCoord): it sends every local client its Welcome.
func (l *Loop) Start(j *job.Job, m job.Membership) {
	m.Epoch = j.Epoch
	j.Members = m
	j.Formed = true
	j.FormedAt = time.Now()
	j.GlobalRows = make([]int, m.Size)
	for i := range j.GlobalRows {
		j.GlobalRows[i] = -1
	}
	for lr := range j.Slots {
		j.GlobalRows[m.Offset+lr] = m.Offset + lr
	}
	j.Barriers = map[int32][]int{0: make([]int, m.Size)}
	backendNames := []string{"shm"}
	if b := j.Engine(); b != nil {
		backendNames = append(backendNames, b.Name())
	}
	l.cfg.Log.Info("job formed", "job", j.ID, "size", m.Size, "node", m.Node, "nodes", m.Nodes(), "pids", j.PIDs(), "elastic", j.Elastic, "epoch", m.Epoch)
	l.startTuner(j)
	l.reformed(j)
	l.helloTimeline(j)
	homog := m.Homogeneous()
	for _, s := range j.Slots {
		cl := clientOf(s)
		cl.rank = m.Offset + cl.localRank
		crossRank, crossSize := m.Cross(cl.localRank)
		cl.sendSocket(0, &ipcpb.ServerMessage{Msg: &ipcpb.ServerMessage_Welcome{Welcome: &ipcpb.Welcome{
			Version: ipc.Version, Rank: int32(cl.rank), Size: int32(m.Size),
			LocalRank: int32(cl.localRank), LocalSize: int32(len(j.Slots)),
			CrossRank: int32(crossRank), CrossSize: int32(crossSize), IsHomogeneous: homog,
			DaemonVersion: DaemonVersion, JobId: j.ID, Backends: backendNames, Epoch: m.Epoch,
			GpuUuids: l.cfg.GPUs.UUIDs(),
		}}}, -1)
	}
}

// now, executing and current serve loopHooks.
func (l *Loop) Executing() bool { return l.execBusy }

// Current reports whether j is its lane's job still (job.LoopHooks).
func (l *Loop) Current(j *job.Job) bool {
	if j == nil {
		return false
	}
	ln := l.laneOf(j)
	return ln != nil && ln.job == j
}

// refuse ends a client that cannot join: it gets a Fatal and its connection is
// closed, which its reader reports as an ordinary close.
func (l *Loop) refuse(c *client, msg string) {
	l.cfg.Log.Warn("refusing client", "pid", c.pid, "reason", msg)
	l.noteError(nil, fmt.Sprintf("refused pid %d (uid %d): %s", c.pid, c.uid, msg))
	c.fatal(ipcpb.Code_CODE_BUSY, msg)
	l.drop(c, nil)
}

func (l *Loop) closed(c *client, bye bool, err error) {
	ln := c.lane
	if ln != nil {
		if i := slices.Index(ln.waiting, c); i >= 0 {
			ln.waiting = slices.Delete(ln.waiting, i, i+1)
		}
		if i := slices.Index(ln.joiners, c); i >= 0 {
			ln.joiners = slices.Delete(ln.joiners, i, i+1)
		}
	}
	l.dead = append(l.dead, c)
	l.closeDead()
	j := c.job
	if j == nil {
		if ln != nil {
			l.endLane(ln)
		}
		return
	}
	for _, g := range c.groups {
		for _, o := range g {
			o.Release()
		}
	}
	c.groups = nil
	j.Open--
	if j.Formed && j.Elastic && bye && !c.exiting {
		j.NoteSurvivor(c)
	}
	if j.Formed && j.Elastic && bye && c.exiting && l.across != nil {
		// hvdd run waits for the exit status of a rank that says its
		// process exits (each such rank: the first ends the epoch, the
		// others follow it).
		l.across.RankExiting(c.Worker())
	}
	if !j.Formed {
		j.Slots[c.localRank] = nil
		j.Joined--
	} else if j.Failed == nil && j.Elastic && bye && c.reset {
		// Horovod's reset after a host update: every rank follows at the
		// same step, and the next epoch takes in the waiting workers.
		l.Abort(j, ipcpb.Code_CODE_ABORTED, fmt.Sprintf("rank %d (pid %d) re-initialises into the next epoch: %s", c.rank, c.pid, hostsUpdatedCause), true)
	} else if j.Failed == nil {
		where := ""
		if j.Members.Nodes() > 1 {
			where = fmt.Sprintf(" on node %d", j.Members.Node)
		}
		switch {
		case bye && j.Elastic && c.exiting:
			// A rank whose process exits while its elastic job runs has
			// left it, whether it failed (an exception) or not: the others
			// reset and go on without it, as after a lost rank (Horovod's
			// workers see its connections close). hvdd run judges the exit
			// by its status.
			l.Abort(j, ipcpb.Code_CODE_ABORTED, fmt.Sprintf("rank %d (pid %d%s) %s", c.rank, c.pid, where, job.RankExitedCause), true)
		case bye:
			l.Abort(j, ipcpb.Code_CODE_SHUT_DOWN, fmt.Sprintf(
				"Horovod has been shut down: rank %d (pid %d%s) called shutdown() or exited while other ranks still had collectives to run; every rank must run the same collectives", c.rank, c.pid, where), true)
		default:
			why := "its connection closed without shutdown: the process died or was killed"
			if err != nil && !errors.Is(err, ipc.ErrClosed) {
				why = err.Error()
			}
			l.Abort(j, ipcpb.Code_CODE_ABORTED, fmt.Sprintf("rank %d (pid %d%s) was lost: %s", c.rank, c.pid, where, why), true)
		}
	}
	if j.Open == 0 {
		l.jobEnded(j)
	}
}

// jobEnded ends j once its last client left it.
func (l *Loop) jobEnded(j *job.Job) {
	ln := l.laneOf(j)
	// Horovod's shutdown ends its timeline too.
	l.stopTimeline(j, nil)
	if ln.tune != nil {
		ln.tune.Close()
	}
	st := j.Stats
	l.cfg.Log.Info("job ended", "job", j.ID, "name", ln.key.name, "batches", st.Batches, "responses", st.Responses, "tensors", st.Tensors, "bytes", st.Bytes)
	l.nodes.Ended(j)
	if j.Across != nil {
		j.Across.End()
	}
	ln.job = nil
	l.reformAfter(j)
	w := ln.waiting
	ln.waiting = nil
	for _, c := range w {
		l.hello(c, c.helloMsg)
	}
	l.seatJoiners(ln)
	l.endLane(ln)
}

// endLane forgets a lane that holds nothing any more; a daemon started
// with --exit-after-job exits once it has none.
func (l *Loop) endLane(ln *lane) {
	l.dropLane(ln)
	if l.cfg.ExitAfterJob && len(l.order) == 0 && !l.quit {
		l.cfg.Log.Info("job over; exiting (--exit-after-job)")
		// Close posts to this loop: not from the loop's own goroutine.
		go l.s.Close()
	}
}

// fail marks the job failed and answers every pending op with the error.
func (l *Loop) fail(j *job.Job, code ipcpb.Code, msg string) {
	if j.Failed != nil {
		return
	}
	j.Failed = &ipcpb.Done{Code: code, Error: msg}
	j.FailedAt = time.Now()
	switch {
	case !j.Formed:
	case (code == ipcpb.Code_CODE_SHUT_DOWN || job.IsRankExited(msg)) && len(j.Pending) == 0:
		// An orderly shutdown, or a rank's exit from an elastic job, with
		// nothing in flight: the job may be ending. (If the other ranks go
		// on, their next collectives fail and the re-formation says why.)
		l.cfg.Log.Debug("job shutting down", "job", j.ID, "why", msg)
	case isHostsUpdated(msg):
		// Not a failure: the ranks reset together (elastic.go).
		l.cfg.Log.Warn("elastic job resets: its hosts were updated", "job", j.ID, "why", msg)
	default:
		l.cfg.Log.Error("job failed", "job", j.ID, "err", msg, "pending", len(j.Pending))
		l.noteError(j, "job failed: "+msg)
	}
	for k, o := range j.Pending {
		o.Finish(j.Failed)
		delete(j.Pending, k)
	}
	failP2P(j)
	for i, q := range j.SetQueue {
		for _, r := range q {
			if r.Conn != nil {
				r.Conn.Reply(r.ID, j.Failed)
			}
		}
		j.SetQueue[i] = nil
	}
	for _, q := range j.LocalSets {
		for _, m := range q {
			for _, r := range m {
				if r.Conn != nil {
					r.Conn.Reply(r.ID, j.Failed)
				}
			}
		}
	}
	j.LocalSets = nil
	for _, s := range j.Slots {
		c := clientOf(s)
		if c == nil {
			continue
		}
		for id, g := range c.groups {
			for _, o := range g {
				o.Finish(j.Failed)
			}
			delete(c.groups, id)
		}
	}
}

func (l *Loop) enqueue(o *job.Op) {
	l.arrived(o)
	c := clientOf(o.Conn)
	j := c.job
	switch {
	case j == nil || !j.Formed:
		o.Finish(&ipcpb.Done{Code: ipcpb.Code_CODE_INVALID_ARGUMENT, Error: "enqueue before the job was formed: wait for init() to return"})
		return
	case j.Failed != nil:
		o.Finish(j.Failed)
		return
	}
	o.Req.Rank = c.rank
	switch o.Type {
	case tensor.Send, tensor.Recv:
		l.p2p(j, o)
		return
	case tensor.Barrier:
		n := j.Barriers[o.Req.ProcessSet]
		if n == nil {
			n = make([]int, j.Members.Size)
			j.Barriers[o.Req.ProcessSet] = n
		}
		o.Req.Name = fmt.Sprintf("barrier.%d", n[c.rank])
		n[c.rank]++
	case tensor.Join:
		o.Req.Name = "join"
	}
	o.Name = o.Req.Name
	if o.GroupSize <= 1 {
		l.submit(j, o)
		return
	}
	g := append(c.groups[o.Group], o)
	if len(g) < o.GroupSize {
		c.groups[o.Group] = g
		return
	}
	delete(c.groups, o.Group)
	names := make([]string, len(g))
	for i, m := range g {
		names[i] = m.Name
	}
	sort.Strings(names)
	key := strings.Join(names, "\x00")
	for _, m := range g {
		m.Req.Group, m.Req.GroupSize = key, len(g)
		l.submit(j, m)
	}
}

func (l *Loop) submit(j *job.Job, o *job.Op) {
	if j.Failed != nil {
		o.Finish(j.Failed)
		return
	}
	if d := j.Coord.Submit(o); d != nil {
		o.Finish(d)
		return
	}
	if t := l.tracerOf(j); t != nil {
		t.submitted(&o.Req)
	}
}

// dispatch hands everything ready to the executor when it is idle, job by
// job: each pass starts with the lane after the one whose batch last went
// to the executor, so that jobs that run at once take turns with it.
func (l *Loop) dispatch() {
	if l.execBusy || l.cycle != nil || len(l.order) == 0 {
		return
	}
	if l.cycleTime > 0 {
		if wait := l.cycleTime - time.Since(l.lastDispatch); wait > 0 {
			l.cycle = time.AfterFunc(wait, func() { l.p.Post(msgCycle{}) })
			return
		}
	}
	lanes := l.order
	if len(lanes) > 1 {
		// A reply can close a client, and its lane with it: walk a copy.
		lanes = slices.Clone(lanes)
	}
	n := len(lanes)
	for i := 0; i < n && !l.execBusy; i++ {
		at := (l.rr + i) % n
		j := lanes[at].job
		for j != nil && j.Formed && j.Failed == nil && !l.execBusy {
			resps := j.Coord.Next()
			if resps == nil {
				break
			}
			l.runResponses(j, resps)
			if l.execBusy {
				l.rr = at + 1
			}
		}
	}
}

// runResponses answers error responses at once and runs the rest as one batch,
// inline when small, else on the executor.
func (l *Loop) runResponses(j *job.Job, resps []plan.Response) {
	var batch []job.Work
	for _, r := range resps {
		if w, ok := l.work(j, r); ok {
			batch = append(batch, w)
		}
	}
	if len(batch) == 0 {
		return
	}
	l.lastDispatch = time.Now()
	var bytes int64
	for _, w := range batch {
		bytes += w.Resp.Bytes
		j.Stats.Tensors += int64(len(w.Resp.Tensors))
	}
	j.Stats.Batches++
	j.Stats.Responses += int64(len(batch))
	j.Stats.Bytes += bytes
	l.fused(j, batch)
	if ln := l.laneOf(j); ln != nil && ln.tune != nil {
		l.tuneBatch(j, resps)
	}
	b := j.Engine()
	if (b == nil && bytes <= job.InlineBytes || exec.LoopRunnable(b, bytes)) && !job.DeviceBatch(batch) {
		// Small work costs less than the hand-off to the executor.
		for _, w := range batch {
			l.x.Execute(w)
		}
		if j.Across != nil {
			j.Across.TraceSent()
		}
		return
	}
	l.execBusy = true
	l.x.Work <- batch
}

// work makes r's work: its ops taken out of the job's pending ones, by row.
// It reports false for a response with nothing to run here (an error,
// answered at once, or a process set without a member on this node).
func (l *Loop) work(j *job.Job, r plan.Response) (job.Work, bool) {
	names := make([]string, len(r.Tensors))
	for i, t := range r.Tensors {
		names[i] = t.Name
	}
	if r.Op == tensor.Join {
		// The join response names no tensor: it completes every rank's join.
		names = []string{"join"}
		r.Tensors = []plan.Tensor{{Name: "join"}}
	}
	rows, root := j.RowRanks(r.ProcessSet, r.Root)
	b := j.Engine()
	tl := l.tracerOf(j)
	w := job.Work{Resp: r, Job: j, Engine: b, Size: len(rows), Ops: make([][]*job.Op, len(names))}
	if r.NCCL && j.Across != nil {
		w.NCCLID = j.Across.NCCLID()
	}
	if b != nil {
		// Across nodes a process set runs on the nodes of its members.
		w.View = j.View(r.ProcessSet)
		switch {
		case w.View.Rows.Node < 0:
			// No member here: the other nodes run it without this one.
			if tl != nil {
				tl.responded(&r)
				if r.Err == nil {
					job.TraceAll(tl.w, &r, timeline.End, "")
				}
			}
			return w, false
		case len(w.View.Nodes) == 1:
			// Every member is here: it runs as on one node.
			w.Engine = nil
		}
	}
	if tl != nil {
		tl.responded(&r)
		w.Trace = tl.w
	} else if sink := l.traceSink(j); sink != nil && r.Err == nil {
		// The coordinator's timeline: this node's phases of the
		// response, on its own track there.
		job.TraceAll(sink, &r, timeline.Begin, job.TopName(&r))
		w.Trace = sink
	}
	w.Resp.Root = root
	for i, name := range names {
		row := make([]*job.Op, len(rows))
		for at, rank := range rows {
			if rank < 0 {
				continue
			}
			k := job.OpKey{Rank: rank, Set: r.ProcessSet, Name: name}
			if o, ok := j.Pending[k]; ok {
				row[at] = o
				delete(j.Pending, k)
			}
		}
		w.Ops[i] = row
		l.negotiated(j, row)
	}
	if r.Err != nil {
		msg := r.Err.Error()
		if r.ProcessSet < 0 {
			msg = p2pError(&r)
		}
		l.noteError(j, msg)
		d := &ipcpb.Done{Code: errorCode(r.Err), Error: msg}
		job.FinishRows(w.Ops, d)
		return w, false
	}
	return w, true
}

// Abort fails the job (loopHooks); its coordination first tells the other
// nodes (notify) and closes the data engine, so that a blocked collective
// returns.
func (l *Loop) Abort(j *job.Job, code ipcpb.Code, msg string, notify bool) {
	if j.Failed != nil {
		return
	}
	if j.Across != nil {
		j.Across.Abort(code, msg, notify)
	}
	switch {
	case j.Formed:
		l.fail(j, code, msg)
	case j.Elastic && j.LaidOut && code == ipcpb.Code_CODE_ABORTED && !l.quit:
		// An elastic epoch laid out across nodes that could not form: its
		// clients wait on in init for the next (elastic.go).
		l.reformUnformed(j, msg)
	default:
		// Its clients still wait in init: they get the reason.
		l.FormFailed(j, msg)
	}
}

// FormFailed ends a job that could not form across nodes: its clients, still
// waiting in init, get the reason.
func (l *Loop) FormFailed(j *job.Job, msg string) {
	l.cfg.Log.Error("job could not form", "job", j.ID, "err", msg)
	l.fail(j, ipcpb.Code_CODE_ABORTED, msg)
	for _, s := range j.Slots {
		if c := clientOf(s); c != nil && !c.dropped {
			c.fatal(ipcpb.Code_CODE_ABORTED, msg)
			l.drop(c, nil)
		}
	}
}

// errorCode classifies a plan error response for the wire: a disagreement
// between ranks is a mismatch; a request every rank agreed on but that cannot
// run is invalid, or unimplemented when Horovod has the feature and hvdd not.
func errorCode(e *plan.Error) ipcpb.Code {
	switch {
	case len(e.Sides) > 1:
		return ipcpb.Code_CODE_MISMATCH
	case strings.Contains(e.Msg, "not supported yet"):
		return ipcpb.Code_CODE_UNIMPLEMENTED
	}
	return ipcpb.Code_CODE_INVALID_ARGUMENT
}

func (l *Loop) armStallTimer() {
	if l.stall != nil || l.cfg.StallCheck <= 0 {
		return
	}
	for _, j := range l.jobs() {
		if len(j.Pending) > 0 || j.P2P != nil && j.P2P.Len() > 0 {
			l.stall = time.AfterFunc(l.cfg.StallCheck, func() { l.p.Post(msgStall{}) })
			return
		}
	}
}

// checkStalls logs, for every job, the tensors (and the sends and recvs on
// this node, p2pStalls) that some ranks wait on longer than the stall check, and fails a job whose stall outlasted the
// stall shutdown; the other jobs go on.
func (l *Loop) checkStalls() {
	for _, j := range l.jobs() {
		l.checkJobStalls(j)
	}
}

func (l *Loop) checkJobStalls(j *job.Job) {
	if j.Coord == nil || j.Failed != nil {
		return
	}
	now := l.Now()
	stalls := j.Coord.Stalls(now, l.cfg.StallCheck.Milliseconds())
	stalls = append(stalls, l.p2pStalls(j, now, l.cfg.StallCheck.Milliseconds())...)
	if len(stalls) == 0 {
		return
	}
	shutdown := l.cfg.StallShutdown > 0 && l.cfg.StallShutdown >= l.cfg.StallCheck
	var over []plan.Stall
	var stalled []int
	if shutdown {
		for _, st := range stalls {
			// A transfer across nodes (a pair set's) that waits for its
			// other side is warned about, but stops no job: a recv may
			// wait for its send as long as the program means it to
			// (torch's timeout bounds it), as on one node.
			if st.ProcessSet >= 0 && now-st.FirstSubmit >= l.cfg.StallShutdown.Milliseconds() {
				over = append(over, st)
				stalled = append(stalled, st.Missing...)
			}
		}
	}
	msg := plan.StallMessage(stalls, plan.StallOptions{
		WarnSeconds:     int64(l.cfg.StallCheck.Seconds()),
		Stalled:         stalled,
		ShutdownSeconds: int64(l.cfg.StallShutdown.Seconds()),
	})
	l.cfg.Log.Warn(msg, "job", j.ID, "name", j.Name)
	j.M.Stalled(len(over) > 0)
	if len(over) > 0 {
		var parts []string
		for _, st := range over {
			parts = append(parts, fmt.Sprintf("tensor %q waits for ranks %v", st.Name, st.Missing))
		}
		l.fail(j, ipcpb.Code_CODE_ABORTED, fmt.Sprintf("job stopped after a stall of more than %v (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS): %s",
			l.cfg.StallShutdown, strings.Join(parts, "; ")))
	}
}
