package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/backends/tcp"
	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/daemon/daemontest"
	"github.com/hvdd/hvdd/daemon/metrics"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// The metrics tests run a known workload through real clients of a real
// daemon and read the counts back: from /metrics as text (every family),
// and through Prometheus itself (its scrape, its storage, its query API).

const (
	metricsJob   = "metrics-test"
	testArena    = 64 << 20 // each client's staging region (hvdd.Client.ArenaSize)
	testOutput   = 1 << 20  // each output region the daemon grants (Config.OutputRegion)
	stallMessage = "One or more tensors were submitted"
)

// series is one expected sample: a metric name (a histogram's _count,
// _sum or _bucket as Prometheus names them), labels besides job_name, and
// its value.
type series struct {
	name   string
	labels map[string]string
	value  float64
}

func (s series) String() string {
	var ls []string
	for k, v := range s.labels {
		ls = append(ls, fmt.Sprintf("%s=%q", k, v))
	}
	sort.Strings(ls)
	return s.name + "{" + strings.Join(ls, ",") + "}"
}

// workloadSeries is what the workload must count in job metricsJob,
// given the stall warnings the daemon logged.
func workloadSeries(stallWarnings int) []series {
	l := func(kv ...string) map[string]string {
		m := map[string]string{"job_name": metricsJob}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	const small, large, bcast, gather = 1000 * 4, 300_000 * 4, 100 * 4, 10 * 4
	return []series{
		// Two ranks: every op counts twice.
		{"hvdd_ops_total", l("collective", "allreduce", "code", "ok"), 2 * (5 + 3)},
		{"hvdd_ops_total", l("collective", "broadcast", "code", "ok"), 2 * 2},
		{"hvdd_ops_total", l("collective", "allgather", "code", "ok"), 2 * 1},
		{"hvdd_ops_total", l("collective", "allreduce", "code", "mismatch"), 2},
		{"hvdd_ops_total", l("collective", "allreduce", "code", "aborted"), 1},
		{"hvdd_op_bytes_total", l("collective", "allreduce"), 2 * (5*small + 3*large)},
		{"hvdd_op_bytes_total", l("collective", "broadcast"), 2 * 2 * bcast},
		{"hvdd_op_bytes_total", l("collective", "allgather"), 2 * gather},
		// Latency: once per tensor executed, by size class.
		{"hvdd_op_duration_seconds_count", l("collective", "allreduce", "size", "4KiB"), 5},
		{"hvdd_op_duration_seconds_count", l("collective", "allreduce", "size", "64MiB"), 3},
		{"hvdd_op_duration_seconds_count", l("collective", "broadcast", "size", "4KiB"), 2},
		{"hvdd_op_duration_seconds_count", l("collective", "allgather", "size", "4KiB"), 1},
		{"hvdd_op_duration_seconds_bucket", l("collective", "allreduce", "size", "64MiB", "le", "+Inf"), 3},
		// Negotiation: every tensor both ranks submitted (the mismatch too).
		{"hvdd_negotiation_wait_seconds_count", l(), 5 + 3 + 2 + 1 + 1},
		// Fusion: blocking ops, one response and tensor per batch; the
		// payload is one rank's input (an allgather's: both ranks').
		{"hvdd_fusion_response_tensors_count", l(), 11},
		{"hvdd_fusion_response_tensors_sum", l(), 11},
		{"hvdd_fusion_batch_tensors_count", l(), 11},
		{"hvdd_fusion_batch_bytes_sum", l(), 5*small + 3*large + 2*bcast + 2*gather},
		{"hvdd_fusion_response_bytes_sum", l(), 5*small + 3*large + 2*bcast + 2*gather},
		{"hvdd_stall_warnings_total", l(), float64(stallWarnings)},
		{"hvdd_stall_shutdowns_total", l(), 1},
		// After the job: nothing connected, nothing mapped.
		{"hvdd_clients", map[string]string{"state": "running"}, 0},
		{"hvdd_clients", map[string]string{"state": "failed"}, 0},
		{"hvdd_jobs", map[string]string{"state": "failed"}, 0},
		{"hvdd_slots", nil, 2},
		{"hvdd_slots_used", nil, 0},
		{"hvdd_shm_mapped_bytes", map[string]string{"kind": "client"}, 0},
		{"hvdd_shm_mapped_bytes", map[string]string{"kind": "channel"}, 0},
		{"hvdd_shm_mapped_bytes", map[string]string{"kind": "output"}, 0},
	}
}

// initJob joins n Go clients of this process to job name on socket, as
// local ranks 0..n-1, with staging regions of testArena bytes.
func initJob(t *testing.T, ctx context.Context, socket, name string, n int) []*hvdd.Client {
	t.Helper()
	clients := make([]*hvdd.Client, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range clients {
		lr := i
		clients[i] = &hvdd.Client{Socket: socket, RequestedLocalRank: &lr, Job: name, JobLocalSize: n, ArenaSize: testArena}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = clients[i].Init(ctx)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
	}
	return clients
}

// runWorkload runs the workload workloadSeries counts: on both ranks 5
// allreduces of 4000 bytes, 3 of 1.2 MB, 2 broadcasts of 400 bytes, an
// allgather of 40 bytes each and a mismatched allreduce; then rank 0
// allreduces a tensor rank 1 never submits, which the stall shutdown fails.
func runWorkload(t *testing.T, ctx context.Context, clients []*hvdd.Client) {
	t.Helper()
	daemontest.RunAll(t, clients, func(c *hvdd.Client) error {
		for i := range 5 {
			if err := hvdd.Allreduce(ctx, c, make([]float32, 1000), hvdd.WithName(fmt.Sprint("small.", i))); err != nil {
				return err
			}
		}
		for i := range 3 {
			if err := hvdd.Allreduce(ctx, c, make([]float32, 300_000), hvdd.WithName(fmt.Sprint("large.", i))); err != nil {
				return err
			}
		}
		for i := range 2 {
			if err := hvdd.Broadcast(ctx, c, make([]int32, 100), 0, hvdd.WithName(fmt.Sprint("bcast.", i))); err != nil {
				return err
			}
		}
		if _, err := hvdd.Allgather(ctx, c, make([]float32, 10), hvdd.WithName("gather")); err != nil {
			return err
		}
		if err := hvdd.Allreduce(ctx, c, make([]float32, 4+c.Rank()), hvdd.WithName("mismatch")); !errors.Is(err, hvdd.ErrMismatch) {
			return fmt.Errorf("shapes 4 and 5: %v, want a mismatch", err)
		}
		return nil
	})
	if err := hvdd.Allreduce(ctx, clients[0], []float32{1}, hvdd.WithName("lonely")); !errors.Is(err, hvdd.ErrAborted) {
		t.Fatalf("stalled allreduce: %v, want the stall shutdown's abort", err)
	}
}

// scrape reads and parses url's /metrics.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("/metrics: %s\n%s", resp.Status, b)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}

// sample finds the one series s names in fams (histogram _count, _sum and
// _bucket read from their family) and returns its value.
func sample(fams map[string]*dto.MetricFamily, s series) (float64, error) {
	name, part := s.name, ""
	for _, suffix := range []string{"_count", "_sum", "_bucket"} {
		if f := fams[strings.TrimSuffix(s.name, suffix)]; strings.HasSuffix(s.name, suffix) && f != nil && f.GetType() == dto.MetricType_HISTOGRAM {
			name, part = strings.TrimSuffix(s.name, suffix), suffix
		}
	}
	f := fams[name]
	if f == nil {
		return 0, fmt.Errorf("no family %s", name)
	}
	var found []float64
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = lp.GetValue()
		}
		ok := true
		for k, v := range s.labels {
			if k != "le" && have[k] != v {
				ok = false
			}
		}
		if !ok {
			continue
		}
		switch h := m.GetHistogram(); {
		case part == "_count":
			found = append(found, float64(h.GetSampleCount()))
		case part == "_sum":
			found = append(found, h.GetSampleSum())
		case part == "_bucket" && s.labels["le"] == "+Inf":
			found = append(found, float64(h.GetSampleCount()))
		case m.GetCounter() != nil:
			found = append(found, m.GetCounter().GetValue())
		case m.GetGauge() != nil:
			found = append(found, m.GetGauge().GetValue())
		}
	}
	if len(found) != 1 {
		return 0, fmt.Errorf("%d series match", len(found))
	}
	return found[0], nil
}

