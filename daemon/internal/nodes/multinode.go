package nodes

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/cluster"
	"github.com/hvdd/hvdd/cluster/clusterpb"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/internal/poll"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/rendezvous"
)

// Forming a job across nodes. Node 0's daemon is the coordinator: it serves
// the rendezvous store and a control listener. When a node has all its local
// clients it dials the coordinator and sends Join; once the coordinator has
// every node (and its own clients) it answers each with the same Layout (a
// fresh job id and every node's slot count), and every node creates the data
// backend for that job id and welcomes its clients. The job's tensors are
// then negotiated by its multiCoord (multinode_job.go); multiNode watches the
// job's control links in the loop's epoll set and hands it their messages.

// MultiNodeJob describes a formed multi-node job to a BackendFactory.
type MultiNodeJob struct {
	// ID identifies the job; backends use it to refuse peers of other jobs.
	ID string
	// NodeRank is this node, Nodes the number of nodes, Slots every node's
	// local rank count.
	NodeRank, Nodes int
	Slots           []int
	// Store is the rendezvous store, already namespaced for this job; nil
	// when the nodes have none (Config.Control).
	Store rendezvous.Store
	// Host is the address this node advertises and binds for data.
	Host string
	// Secret is the job's shared secret.
	Secret []byte
	// Logger is the daemon's logger.
	Logger *slog.Logger
}

// ControlTransport opens the streams that carry the control links between
// daemons when they do not use TCP: the coordinator (node 0) accepts one
// stream from every other node per job. The links' handshake and framing run
// on the streams as on TCP.
type ControlTransport interface {
	// Dial opens a stream to node.
	Dial(ctx context.Context, node int) (net.Conn, error)
	// Accept returns the next stream another node opened, and that node.
	Accept() (net.Conn, int, error)
}

// BackendFactory creates the cross-node engine of a job; every node calls it
// at about the same time, and it returns once the engine is connected.
type BackendFactory func(ctx context.Context, j MultiNodeJob) (backends.Backend, error)

// A multiNode has the part of a formation across nodes too: the loop finds
// it by its probe in loop.New.
var _ job.FormationAcross = (*multiNode)(nil)

// multiNode forms jobs with the daemons of the other nodes (the loop's
// formation on several nodes) and watches the running job's control links.
// Only the loop goroutine touches it, except where noted.
type multiNode struct {
	hooks job.LoopHooksAcross
	p     *poll.Poller
	log   *slog.Logger
	cfg   Config
	nodes int
	rank  int
	// lead is the node that coordinates: node 0, or the node that took over
	// an elastic job's coordination (election.go); -1 once this node left
	// the elastic job it coordinated.
	lead  int
	host  string
	store rendezvous.Store
	ccfg  cluster.Config

	rdv *rendezvous.Server // node 0's, unless external

	// The coordinator only.
	ctrl    *cluster.Listener
	joins   map[int]nodeJoin // nodes waiting for the next job
	waiting *job.Job         // our local job, complete, waiting for the nodes

	watched map[int]*watchedLink // the running job's control links, by descriptor
	running *job.Job             // the elastic job that runs, until it is over

	// linkBytes is what the engines of the jobs that ended exchanged with
	// each node ({sent, received}, by --node-rank), for the metrics.
	linkBytes map[int]*[2]int64

	// removedHost is this node's host once hvdd run's elastic driver
	// removed it (removal.go).
	removedHost string
	// life ends when the daemon closes: the removal watch and elections
	// (election.go) run under it.
	life      context.Context
	endLife   context.CancelFunc
	linkCheck *time.Timer // next checkLinks; nil when none is due

	// next is the next epoch of an elastic job while it forms across the
	// nodes (elastic_multinode.go); nil otherwise.
	next *nextEpoch

	// joining holds the links that goroutines hold before the loop takes
	// them (a joinCoordinator waiting for the layout, a node joining a
	// running elastic job may wait long; an election's; an accepted link
	// until its Join reaches the loop), so that close can end their waits
	// and no link outlives the daemon.
	joining linkSet
	// held are nodes that dialled in to join the next epoch while this
	// node's own claim to coordinate it was still in flight (it may have
	// won, and published its address, before the loop heard): elected
	// takes them up once the outcome is known.
	held []nodeJoin

	// Reports to hvdd run's elastic driver (driven.go): reports runs them
	// in order on a goroutine of their own, started on first use under
	// reportMu; membersStop ends the watch of the forming epoch's
	// decisions.
	// formedWith is the version of the decision the epoch being laid
	// out follows (0: none), which reportFormed tells the driver.
	reportMu    sync.Mutex
	reports     chan func()
	membersStop context.CancelFunc
	formedWith  int
}

