package daemon

import (
	"fmt"

	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/tensor"
)

// The calling convention of gpu/kernels' element-wise kernels, in one place:
// reduce_<op>_<dtype>(dst, src, n) and scale_<dtype>(p, n, f), n a uint64
// element count, launched 1-D with 256 threads per block. (Until gpu/kernels
// is merged the image is empty and the device paths report it.)

// kernelImage is the PTX the daemon loads on each GPU.
func kernelImage() []byte { return nil }

const kernelBlock = 256

func kernelGrid(n int) int { return max(1, min((n+kernelBlock-1)/kernelBlock, 4096)) }

var kernelOps = map[tensor.ReduceOp]string{tensor.Sum: "sum", tensor.Min: "min", tensor.Max: "max", tensor.Product: "prod"}

func kernelReduce(f func(string) (gpu.Function, error), s gpu.Stream, dst, src gpu.DevicePtr, count int, dt tensor.DType, op tensor.ReduceOp) error {
	o, ok := kernelOps[op]
	if !ok {
		return fmt.Errorf("no reduce kernel for %v", op)
	}
	fn, err := f("reduce_" + o + "_" + dt.String())
	if err != nil {
		return err
	}
	return fn.Launch(s, kernelGrid(count), kernelBlock, dst, src, uint64(count))
}

func kernelScale(f func(string) (gpu.Function, error), s gpu.Stream, p gpu.DevicePtr, count int, dt tensor.DType, factor float64) error {
	if dt == tensor.Bool {
		return nil // reduce.Scale leaves bool alone; so does the GPU path
	}
	fn, err := f("scale_" + dt.String())
	if err != nil {
		return err
	}
	return fn.Launch(s, kernelGrid(count), kernelBlock, p, uint64(count), factor)
}
