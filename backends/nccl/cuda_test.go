package nccl

import (
	"errors"
	"testing"

	"github.com/hvdd/hvdd/backends/devicetest"
	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/gpuload"
)

// TestConformanceCUDA runs the suite on the real driver and libnccl where a
// GPU is present (scripts/gpu-check.sh builds this test into
// bin/nccl-engine.test for the GPU machine); it skips elsewhere. NCCL puts
// one rank on a GPU, so the world sizes past the machine's GPU count skip,
// and with them the failure cases (two ranks at least).
func TestConformanceCUDA(t *testing.T) {
	drv, lib, err := gpuload.Load("cuda")
	switch {
	case drv == nil:
		if !errors.Is(err, gpu.ErrNoDriver) {
			t.Fatalf("loading the CUDA driver: %v (not gpu.ErrNoDriver)", err)
		}
		t.Skipf("no CUDA driver here (%v): the suite runs on a GPU machine (scripts/gpu-check.sh)", err)
	case lib == nil:
		t.Skipf("the CUDA driver loads but NCCL does not: %v", err)
	}
	infos, err := drv.Devices()
	if err != nil || len(infos) == 0 {
		t.Skipf("the CUDA driver loads but lists no GPU (%v)", err)
	}
	v, _ := lib.Version()
	t.Logf("%d GPU(s), %s; NCCL %d", len(infos), infos[0].Name, v)
	t.Run("Local", func(t *testing.T) { devicetest.Run(t, localFactory(drv, lib), devicetest.Options{}) })
	t.Run("Join", func(t *testing.T) { devicetest.Run(t, joinFactory(drv, lib), devicetest.Options{}) })
}
