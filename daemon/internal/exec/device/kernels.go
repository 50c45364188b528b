package device

import (
	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/kernels"
	"github.com/hvdd/hvdd/tensor"
)

// The calling convention of gpu/kernels' scale kernel, scale_<dtype>(p, n,
// f), n a uint64 element count, launched 1-D with kernels.BlockSize
// threads per block. (The combine kernel's is in combine.go.)

// kernelImage is the PTX the daemon loads on each GPU.
func kernelImage() []byte { return kernels.PTX() }

func kernelScale(f func(string) (gpu.Function, error), s gpu.Stream, p gpu.DevicePtr, count int, dt tensor.DType, factor float64) error {
	if dt == tensor.Bool {
		return nil // reduce.Scale leaves bool alone; so does the GPU path
	}
	name, err := kernels.ScaleName(dt)
	if err != nil {
		return err
	}
	fn, err := f(name)
	if err != nil {
		return err
	}
	return fn.Launch(s, kernels.Grid(count), kernels.BlockSize, p, uint64(count), factor)
}