// linkSet is a set of links that goroutines other than the loop's hold,
// closed all at once by closeAll.
type linkSet struct {
	mu     sync.Mutex
	links  map[*cluster.Link]bool
	closed bool
}

// add records link; false once closeAll has run.
func (s *linkSet) Add(link *cluster.Link) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.links == nil {
		s.links = make(map[*cluster.Link]bool)
	}
	s.links[link] = true
	return true
}

func (s *linkSet) remove(link *cluster.Link) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.links, link)
}

// closeAll closes the links recorded and every later one.
func (s *linkSet) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for link := range s.links {
		link.Close()
	}
}

type nodeJoin struct {
	link *cluster.Link
	join *clusterpb.Join
}

// Messages of the multi-node side.
type (
	msgJoin   struct{ nj nodeJoin }
	msgLayout struct {
		j      *job.Job
		link   *cluster.Link
		layout *clusterpb.Layout
		err    error
		// reclaim: node 0, which left an elastic job whose coordination
		// moved, coordinates again (that job is over).
		reclaim bool
	}
	msgBackendUp struct {
		j     *job.Job
		b     backends.Backend
		slots []int
		node  int // this node's place among the job's
		err   error
	}
	msgLinkCheck struct{} // time to look for silent control links
)

// Config is what coordination across nodes takes of the daemon's
// configuration: the fields of daemon.Config of the same names, which say
// what they mean.
type Config struct {
	Nodes, NodeRank        int
	Advertise              string
	Rendezvous             string
	ExternalRendezvous     bool
	ElasticDriver          bool
	Secret                 []byte
	Control                ControlTransport
	NewBackend             BackendFactory
	Elastic                bool
	StartTimeout           time.Duration
	Heartbeat, PeerTimeout time.Duration
	FusionThreshold        int64
	// NCCLAcross says that this node can join its GPUs to the other nodes'
	// on NCCL (Config.GPUAllreduce "nccl", and the node has NCCL), and
	// NCCLUniqueID draws the id of such a communicator (on the
	// coordinator).
	NCCLAcross   bool
	NCCLUniqueID func() ([]byte, error)
}

// New returns the formation across nodes: it joins this daemon's jobs with
// the other nodes' daemons (through the rendezvous, or cfg.Control), and
// reaches the loop through hooks, which must be job.LoopHooksAcross too (the
// loop's are), and p.
func New(hooks job.LoopHooks, p *poll.Poller, cfg Config, log *slog.Logger) (job.Formation, error) {
	h, ok := hooks.(job.LoopHooksAcross)
	if !ok {
		return nil, fmt.Errorf("nodes: the loop's hooks (%T) lack those of a formation across nodes (job.LoopHooksAcross)", hooks)
	}
	c := &multiNode{hooks: h, p: p, log: log, cfg: cfg, nodes: cfg.Nodes, rank: cfg.NodeRank, host: cfg.Advertise, joins: make(map[int]nodeJoin),
		watched: make(map[int]*watchedLink),
		ccfg:    cluster.Config{Secret: cfg.Secret, Heartbeat: cfg.Heartbeat, PeerTimeout: cfg.PeerTimeout}.WithDefaults()}
	c.life, c.endLife = context.WithCancel(context.Background())
	if cfg.Control != nil {
		// Control streams come from the transport; nothing listens.
		c.log.Info("control links through the daemons' transport (no rendezvous)", "node", c.rank, "nodes", c.nodes)
		if c.rank == 0 {
			go c.acceptControl(cfg.Control)
		}
		return c, nil
	}
	if c.rank != 0 || cfg.ExternalRendezvous {
		c.store = rendezvous.NewClient(cfg.Rendezvous, cfg.Secret)
	}
	if c.migratable() {
		// Any node may come to coordinate: its listener is open from the
		// start, so that an election publishes its address at once.
		if err := c.listenControl(); err != nil {
			return nil, err
		}
		go c.watchRemoval(c.life)
	}
	if c.rank != 0 {
		return c, nil
	}
	if !cfg.ExternalRendezvous {
		rdv, err := rendezvous.NewServer(rendezvous.ServerConfig{Addr: cfg.Rendezvous, Secret: cfg.Secret, Logger: c.log})
		if err != nil {
			return nil, fmt.Errorf("daemon: rendezvous: %w", err)
		}
		c.rdv, c.store = rdv, rdv.Store()
		go rdv.Serve(context.Background())
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.StartTimeout)
	defer cancel()
	err := c.listenControl()
	if err == nil {
		if err = c.publish(ctx, "coordinator", c.ctrl.Addr()); err != nil {
			c.ctrl.Close()
		}
	}
	if err != nil {
		if c.rdv != nil {
			c.rdv.Close()
		}
		return nil, err
	}
	c.log.Info("coordinator listening", "rendezvous", cfg.Rendezvous, "external", cfg.ExternalRendezvous, "control", c.ctrl.Addr(), "nodes", c.nodes)
	return c, nil
}

