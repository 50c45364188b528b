package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/hvdd/hvdd/gpu/gputest"
)

// gpusJSON is the part of `hvdd gpus --json` the tests read.
type gpusJSON struct {
	Available bool   `json:"available"`
	Reason    string `json:"reason"`
	GPUs      []struct {
		Index    int    `json:"index"`
		UUID     string `json:"uuid"`
		PCIBusID string `json:"pci_bus_id"`
	} `json:"gpus"`
	Pairs []struct {
		A, B int
		Link string `json:"link"`
	} `json:"pairs"`
}

// runGPUs runs `bin gpus args...` and returns its stdout; it fails the
// test unless the exit status is 0 and stderr is empty.
func runGPUs(t *testing.T, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"gpus"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || stderr.Len() > 0 {
		t.Fatalf("hvdd gpus %v: %v\nstdout:\n%s\nstderr:\n%s", args, err, out, stderr.String())
	}
	return string(out)
}

// TestGPUs runs the built hvdd gpus, as text and as JSON: both exit 0 and
// tell the same. Without a GPU (this machine, CI) both give the same
// reason, ending in CPU-only, and the JSON's lists are empty, not null;
// with GPUs (scripts/gpu-check.sh's machine) the table names every GPU
// the JSON lists.
func TestGPUs(t *testing.T) {
	text := runGPUs(t, hvddBin)
	raw := runGPUs(t, hvddBin, "--json")
	var r gpusJSON
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		t.Fatalf("hvdd gpus --json: %v\n%s", err, raw)
	}
	if !r.Available {
		if !strings.HasSuffix(r.Reason, ": CPU-only") || text != r.Reason+"\n" {
			t.Errorf("without GPUs: text %q, JSON reason %q; want the same reason, ending in CPU-only", text, r.Reason)
		}
		if !strings.Contains(raw, `"gpus":[]`) || !strings.Contains(raw, `"pairs":[]`) {
			t.Errorf("without GPUs the JSON's lists are not empty lists: %s", raw)
		}
		return
	}
	if len(r.GPUs) == 0 || len(r.Pairs) != len(r.GPUs)*(len(r.GPUs)-1)/2 {
		t.Errorf("%d GPUs and %d pairs in %s", len(r.GPUs), len(r.Pairs), raw)
	}
	for _, g := range r.GPUs {
		if !strings.Contains(text, g.UUID) || !strings.Contains(text, g.PCIBusID) {
			t.Errorf("the table lacks GPU %d (%s, %s):\n%s", g.Index, g.UUID, g.PCIBusID, text)
		}
	}
	t.Logf("\n%s", text)
}

func TestGPUsUsage(t *testing.T) {
	out, err := exec.Command(hvddBin, "gpus", "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Usage: hvdd gpus") || !strings.Contains(string(out), "-json") {
		t.Errorf("hvdd gpus --help: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"gpus", "extra"}, {"gpus", "--frob"}} {
		out, err := exec.Command(hvddBin, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("hvdd %v: %v, want exit status 2\n%s", args, err, out)
		}
	}
	out, _ = exec.Command(hvddBin, "--help").CombinedOutput()
	if !strings.Contains(string(out), "hvdd gpus [--json]") {
		t.Errorf("hvdd --help does not list hvdd gpus:\n%s", out)
	}
}

// TestGPUsWithoutCgo builds hvdd with CGO_ENABLED=0 (which must work: the
// daemon runs CPU-only without cgo) and runs hvdd gpus of both builds on
// gpu/nvml's stub NVML (a C library with nvml.h's ABI, two GPUs joined by
// two NVLinks): the default (cgo) build finds the GPUs, as text and as
// JSON, through go-nvml; the CGO_ENABLED=0 build exits 1 saying that GPU
// discovery needs a cgo build.
func TestGPUsWithoutCgo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds hvdd again (-short)")
	}
	so := gputest.SharedLib(t, "../../gpu/nvml/testdata/stub.c", "libnvidia-ml.so.1")
	bin := filepath.Join(t.TempDir(), "hvdd-nocgo")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build ./cmd/hvdd: %v\n%s", err, out)
	}
	t.Setenv("HVDD_NVML_LIBRARY", so)
	text := runGPUs(t, hvddBin)
	if !strings.Contains(text, "Stub H100 80GB HBM3") || !strings.Contains(text, "NV2") {
		t.Errorf("hvdd gpus on the stub NVML does not show its GPUs and their 2 NVLinks:\n%s", text)
	}
	var r gpusJSON
	if err := json.Unmarshal([]byte(runGPUs(t, hvddBin, "--json")), &r); err != nil {
		t.Fatal(err)
	}
	if !r.Available || len(r.GPUs) != 2 {
		t.Errorf("hvdd gpus --json on the stub NVML: %+v", r)
	}
	for _, args := range [][]string{{"gpus"}, {"gpus", "--json"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "GPU discovery needs a cgo build") {
			t.Errorf("CGO_ENABLED=0 hvdd %v: %v, want exit status 1 saying discovery needs cgo\n%s", args, err, out)
		}
	}
}

// TestServeLogsGPUs: hvdd serve logs the GPUs NVML lists at info level, or
// (here, without a GPU) says once that it runs CPU-only and, at debug
// level, NVML's reason as hvdd gpus gives it; then it stops cleanly.
func TestServeLogsGPUs(t *testing.T) {
	var r gpusJSON
	if err := json.Unmarshal([]byte(runGPUs(t, hvddBin, "--json")), &r); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "hvdd.sock")
	d := startDaemon(t, nil, hvddBin, "serve", "--slots", "1", "--socket", sock, "--log-level", "debug")
	if r.Available {
		d.waitLine(t, regexp.MustCompile(`^(.*level=INFO msg="NVIDIA GPUs".*)$`))
	} else {
		d.waitLine(t, regexp.MustCompile(`^(.*level=DEBUG msg="`+regexp.QuoteMeta(r.Reason)+`".*)$`))
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	if err := d.wait(t); err != nil {
		t.Fatalf("hvdd serve after SIGTERM: %v", err)
	}
	if n := strings.Count(d.out.String(), "level=INFO msg=\"no CUDA driver: CPU-only\""); !r.Available && n != 1 {
		t.Errorf("serve said CPU-only at info %d times, want once:\n%s", n, d.out.String())
	}
}
