package daemon

import (
	"strings"

	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/tensor"
)

// The calling convention of gpu/kernels' element-wise kernels, in one place.

// kernelImage is the PTX the daemon loads on each GPU.
func kernelImage() []byte { return nil }

// kernelReduceName is the kernel for dst = op(dst, src) of dtype dt:
// reduce_<op>_<dtype>, as "reduce_sum_float32".
func kernelReduceName(op tensor.ReduceOp, dt tensor.DType) string {
	return "reduce_" + strings.ToLower(op.String()) + "_" + dt.String()
}

// kernelScaleName is the kernel for p *= factor of dtype dt.
func kernelScaleName(dt tensor.DType) string { return "scale_" + dt.String() }

func kernelReduceLaunch(f gpu.Function, s gpu.Stream, dst, src gpu.DevicePtr, count int) error {
	return f.Launch(s, grid(count), kernelBlock, dst, src, uint64(count))
}

func kernelScaleLaunch(f gpu.Function, s gpu.Stream, p gpu.DevicePtr, count int, factor float64) error {
	return f.Launch(s, grid(count), kernelBlock, p, uint64(count), factor)
}