// metricsDaemon starts a daemon of 2 slots counting into metrics it serves
// on a loopback port, with a quick stall check and shutdown; it returns the
// daemon and the endpoint's address.
func metricsDaemon(t *testing.T) (*daemontest.Server, string) {
	t.Helper()
	m := metrics.New(metrics.Options{Version: daemon.Version})
	ln, err := metrics.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := m.Serve(ln, nil)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	s := daemontest.Start(t, daemon.Config{Slots: 2, Metrics: m, OutputRegion: testOutput,
		StallCheck: 200 * time.Millisecond, StallShutdown: 700 * time.Millisecond})
	return s, srv.Addr()
}

// TestMetricsExposition runs the workload and reads /metrics as text:
// every family of the daemon's, with the workload's counts exactly, the
// gauges while the job runs and fails and after it, and the process and Go
// runtime collectors'.
func TestMetricsExposition(t *testing.T) {
	s, addr := metricsDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	clients := initJob(t, ctx, s.Socket, metricsJob, 2)
	// Each client registers its shared-memory channel after Init returns,
	// on its own: wait until the daemon has mapped both (it counts a
	// channel's bytes, then logs it).
	for lr := range 2 {
		s.WaitLog(t, fmt.Sprintf(`msg="shared-memory channel registered" pid=%d local_rank=%d`, os.Getpid(), lr), 10*time.Second)
	}
	running := scrape(t, addr)
	for _, want := range []series{
		{"hvdd_clients", map[string]string{"state": "running"}, 2},
		{"hvdd_jobs", map[string]string{"state": "running"}, 1},
		{"hvdd_slots_used", nil, 2},
		{"hvdd_shm_mapped_bytes", map[string]string{"kind": "client"}, 2 * testArena},
	} {
		if got, err := sample(running, want); err != nil || got != want.value {
			t.Errorf("job running: %v = %v (%v), want %v", want, got, err, want.value)
		}
	}
	if got, err := sample(running, series{"hvdd_shm_mapped_bytes", map[string]string{"kind": "channel"}, 0}); err != nil || got <= 0 {
		t.Errorf("job running: channel regions mapped %v (%v), want some", got, err)
	}
	runWorkload(t, ctx, clients)
	failed := scrape(t, addr)
	for _, want := range []series{
		{"hvdd_clients", map[string]string{"state": "failed"}, 2},
		{"hvdd_jobs", map[string]string{"state": "failed"}, 1},
		{"hvdd_shm_mapped_bytes", map[string]string{"kind": "output"}, 2 * testOutput},
	} {
		if got, err := sample(failed, want); err != nil || got != want.value {
			t.Errorf("job failed, clients connected: %v = %v (%v), want %v", want, got, err, want.value)
		}
	}
	for _, c := range clients {
		c.Close()
	}
	s.WaitLog(t, `msg="job ended"`, 10*time.Second)
	fams := scrape(t, addr)
	for _, want := range workloadSeries(strings.Count(s.Logs(), stallMessage)) {
		if got, err := sample(fams, want); err != nil || got != want.value {
			t.Errorf("%v = %v (%v), want %v", want, got, err, want.value)
		}
	}
	if n := strings.Count(s.Logs(), stallMessage); n < 1 {
		t.Errorf("the daemon logged no stall warning")
	}
	// The latency of the large allreduces lies in the histogram's range.
	if sum, err := sample(fams, series{name: "hvdd_op_duration_seconds_sum", labels: map[string]string{"collective": "allreduce", "size": "64MiB"}}); err != nil || sum <= 0 || sum > 30 {
		t.Errorf("3 large allreduces took %v s in all (%v)", sum, err)
	}
	for _, name := range []string{"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds", "go_goroutines"} {
		if got, err := sample(fams, series{name: name}); err != nil || got <= 0 {
			t.Errorf("%s = %v (%v), want a positive value", name, got, err)
		}
	}
	if got, err := sample(fams, series{"hvdd_build_info", map[string]string{"version": daemon.Version}, 1}); err != nil || got != 1 {
		t.Errorf("hvdd_build_info: %v (%v)", got, err)
	}
}

