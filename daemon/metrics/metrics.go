// Package metrics is the daemon's Prometheus instrumentation: the metric
// families hvdd exports (see docs/ARCHITECTURE.md, "Metrics"), children
// resolved ahead of the hot path so that counting an op costs a few atomic
// adds and no allocation, and the /metrics HTTP endpoint on a listener of
// its own.
//
// It does not read the daemon's state: the daemon counts into a Job's
// children from its loop and executor, registers a collector of its own
// (Registry) for what is read at scrape time (clients, jobs, links), and
// hands over each round of its GPU sampler's figures (SetGPUs, gpu.go).
// Nothing here blocks the daemon: the scrape runs on the HTTP server's
// goroutines, and the children the hot path touches are atomic.
//
// A job's series carry the label job_name (the name its processes gave:
// hvdd run --job, HVDD_JOB), not job, which Prometheus attaches to every
// scraped series itself (the scrape job's name) and would rename ours to
// exported_job. They are deleted Retain after the job ended, so that a
// daemon running many short jobs with generated names keeps a bounded set
// of series.
package metrics

import (
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

// DefaultRetain is how long a job's series outlive the job when
// Options.Retain is zero: a few scrapes at any usual interval.
const DefaultRetain = 5 * time.Minute

// Options configures New. The zero value is the production setting.
type Options struct {
	// Retain is how long the series of a job that ended are kept before
	// they are deleted. Zero means DefaultRetain; negative deletes them
	// as the job ends.
	Retain time.Duration
	// Version is the daemon's version, exported as hvdd_build_info. Empty
	// leaves the label empty.
	Version string
	// NoProcess leaves out the process and Go runtime collectors (tests
	// that compare whole expositions).
	NoProcess bool
}

// Size classes of op latency (the size label): an op's bytes fall in the
// first class whose bound they do not exceed.
var (
	sizeBounds = [...]int64{4 << 10, 1 << 20, 64 << 20, math.MaxInt64}
	sizeNames  = [...]string{"4KiB", "1MiB", "64MiB", "+Inf"}
)

// NumSizeClasses is the number of size classes (the size label's values:
// 4KiB, 1MiB, 64MiB and +Inf, each the class's upper bound).
const NumSizeClasses = len(sizeBounds)

// SizeClass returns the size class of an op of n bytes.
func SizeClass(n int64) int {
	for i, b := range sizeBounds {
		if n <= b {
			return i
		}
	}
	return NumSizeClasses - 1
}

// SizeClassName returns the size label of class k.
func SizeClassName(k int) string { return sizeNames[k] }

// numOps bounds tensor.OpType values (INVALID..RECV).
const numOps = 10

// opNames are the collective label's values, by tensor.OpType.
var opNames = func() (n [numOps]string) {
	for i := range n {
		n[i] = tensor.OpType(i).Lower()
	}
	return n
}()

// CodeName is the code label of an ipc status code: "ok", "mismatch",
// "aborted", ... (the enum's name without CODE_, in lower case).
func CodeName(c ipcpb.Code) string {
	if s, ok := ipcpb.Code_name[int32(c)]; ok {
		return strings.ToLower(strings.TrimPrefix(s, "CODE_"))
	}
	return "unknown"
}

// Histogram buckets.
var (
	// Op latency: 10 µs (a small allreduce on one node) to 9 s.
	latencyBuckets = prometheus.ExponentialBuckets(10e-6, 2.5, 16)
	// Negotiation wait: 1 µs (ranks in lockstep) to 14 s (a stall).
	waitBuckets = prometheus.ExponentialBuckets(1e-6, 3, 16)
	// Tensors per fused response or batch: 1 to 2048.
	countBuckets = prometheus.ExponentialBuckets(1, 2, 12)
	// Bytes per fused response or batch: 256 B to 1 GiB.
	byteBuckets = prometheus.ExponentialBuckets(256, 4, 12)
)

// Metrics holds the registry and the families of one daemon. Create it
// with New; its methods are safe for concurrent use.
type Metrics struct {
	reg    *prometheus.Registry
	retain time.Duration

	ops            *prometheus.CounterVec
	bytes          *prometheus.CounterVec
	latency        *prometheus.HistogramVec
	wait           *prometheus.HistogramVec
	respTensors    *prometheus.HistogramVec
	respBytes      *prometheus.HistogramVec
	batchTensors   *prometheus.HistogramVec
	batchBytes     *prometheus.HistogramVec
	stallWarnings  *prometheus.CounterVec
	stallShutdowns *prometheus.CounterVec
	gpus           *gpuCollector

	// now is the clock of retention; time.Now but in tests.
	now func() time.Time

	// mu guards the fields that follow (never held by the hot path: only
	// as a job starts or ends, and at scrape time).
	mu   sync.Mutex
	jobs map[string]*jobEntry
}

// jobEntry is a job name with series: how many Jobs use it now, and when
// the last one was released.
type jobEntry struct {
	live  int
	ended time.Time
}

// New returns the daemon's metrics, registered in a registry of their own
// with the process and Go runtime collectors (unless opts.NoProcess).
func New(opts Options) *Metrics {
	retain := opts.Retain
	if retain == 0 {
		retain = DefaultRetain
	}
	m := &Metrics{reg: prometheus.NewRegistry(), retain: retain, now: time.Now, jobs: make(map[string]*jobEntry)}
	job := []string{"job_name"}
	m.ops = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hvdd_ops_total",
		Help: "Ops answered (one per rank per tensor), by job, collective and status code (ok, or the error's code).",
	}, []string{"job_name", "collective", "code"})
	m.bytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hvdd_op_bytes_total",
		Help: "Input bytes of the ops answered ok (one rank's tensor per op, summed over ranks), by job and collective.",
	}, []string{"job_name", "collective"})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "hvdd_op_duration_seconds",
		Help:    "Time from the dispatch of a response's batch (to the idle executor, or run inline by the loop) to its ranks' answers, once per tensor, by job, collective and size class (the op's bytes: at most 4KiB, 1MiB, 64MiB, or +Inf).",
		Buckets: latencyBuckets,
	}, []string{"job_name", "collective", "size"})
	m.wait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "hvdd_negotiation_wait_seconds",
		Help:    "Per tensor, the time from this node's first rank's request to its last rank's (how long ranks wait for each other here), by job.",
		Buckets: waitBuckets,
	}, job)
	m.respTensors = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "hvdd_fusion_response_tensors", Help: "Tensors per fused response (one collective on one buffer), by job.", Buckets: countBuckets,
	}, job)
	m.respBytes = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "hvdd_fusion_response_bytes", Help: "Payload bytes per fused response, by job.", Buckets: byteBuckets,
	}, job)
	m.batchTensors = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "hvdd_fusion_batch_tensors", Help: "Tensors per batch (the responses ready together, run as one), by job.", Buckets: countBuckets,
	}, job)
	m.batchBytes = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "hvdd_fusion_batch_bytes", Help: "Payload bytes per batch, by job.", Buckets: byteBuckets,
	}, job)
	m.stallWarnings = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hvdd_stall_warnings_total",
		Help: "Stall warnings logged (tensors some ranks waited on longer than --stall-check), by job.",
	}, job)
	m.stallShutdowns = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hvdd_stall_shutdowns_total",
		Help: "Jobs failed by a stall longer than --stall-shutdown, by job.",
	}, job)
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hvdd_build_info", Help: "The daemon's version; always 1.",
	}, []string{"version"})
	build.WithLabelValues(opts.Version).Set(1)
	m.gpus = newGPUCollector()
	m.reg.MustRegister(m.ops, m.bytes, m.latency, m.wait, m.respTensors, m.respBytes,
		m.batchTensors, m.batchBytes, m.stallWarnings, m.stallShutdowns, build, m.gpus)
	if !opts.NoProcess {
		m.reg.MustRegister(&cached{c: collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), every: processEvery, now: time.Now},
			collectors.NewGoCollector())
	}
	return m
}

