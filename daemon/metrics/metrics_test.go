package metrics

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

func TestSizeClass(t *testing.T) {
	tests := []struct {
		n    int64
		want string
	}{
		{0, "4KiB"}, {1, "4KiB"}, {4096, "4KiB"}, {4097, "1MiB"}, {1 << 20, "1MiB"},
		{1<<20 + 1, "64MiB"}, {64 << 20, "64MiB"}, {64<<20 + 1, "+Inf"}, {1 << 40, "+Inf"},
	}
	for _, tc := range tests {
		if got := SizeClassName(SizeClass(tc.n)); got != tc.want {
			t.Errorf("SizeClass(%d) = %s, want %s", tc.n, got, tc.want)
		}
	}
}

func TestAddr(t *testing.T) {
	tests := []struct {
		in, want string
		bad      bool
	}{
		{in: ":9464", want: "127.0.0.1:9464"},
		{in: "9464", want: "127.0.0.1:9464"},
		{in: "127.0.0.2:80", want: "127.0.0.2:80"},
		{in: "0.0.0.0:9464", want: "0.0.0.0:9464"},
		{in: "[::1]:9464", want: "[::1]:9464"},
		{in: "node1.example:9464", want: "node1.example:9464"},
		{in: "", bad: true},
		{in: "host", bad: true},
		{in: ":http", bad: true},
		{in: "70000", bad: true},
		{in: "h:70000", bad: true},
	}
	for _, tc := range tests {
		got, err := Addr(tc.in)
		switch {
		case tc.bad && err == nil:
			t.Errorf("Addr(%q) = %q, want an error", tc.in, got)
		case !tc.bad && (err != nil || got != tc.want):
			t.Errorf("Addr(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestCodeName(t *testing.T) {
	for code, want := range map[ipcpb.Code]string{
		ipcpb.Code_CODE_OK: "ok", ipcpb.Code_CODE_MISMATCH: "mismatch", ipcpb.Code_CODE_ABORTED: "aborted",
		ipcpb.Code_CODE_INVALID_ARGUMENT: "invalid_argument", ipcpb.Code(999): "unknown",
	} {
		if got := CodeName(code); got != want {
			t.Errorf("CodeName(%v) = %q, want %q", code, got, want)
		}
	}
}

// families gathers m's registry.
func families(t *testing.T, m *Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]*dto.MetricFamily)
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// jobSeries counts the series of job name across m's families.
func jobSeries(t *testing.T, m *Metrics, name string) int {
	t.Helper()
	n := 0
	for _, f := range families(t, m) {
		for _, mt := range f.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == "job_name" && lp.GetValue() == name {
					n++
				}
			}
		}
	}
	return n
}

func TestJobCounts(t *testing.T) {
	m := New(Options{NoProcess: true, Version: "test"})
	j := m.Job("train")
	ar := j.Collective(tensor.Allreduce)
	if j.Collective(tensor.Allreduce) != ar {
		t.Fatal("a collective's children were resolved twice")
	}
	for range 3 {
		ar.Done(ipcpb.Code_CODE_OK, 100)
	}
	ar.Done(ipcpb.Code_CODE_MISMATCH, 100)
	j.Failed(tensor.OpType(200), ipcpb.Code_CODE_INVALID_ARGUMENT)
	ar.Latency(SizeClass(100)).Observe(0.001)
	ar.Latency(SizeClass(100)).Observe(0.002)
	j.Negotiated(3 * time.Millisecond)
	j.Response(4, 400)
	j.Batch(4, 400)
	j.Stalled(false)
	j.Stalled(true)
	for _, tc := range []struct {
		got  float64
		want float64
		what string
	}{
		{testutil.ToFloat64(m.ops.WithLabelValues("train", "allreduce", "ok")), 3, "ok ops"},
		{testutil.ToFloat64(m.ops.WithLabelValues("train", "allreduce", "mismatch")), 1, "mismatched ops"},
		{testutil.ToFloat64(m.ops.WithLabelValues("train", "invalid", "invalid_argument")), 1, "invalid ops"},
		{testutil.ToFloat64(m.bytes.WithLabelValues("train", "allreduce")), 300, "bytes (ok ops only)"},
		{testutil.ToFloat64(m.stallWarnings.WithLabelValues("train")), 2, "stall warnings"},
		{testutil.ToFloat64(m.stallShutdowns.WithLabelValues("train")), 1, "stall shutdowns"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %v, want %v", tc.what, tc.got, tc.want)
		}
	}
	h := families(t, m)["hvdd_op_duration_seconds"].GetMetric()
	if len(h) != 1 || h[0].GetHistogram().GetSampleCount() != 2 || h[0].GetHistogram().GetSampleSum() != 0.003 {
		t.Errorf("latency histograms: %v, want one of 2 samples summing 3 ms", h)
	}
	for _, lp := range h[0].GetLabel() {
		if lp.GetName() == "size" && lp.GetValue() != "4KiB" {
			t.Errorf("size label %q, want 4KiB", lp.GetValue())
		}
	}
	if b := families(t, m)["hvdd_build_info"].GetMetric(); len(b) != 1 || b[0].GetLabel()[0].GetValue() != "test" {
		t.Errorf("build info: %v", b)
	}
}

