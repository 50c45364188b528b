package daemon

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/cluster"
	"github.com/hvdd/hvdd/cluster/clusterpb"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/rendezvous"
	"github.com/hvdd/hvdd/tensor"
)

// A multi-node job. Node 0's daemon is the coordinator: it serves the
// rendezvous store and a control listener. When a node has all its local
// clients it dials the coordinator and sends Join; once the coordinator has
// every node (and its own clients) it answers each with the same Layout (a
// fresh job id and every node's slot count), and every node creates the data
// backend for that job id and welcomes its clients.
//
// During the job each non-coordinator node forwards a tensor's requests (of
// all its local ranks, in one Ready message per loop pass) once every local
// rank has submitted it; joins go at once. The coordinator feeds its own
// clients' requests and the forwarded ones to one plan table over all global
// ranks and, whenever its executor is idle, sends the next batch of responses
// to every node as a numbered Plan. Every node runs the plans in order:
// local reduction through shared memory, the backend on the fused buffer,
// write-back. A lost link, a lost client, a backend error or an Abort fails
// the job on every node.

// ClusterJob describes a formed multi-node job to a BackendFactory.
type ClusterJob struct {
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
type BackendFactory func(ctx context.Context, j ClusterJob) (backends.Backend, error)

// clusterNode is the loop's multi-node side. Only the loop goroutine touches
// it, except where noted.
type clusterNode struct {
	l     *loop
	nodes int
	rank  int
	host  string
	store rendezvous.Store
	ccfg  cluster.Config

	// Node 0 only.
	rdv     *rendezvous.Server
	ctrl    *cluster.Listener
	joins   map[int]nodeJoin // nodes waiting for the next job
	waiting *job             // our local job, complete, waiting for the nodes

	watched   map[int]*watchedLink // the running job's control links, by descriptor
	linkCheck *time.Timer          // next checkLinks; nil when none is due
}

type nodeJoin struct {
	link *cluster.Link
	join *clusterpb.Join
}

// multiJob is a job's multi-node negotiation state.
type multiJob struct {
	links  map[int]*cluster.Link            // node 0: every other node; else {0: coordinator}
	byes   map[int]bool                     // node 0: nodes whose job ended normally
	count  map[setName]int                  // non-coordinator: local submissions per tensor
	joined int                              // non-coordinator: local ranks joined
	out    [][]*clusterpb.Request           // non-coordinator: groups of requests to forward
	outKey []setName                        // the tensor of each group (zero value: a join)
	sent   map[setName]*cacheEntry          // non-coordinator: what was forwarded before
	nslots int                              // non-coordinator: cache slots used
	plans  []*clusterpb.Plan                // non-coordinator: received, not yet run
	seq    uint64                           // plans sent (node 0) or run (others)
	caches map[int]map[int32][]plan.Request // node 0: per node, cache slot -> requests
	// shutdown is an orderly shutdown (an Abort with CODE_SHUT_DOWN) that
	// waits for the plans received before it: they ran, or run, on the node
	// it came from, so they run here too.
	shutdown *clusterpb.Abort
	// expecting is what the links were last told (cluster.Link.Expect).
	expecting bool
}

// cacheEntry is a tensor's requests as last forwarded, under a cache slot.
type cacheEntry struct {
	slot int32
	reqs []*clusterpb.Request
}

type setName struct {
	set  int32
	name string
}

// Messages of the multi-node side.
type (
	msgJoin   struct{ nj nodeJoin }
	msgLayout struct {
		j      *job
		link   *cluster.Link
		layout *clusterpb.Layout
		err    error
	}
	msgBackendUp struct {
		j     *job
		b     backends.Backend
		slots []int
		err   error
	}
	msgLinkCheck struct{} // time to look for silent control links
	msgExecErr   struct {
		j   *job
		err error
	}
)

func newClusterNode(l *loop) (*clusterNode, error) {
	cfg := l.cfg
	c := &clusterNode{l: l, nodes: cfg.Nodes, rank: cfg.NodeRank, host: cfg.Advertise, joins: make(map[int]nodeJoin),
		watched: make(map[int]*watchedLink),
		ccfg:    cluster.Config{Secret: cfg.Secret, Heartbeat: cfg.Heartbeat, PeerTimeout: cfg.PeerTimeout}.WithDefaults()}
	if cfg.Control != nil {
		// Control streams come from the transport; nothing listens.
		l.s.log.Info("control links through the daemons' transport (no rendezvous)", "node", c.rank, "nodes", c.nodes)
		if c.rank == 0 {
			go c.acceptControl(cfg.Control)
		}
		return c, nil
	}
	if c.rank != 0 {
		c.store = rendezvous.NewClient(cfg.Rendezvous, cfg.Secret)
		return c, nil
	}
	rdv, err := rendezvous.NewServer(rendezvous.ServerConfig{Addr: cfg.Rendezvous, Secret: cfg.Secret, Logger: l.s.log})
	if err != nil {
		return nil, fmt.Errorf("daemon: rendezvous: %w", err)
	}
	ctrl, err := cluster.Listen(net.JoinHostPort(c.host, "0"), c.ccfg)
	if err != nil {
		rdv.Close()
		return nil, err
	}
	c.rdv, c.ctrl, c.store = rdv, ctrl, rdv.Store()
	go rdv.Serve(context.Background())
	if err := c.store.Set(context.Background(), "coordinator", []byte(ctrl.Addr())); err != nil {
		rdv.Close()
		ctrl.Close()
		return nil, err
	}
	go c.accept()
	l.s.log.Info("coordinator listening", "rendezvous", rdv.Addr(), "control", ctrl.Addr(), "nodes", c.nodes)
	return c, nil
}

func (c *clusterNode) close() {
	if c.linkCheck != nil {
		c.linkCheck.Stop()
	}
	if c.ctrl != nil {
		c.ctrl.Close()
	}
	if c.rdv != nil {
		c.rdv.Close()
	}
	for _, nj := range c.joins {
		nj.link.Close()
	}
}

// accept runs on its own goroutine (node 0): it authenticates nodes and hands
// their Join to the loop.
func (c *clusterNode) accept() {
	for {
		link, who, err := c.ctrl.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			c.l.s.log.Warn("refused a node", "err", err)
			continue
		}
		go c.takeJoin(link, who)
	}
}

