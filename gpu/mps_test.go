package gpu

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestDetectMPS: MPS counts as running only where the control daemon's
// FIFO is, in CUDA_MPS_PIPE_DIRECTORY (else /tmp/nvidia-mps).
func TestDetectMPS(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("CUDA_MPS_PIPE_DIRECTORY", dir)
	if m := DetectMPS(); m.Running || m.PipeDir != dir {
		t.Fatalf("empty pipe directory: %+v, want not running in %s", m, dir)
	}
	if !strings.Contains(DetectMPS().Advice(), "not running") {
		t.Errorf("advice without MPS: %q", DetectMPS().Advice())
	}
	// A plain file is not the control daemon's pipe.
	if err := os.WriteFile(filepath.Join(dir, "control"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if DetectMPS().Running {
		t.Fatal("a plain file named control counted as MPS running")
	}
	os.Remove(filepath.Join(dir, "control"))
	if err := syscall.Mkfifo(filepath.Join(dir, "control"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := DetectMPS()
	if !m.Running {
		t.Fatalf("control FIFO in %s: %+v, want running", dir, m)
	}
	if !strings.Contains(m.Advice(), "runs") {
		t.Errorf("advice with MPS: %q", m.Advice())
	}
	t.Setenv("CUDA_MPS_PIPE_DIRECTORY", "")
	if m := DetectMPS(); m.PipeDir != DefaultMPSPipeDir {
		t.Errorf("without CUDA_MPS_PIPE_DIRECTORY: pipe directory %q, want %q", m.PipeDir, DefaultMPSPipeDir)
	}
}
