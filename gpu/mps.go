package gpu

import (
	"os"
	"path/filepath"
)

// MPS is what this node says of NVIDIA's Multi-Process Service, under
// which the CUDA contexts of several processes on one GPU run at once
// instead of taking turns: ranks that share a GPU, and the daemon that
// reduces their tensors there, each have a context of their own.
type MPS struct {
	// PipeDir is where a process of this environment looks for the MPS
	// control daemon: $CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps.
	PipeDir string `json:"pipe_directory"`
	// Running is true when the control daemon's pipe is there: CUDA
	// contexts made from now on in this environment go through MPS.
	Running bool `json:"running"`
}

// DefaultMPSPipeDir is where CUDA looks for MPS without
// CUDA_MPS_PIPE_DIRECTORY.
const DefaultMPSPipeDir = "/tmp/nvidia-mps"

// DetectMPS looks for the MPS control daemon where the CUDA driver would:
// its control pipe (a FIFO named "control") in the pipe directory.
func DetectMPS() MPS {
	dir := os.Getenv("CUDA_MPS_PIPE_DIRECTORY")
	if dir == "" {
		dir = DefaultMPSPipeDir
	}
	fi, err := os.Stat(filepath.Join(dir, "control"))
	return MPS{PipeDir: dir, Running: err == nil && fi.Mode()&os.ModeNamedPipe != 0}
}

// Advice says what MPS means for ranks that share a GPU, in a line.
func (m MPS) Advice() string {
	if m.Running {
		return "NVIDIA MPS runs (pipe directory " + m.PipeDir + "): processes that share a GPU run on it at once"
	}
	return "NVIDIA MPS is not running (no control pipe in " + m.PipeDir + "): processes that share a GPU (several ranks, and the daemon) take turns on it; deploy/systemd/README-mps.md says when MPS pays and how to run it"
}
