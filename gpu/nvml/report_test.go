package nvml

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// twoGPUs is a report of two NVLinked GPUs.
func twoGPUs() Report {
	return Report{
		Available: true, DriverVersion: "550.54.15", CUDAVersion: 12040,
		GPUs: []GPU{
			{Index: 0, UUID: "GPU-aaaa", Name: "NVIDIA H100 80GB HBM3", PCIBusID: "0000:18:00.0", MemoryTotal: 80 << 30, MemoryUsed: 1 << 30, ComputeCapability: "9.0",
				NVLinks: []NVLink{{Link: 0, Active: true, RemotePCIBusID: "0000:2a:00.0", RemoteGPU: 1}, {Link: 1, Active: false, RemoteGPU: -1}}},
			{Index: 1, UUID: "GPU-bbbb", Name: "NVIDIA H100 80GB HBM3", PCIBusID: "0000:2a:00.0", MemoryTotal: 80 << 30, ComputeCapability: "9.0",
				NVLinks: []NVLink{{Link: 0, Active: true, RemotePCIBusID: "0000:18:00.0", RemoteGPU: 0}}},
		},
		Pairs: []Pair{{A: 0, B: 1, Link: "NV1", Topology: "NODE", NVLinks: 1, P2PRead: "OK", P2PWrite: "OK", P2PNVLink: "OK"}},
	}
}

// fields splits the line of out that starts with prefix into its fields.
func fields(t *testing.T, out, prefix string) []string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return strings.Fields(l)
		}
	}
	t.Fatalf("no line starting %q in\n%s", prefix, out)
	return nil
}

func TestFormat(t *testing.T) {
	r := twoGPUs()
	var b bytes.Buffer
	if err := r.Format(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.HasPrefix(out, "NVIDIA driver 550.54.15, CUDA 12.4, 2 GPUs\n") {
		t.Errorf("first line of\n%s", out)
	}
	row := fields(t, out, "0 ")
	want := []string{"0", "NVIDIA", "H100", "80GB", "HBM3", "GPU-aaaa", "0000:18:00.0", "1.0", "GiB", "/", "80.0", "GiB", "9.0", "1"}
	if strings.Join(row, " ") != strings.Join(want, " ") {
		t.Errorf("GPU 0's row %q, want %q", row, want)
	}
	// The two matrices: the topology one comes first.
	topo := strings.Index(out, "Topology:")
	p2p := strings.Index(out, "Peer-to-peer reads:")
	if topo < 0 || p2p < topo {
		t.Fatalf("no topology then P2P matrix in\n%s", out)
	}
	if got := strings.Join(fields(t, out[topo:], "GPU1"), " "); got != "GPU1 NV1 X" {
		t.Errorf("topology row GPU1 = %q, want GPU1 NV1 X", got)
	}
	if got := strings.Join(fields(t, out[p2p:], "GPU0"), " "); got != "GPU0 X OK" {
		t.Errorf("P2P row GPU0 = %q, want GPU0 X OK", got)
	}
	if !strings.Contains(out, "NV#  = ") {
		t.Errorf("no legend in\n%s", out)
	}

	// One GPU: no matrices.
	r.GPUs, r.Pairs = r.GPUs[:1], nil
	b.Reset()
	r.Format(&b)
	if strings.Contains(b.String(), "Topology") {
		t.Errorf("a matrix for one GPU:\n%s", b.String())
	}
	b.Reset()
	(Report{Reason: "no NVIDIA driver (libnvidia-ml.so.1 not found): CPU-only"}).Format(&b)
	if b.String() != "no NVIDIA driver (libnvidia-ml.so.1 not found): CPU-only\n" {
		t.Errorf("Format without GPUs: %q", b.String())
	}
}

func TestSummaryAndLog(t *testing.T) {
	r := twoGPUs()
	s := r.Summary()
	for _, want := range []string{"2 NVIDIA GPUs (driver 550.54.15, CUDA 12.4)", "0 NVIDIA H100 80GB HBM3 GPU-aaaa 0000:18:00.0 80.0 GiB sm_90", "NVLink: 0-1 NV1"} {
		if !strings.Contains(s, want) {
			t.Errorf("Summary %q lacks %q", s, want)
		}
	}
	if strings.Contains(s, "\n") {
		t.Errorf("Summary spans lines: %q", s)
	}
	var b bytes.Buffer
	r.Log(slog.New(slog.NewTextHandler(&b, nil)))
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 || !strings.Contains(lines[2], "uuid=GPU-bbbb") || !strings.Contains(lines[3], `0-1:NV1/p2p=OK`) {
		t.Errorf("Log wrote\n%s\nwant a header, one line per GPU, the topology", b.String())
	}
	b.Reset()
	debug := &slog.HandlerOptions{Level: slog.LevelDebug}
	(Report{Reason: "no NVIDIA driver (libnvidia-ml.so.1 not found): CPU-only"}).Log(slog.New(slog.NewTextHandler(&b, debug)))
	if strings.Count(b.String(), "\n") != 1 || !strings.Contains(b.String(), "level=DEBUG") || !strings.Contains(b.String(), "CPU-only") {
		t.Errorf("Log without GPUs wrote %q, want one CPU-only line at debug level", b.String())
	}
}

func TestJSON(t *testing.T) {
	b, err := json.Marshal(twoGPUs())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	gpus, _ := m["gpus"].([]any)
	pairs, _ := m["pairs"].([]any)
	if m["available"] != true || len(gpus) != 2 || len(pairs) != 1 {
		t.Fatalf("JSON %s", b)
	}
	g0 := gpus[0].(map[string]any)
	if g0["uuid"] != "GPU-aaaa" || g0["pci_bus_id"] != "0000:18:00.0" || g0["memory_total"] != float64(80<<30) || g0["compute_capability"] != "9.0" {
		t.Errorf("GPU 0 in JSON: %v", g0)
	}
	if p := pairs[0].(map[string]any); p["link"] != "NV1" || p["p2p_read"] != "OK" {
		t.Errorf("pair in JSON: %v", p)
	}
}

// haveNVML reports whether libnvidia-ml.so.1 is where the dynamic loader
// would find it: on $LD_LIBRARY_PATH, in ldconfig's cache, or in the usual
// directories.
func haveNVML() bool {
	dirs := filepath.SplitList(os.Getenv("LD_LIBRARY_PATH"))
	dirs = append(dirs, "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib64", "/usr/local/nvidia/lib64")
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "libnvidia-ml.so.1")); err == nil {
			return true
		}
	}
	out, _ := exec.Command("/sbin/ldconfig", "-p").Output()
	return bytes.Contains(out, []byte("libnvidia-ml.so.1"))
}