// TestRetention: a job's series outlive it by Retain, then go, unless a
// job of the same name runs again.
func TestRetention(t *testing.T) {
	m := New(Options{NoProcess: true, Retain: time.Minute})
	now := time.Unix(1000, 0)
	m.now = func() time.Time { return now }

	a := m.Job("a")
	a.Collective(tensor.Allreduce).Done(ipcpb.Code_CODE_OK, 1)
	b := m.Job("b")
	b.Collective(tensor.Broadcast).Done(ipcpb.Code_CODE_OK, 1)
	a.Release()
	a.Release() // idempotent
	b.Release()
	b2 := m.Job("b") // b runs again before its series expire
	now = now.Add(59 * time.Second)
	m.Prune()
	if jobSeries(t, m, "a") == 0 {
		t.Fatal("job a's series went before Retain")
	}
	now = now.Add(2 * time.Second)
	m.Prune()
	if n := jobSeries(t, m, "a"); n != 0 {
		t.Fatalf("job a ended over Retain ago and still has %d series", n)
	}
	if jobSeries(t, m, "b") == 0 {
		t.Fatal("job b runs again, but its series went")
	}
	if got := testutil.ToFloat64(m.ops.WithLabelValues("b", "broadcast", "ok")); got != 1 {
		t.Fatalf("job b's count across its two runs = %v, want 1 (kept)", got)
	}
	b2.Release()

	now2 := New(Options{NoProcess: true, Retain: -1})
	c := now2.Job("c")
	c.Collective(tensor.Allreduce).Done(ipcpb.Code_CODE_OK, 1)
	c.Release()
	if n := jobSeries(t, now2, "c"); n != 0 {
		t.Fatalf("negative Retain kept %d series", n)
	}
}

func TestNil(t *testing.T) {
	var m *Metrics
	j := m.Job("x")
	if j != nil {
		t.Fatal("a nil Metrics gave a Job")
	}
	j.Release()
	j.Negotiated(time.Second)
	j.Response(1, 1)
	j.Batch(1, 1)
	j.Stalled(true)
	j.Failed(tensor.Allreduce, ipcpb.Code_CODE_ABORTED)
	if j.Collective(tensor.Allreduce) != nil {
		t.Fatal("a nil Job gave a Collective")
	}
}

// TestHotPathAllocs pins the hot path at zero allocations once a
// collective and size class have been seen.
func TestHotPathAllocs(t *testing.T) {
	m := New(Options{NoProcess: true})
	j := m.Job("j")
	c := j.Collective(tensor.Allreduce)
	c.Latency(0)
	if n := testing.AllocsPerRun(1000, func() {
		c := j.Collective(tensor.Allreduce)
		c.Done(ipcpb.Code_CODE_OK, 4096)
		c.Latency(0).Observe(20e-6)
		j.Negotiated(time.Microsecond)
		j.Response(1, 4096)
		j.Batch(1, 4096)
	}); n != 0 {
		t.Fatalf("hot path allocates %v times per op, want 0", n)
	}
}