// acceptControl is accept for streams of a ControlTransport.
func (c *clusterNode) acceptControl(t ControlTransport) {
	for {
		conn, node, err := t.Accept()
		if err != nil {
			return // the transport closed
		}
		go func() {
			link, who, err := cluster.ServerHandshake(conn, fmt.Sprintf("node %d", node), c.ccfg)
			if err != nil {
				c.l.s.log.Warn("refused a node", "err", err)
				return
			}
			c.takeJoin(link, who)
		}()
	}
}

// takeJoin (its own goroutine) waits for a new link's Join and hands it to
// the loop.
func (c *clusterNode) takeJoin(link *cluster.Link, who string) {
	m, err := link.Recv()
	if err != nil || m.GetJoin() == nil {
		c.l.s.log.Warn("node did not join", "peer", who, "err", err)
		link.Close()
		return
	}
	c.l.p.post(msgJoin{nodeJoin{link, m.GetJoin()}})
}

// localComplete is called when every local client of j has said hello.
func (c *clusterNode) localComplete(j *job) {
	j.mn = &multiJob{links: make(map[int]*cluster.Link), byes: make(map[int]bool), count: make(map[setName]int),
		sent: make(map[setName]*cacheEntry), caches: make(map[int]map[int32][]plan.Request)}
	if c.rank == 0 {
		c.waiting = j
		c.maybeLayout()
		return
	}
	go c.joinCoordinator(j)
}

// joinCoordinator (its own goroutine) reaches node 0 and waits for the layout.
func (c *clusterNode) joinCoordinator(j *job) {
	ctx, cancel := context.WithTimeout(context.Background(), c.l.cfg.StartTimeout)
	defer cancel()
	res := msgLayout{j: j}
	defer func() { c.l.p.post(res) }()
	link, err := c.dialCoordinator(ctx)
	if err != nil {
		res.err = err
		return
	}
	pids := make([]int32, 0, len(j.slots))
	for _, cl := range j.slots {
		pids = append(pids, cl.pid)
	}
	if err := link.Send(&clusterpb.Message{Msg: &clusterpb.Message_Join{Join: &clusterpb.Join{
		NodeRank: int32(c.rank), Slots: int32(len(j.slots)), DataHost: c.host, Pids: pids}}}); err != nil {
		link.Close()
		res.err = err
		return
	}
	m, err := link.Recv()
	if err != nil {
		link.Close()
		res.err = fmt.Errorf("waiting for the other nodes: %w", err)
		return
	}
	if a := m.GetAbort(); a != nil {
		link.Close()
		res.err = errors.New(a.GetMsg())
		return
	}
	if m.GetLayout() == nil {
		link.Close()
		res.err = fmt.Errorf("coordinator sent %T instead of a layout", m.Msg)
		return
	}
	res.link, res.layout = link, m.GetLayout()
}

