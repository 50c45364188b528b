// Package gpuload picks the gpu.Driver and gpu.NCCL a process uses: the real
// CUDA driver (gpu/cuda), the fake (gpu/fake) or none, by name. It is the
// one place that knows every implementation, so that the daemon and the
// commands import only the seam (gpu) and this package.
package gpuload

import (
	"errors"
	"fmt"
	"os"

	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/cuda"
	"github.com/hvdd/hvdd/gpu/fake"
)

// Env is the environment variable that names the default driver for
// Default ("auto" when empty or unset). Unstable: for tests and debugging.
const Env = "HVDD_GPU_DRIVER"

// ErrOff is returned (wrapping gpu.ErrNoDriver) for the name "off".
var ErrOff = fmt.Errorf("gpuload: GPU support turned off: %w", gpu.ErrNoDriver)

// Names lists the names Load accepts.
var Names = []string{"auto", "cuda", "fake", "off"}

// Load returns the driver called name and its NCCL:
//
//   - "auto" (or ""): the CUDA driver if it loads and sees a GPU, else an
//     error wrapping gpu.ErrNoDriver (the node runs CPU-only);
//   - "cuda": the CUDA driver, or its error (wrapping gpu.ErrNoDriver);
//   - "fake": gpu/fake, configured by its environment (HVDD_FAKE_GPUS, ...);
//   - "off": ErrOff.
//
// With a driver, NCCL may be nil when libnccl.so.2 does not load: the
// driver is returned with a nil NCCL and a non-nil error wrapping
// gpu.ErrNoNCCL that says why, so a caller that needs only the driver
// (kernels, IPC) goes on and one that needs NCCL reports it. Any other
// error comes with a nil driver.
func Load(name string) (gpu.Driver, gpu.NCCL, error) {
	switch name {
	case "", "auto", "cuda":
		d, err := cuda.Open()
		if err != nil {
			return nil, nil, err
		}
		if name != "cuda" {
			infos, err := d.Devices()
			if err != nil {
				return nil, nil, fmt.Errorf("%w: the CUDA driver loads but cannot list GPUs: %v", gpu.ErrNoDriver, err)
			}
			if len(infos) == 0 {
				return nil, nil, fmt.Errorf("%w: the CUDA driver loads but sees no GPU", gpu.ErrNoDriver)
			}
		}
		n, err := cuda.OpenNCCL()
		if err != nil {
			return d, nil, err
		}
		return d, n, nil
	case "fake":
		return fake.New(fake.Options{}), fake.NewNCCL(), nil
	case "off":
		return nil, nil, ErrOff
	}
	return nil, nil, fmt.Errorf("gpuload: unknown GPU driver %q (want one of auto, cuda, fake, off)", name)
}

// Default is Load of $HVDD_GPU_DRIVER.
func Default() (gpu.Driver, gpu.NCCL, error) { return Load(os.Getenv(Env)) }

// NoDriver reports whether err means "no GPU here" (run CPU-only) rather
// than a failure to report.
func NoDriver(err error) bool { return errors.Is(err, gpu.ErrNoDriver) }
