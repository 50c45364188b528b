package loop

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/metrics"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

// Metrics (Config.Metrics, package daemon/metrics). What is counted where:
//
//   - an op, as the loop takes it (enqueue: arrived), gets its job's
//     children for its collective (resolved once per job and collective),
//     its arrival time and its size class; it is counted as it is answered
//     (op.finish, finishBatched: count), on whichever goroutine answers it;
//   - the executor times each response from its batch's dispatch (the
//     loop's clock reading as it dispatches, kept in executor.dispatched)
//     to its ranks' answers (execute: observeLatency), once per tensor;
//   - the loop records, as it dispatches a batch (runResponses), each
//     tensor's negotiation wait (its local ranks' first to last arrival)
//     and the batch's fusion (tensors and bytes per response and batch), and
//     each stall warning and stall shutdown (checkJobStalls);
//   - shared memory is counted as regions are mapped and unmapped (atomic
//     adds, any goroutine);
//   - what only the loop knows (its clients and jobs, the engine's per-link
//     bytes, the control links' round-trip times) is read at scrape time:
//     the scraping goroutine posts msgMetrics, the loop fills a snapshot in
//     and signals it, so the loop pays for it once per scrape and never
//     shares its state.
//
// Off (Config.Metrics nil), every hook is a nil check. On, the hot path
// costs no allocation and no lock: pre-resolved children, atomic adds, a
// clock reading per op and one per response (BenchmarkOpMetrics).

// monoEpoch is the zero of monoNow.
var monoEpoch = time.Now()

// monoNow is the monotonic clock in nanoseconds since monoEpoch.
func monoNow() int64 { return int64(time.Since(monoEpoch)) }

// shmMapped counts the shared memory the daemon has mapped, in bytes, by
// kind: the regions clients registered, their channels' regions, and the
// output regions the daemon created and granted.
type shmMapped struct {
	client, channel, output atomic.Int64
}

// account adds the region's mapping to ctr, which unaccount takes it out
// of again as the mapping is closed.
func (r *region) account(ctr *atomic.Int64) {
	r.acct = ctr
	ctr.Add(r.m.Size())
}

func (r *region) unaccount() {
	if r.acct != nil {
		r.acct.Add(-r.m.Size())
		r.acct = nil
	}
}

// arrived prepares o's counting as the loop takes it: its job's children
// for its collective, when it arrived, its size class.
func (l *Loop) arrived(o *job.Op) {
	ln := clientOf(o.Conn).lane
	if ln == nil || ln.m == nil {
		return
	}
	o.M = ln.m.Collective(o.Type)
	o.At = monoNow()
	o.Class = uint8(metrics.SizeClass(int64(len(o.Buf))))
}

// negotiated records a tensor's negotiation wait on this node: from its
// first local rank's arrival to its last's (row holds its ops).
func (l *Loop) negotiated(j *job.Job, row []*job.Op) {
	m := j.M
	if m == nil {
		return
	}
	first, last, n := int64(0), int64(0), 0
	for _, o := range row {
		if o == nil || o.M == nil {
			continue
		}
		if n == 0 || o.At < first {
			first = o.At
		}
		if n == 0 || o.At > last {
			last = o.At
		}
		n++
	}
	if n > 0 {
		m.Negotiated(time.Duration(last - first))
	}
}

// fused records a dispatched batch's fusion: the tensors and bytes of
// each response, and of the whole. It hands the executor the batch's
// dispatch time for the latency: the loop dispatches only to an idle
// executor, which reads it after it got the batch (inline, or through its
// channel).
func (l *Loop) fused(j *job.Job, batch []job.Work) {
	m := j.M
	if m == nil {
		return
	}
	l.x.Dispatched = l.lastDispatch
	tensors, bytes := 0, int64(0)
	for i := range batch {
		r := &batch[i].Resp
		m.Response(len(r.Tensors), r.Bytes)
		tensors += len(r.Tensors)
		bytes += r.Bytes
	}
	m.Batch(tensors, bytes)
}

// refusedOp counts an Enqueue refused before it became an op.
func (l *Loop) refusedOp(c *client, e *ipcpb.Enqueue) {
	if c.lane != nil {
		c.lane.m.Failed(tensor.OpType(e.GetOp()), ipcpb.Code_CODE_INVALID_ARGUMENT)
	}
}

