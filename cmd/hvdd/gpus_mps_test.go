package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/nvml"
)

// TestPrintGPUsMPS: hvdd gpus ends with whether NVIDIA MPS runs where there
// are GPUs (and says nothing of it on a CPU-only node); --json has it as
// "mps" either way.
func TestPrintGPUsMPS(t *testing.T) {
	r := nvml.Report{Available: true, DriverVersion: "580.1", CUDAVersion: 13000,
		GPUs: []nvml.GPU{{Index: 0, Name: "NVIDIA H200", UUID: "GPU-0"}}}
	for _, tc := range []struct {
		mps  gpu.MPS
		want string
	}{
		{gpu.MPS{PipeDir: "/tmp/nvidia-mps"}, "take turns"},
		{gpu.MPS{PipeDir: "/run/nvidia-mps", Running: true}, "run on it at once"},
	} {
		var b bytes.Buffer
		if err := printGPUs(&b, r, tc.mps, false); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), tc.want) || !strings.Contains(b.String(), tc.mps.PipeDir) {
			t.Errorf("MPS %+v: output lacks %q and the pipe directory:\n%s", tc.mps, tc.want, b.String())
		}
		b.Reset()
		if err := printGPUs(&b, r, tc.mps, true); err != nil {
			t.Fatal(err)
		}
		var got struct {
			GPUs []nvml.GPU `json:"gpus"`
			MPS  gpu.MPS    `json:"mps"`
		}
		if err := json.Unmarshal(b.Bytes(), &got); err != nil {
			t.Fatal(err)
		}
		if got.MPS != tc.mps || len(got.GPUs) != 1 {
			t.Errorf("--json: mps %+v and %d GPUs, want %+v and 1", got.MPS, len(got.GPUs), tc.mps)
		}
	}
	var b bytes.Buffer
	if err := printGPUs(&b, nvml.Report{Reason: "no NVIDIA driver: CPU-only"}, gpu.MPS{}, false); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "MPS") {
		t.Errorf("a CPU-only node's output speaks of MPS:\n%s", b.String())
	}
}