// listenControl opens this node's control listener unless it is open: node
// 0's, and every node's when an elastic job's coordination can move to it
// (election.go). New runs it.
func (c *multiNode) listenControl() error {
	if c.ctrl != nil {
		return nil
	}
	ctrl, err := cluster.Listen(net.JoinHostPort(c.host, "0"), c.ccfg)
	if err != nil {
		return err
	}
	c.ctrl = ctrl
	go c.accept()
	return nil
}

// publish sets key at the rendezvous to the control listener's address
// addr, for the nodes that dial the coordinator.
func (c *multiNode) publish(ctx context.Context, key, addr string) error {
	if err := c.store.Set(ctx, key, []byte(addr)); err != nil {
		return fmt.Errorf("cannot publish this node's control address at the rendezvous %s: %w", c.cfg.Rendezvous, err)
	}
	return nil
}

// Close ends the formation's listeners, links and watches as the daemon
// stops.
func (c *multiNode) Close() {
	c.endLife()
	c.joining.closeAll()
	for _, nj := range c.held {
		nj.link.Close()
	}
	c.held = nil
	if c.linkCheck != nil {
		c.linkCheck.Stop()
	}
	if c.ctrl != nil {
		c.ctrl.Close()
	}
	if c.rdv != nil {
		c.rdv.Close()
	}
	if cl, ok := c.store.(*rendezvous.Client); ok {
		// Its kept-alive connections would outlive the daemon.
		cl.Close()
	}
	for _, nj := range c.joins {
		nj.link.Close()
	}
	if c.next != nil {
		for _, link := range c.next.links {
			if link != nil {
				link.Close()
			}
		}
	}
}

// accept runs on its own goroutine (node 0): it authenticates nodes and hands
// their Join to the loop.
func (c *multiNode) accept() {
	for {
		link, who, err := c.ctrl.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			c.log.Warn("refused a node", "err", err)
			continue
		}
		go c.takeJoin(link, who)
	}
}

// acceptControl is accept for streams of a ControlTransport.
func (c *multiNode) acceptControl(t ControlTransport) {
	for {
		conn, node, err := t.Accept()
		if err != nil {
			return // the transport closed
		}
		go func() {
			link, who, err := cluster.ServerHandshake(conn, fmt.Sprintf("node %d", node), c.ccfg)
			if err != nil {
				c.log.Warn("refused a node", "err", err)
				return
			}
			c.takeJoin(link, who)
		}()
	}
}

// takeJoin (its own goroutine) waits for a new link's Join and hands it to
// the loop.
func (c *multiNode) takeJoin(link *cluster.Link, who string) {
	// Held in joining until the loop takes it (msgJoin): a daemon that
	// closes first closes it, rather than leave it open, heartbeating, to
	// a node that would take this one for alive.
	if !c.joining.Add(link) {
		link.Close()
		return
	}
	m, err := link.Recv()
	if err != nil || m.GetJoin() == nil {
		c.log.Warn("node did not join", "peer", who, "err", err)
		c.joining.remove(link)
		link.Close()
		return
	}
	c.p.Post(msgJoin{nodeJoin{link, m.GetJoin()}})
}

// Complete is called when every local client of j has said hello: the job
// forms with the other nodes (formation).
func (c *multiNode) Complete(j *job.Job) {
	j.SetCoord(newMultiCoord(c, j))
	if j.Epoch > 0 {
		c.completeEpoch(j)
		return
	}
	if c.leads() {
		c.waiting = j
		c.maybeLayout()
		return
	}
	c.reportJoining(j)
	// The Join is built here: the loop owns j.
	go c.joinCoordinator(j, c.joinOf(j), c.rank == 0 && c.lead < 0)
}

