// Package device is the executor's device path: responses with tensors in
// the clients' GPU memory. gpu.go keeps the node's GPUs (contexts, streams,
// fusion buffers, the daemon's kernels, NCCL communicators) and each
// connection's CUDA IPC mappings and pool of result buffers (ConnGPU);
// later.go runs the driver calls that may block (IPC opens and closes,
// frees, a GPU's first context) on a housekeeping goroutine, off the loop;
// combine.go launches the combine kernel (every rank's tensor read once,
// every result written once) with its tables kept on the GPU; device.go
// runs the native paths in device memory, on one GPU, over the node's GPUs
// on NCCL, across nodes through the engine (the host path's calls) or on
// NCCL across nodes, and stages the rest through host memory onto the host
// path. Package exec describes which response takes which path.
package device