// processEvery is how often at most the process collector reads /proc:
// each reading costs about a millisecond of CPU (/proc/self/net/netstat,
// /proc/stat, the descriptor table), which a scraper polling every 100 ms
// would otherwise pay each time. Its values are then up to this old.
const processEvery = time.Second

// cached is a collector whose metrics are collected from c at most once
// per every, and sent again as they were in between (const metrics, which
// stay valid).
type cached struct {
	c     prometheus.Collector
	every time.Duration
	now   func() time.Time

	// mu guards the fields that follow; held through a collection, so
	// that concurrent scrapes collect once.
	mu   sync.Mutex
	at   time.Time
	last []prometheus.Metric
}

// Describe passes c's descriptors on.
func (c *cached) Describe(ch chan<- *prometheus.Desc) { c.c.Describe(ch) }

// Collect sends c's metrics, collected anew once every has passed.
func (c *cached) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	if now := c.now(); c.last == nil || now.Sub(c.at) >= c.every {
		in := make(chan prometheus.Metric)
		done := make(chan struct{})
		var got []prometheus.Metric
		go func() {
			defer close(done)
			for m := range in {
				got = append(got, m)
			}
		}()
		c.c.Collect(in)
		close(in)
		<-done
		c.at, c.last = now, got
	}
	last := c.last
	c.mu.Unlock()
	for _, m := range last {
		ch <- m
	}
}