// joinCoordinator (its own goroutine) reaches the coordinator and waits for
// the layout. A node that does not coordinate any more (an elastic job's
// coordination moved to it, and that job is over) refuses the Join as moved:
// the address is read anew, and node 0, when it is the one that left
// (reclaim), takes the coordination back.
func (c *multiNode) joinCoordinator(j *job.Job, join *clusterpb.Message, reclaim bool) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.StartTimeout)
	defer cancel()
	res := msgLayout{j: j}
	defer func() { c.p.Post(res) }()
	for {
		var moved bool
		res.link, res.layout, moved, res.err = c.tryJoin(ctx, join)
		if !moved {
			return
		}
		if reclaim {
			res.err, res.reclaim = nil, true
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// tryJoin sends join to the coordinator registered at the rendezvous and
// waits for its layout; moved says that node does not coordinate.
func (c *multiNode) tryJoin(ctx context.Context, join *clusterpb.Message) (*cluster.Link, *clusterpb.Layout, bool, error) {
	link, err := c.dialCoordinator(ctx)
	if err != nil {
		return nil, nil, false, err
	}
	if !c.joining.Add(link) {
		link.Close()
		return nil, nil, false, errors.New("the daemon is shutting down")
	}
	// On success the link stays in joining until the loop takes the
	// layout (layout), so that a daemon closing meanwhile closes it.
	fail := func(moved bool, err error) (*cluster.Link, *clusterpb.Layout, bool, error) {
		c.joining.remove(link)
		link.Close()
		return nil, nil, moved, err
	}
	if err := link.Send(join); err != nil {
		return fail(false, err)
	}
	m, err := link.Recv()
	if err != nil {
		return fail(false, fmt.Errorf("waiting for the other nodes: %w", err))
	}
	if a := m.GetAbort(); a != nil {
		return fail(a.GetMoved(), errors.New(a.GetMsg()))
	}
	if m.GetLayout() == nil {
		return fail(false, fmt.Errorf("coordinator sent %T instead of a layout", m.Msg))
	}
	return link, m.GetLayout(), false, nil
}

// joinOf is the Join this node sends for j, complete.
func (c *multiNode) joinOf(j *job.Job) *clusterpb.Message {
	pids := make([]int32, 0, len(j.Slots))
	for _, cl := range j.Slots {
		pids = append(pids, cl.PID())
	}
	return &clusterpb.Message{Msg: &clusterpb.Message_Join{Join: &clusterpb.Join{
		NodeRank: int32(c.rank), Slots: int32(len(j.Slots)), DataHost: c.host, Pids: pids,
		Epoch: j.Epoch, Elastic: j.Elastic}}}
}

// dialCoordinator opens an authenticated link to node 0: through the
// control transport, or over TCP to the address node 0 registered at the
// rendezvous.
func (c *multiNode) dialCoordinator(ctx context.Context) (*cluster.Link, error) {
	who := "node " + strconv.Itoa(c.rank)
	if t := c.cfg.Control; t != nil {
		conn, err := t.Dial(ctx, 0)
		if err != nil {
			return nil, fmt.Errorf("cannot reach node 0 (the coordinator): %w", err)
		}
		return cluster.ClientHandshake(ctx, conn, "node 0 (the coordinator)", c.ccfg, who)
	}
	kv, err := c.store.Wait(ctx, "coordinator")
	if err != nil {
		return nil, fmt.Errorf("no coordinator registered at the rendezvous %s: %w", c.cfg.Rendezvous, err)
	}
	addr := string(kv["coordinator"])
	for {
		link, err := cluster.Dial(ctx, addr, c.ccfg, who)
		if err == nil || errors.Is(err, cluster.ErrAuth) || ctx.Err() != nil {
			return link, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
		// The coordination may have moved (an elastic job's coordinator
		// lost): dial whoever is registered now.
		if v, err := c.store.Get(ctx, "coordinator"); err == nil {
			addr = string(v)
		}
	}
}

// join records a node that wants the next job (node 0).
func (c *multiNode) join(nj nodeJoin) {
	r := int(nj.join.GetNodeRank())
	if nj.join.GetEpoch() > 0 {
		// A survivor of an elastic job's failed epoch, after an election.
		c.epochDialIn(nj)
		return
	}
	refuse := func(msg string) {
		c.log.Warn("refusing node", "node", r, "reason", msg)
		nj.link.Send(abortMsg(ipcpb.Code_CODE_BUSY, msg, 0))
		nj.link.Close()
	}
	switch {
	case !c.leads():
		msg := fmt.Sprintf("node %d does not coordinate the job any more", c.rank)
		c.log.Warn("refusing node", "node", r, "reason", msg)
		a := abortMsg(ipcpb.Code_CODE_BUSY, msg, 0)
		a.GetAbort().Moved = true
		nj.link.Send(a)
		nj.link.Close()
		return
	case r < 0 || r == c.rank || r >= c.nodes && !(c.cfg.Elastic && nj.join.GetElastic()):
		refuse(fmt.Sprintf("node rank %d is out of range: the coordinator (node %d) expects nodes 0..%d but itself (--nodes %d)", r, c.rank, c.nodes-1, c.nodes))
		return
	case nj.join.GetSlots() < 1:
		refuse(fmt.Sprintf("node %d has no slots", r))
		return
	}
	if (c.next != nil || c.running != nil) && !nj.join.GetElastic() {
		refuse(fmt.Sprintf("node %d's ranks are not elastic (HOROVOD_ELASTIC unset), and an elastic job runs across the nodes", r))
		return
	}
	if old, ok := c.joins[r]; ok {
		// A restarted node: its new link replaces the stale one.
		c.closeLink(old.link)
	}
	c.joins[r] = nj
	if r >= c.nodes || c.next != nil || c.running != nil {
		// A node joining the running elastic job: its next epoch takes it.
		// Its link is watched meanwhile, so that a node lost while it
		// waits is not laid out.
		c.log.Warn("a node waits to join the elastic job at its next epoch", "node", r, "slots", nj.join.GetSlots())
		if err := c.watch(nil, -1, r, nj.link); err != nil {
			c.log.Warn("a node waiting to join is not watched", "node", r, "err", err)
		}
		c.hooks.HostsUpdated(job.HostsAdded)
	}
	c.maybeLayout()
}

// maybeLayout forms the job once our clients and every node are there: all
// the nodes for a new job, the nodes still in it for an elastic job's next
// epoch.
func (c *multiNode) maybeLayout() {
	j := c.waiting
	if j == nil || !c.hooks.Current(j) || j.Failed != nil {
		return
	}
	ids, slots := []int{c.rank}, []int{len(j.Slots)}
	links := make(map[int]*cluster.Link)
	j.NodeRanks = nil
	add := func(id int, jn *clusterpb.Join, link *cluster.Link) {
		j.NodeRanks = append(j.NodeRanks, job.NodeRanks{Node: len(ids), Host: jn.GetDataHost(), PIDs: jn.GetPids()})
		ids, slots, links[id] = append(ids, id), append(slots, int(jn.GetSlots())), link
	}
	if j.Epoch > 0 {
		n := c.next
		if n == nil || n.epoch != j.Epoch {
			return
		}
		prev, joined := n.Nodes(), c.elasticJoins()
		if c.driven() {
			var ok bool
			if prev, joined, ok = c.drivenNodes(j, n); !ok {
				return // hvdd run's elastic driver decides
			}
			c.formedWith = n.members.version
		}
		for _, id := range prev {
			if n.joins[id] == nil {
				return
			}
		}
		for _, id := range prev {
			add(id, n.joins[id], n.links[id])
		}
		c.next = nil
		c.stopMembers()
		// Nodes that joined the running job come after the others.
		for _, id := range joined {
			add(id, c.joins[id].join, c.joins[id].link)
			delete(c.joins, id)
		}
	} else {
		for id := 1; id < c.nodes; id++ {
			if _, ok := c.joins[id]; !ok {
				return // not every node is here yet
			}
		}
		for _, id := range c.joinOrder() {
			nj := c.joins[id]
			if nj.join.GetElastic() != j.Elastic {
				c.refuseJoins(j, fmt.Sprintf("every rank of a job must agree on HOROVOD_ELASTIC: node 0's ranks run with elastic=%v, node %d's with elastic=%v", j.Elastic, id, nj.join.GetElastic()))
				return
			}
			add(id, nj.join, nj.link)
		}
		c.joins = make(map[int]nodeJoin)
	}
	c.waiting = nil
	c.formLayout(j, ids, slots, links)
}

// abortMsg is the Abort message of a job (or elastic epoch) that fails with
// code and msg.
func abortMsg(code ipcpb.Code, msg string, epoch uint64) *clusterpb.Message {
	return &clusterpb.Message{Msg: &clusterpb.Message_Abort{Abort: &clusterpb.Abort{Code: int32(code), Msg: msg, Epoch: epoch}}}
}

// joinOrder returns the nodes in c.joins in order.
func (c *multiNode) joinOrder() []int { return slices.Sorted(maps.Keys(c.joins)) }

// elasticJoins returns the nodes in c.joins that join an elastic job, in
// order.
func (c *multiNode) elasticJoins() []int {
	var ids []int
	for _, id := range c.joinOrder() {
		if c.joins[id].join.GetElastic() {
			ids = append(ids, id)
		}
	}
	return ids
}

// refuseJoins fails the waiting job j and the nodes that joined it with msg.
func (c *multiNode) refuseJoins(j *job.Job, msg string) {
	a := abortMsg(ipcpb.Code_CODE_ABORTED, msg, 0)
	for _, nj := range c.joins {
		nj.link.Send(a)
		c.closeLink(nj.link)
	}
	c.joins = make(map[int]nodeJoin)
	c.waiting = nil
	c.hooks.FormFailed(j, msg)
}

// formLayout sends the job's layout to the nodes ids[1:] (on links, by node)
// and starts its data engine: ids are the nodes in rank order, slots their
// rank counts (node 0, this one, first).
func (c *multiNode) formLayout(j *job.Job, ids, slots []int, links map[int]*cluster.Link) {
	var idb [8]byte
	rand.Read(idb[:])
	id := binary.LittleEndian.Uint64(idb[:])
	// The table exists before any node can forward requests: a node whose
	// engine connects first may submit before ours is up.
	total := 0
	for _, n := range slots {
		total += n
	}
	t, err := plan.New(plan.Config{Size: total, FusionThreshold: c.cfg.FusionThreshold})
	if err != nil {
		c.hooks.FormFailed(j, fmt.Sprintf("cannot start the job: %v", err))
		return
	}
	mc := coordOf(j)
	mc.table, mc.ids = t, ids
	j.LaidOut = true
	lay := &clusterpb.Message{Msg: &clusterpb.Message_Layout{Layout: &clusterpb.Layout{Generation: id, Slots: ints32(slots), Nodes: ints32(ids), Epoch: j.Epoch}}}
	for at, node := range ids[1:] {
		link := links[node]
		mc.links[at+1] = link
		if err := link.Send(lay); err != nil {
			c.log.Warn("node left before the job formed", "node", node, "err", err)
		}
	}
	for at, node := range ids[1:] {
		if err := c.watch(mc, at+1, node, mc.links[at+1]); err != nil {
			c.hooks.Abort(j, ipcpb.Code_CODE_INTERNAL, err.Error(), true)
		}
	}
	go c.startBackend(j, id, slots, 0)
}

// layout is a non-coordinator's answer from node 0.
func (c *multiNode) layout(m msgLayout) {
	j := m.j
	if m.link != nil {
		c.joining.remove(m.link) // the loop's now (tryJoin)
	}
	if !c.hooks.Current(j) || j.Failed != nil {
		if m.link != nil {
			m.link.Close()
		}
		return
	}
	if m.err != nil {
		c.hooks.FormFailed(j, fmt.Sprintf("node %d could not join the job: %v", c.rank, m.err))
		return
	}
	if m.reclaim {
		c.reclaim(j)
		return
	}
	slots, ids := ints(m.layout.GetSlots()), ints(m.layout.GetNodes())
	if len(ids) == 0 {
		for i := range slots {
			ids = append(ids, i)
		}
	}
	at := slices.Index(ids, c.rank)
	if j.Elastic && j.Epoch == 0 {
		// A node that joined a running elastic job enters at its epoch.
		j.Epoch = m.layout.GetEpoch()
	}
	if len(ids) != len(slots) || at < 1 || slots[at] != len(j.Slots) || !j.Elastic && len(slots) != c.nodes {
		c.closeLink(m.link)
		c.hooks.FormFailed(j, fmt.Sprintf("the coordinator's layout (nodes %v, slots %v) does not fit this node (node %d of %d with %d slots)", ids, slots, c.rank, c.nodes, len(j.Slots)))
		return
	}
	mc := coordOf(j)
	mc.links[0], mc.ids = m.link, ids
	j.LaidOut = true
	c.lead = ids[0]
	if err := c.watch(mc, 0, ids[0], m.link); err != nil {
		c.hooks.Abort(j, ipcpb.Code_CODE_INTERNAL, err.Error(), true)
		return
	}
	go c.startBackend(j, m.layout.GetGeneration(), slots, at)
}

// startBackend (its own goroutine) connects the job's data engine.
// node is this node's place among the job's.
func (c *multiNode) startBackend(j *job.Job, id uint64, slots []int, node int) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.StartTimeout)
	defer cancel()
	jid := fmt.Sprintf("job-%016x", id)
	var store rendezvous.Store
	if c.store != nil {
		store = rendezvous.Prefix(c.store, jid)
	}
	b, err := c.cfg.NewBackend(ctx, MultiNodeJob{
		ID: jid, NodeRank: node, Nodes: len(slots), Slots: slots,
		Store: store, Host: c.host, Secret: c.cfg.Secret, Logger: c.log,
	})
	if err != nil {
		b = nil // a factory may return a typed nil with its error
	}
	c.p.Post(msgBackendUp{j: j, b: b, slots: slots, node: node, err: err})
}

func (c *multiNode) backendUp(m msgBackendUp) {
	j := m.j
	if !c.hooks.Current(j) || j.Failed != nil {
		if m.b != nil {
			m.b.Close()
		}
		return
	}
	if m.err != nil {
		c.hooks.Abort(j, ipcpb.Code_CODE_ABORTED, fmt.Sprintf("node %d could not connect the %d nodes' data engine: %v", c.rank, len(m.slots), m.err), true)
		return
	}
	mc := coordOf(j)
	mc.b = m.b
	if j.Elastic {
		c.running = j
	}
	c.hooks.Start(j, job.NewMembership(m.slots, m.node))
	c.reportFormed(j)
	if j.Elastic && c.leads() && len(c.elasticJoins()) > 0 {
		// Nodes came while the epoch formed and were not in it: the
		// next reset takes them.
		c.hooks.HostsUpdated(job.HostsAdded)
	}
	if j.Elastic && c.removedHost != "" {
		// Removed while the epoch formed: the next reset drops this node.
		c.hooks.HostsUpdated(job.HostsRemoved)
	}
}

// watchedLink is a control link of the running job that the loop reads from
// its own epoll set: a control message costs no goroutine hand-off. An
// elastic job's links outlive a failed epoch and carry the next one's
// formation (elastic_multinode.go).
type watchedLink struct {
	mc   *multiCoord
	node int // the peer's place among the job's nodes (multiCoord.links)
	id   int // the peer's --node-rank
	link *cluster.Link
	fd   int
}

// watch starts reading a job's link in the loop, or hands a link watched
// since an earlier epoch to mc. mc is nil for the link of a node waiting to
// join a running elastic job.
func (c *multiNode) watch(mc *multiCoord, node, id int, link *cluster.Link) error {
	fd := link.FD()
	if w := c.watched[fd]; w != nil && w.link == link {
		w.mc, w.node = mc, node
		return nil
	}
	if err := c.p.Add(fd); err != nil {
		return fmt.Errorf("cannot watch the control link to node %d: %w", id, err)
	}
	w := &watchedLink{mc: mc, node: node, id: id, link: link, fd: fd}
	c.watched[fd] = w
	// Recv may have read past the message it returned while the job formed;
	// epoll would not report those bytes again.
	c.readLink(w, false)
	c.armLinkCheck()
	return nil
}

// armLinkCheck schedules the next checkLinks while links are watched.
func (c *multiNode) armLinkCheck() {
	if len(c.watched) > 0 && c.linkCheck == nil {
		c.linkCheck = time.AfterFunc(c.ccfg.Heartbeat, func() { c.p.Post(msgLinkCheck{}) })
	}
}

// Readable reads the control link watched on descriptor fd (formation).
func (c *multiNode) Readable(fd int) bool {
	w := c.watched[fd]
	if w == nil {
		return false
	}
	c.readLink(w, false)
	return true
}

// Message handles the messages of the multi-node side (formation).
func (c *multiNode) Message(m any) bool {
	switch m := m.(type) {
	case msgJoin:
		c.joining.remove(m.nj.link) // the loop's now
		c.join(m.nj)
	case msgLayout:
		c.layout(m)
	case msgBackendUp:
		c.backendUp(m)
	case msgLinkCheck:
		c.checkLinks()
	case msgRemoved:
		c.hostRemoved(m.host)
	case msgElected:
		c.elected(m)
	case msgElectDeadline:
		c.electDeadline(m.n)
	case msgMembers:
		c.membersDecided(m)

	default:
		return false
	}
	return true
}

// Ended forgets a job that ended while it waited for the other nodes
// (formation).
func (c *multiNode) Ended(j *job.Job) {
	if c.waiting == j {
		c.waiting = nil
	}
	if j.Elastic && j.Formed && j.Failed.GetCode() != ipcpb.Code_CODE_ABORTED {
		// The elastic job is over (it re-forms only after CODE_ABORTED):
		// the nodes that waited to join it hear so, and node 0
		// coordinates the next job, unless it left this one (the
		// coordination moved: it then finds the job at the rendezvous).
		c.running = nil
		c.stopMembers()
		c.log.Info("the elastic job is over", "job", j.ID, "epoch", j.Epoch)
		if c.lead >= 0 {
			c.lead = 0
		}
		for _, id := range c.elasticJoins() {
			nj := c.joins[id]
			delete(c.joins, id)
			msg := fmt.Sprintf("the elastic job node %d was to join has ended", id)
			c.log.Warn("refusing node", "node", id, "reason", msg)
			nj.link.Send(abortMsg(ipcpb.Code_CODE_ABORTED, msg, 0))
			c.closeLink(nj.link)
		}
	}
}

// linkGone handles a watched link that broke or fell silent.
func (c *multiNode) linkGone(w *watchedLink, err error) {
	c.unwatch(w.link)
	if w.mc != nil {
		w.mc.linkLost(w.node, err)
	}
	c.nextLost(w, err)
	if nj, ok := c.joins[w.id]; ok && nj.link == w.link {
		c.log.Warn("a node waiting to join the elastic job was lost", "node", w.id, "err", err)
		delete(c.joins, w.id)
		w.link.Close()
	}
}

// closeLink stops watching link and closes it.
func (c *multiNode) closeLink(link *cluster.Link) {
	c.unwatch(link)
	link.Close()
}

// unwatch stops reading link; it must happen before the link closes, while
// its descriptor is still its own.
func (c *multiNode) unwatch(link *cluster.Link) {
	for fd, w := range c.watched {
		if w.link == link {
			c.p.Del(fd)
			delete(c.watched, fd)
		}
	}
}

// readLink handles the whole messages a readable link holds. Unless drain is
// set it stops when none is left in the link's buffer, leaving bytes still in
// the socket to the next epoll report (level-triggered), which saves a read
// that finds the socket empty on every control message. Drain reads until the
// socket is empty, so that Silent judges by the latest byte.
func (c *multiNode) readLink(w *watchedLink, drain bool) {
	for c.watched[w.fd] == w {
		m, err := w.link.TryRecv()
		if err != nil {
			c.linkGone(w, err)
			return
		}
		if m == nil {
			return
		}
		if c.epochMessage(w, m) {
			continue
		}
		w.mc.control(w.node, m)
		if !drain && !w.link.Buffered() {
			return
		}
	}
}

// checkLinks (every heartbeat period while links are watched) reads what the
// links hold and declares lost those silent for the peer timeout.
func (c *multiNode) checkLinks() {
	c.linkCheck = nil
	now := time.Now()
	for _, w := range c.watched {
		c.readLink(w, true)
		if c.watched[w.fd] != w {
			continue
		}
		if err := w.link.Silent(now); err != nil {
			c.linkGone(w, err)
		}
	}
	c.armLinkCheck()
}

// endedLinkBytes adds a job's engine counters, by place among its nodes
// (ids: each place's --node-rank), to what the daemon's earlier jobs
// exchanged with each node, so that the link counters keep growing across
// jobs.
func (c *multiNode) endedLinkBytes(ids []int, st backends.Stats) {
	if c.linkBytes == nil {
		c.linkBytes = make(map[int]*[2]int64)
	}
	for at := range st.SentBytes {
		if at >= len(ids) || at >= len(st.RecvBytes) || ids[at] == c.rank {
			continue
		}
		b := c.linkBytes[ids[at]]
		if b == nil {
			b = new([2]int64)
			c.linkBytes[ids[at]] = b
		}
		b[0] += st.SentBytes[at]
		b[1] += st.RecvBytes[at]
	}
}

// Links reports the links to the other nodes (job.Formation).
func (c *multiNode) Links(jobs []*job.Job) map[int]*job.LinkStats {
	links := make(map[int]*job.LinkStats)
	link := func(id int) *job.LinkStats {
		if links[id] == nil {
			links[id] = &job.LinkStats{}
		}
		return links[id]
	}
	for _, w := range c.watched {
		if w.id != c.rank {
			link(w.id).RTT = w.link.RTT()
		}
	}
	for id, b := range c.linkBytes {
		ls := link(id)
		ls.Sent, ls.Recv, ls.Bytes = ls.Sent+b[0], ls.Recv+b[1], true
	}
	for _, j := range jobs {
		mc, ok := j.Coord.(*multiCoord)
		if !ok || mc.b == nil {
			continue
		}
		sr, ok := mc.b.(backends.StatsReporter)
		if !ok {
			continue
		}
		st := sr.Stats()
		for at := range st.SentBytes {
			if at >= len(mc.ids) || at >= len(st.RecvBytes) || mc.ids[at] == c.rank {
				continue
			}
			ls := link(mc.ids[at])
			ls.Sent, ls.Recv, ls.Bytes = ls.Sent+st.SentBytes[at], ls.Recv+st.RecvBytes[at], true
		}
	}
	return links
}