// The states of clients and jobs (hvdd_clients, hvdd_jobs).
var (
	clientStates = []string{"handshake", "waiting", "forming", "running", "failed", "status"}
	jobStates    = []string{"forming", "running", "failed", "reforming"}
)

// stateSnapshot is what the loop tells a scrape.
type stateSnapshot struct {
	clients   [6]int // by clientStates
	jobs      [4]int // by jobStates
	slotsUsed int
	links     map[int]*job.LinkStats // by peer --node-rank
}

// msgMetrics asks the loop for a snapshot: it fills snap in and closes
// done.
type msgMetrics struct {
	snap *stateSnapshot
	done chan struct{}
}

// fillSnapshot fills in m's snapshot from the loop's state (on the loop's
// goroutine).
func (l *Loop) fillSnapshot(m msgMetrics) {
	defer close(m.done)
	s := m.snap
	for _, c := range l.clients {
		switch j := c.job; {
		case c.status:
			s.clients[5]++ // hvdd status
		case !c.hello:
			s.clients[0]++
		case j == nil:
			s.clients[1]++
		case j.Failed != nil:
			s.clients[4]++
		case !j.Formed:
			s.clients[2]++
		default:
			s.clients[3]++
		}
	}
	for _, ln := range l.order {
		s.slotsUsed += ln.taken()
		switch j := ln.job; {
		case j == nil && ln.reform != nil:
			s.jobs[3]++
		case j == nil:
		case j.Failed != nil:
			s.jobs[2]++
		case !j.Formed:
			s.jobs[0]++
		default:
			s.jobs[1]++
		}
	}
	if l.across != nil {
		s.links = l.across.Links(l.jobs())
	}
}

// snapshotTimeout bounds how long a scrape waits for the loop.
const snapshotTimeout = 2 * time.Second

// snapshot asks the loop for its state, waiting at most timeout. Safe from
// any goroutine.
func (l *Loop) snapshot(timeout time.Duration) (*stateSnapshot, error) {
	m := msgMetrics{snap: &stateSnapshot{}, done: make(chan struct{})}
	l.p.Post(m)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-m.done:
		return m.snap, nil
	case <-l.done:
		return nil, ErrLoopDone
	case <-t.C:
		return nil, fmt.Errorf("the daemon's loop did not answer within %v", timeout)
	}
}

// stateCollector exports, at scrape time, the loop's snapshot and the
// shared memory mapped (hvdd_clients, hvdd_jobs, hvdd_slots*,
// hvdd_link_*, hvdd_shm_mapped_bytes).
type stateCollector struct{ l *Loop }

var (
	clientsDesc   = prometheus.NewDesc("hvdd_clients", "Client connections, by state: handshake (no Hello yet), waiting (for a job to end or an elastic epoch), forming (their job waits for its ranks or nodes), running, failed (their job failed; on their way out).", []string{"state"}, nil)
	jobsDesc      = prometheus.NewDesc("hvdd_jobs", "Jobs on this daemon, by state: forming, running, failed (its connections not all closed yet), reforming (an elastic job between epochs).", []string{"state"}, nil)
	slotsDesc     = prometheus.NewDesc("hvdd_slots", "The daemon's --slots: local processes its jobs may have in all.", nil, nil)
	usedDesc      = prometheus.NewDesc("hvdd_slots_used", "Slots the jobs forming and running hold.", nil, nil)
	sentDesc      = prometheus.NewDesc("hvdd_link_sent_bytes_total", "Payload bytes the cross-node engine sent to a peer node (every job so far), by the peer's --node-rank.", []string{"peer_node"}, nil)
	recvDesc      = prometheus.NewDesc("hvdd_link_received_bytes_total", "Payload bytes the cross-node engine received from a peer node (every job so far), by the peer's --node-rank.", []string{"peer_node"}, nil)
	rttDesc       = prometheus.NewDesc("hvdd_link_rtt_seconds", "The last round-trip time of the control link to a peer node (heartbeat echoes, once per heartbeat period), by the peer's --node-rank.", []string{"peer_node"}, nil)
	devOpsDesc    = prometheus.NewDesc("hvdd_gpu_device_ops_total", "What the device path did to GPU memory since the daemon started, by kind: allocation (cuMemAlloc: fusion and scratch buffers as they grow, results, device outputs), export (IPC handles exported to clients), open and close (clients' IPC memory handles and events), staging (device tensors copied to host memory for the host path). A training job's steady state should add nothing.", []string{"kind"}, nil)
	hostSyncsDesc = prometheus.NewDesc("hvdd_gpu_host_syncs_total", "How often the daemon's host waited for a GPU since it started (a stream synchronised, NCCL's work waited for, the completion event waited on before client memory is unmapped): one or more per response completed host-synchronised, none per response completed ordered on the GPU (hvdd serve --gpu-completion stream).", nil, nil)
	shmDesc       = prometheus.NewDesc("hvdd_shm_mapped_bytes", "Shared memory the daemon has mapped, by kind: client (regions clients registered), channel (their shared-memory channels), output (regions the daemon granted for results).", []string{"kind"}, nil)
)