// Registry is the registry the metrics live in: the daemon registers its
// scrape-time collector there, and Handler serves it.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// jobVecs are the families labelled by job_name, for deletion.
func (m *Metrics) jobVecs() []*prometheus.MetricVec {
	return []*prometheus.MetricVec{m.ops.MetricVec, m.bytes.MetricVec, m.latency.MetricVec, m.wait.MetricVec,
		m.respTensors.MetricVec, m.respBytes.MetricVec, m.batchTensors.MetricVec, m.batchBytes.MetricVec,
		m.stallWarnings.MetricVec, m.stallShutdowns.MetricVec}
}

// Job returns the children of a job named name, resolved now (its
// per-job histograms and counters) or on first use (per collective and
// size class). Call Release when the job has ended. Jobs of one name share
// their series. A nil Metrics returns nil, which counts nothing.
func (m *Metrics) Job(name string) *Job {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	m.prune()
	e := m.jobs[name]
	if e == nil {
		e = &jobEntry{}
		m.jobs[name] = e
	}
	e.live++
	m.mu.Unlock()
	return &Job{m: m, name: name,
		wait:        m.wait.WithLabelValues(name),
		respTensors: m.respTensors.WithLabelValues(name), respBytes: m.respBytes.WithLabelValues(name),
		batchTensors: m.batchTensors.WithLabelValues(name), batchBytes: m.batchBytes.WithLabelValues(name),
		stallWarnings: m.stallWarnings.WithLabelValues(name), stallShutdowns: m.stallShutdowns.WithLabelValues(name),
	}
}

// Prune deletes the series of jobs that ended more than Retain ago. The
// handler calls it before each scrape, and Job as a job starts.
func (m *Metrics) Prune() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.prune()
}

func (m *Metrics) prune() {
	now := m.now()
	for name, e := range m.jobs {
		if e.live > 0 || now.Sub(e.ended) < m.retain {
			continue
		}
		for _, v := range m.jobVecs() {
			v.DeletePartialMatch(prometheus.Labels{"job_name": name})
		}
		delete(m.jobs, name)
	}
}