// dialCoordinator opens an authenticated link to node 0: through the
// control transport, or over TCP to the address node 0 registered at the
// rendezvous.
func (c *clusterNode) dialCoordinator(ctx context.Context) (*cluster.Link, error) {
	who := "node " + strconv.Itoa(c.rank)
	if t := c.l.cfg.Control; t != nil {
		conn, err := t.Dial(ctx, 0)
		if err != nil {
			return nil, fmt.Errorf("cannot reach node 0 (the coordinator): %w", err)
		}
		return cluster.ClientHandshake(ctx, conn, "node 0 (the coordinator)", c.ccfg, who)
	}
	kv, err := c.store.Wait(ctx, "coordinator")
	if err != nil {
		return nil, fmt.Errorf("no coordinator registered at the rendezvous %s: %w", c.l.cfg.Rendezvous, err)
	}
	for {
		link, err := cluster.Dial(ctx, string(kv["coordinator"]), c.ccfg, who)
		if err == nil || errors.Is(err, cluster.ErrAuth) || ctx.Err() != nil {
			return link, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// join records a node that wants the next job (node 0).
func (c *clusterNode) join(nj nodeJoin) {
	r := int(nj.join.GetNodeRank())
	refuse := func(msg string) {
		c.l.s.log.Warn("refusing node", "node", r, "reason", msg)
		nj.link.Send(&clusterpb.Message{Msg: &clusterpb.Message_Abort{Abort: &clusterpb.Abort{Code: int32(ipcpb.Code_CODE_BUSY), Msg: msg}}})
		nj.link.Close()
	}
	switch {
	case r <= 0 || r >= c.nodes:
		refuse(fmt.Sprintf("node rank %d is out of range: the coordinator expects nodes 1..%d (--nodes %d)", r, c.nodes-1, c.nodes))
		return
	case nj.join.GetSlots() < 1:
		refuse(fmt.Sprintf("node %d has no slots", r))
		return
	}
	if old, ok := c.joins[r]; ok {
		// A restarted node: its new link replaces the stale one.
		old.link.Close()
	}
	c.joins[r] = nj
	c.maybeLayout()
}

// maybeLayout forms the job once our clients and every node are there.
func (c *clusterNode) maybeLayout() {
	j := c.waiting
	if j == nil || len(c.joins) < c.nodes-1 || j != c.l.job || j.failed != nil {
		return
	}
	var idb [8]byte
	rand.Read(idb[:])
	id := binary.LittleEndian.Uint64(idb[:])
	slots := make([]int, c.nodes)
	slots[0] = len(j.slots)
	for r, nj := range c.joins {
		slots[r] = int(nj.join.GetSlots())
	}
	// The table exists before any node can forward requests: a node whose
	// engine connects first may submit before ours is up.
	total := 0
	for _, n := range slots {
		total += n
	}
	t, err := plan.New(plan.Config{Size: total, FusionThreshold: c.l.cfg.FusionThreshold})
	if err != nil {
		c.l.formFailed(j, fmt.Sprintf("cannot start the job: %v", err))
		return
	}
	j.table = t
	lay := &clusterpb.Message{Msg: &clusterpb.Message_Layout{Layout: &clusterpb.Layout{Generation: id, Slots: ints32(slots)}}}
	for r, nj := range c.joins {
		j.mn.links[r] = nj.link
		if err := nj.link.Send(lay); err != nil {
			c.l.s.log.Warn("node left before the job formed", "node", r, "err", err)
		}
	}
	c.joins = make(map[int]nodeJoin)
	c.waiting = nil
	for r, link := range j.mn.links {
		c.watch(j, r, link)
	}
	go c.startBackend(j, id, slots)
}

// layout is a non-coordinator's answer from node 0.
func (c *clusterNode) layout(m msgLayout) {
	j := m.j
	if j != c.l.job || j.failed != nil {
		if m.link != nil {
			m.link.Close()
		}
		return
	}
	if m.err != nil {
		c.l.formFailed(j, fmt.Sprintf("node %d could not join the job: %v", c.rank, m.err))
		return
	}
	slots := ints(m.layout.GetSlots())
	if len(slots) != c.nodes || slots[c.rank] != len(j.slots) {
		m.link.Close()
		c.l.formFailed(j, fmt.Sprintf("the coordinator's layout %v does not fit this node (node %d of %d with %d slots)", slots, c.rank, c.nodes, len(j.slots)))
		return
	}
	j.mn.links[0] = m.link
	c.watch(j, 0, m.link)
	go c.startBackend(j, m.layout.GetGeneration(), slots)
}

// startBackend (its own goroutine) connects the job's data engine.
func (c *clusterNode) startBackend(j *job, id uint64, slots []int) {
	ctx, cancel := context.WithTimeout(context.Background(), c.l.cfg.StartTimeout)
	defer cancel()
	jid := fmt.Sprintf("job-%016x", id)
	var store rendezvous.Store
	if c.store != nil {
		store = rendezvous.Prefix(c.store, jid)
	}
	b, err := c.l.cfg.NewBackend(ctx, ClusterJob{
		ID: jid, NodeRank: c.rank, Nodes: c.nodes, Slots: slots,
		Store: store, Host: c.host, Secret: c.l.cfg.Secret, Logger: c.l.s.log,
	})
	if err != nil {
		b = nil // a factory may return a typed nil with its error
	}
	c.l.p.post(msgBackendUp{j: j, b: b, slots: slots, err: err})
}

func (c *clusterNode) backendUp(m msgBackendUp) {
	j := m.j
	if j != c.l.job || j.failed != nil {
		if m.b != nil {
			m.b.Close()
		}
		return
	}
	if m.err != nil {
		c.l.abort(j, ipcpb.Code_CODE_ABORTED, fmt.Sprintf("node %d could not connect the %d nodes' data engine: %v", c.rank, c.nodes, m.err), true)
		return
	}
	c.l.start(j, m.slots, c.rank, m.b)
}

// watchedLink is a control link of the running job that the loop reads from
// its own epoll set: a control message costs no goroutine hand-off.
type watchedLink struct {
	j    *job
	node int
	link *cluster.Link
	fd   int
}

// watch starts reading a job's link in the loop.
func (c *clusterNode) watch(j *job, node int, link *cluster.Link) {
	fd := link.FD()
	if err := c.l.p.add(fd); err != nil {
		c.l.abort(j, ipcpb.Code_CODE_INTERNAL, fmt.Sprintf("cannot watch the control link to node %d: %v", node, err), true)
		return
	}
	w := &watchedLink{j: j, node: node, link: link, fd: fd}
	c.watched[fd] = w
	// Recv may have read past the message it returned while the job formed;
	// epoll would not report those bytes again.
	c.readLink(w, false)
	c.armLinkCheck()
}

// armLinkCheck schedules the next checkLinks while links are watched.
func (c *clusterNode) armLinkCheck() {
	if len(c.watched) > 0 && c.linkCheck == nil {
		c.linkCheck = time.AfterFunc(c.ccfg.Heartbeat, func() { c.l.p.post(msgLinkCheck{}) })
	}
}

// linkOn returns the link watched on descriptor fd, or nil (also on a
// single node, where c is nil).
func (c *clusterNode) linkOn(fd int) *watchedLink {
	if c == nil {
		return nil
	}
	return c.watched[fd]
}

// unwatch stops reading link; it must happen before the link closes, while
// its descriptor is still its own.
func (c *clusterNode) unwatch(link *cluster.Link) {
	for fd, w := range c.watched {
		if w.link == link {
			c.l.p.del(fd)
			delete(c.watched, fd)
		}
	}
}

// readLink handles the whole messages a readable link holds. Unless drain is
// set it stops when none is left in the link's buffer, leaving bytes still in
// the socket to the next epoll report (level-triggered), which saves a read
// that finds the socket empty on every control message. Drain reads until the
// socket is empty, so that Silent judges by the latest byte.
func (c *clusterNode) readLink(w *watchedLink, drain bool) {
	for c.watched[w.fd] == w {
		m, err := w.link.TryRecv()
		if err != nil {
			c.unwatch(w.link)
			c.linkLost(w.j, w.node, err)
			return
		}
		if m == nil {
			return
		}
		c.control(w.j, w.node, m)
		if !drain && !w.link.Buffered() {
			return
		}
	}
}

// checkLinks (every heartbeat period while links are watched) reads what the
// links hold and declares lost those silent for the peer timeout.
func (c *clusterNode) checkLinks() {
	c.linkCheck = nil
	now := time.Now()
	for _, w := range c.watched {
		c.readLink(w, true)
		if c.watched[w.fd] != w {
			continue
		}
		if err := w.link.Silent(now); err != nil {
			c.unwatch(w.link)
			c.linkLost(w.j, w.node, err)
		}
	}
	c.armLinkCheck()
}

// control acts on a message from another node of the running job.
func (c *clusterNode) control(j *job, node int, m *clusterpb.Message) {
	if j != c.l.job || j.mn == nil {
		return
	}
	switch msg := m.Msg.(type) {
	case *clusterpb.Message_Ready:
		if c.rank != 0 || j.failed != nil || j.table == nil {
			return
		}
		if err := c.ready(j, node, msg.Ready); err != nil {
			c.l.abort(j, ipcpb.Code_CODE_INVALID_ARGUMENT, err.Error(), true)
			return
		}
	case *clusterpb.Message_Plan:
		if c.rank != 0 {
			j.mn.plans = append(j.mn.plans, msg.Plan)
		}
	case *clusterpb.Message_Abort:
		if ipcpb.Code(msg.Abort.GetCode()) == ipcpb.Code_CODE_SHUT_DOWN && (c.l.execBusy || len(j.mn.plans) > 0) {
			// A rank shut down after its last collective; plans sent
			// before that still run here (see dispatchMulti).
			c.l.s.log.Debug("shutdown waits for the plans before it", "job", j.id, "from", node, "plans", len(j.mn.plans), "running", c.l.execBusy)
			j.mn.shutdown = msg.Abort
			return
		}
		// Node 0 relays a node's abort to the others.
		c.l.abort(j, ipcpb.Code(msg.Abort.GetCode()), msg.Abort.GetMsg(), c.rank == 0)
	case *clusterpb.Message_Bye:
		j.mn.byes[node] = true
	}
}

// ready submits what a node forwarded (node 0): new request groups, which
// also fill the node's cache slots, and the cached groups its bit vector names.
func (c *clusterNode) ready(j *job, node int, rd *clusterpb.Ready) error {
	cache := j.mn.caches[node]
	if cache == nil {
		cache = make(map[int32][]plan.Request)
		j.mn.caches[node] = cache
	}
	var all []plan.Request
	reqs, starts, slots := rd.GetRequests(), rd.GetGroupStart(), rd.GetSlot()
	if len(starts) != len(slots) {
		return fmt.Errorf("node %d sent a malformed Ready (%d groups, %d slots)", node, len(starts), len(slots))
	}
	for g := range starts {
		lo, hi := int(starts[g]), len(reqs)
		if g+1 < len(starts) {
			hi = int(starts[g+1])
		}
		if lo < 0 || lo > hi || hi > len(reqs) {
			return fmt.Errorf("node %d sent a malformed Ready (group %d spans [%d, %d) of %d)", node, g, lo, hi, len(reqs))
		}
		group := make([]plan.Request, 0, hi-lo)
		for _, pr := range reqs[lo:hi] {
			group = append(group, requestFromPB(pr))
		}
		if slots[g] >= 0 {
			cache[slots[g]] = group
		}
		all = append(all, group...)
	}
	for i, b := range rd.GetCached() {
		for bit := 0; bit < 8; bit++ {
			if b&(1<<bit) == 0 {
				continue
			}
			group, ok := cache[int32(i*8+bit)]
			if !ok {
				return fmt.Errorf("node %d named cache slot %d, which it never filled", node, i*8+bit)
			}
			all = append(all, group...)
		}
	}
	for _, r := range all {
		if err := j.table.Submit(r, c.l.now()); err != nil {
			return fmt.Errorf("rank %d's request for %q was refused: %v", r.Rank, r.Name, err)
		}
	}
	return nil
}

// linkLost handles a broken control link.
func (c *clusterNode) linkLost(j *job, node int, err error) {
	if j != c.l.job || j.mn == nil || j.failed != nil || j.mn.byes[node] {
		return
	}
	who := fmt.Sprintf("node %d", node)
	if node == 0 {
		who = "node 0 (the coordinator)"
	}
	c.l.abort(j, ipcpb.Code_CODE_ABORTED, fmt.Sprintf("%s%s was lost: %v", who, j.rankRange(node), err), true)
}

// rankRange names the global ranks of a node, " (ranks 2-3)".
func (j *job) rankRange(node int) string {
	if node < 0 || node >= len(j.nodeSlots) {
		return ""
	}
	lo := 0
	for i := 0; i < node; i++ {
		lo += j.nodeSlots[i]
	}
	hi := lo + j.nodeSlots[node] - 1
	if lo == hi {
		return fmt.Sprintf(" (rank %d)", lo)
	}
	return fmt.Sprintf(" (ranks %d-%d)", lo, hi)
}

// submitMulti takes a local request of a multi-node job.
func (c *clusterNode) submitMulti(j *job, o *op) {
	k := opKey{o.req.Rank, o.req.ProcessSet, o.req.Name}
	if c.rank == 0 {
		if err := j.table.Submit(o.req, c.l.now()); err != nil {
			code := ipcpb.Code_CODE_INVALID_ARGUMENT
			if errors.Is(err, plan.ErrDuplicateName) {
				code = ipcpb.Code_CODE_DUPLICATE_NAME
			}
			o.finish(&ipcpb.Done{Code: code, Error: err.Error()})
			return
		}
		j.pending[k] = o
		return
	}
	if _, dup := j.pending[k]; dup {
		o.finish(&ipcpb.Done{Code: ipcpb.Code_CODE_DUPLICATE_NAME, Error: fmt.Sprintf(
			"Requested to %s a tensor with the same name as another tensor that is currently being processed (%q). If you want to request another tensor, use a different tensor name.",
			o.typ.Lower(), o.name)})
		return
	}
	j.pending[k] = o
	mn := j.mn
	if o.typ == tensor.Join {
		mn.joined++
		mn.out = append(mn.out, []*clusterpb.Request{requestToPB(&o.req)})
		mn.outKey = append(mn.outKey, setName{})
		// Tensors the remaining local ranks have all submitted are ready now.
		for sn, n := range mn.count {
			if n >= len(j.slots)-mn.joined {
				c.forward(j, sn)
			}
		}
		return
	}
	sn := setName{o.req.ProcessSet, o.req.Name}
	mn.count[sn]++
	if mn.count[sn] >= len(j.slots)-mn.joined {
		c.forward(j, sn)
	}
}

// forward queues every local rank's request for a locally ready tensor.
func (c *clusterNode) forward(j *job, sn setName) {
	delete(j.mn.count, sn)
	var group []*clusterpb.Request
	for lr := range j.slots {
		if o, ok := j.pending[opKey{j.offset + lr, sn.set, sn.name}]; ok {
			group = append(group, requestToPB(&o.req))
		}
	}
	j.mn.out = append(j.mn.out, group)
	j.mn.outKey = append(j.mn.outKey, sn)
}

// flush sends what became locally ready during this loop pass, in one
// message. A tensor forwarded before with the same requests travels as one
// bit of the cache vector; others travel whole and (re)fill a cache slot.
func (c *clusterNode) flush(j *job) {
	if j == nil || j.mn == nil || len(j.mn.out) == 0 || j.failed != nil {
		return
	}
	mn := j.mn
	rd := &clusterpb.Ready{}
	for i, group := range mn.out {
		sn := mn.outKey[i]
		if sn == (setName{}) {
			// A join: never cached.
			rd.GroupStart = append(rd.GroupStart, int32(len(rd.Requests)))
			rd.Slot = append(rd.Slot, -1)
			rd.Requests = append(rd.Requests, group...)
			continue
		}
		e := mn.sent[sn]
		if e != nil && sameRequests(e.reqs, group) {
			for int(e.slot/8) >= len(rd.Cached) {
				rd.Cached = append(rd.Cached, 0)
			}
			rd.Cached[e.slot/8] |= 1 << (e.slot % 8)
			continue
		}
		if e == nil {
			e = &cacheEntry{slot: int32(mn.nslots)}
			mn.nslots++
			mn.sent[sn] = e
		}
		e.reqs = group
		rd.GroupStart = append(rd.GroupStart, int32(len(rd.Requests)))
		rd.Slot = append(rd.Slot, e.slot)
		rd.Requests = append(rd.Requests, group...)
	}
	mn.out, mn.outKey = nil, nil
	if link := mn.links[0]; link != nil {
		if err := link.Send(&clusterpb.Message{Msg: &clusterpb.Message_Ready{Ready: rd}}); err != nil {
			c.l.abort(j, ipcpb.Code_CODE_ABORTED, fmt.Sprintf("node 0 (the coordinator) was lost: %v", err), false)
		}
	}
}

// expect tells the job's control links whether this node awaits messages
// on them: while a local request is pending it does. Links over MPI
// (--control mpi) then probe for messages often, and rarely otherwise.
func (c *clusterNode) expect(j *job) {
	if j == nil || j.mn == nil {
		return
	}
	on := len(j.pending) > 0
	if on == j.mn.expecting {
		return
	}
	j.mn.expecting = on
	for _, link := range j.mn.links {
		if link != nil {
			link.Expect(on)
		}
	}
}

// sameRequests compares two groups of requests field by field.
func sameRequests(a, b []*clusterpb.Request) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// dispatchMulti starts plans while the executor is idle: on node 0 the next
// batch of ready responses, which it sends to every node first; on the
// others every plan received so far, in order. A shutdown that came after
// plans takes effect once they have run.
func (c *clusterNode) dispatchMulti(j *job) {
	if c.l.execBusy || j.failed != nil {
		return
	}
	defer c.shutdownAfterPlans(j)
	if c.rank == 0 {
		if j.mn.shutdown != nil {
			return
		}
		resps := j.table.Ready()
		if len(resps) == 0 {
			return
		}
		j.mn.seq++
		pm := &clusterpb.Plan{Seq: j.mn.seq}
		for i := range resps {
			pm.Responses = append(pm.Responses, responseToPB(&resps[i]))
		}
		msg := &clusterpb.Message{Msg: &clusterpb.Message_Plan{Plan: pm}}
		for r, link := range j.mn.links {
			if err := link.Send(msg); err != nil {
				c.l.abort(j, ipcpb.Code_CODE_ABORTED, fmt.Sprintf("node %d%s was lost: %v", r, j.rankRange(r), err), true)
				return
			}
		}
		c.runPlan(j, resps)
		return
	}
	// Several plans may have arrived in one read. Run them all while the
	// executor stays idle: one that runs in the loop leaves nothing that
	// would bring the loop back here for the next, and the ranks waiting
	// for it send nothing more.
	for len(j.mn.plans) > 0 && !c.l.execBusy && j.failed == nil {
		pm := j.mn.plans[0]
		j.mn.plans = j.mn.plans[1:]
		j.mn.seq++
		if pm.GetSeq() != j.mn.seq {
			c.l.abort(j, ipcpb.Code_CODE_INTERNAL, fmt.Sprintf("plan %d arrived where %d was due", pm.GetSeq(), j.mn.seq), true)
			return
		}
		resps := make([]plan.Response, 0, len(pm.GetResponses()))
		for _, pr := range pm.GetResponses() {
			resps = append(resps, responseFromPB(pr))
		}
		c.runPlan(j, resps)
	}
}

// shutdownAfterPlans applies a deferred shutdown once no plan waits or runs.
func (c *clusterNode) shutdownAfterPlans(j *job) {
	a := j.mn.shutdown
	if a == nil || c.l.execBusy || len(j.mn.plans) > 0 || j.failed != nil {
		return
	}
	j.mn.shutdown = nil
	c.l.abort(j, ipcpb.Code(a.GetCode()), a.GetMsg(), c.rank == 0)
}

// runPlan runs one plan's responses (every node, in plan order).
func (c *clusterNode) runPlan(j *job, resps []plan.Response) {
	for _, r := range resps {
		if r.Op == tensor.Join {
			j.mn.joined = 0
		}
	}
	c.l.runResponses(j, resps)
}