// Describe sends the collector's descriptors.
func (sc stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{clientsDesc, jobsDesc, slotsDesc, usedDesc, sentDesc, recvDesc, rttDesc, shmDesc, devOpsDesc, hostSyncsDesc} {
		ch <- d
	}
}

// Collect sends the shared memory mapped, then the loop's snapshot, or an
// error in its place when the loop does not answer in time.
func (sc stateCollector) Collect(ch chan<- prometheus.Metric) {
	sh := &sc.l.mapped
	for kind, v := range map[string]int64{"client": sh.client.Load(), "channel": sh.channel.Load(), "output": sh.output.Load()} {
		ch <- prometheus.MustNewConstMetric(shmDesc, prometheus.GaugeValue, float64(v), kind)
	}
	if g := sc.l.cfg.GPUs; g != nil {
		c := g.Counts()
		for kind, v := range map[string]int64{"allocation": c.Allocs, "export": c.Exports, "open": c.Opens, "close": c.Closes, "staging": c.Stagings} {
			ch <- prometheus.MustNewConstMetric(devOpsDesc, prometheus.CounterValue, float64(v), kind)
		}
		ch <- prometheus.MustNewConstMetric(hostSyncsDesc, prometheus.CounterValue, float64(c.HostSyncs))
	}
	ch <- prometheus.MustNewConstMetric(slotsDesc, prometheus.GaugeValue, float64(sc.l.cfg.Slots))
	snap, err := sc.l.snapshot(snapshotTimeout)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(clientsDesc, err)
		return
	}
	for i, st := range clientStates {
		ch <- prometheus.MustNewConstMetric(clientsDesc, prometheus.GaugeValue, float64(snap.clients[i]), st)
	}
	for i, st := range jobStates {
		ch <- prometheus.MustNewConstMetric(jobsDesc, prometheus.GaugeValue, float64(snap.jobs[i]), st)
	}
	ch <- prometheus.MustNewConstMetric(usedDesc, prometheus.GaugeValue, float64(snap.slotsUsed))
	for id, ls := range snap.links {
		peer := fmt.Sprint(id)
		if ls.Bytes {
			ch <- prometheus.MustNewConstMetric(sentDesc, prometheus.CounterValue, float64(ls.Sent), peer)
			ch <- prometheus.MustNewConstMetric(recvDesc, prometheus.CounterValue, float64(ls.Recv), peer)
		}
		if ls.RTT > 0 {
			ch <- prometheus.MustNewConstMetric(rttDesc, prometheus.GaugeValue, ls.RTT.Seconds(), peer)
		}
	}
}

// RegisterMetrics registers the daemon's scrape-time collector with
// Config.Metrics, if set; the returned func unregisters it.
func (l *Loop) RegisterMetrics() (func(), error) {
	m := l.cfg.Metrics
	if m == nil {
		return func() {}, nil
	}
	sc := stateCollector{l}
	if err := m.Registry().Register(sc); err != nil {
		return nil, fmt.Errorf("daemon: Config.Metrics is in use by another Server (give each its own metrics.New): %w", err)
	}
	return func() { m.Registry().Unregister(sc) }, nil
}
