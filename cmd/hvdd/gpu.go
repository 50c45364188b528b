package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/gpuload"
)

// The GPU path's flags of hvdd serve: --gpu picks the driver (gpu/gpuload),
// --gpu-allreduce how GPU tensors are reduced (daemon.Config.GPUAllreduce).

// defaultGPUAllreduce is --gpu-allreduce's default from Horovod's knobs:
// HOROVOD_HIERARCHICAL_ALLREDUCE=1 is the hierarchical path (local
// reduction on the GPUs, NCCL between them, the node's result through the
// cross-node engine); else HOROVOD_GPU_ALLREDUCE=NCCL joins the nodes on
// NCCL too, and MPI or GLOO (the CPU engines) stage GPU tensors through host
// memory. Unset: hierarchical.
func defaultGPUAllreduce(getenv func(string) string) (string, error) {
	if h := getenv("HOROVOD_HIERARCHICAL_ALLREDUCE"); h != "" && h != "0" {
		return daemon.GPUAllreduceHierarchical, nil
	}
	switch v := strings.ToUpper(getenv("HOROVOD_GPU_ALLREDUCE")); v {
	case "":
	case "NCCL":
		return daemon.GPUAllreduceNCCL, nil
	case "MPI", "GLOO":
		return daemon.GPUAllreduceHost, nil
	default:
		return "", fmt.Errorf("HOROVOD_GPU_ALLREDUCE=%s: hvdd knows NCCL, MPI and GLOO", v)
	}
	return daemon.GPUAllreduceHierarchical, nil
}

// gpuConfig loads the driver --gpu names into cfg. No driver (none
// installed, no GPU, --gpu off) is no error: the daemon runs CPU-only and
// says so once.
func gpuConfig(cfg *daemon.Config, driver, mode string) error {
	switch mode {
	case daemon.GPUAllreduceHierarchical, daemon.GPUAllreduceNCCL, daemon.GPUAllreduceHost:
	default:
		return fmt.Errorf("--gpu-allreduce %q: want %s, %s or %s", mode, daemon.GPUAllreduceHierarchical, daemon.GPUAllreduceNCCL, daemon.GPUAllreduceHost)
	}
	cfg.GPUAllreduce = mode
	drv, nccl, err := gpuload.Load(driver)
	switch {
	case err == nil:
	case drv != nil && errors.Is(err, gpu.ErrNoNCCL):
		cfg.Logger.Info("no NCCL: tensors on different local GPUs are reduced through host memory", "why", err)
	case gpuload.NoDriver(err):
		cfg.Logger.Info("no CUDA driver: CPU-only", "why", err)
		return nil
	default:
		return fmt.Errorf("--gpu %s: %w", driver, err)
	}
	cfg.GPU, cfg.NCCL = drv, nccl
	return nil
}

// defaultGPUDriver is --gpu's default: $HVDD_GPU_DRIVER, else auto.
func defaultGPUDriver() string {
	if v := os.Getenv(gpuload.Env); v != "" {
		return v
	}
	return "auto"
}