// TestMetricsRefusedOp: an op the daemon refuses before it reaches the
// job (its buffer lies outside every region) counts as invalid_argument.
func TestMetricsRefusedOp(t *testing.T) {
	s, addr := metricsDaemon(t)
	r := dialRaw(t, s.Socket)
	r.helloJob("refused", 1, 0)
	r.welcome()
	r.send(7, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Enqueue{Enqueue: &ipcpb.Enqueue{Name: "x", Op: ipcpb.OpType_OP_ALLREDUCE,
		Dtype: ipcpb.DType_DTYPE_FLOAT32, Shape: []int64{4}, Buffer: &ipcpb.Buffer{Region: 999, Length: 16}}}}, -1)
	if _, m, err := r.next(); err != nil || m.GetDone().GetCode().String() != "CODE_INVALID_ARGUMENT" {
		t.Fatalf("want an invalid-argument Done, got %v %v", m, err)
	}
	want := series{"hvdd_ops_total", map[string]string{"job_name": "refused", "collective": "allreduce", "code": "invalid_argument"}, 1}
	if got, err := sample(scrape(t, addr), want); err != nil || got != 1 {
		t.Fatalf("%v = %v (%v), want 1", want, got, err)
	}
}

var metricsSecret = []byte("metrics test secret, 32 bytes!!!")