// TestDiscoverHere runs discovery with the real library on this machine:
// without NVML it must say so and not fail; with it (a GPU machine running
// the test binary of scripts/gpu-check.sh) it must describe real GPUs.
func TestDiscoverHere(t *testing.T) {
	r, err := Discover()
	if errors.Is(err, ErrNeedsCgo) {
		t.Skipf("%v (nocgo_test.go checks what such a build says)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", r.Summary())
	const notFound = "no NVIDIA driver (libnvidia-ml.so.1 not found): CPU-only"
	switch {
	case r.Reason == notFound:
		// haveNVML looks where the loader would (not everywhere it
		// could): where it finds the library, dlopen must have too.
		if haveNVML() {
			t.Errorf("libnvidia-ml.so.1 is installed, yet Discover says %q", r.Reason)
		}
	case !r.Available:
		if !strings.HasSuffix(r.Reason, ": CPU-only") {
			t.Errorf("no GPU, and the reason %q does not say CPU-only", r.Reason)
		}
		t.Skipf("NVML is here but gives no GPU: %s", r.Reason)
	default:
		if len(r.GPUs) == 0 || len(r.Pairs) != len(r.GPUs)*(len(r.GPUs)-1)/2 {
			t.Errorf("%d GPUs, %d pairs", len(r.GPUs), len(r.Pairs))
		}
		for _, g := range r.GPUs {
			if !strings.HasPrefix(g.UUID, "GPU-") || len(g.PCIBusID) != len("0000:3b:00.0") || g.Name == "" ||
				g.MemoryTotal == 0 || g.ComputeCapability == "" || len(g.Errors) > 0 {
				t.Errorf("GPU %d: %+v", g.Index, g)
			}
		}
		var b bytes.Buffer
		r.Format(&b)
		t.Logf("\n%s", b.String())
	}
}

var sampleOut = flag.String("sample-out", "", "TestSampleHere writes the samples it read to this file, as JSON (scripts/gpu-check.sh compares them with nvidia-smi)")

// TestSampleHere opens a Sampler on this machine's NVML and reads its
// GPUs twice: without NVML or a GPU it skips; with them (a GPU machine
// running the test binary of scripts/gpu-check.sh) the figures every
// data-centre GPU has must be there and plausible, and no GPU lost.
func TestSampleHere(t *testing.T) {
	s, err := OpenSampler()
	if err != nil {
		if r, _ := Discover(); !r.Available || errors.Is(err, ErrNeedsCgo) {
			t.Skipf("no sampler here: %v (%s)", err, r.Reason)
		}
		t.Fatal(err)
	}
	defer s.Close()
	var got []Sample
	for range 2 {
		if got, err = s.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := json.MarshalIndent(got, "", "  ")
	t.Logf("%s", b)
	if *sampleOut != "" {
		if err := os.WriteFile(*sampleOut, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) == 0 {
		t.Skip("NVML lists no GPU here")
	}
	for _, g := range got {
		must := FieldUtilization | FieldMemory | FieldTemperature
		if g.Lost != nil || !g.Valid.Has(must) || len(g.Errors) > 0 || !strings.HasPrefix(g.UUID, "GPU-") ||
			g.UtilizationGPU > 100 || g.UtilizationMemory > 100 || g.MemoryTotal == 0 || g.MemoryUsed > g.MemoryTotal ||
			g.Temperature == 0 || g.Temperature > 125 || (g.Valid.Has(FieldPower) && g.PowerMilliwatts == 0) {
			t.Errorf("GPU %d: %+v", g.Index, g)
		}
	}
	if lost := s.Lost(); lost != nil {
		t.Errorf("lost GPUs: %+v", lost)
	}
}