// Job is the instrumentation of one job. Its methods are safe for
// concurrent use, cost no allocation once a collective and size class have
// been seen, and a nil *Job does nothing.
type Job struct {
	m    *Metrics
	name string

	wait                     prometheus.Observer
	respTensors, respBytes   prometheus.Observer
	batchTensors, batchBytes prometheus.Observer
	stallWarnings            prometheus.Counter
	stallShutdowns           prometheus.Counter
	colls                    [numOps]atomic.Pointer[Collective]
	released                 atomic.Bool
}

// Name is the job's name (its job_name label).
func (j *Job) Name() string { return j.name }

// Release says the job has ended: its series are deleted Retain later
// (unless another job of the same name runs by then). Idempotent.
func (j *Job) Release() {
	if j == nil || j.released.Swap(true) {
		return
	}
	m := j.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.jobs[j.name]; e != nil {
		e.live--
		e.ended = m.now()
		if m.retain < 0 {
			m.prune()
		}
	}
}

// Collective returns the children of collective t in the job: nil for a
// nil Job or an invalid t.
func (j *Job) Collective(t tensor.OpType) *Collective {
	if j == nil || int(t) >= numOps {
		return nil
	}
	if c := j.colls[t].Load(); c != nil {
		return c
	}
	c := &Collective{job: j, typ: t,
		ok:    j.m.ops.WithLabelValues(j.name, opNames[t], "ok"),
		bytes: j.m.bytes.WithLabelValues(j.name, opNames[t])}
	if !j.colls[t].CompareAndSwap(nil, c) {
		return j.colls[t].Load()
	}
	return c
}

// Negotiated records one tensor's negotiation wait on this node: from its
// first local rank's request to its last's.
func (j *Job) Negotiated(d time.Duration) {
	if j != nil {
		j.wait.Observe(d.Seconds())
	}
}

// Response records one fused response of a batch: its tensors and bytes.
func (j *Job) Response(tensors int, bytes int64) {
	if j != nil {
		j.respTensors.Observe(float64(tensors))
		j.respBytes.Observe(float64(bytes))
	}
}

// Batch records one batch: the tensors and bytes of its responses.
func (j *Job) Batch(tensors int, bytes int64) {
	if j != nil {
		j.batchTensors.Observe(float64(tensors))
		j.batchBytes.Observe(float64(bytes))
	}
}

// Stalled records a stall warning, and with shutdown the job's failure
// for it.
func (j *Job) Stalled(shutdown bool) {
	if j == nil {
		return
	}
	j.stallWarnings.Inc()
	if shutdown {
		j.stallShutdowns.Inc()
	}
}

// Failed counts an op of collective t answered with code, an error (the
// error path: it may allocate).
func (j *Job) Failed(t tensor.OpType, code ipcpb.Code) {
	if j == nil {
		return
	}
	name := "invalid"
	if int(t) < numOps {
		name = opNames[t]
	}
	j.m.ops.WithLabelValues(j.name, name, CodeName(code)).Inc()
}

// Collective is the instrumentation of one collective in one job.
type Collective struct {
	job   *Job
	typ   tensor.OpType
	ok    prometheus.Counter
	bytes prometheus.Counter
	lat   [NumSizeClasses]atomic.Pointer[observer]
}

// observer holds a resolved histogram child (an interface, which an
// atomic.Pointer cannot hold itself).
type observer struct{ o prometheus.Observer }

// Done counts an op answered with code; bytes is its input's size.
func (c *Collective) Done(code ipcpb.Code, bytes int) {
	if code == ipcpb.Code_CODE_OK {
		c.ok.Inc()
		c.bytes.Add(float64(bytes))
		return
	}
	c.job.Failed(c.typ, code)
}

// Latency returns the latency histogram of size class k (SizeClass).
func (c *Collective) Latency(k int) prometheus.Observer {
	if o := c.lat[k].Load(); o != nil {
		return o.o
	}
	o := &observer{c.job.m.latency.WithLabelValues(c.job.name, opNames[c.typ], sizeNames[k])}
	if !c.lat[k].CompareAndSwap(nil, o) {
		return c.lat[k].Load().o
	}
	return o.o
}