// TestMetricsLinks runs a job on two nodes (one rank each, tcp engine):
// each daemon counts its own rank's ops, the bytes each node's engine sent
// the other are the bytes the other received, the control link's round
// trip is measured both ways, and the link counters outlive the job.
func TestMetricsLinks(t *testing.T) {
	rdvLn, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	rdv := rdvLn.Addr().String()
	rdvLn.Close()
	factory := func(ctx context.Context, j daemon.MultiNodeJob) (backends.Backend, error) {
		return tcp.New(ctx, tcp.Config{Rank: j.NodeRank, Size: j.Nodes, Store: j.Store, Prefix: j.ID,
			ListenAddr: net.JoinHostPort(j.Host, "0"), Secret: j.Secret, Logger: j.Logger})
	}
	var nodes []*daemontest.Server
	var addrs []string
	for n := range 2 {
		m := metrics.New(metrics.Options{NoProcess: true})
		ln, err := metrics.Listen("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := m.Serve(ln, nil)
		t.Cleanup(func() { srv.Shutdown(context.Background()) })
		nodes = append(nodes, daemontest.Start(t, daemon.Config{
			Slots: 1, Nodes: 2, NodeRank: n, Rendezvous: rdv, Advertise: fmt.Sprintf("127.0.0.%d", n+2),
			Secret: metricsSecret, NewBackend: factory, Metrics: m,
			Heartbeat: 50 * time.Millisecond, PeerTimeout: 2 * time.Second, StartTimeout: 30 * time.Second,
		}))
		addrs = append(addrs, srv.Addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	clients := make([]*hvdd.Client, 2)
	for n := range clients {
		clients[n] = &hvdd.Client{Socket: nodes[n].Socket, Job: metricsJob, ArenaSize: testArena}
	}
	daemontest.RunAll(t, clients, func(c *hvdd.Client) error { return c.Init(ctx) })
	daemontest.RunAll(t, clients, func(c *hvdd.Client) error {
		for i := range 3 {
			if err := hvdd.Allreduce(ctx, c, make([]float32, 1<<18), hvdd.WithName(fmt.Sprint("w.", i))); err != nil {
				return err
			}
		}
		return nil
	})
	peer := func(n int) map[string]string { return map[string]string{"peer_node": strconv.Itoa(1 - n)} }
	// The round trip: each side has echoed the other's heartbeat.
	deadline := time.Now().Add(20 * time.Second)
	for n := 0; n < 2; {
		if rtt, err := sample(scrape(t, addrs[n]), series{name: "hvdd_link_rtt_seconds", labels: peer(n)}); err == nil {
			if rtt <= 0 || rtt > 2 {
				t.Fatalf("node %d: loopback rtt %v s", n, rtt)
			}
			n++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %d measured no round trip to node %d in 20 s", n, 1-n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	during := linkBytes(t, addrs, peer)
	for _, c := range clients {
		c.Close()
	}
	for _, s := range nodes {
		s.WaitLog(t, `msg="job ended"`, 20*time.Second)
	}
	after := linkBytes(t, addrs, peer)
	if after != during {
		t.Errorf("link counters after the job %v, during it %v: want them kept", after, during)
	}
	for n := range nodes {
		want := series{"hvdd_ops_total", map[string]string{"job_name": metricsJob, "collective": "allreduce", "code": "ok"}, 3}
		if got, err := sample(scrape(t, addrs[n]), want); err != nil || got != 3 {
			t.Errorf("node %d: %v = %v (%v), want 3 (its own rank's)", n, want, got, err)
		}
	}
}

// linkBytes reads both nodes' link counters and checks that what each sent
// the other is what the other received.
func linkBytes(t *testing.T, addrs []string, peer func(int) map[string]string) [2][2]float64 {
	t.Helper()
	var b [2][2]float64
	for n, addr := range addrs {
		fams := scrape(t, addr)
		var err1, err2 error
		b[n][0], err1 = sample(fams, series{name: "hvdd_link_sent_bytes_total", labels: peer(n)})
		b[n][1], err2 = sample(fams, series{name: "hvdd_link_received_bytes_total", labels: peer(n)})
		if err1 != nil || err2 != nil {
			t.Fatalf("node %d: link bytes: %v, %v", n, err1, err2)
		}
	}
	if b[0][0] <= 3<<20/2 || b[0][0] != b[1][1] || b[1][0] != b[0][1] {
		t.Errorf("link bytes: node 0 sent %v received %v, node 1 sent %v received %v: want each node's sent (at least half of 3 MiB) the other's received",
			b[0][0], b[0][1], b[1][0], b[1][1])
	}
	return b
}

// promServer is a Prometheus server started for a test.
type promServer struct {
	url string
	out *bytes.Buffer
}

// startPrometheus starts /usr/bin/prometheus scraping target every 200 ms
// (job "hvdd"), with its storage in a temporary directory and its API on a
// free loopback port, and waits until it is ready. It skips the test when
// Prometheus is not installed (scripts/setup.sh installs it).
func startPrometheus(t *testing.T, target string) *promServer {
	t.Helper()
	const bin = "/usr/bin/prometheus"
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("%s is missing (scripts/setup.sh installs Debian's prometheus package): %v", bin, err)
	}
	dir := t.TempDir()
	cfg := fmt.Sprintf("global:\n  scrape_interval: 200ms\n  scrape_timeout: 200ms\nscrape_configs:\n  - job_name: hvdd\n    static_configs:\n      - targets: [%q]\n", target)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	web := ln.Addr().String()
	ln.Close()
	p := &promServer{url: "http://" + web, out: &bytes.Buffer{}}
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+web, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("prometheus output:\n%s", p.out)
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(p.url + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case <-exited:
			t.Fatalf("prometheus exited before it was ready:\n%s", p.out)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 60 s:\n%s", p.out)
		}
	}
}

// query evaluates a PromQL instant query at time at (unix seconds; 0:
// now) and returns the vector's samples by their labels.
func (p *promServer) query(t *testing.T, q string, at float64) []model.Sample {
	t.Helper()
	v := url.Values{"query": {q}}
	if at != 0 {
		v.Set("time", strconv.FormatFloat(at, 'f', -1, 64))
	}
	resp, err := http.Get(p.url + "/api/v1/query?" + v.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string         `json:"resultType"`
			Result     []model.Sample `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("query %s: %v", q, err)
	}
	if r.Status != "success" || r.Data.ResultType != "vector" {
		t.Fatalf("query %s: %s %s (result type %q)", q, r.Status, r.Error, r.Data.ResultType)
	}
	return r.Data.Result
}

// TestMetricsPrometheus has Prometheus itself scrape the daemon through
// the workload, waits until it has scraped after the workload ended, and
// reads every count back through its query API: the same values, exactly,
// as the workload's and as /metrics says; the scrape's own job label beside
// the daemon's job_name.
func TestMetricsPrometheus(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Prometheus")
	}
	s, addr := metricsDaemon(t)
	prom := startPrometheus(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	clients := initJob(t, ctx, s.Socket, metricsJob, 2)
	runWorkload(t, ctx, clients)
	for _, c := range clients {
		c.Close()
	}
	s.WaitLog(t, `msg="job ended"`, 10*time.Second)
	ended := float64(time.Now().UnixNano()) / 1e9

	// A scrape that started after the job ended: its samples carry its
	// start time.
	var at float64
	deadline := time.Now().Add(30 * time.Second)
	for {
		if r := prom.query(t, `timestamp(up{job="hvdd"} == 1)`, 0); len(r) == 1 && float64(r[0].Value) > ended {
			at = float64(r[0].Value)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus did not scrape the daemon successfully after the workload within 30 s: %v", prom.query(t, `up`, 0))
		}
		time.Sleep(50 * time.Millisecond)
	}
	direct := scrape(t, addr)
	for _, want := range workloadSeries(strings.Count(s.Logs(), stallMessage)) {
		var sel []string
		for k, v := range want.labels {
			sel = append(sel, fmt.Sprintf("%s=%q", k, v))
		}
		sel = append(sel, `job="hvdd"`)
		q := want.name + "{" + strings.Join(sel, ",") + "}"
		r := prom.query(t, q, at)
		if len(r) != 1 {
			t.Errorf("prometheus: %s has %d series, want 1: %v", q, len(r), r)
			continue
		}
		got := float64(r[0].Value)
		if got != want.value {
			t.Errorf("prometheus: %s = %v, want %v", q, got, want.value)
		}
		if d, err := sample(direct, want); err != nil || d != got {
			t.Errorf("prometheus: %s = %v, /metrics says %v (%v)", q, got, d, err)
		}
	}
	// Histograms: the buckets Prometheus stored add up, per collective and
	// size class, to the counts.
	r := prom.query(t, fmt.Sprintf(`sum by (collective, size) (hvdd_op_duration_seconds_bucket{job_name=%q,le="+Inf"}) - sum by (collective, size) (hvdd_op_duration_seconds_count{job_name=%q})`, metricsJob, metricsJob), at)
	if len(r) != 4 {
		t.Errorf("latency histograms in prometheus: %d collective/size pairs, want 4: %v", len(r), r)
	}
	for _, smp := range r {
		if smp.Value != 0 {
			t.Errorf("latency histogram %v: +Inf bucket and count differ by %v", smp.Metric, smp.Value)
		}
	}
}

// TestMetricsTwoJobs: two jobs at once on one daemon count into their own
// series, and the gauges count both.
func TestMetricsTwoJobs(t *testing.T) {
	m := metrics.New(metrics.Options{NoProcess: true})
	ln, err := metrics.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := m.Serve(ln, nil)
	defer srv.Shutdown(context.Background())
	s := daemontest.Start(t, daemon.Config{Slots: 4, Metrics: m})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	jobs := map[string]int{"job-a": 3, "job-b": 5} // allreduces each
	all := map[string][]*hvdd.Client{}
	for name := range jobs {
		all[name] = initJob(t, ctx, s.Socket, name, 2)
	}
	var wg sync.WaitGroup
	for name, n := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			daemontest.RunAll(t, all[name], func(c *hvdd.Client) error {
				for i := range n {
					if err := hvdd.Allreduce(ctx, c, make([]float32, 64), hvdd.WithName(fmt.Sprint("t.", i))); err != nil {
						return err
					}
				}
				return nil
			})
		}()
	}
	wg.Wait()
	fams := scrape(t, srv.Addr())
	want := []series{
		{"hvdd_clients", map[string]string{"state": "running"}, 4},
		{"hvdd_jobs", map[string]string{"state": "running"}, 2},
		{"hvdd_slots_used", nil, 4},
	}
	for name, n := range jobs {
		want = append(want,
			series{"hvdd_ops_total", map[string]string{"job_name": name, "collective": "allreduce", "code": "ok"}, float64(2 * n)},
			series{"hvdd_op_duration_seconds_count", map[string]string{"job_name": name, "collective": "allreduce", "size": "4KiB"}, float64(n)})
	}
	for _, w := range want {
		if got, err := sample(fams, w); err != nil || got != w.value {
			t.Errorf("%v = %v (%v), want %v", w, got, err, w.value)
		}
	}
	for _, cs := range all {
		for _, c := range cs {
			c.Close()
		}
	}
}
