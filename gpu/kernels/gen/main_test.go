package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestCommitted checks that kernels.ptx is what the generator writes now.
func TestCommitted(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "kernels.ptx")
	cmd := exec.Command("go", "run", ".", "-o", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run ./gen: %v\n%s", err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile("../kernels.ptx")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, generate()) {
		t.Fatal("the generator's output differs from run to run")
	}
	if !bytes.Equal(got, committed) {
		t.Fatal("gpu/kernels/kernels.ptx is stale: run go generate ./gpu/kernels and commit the result")
	}
}

// ptxas finds ptxas: $PTXAS, then $PATH, then the nvidia-cuda-nvcc-cu12
// wheel unpacked where the install hint puts it.
func ptxas() string {
	if p := os.Getenv("PTXAS"); p != "" {
		return p
	}
	if p, err := exec.LookPath("ptxas"); err == nil {
		return p
	}
	for _, p := range []string{"/tmp/nvcc/nvidia/cuda_nvcc/bin/ptxas", "/usr/local/cuda/bin/ptxas"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// TestAssemble assembles the PTX for sm_70 (its target) and sm_80 with
// ptxas, which checks every instruction's syntax and types.
func TestAssemble(t *testing.T) {
	p := ptxas()
	if p == "" {
		t.Skip("no ptxas: install it with `pip download nvidia-cuda-nvcc-cu12 --no-deps -d /tmp/nvccwheel && " +
			"unzip -o /tmp/nvccwheel/*.whl 'nvidia/cuda_nvcc/bin/ptxas' -d /tmp/nvcc` (or set PTXAS)")
	}
	for _, arch := range []string{"sm_70", "sm_80", "sm_90"} {
		out := filepath.Join(t.TempDir(), arch+".cubin")
		cmd := exec.Command(p, "-arch="+arch, "-o", out, "../kernels.ptx")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("ptxas -arch=%s: %v\n%s", arch, err, b)
		}
	}
}