// BenchmarkHotPath is one op's counting in the package: its collective,
// its answer, its latency, negotiation wait and fusion.
func BenchmarkHotPath(b *testing.B) {
	m := New(Options{NoProcess: true})
	j := m.Job("j")
	b.ReportAllocs()
	for b.Loop() {
		c := j.Collective(tensor.Allreduce)
		c.Done(ipcpb.Code_CODE_OK, 4096)
		c.Latency(0).Observe(20e-6)
		j.Negotiated(time.Microsecond)
		j.Response(1, 4096)
		j.Batch(1, 4096)
	}
}

// TestServe serves the endpoint on loopback and reads it as a scraper
// would: the text format, parseable, with the process collector's metrics.
func TestServe(t *testing.T) {
	m := New(Options{Version: "v"})
	m.Job("j").Collective(tensor.Allreduce).Done(ipcpb.Code_CODE_OK, 8)
	ln, err := Listen(":0")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ln.Addr().String(), "127.0.0.1:") {
		t.Fatalf("a bare port bound %s, want loopback", ln.Addr())
	}
	srv := m.Serve(ln, nil)
	defer func() {
		if err := srv.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	}()
	get := func(path string) (*http.Response, string) {
		resp, err := http.Get("http://" + srv.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, string(body)
	}
	resp, body := get("/metrics")
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("/metrics: %s, %q", resp.Status, resp.Header.Get("Content-Type"))
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v\n%s", err, body)
	}
	for _, name := range []string{"hvdd_ops_total", "hvdd_op_bytes_total", "hvdd_build_info", "process_cpu_seconds_total", "process_resident_memory_bytes", "go_goroutines"} {
		if fams[name] == nil {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if v := fams["hvdd_op_bytes_total"].GetMetric()[0].GetCounter().GetValue(); v != 8 {
		t.Errorf("hvdd_op_bytes_total = %v, want 8", v)
	}
	if resp, _ := get("/"); resp.StatusCode != 200 {
		t.Errorf("/: %s", resp.Status)
	}
	if resp, _ := get("/nothing"); resp.StatusCode != 404 {
		t.Errorf("/nothing: %s, want 404", resp.Status)
	}
}

// countingCollector counts its collections and sends one metric of that
// count.
type countingCollector struct {
	desc *prometheus.Desc
	n    int
}

func (c *countingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *countingCollector) Collect(ch chan<- prometheus.Metric) {
	c.n++
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(c.n))
}

// TestCached: the process collector's cache collects at most once per
// interval and repeats the last values in between.
func TestCached(t *testing.T) {
	now := time.Unix(0, 0)
	inner := &countingCollector{desc: prometheus.NewDesc("collections", "h", nil, nil)}
	c := &cached{c: inner, every: time.Second, now: func() time.Time { return now }}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	value := func() float64 {
		fams, err := reg.Gather()
		if err != nil || len(fams) != 1 {
			t.Fatalf("gather: %v %v", fams, err)
		}
		return fams[0].GetMetric()[0].GetGauge().GetValue()
	}
	for _, step := range []struct {
		advance time.Duration
		want    float64
	}{{0, 1}, {500 * time.Millisecond, 1}, {499 * time.Millisecond, 1}, {time.Millisecond, 2}, {0, 2}, {5 * time.Second, 3}} {
		now = now.Add(step.advance)
		if got := value(); got != step.want {
			t.Fatalf("after %v more: collection %v, want %v", step.advance, got, step.want)
		}
	}
}

// BenchmarkScrape is one scrape of a daemon's metrics through the handler
// (one job's series, the process and Go collectors), as Prometheus asks
// for it (gzip accepted).
func BenchmarkScrape(b *testing.B) {
	m := New(Options{})
	j := m.Job("j")
	c := j.Collective(tensor.Allreduce)
	c.Done(ipcpb.Code_CODE_OK, 10)
	c.Latency(0).Observe(1)
	j.Negotiated(1)
	j.Response(1, 1)
	j.Batch(1, 1)
	h := m.Handler()
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest("GET", "/metrics", nil)
		r.Header.Set("Accept-Encoding", "gzip")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK || w.Header().Get("Content-Encoding") != "" {
			b.Fatalf("%d, encoding %q", w.Code, w.Header().Get("Content-Encoding"))
		}
	}
}
