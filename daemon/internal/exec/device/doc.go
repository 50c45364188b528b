// Package device is the executor's device path: responses with tensors in
// the clients' GPU memory. gpu.go keeps the node's GPUs (contexts, streams,
// fusion buffers, combine tables, the daemon's kernels, NCCL communicators) and
// each connection's CUDA IPC mappings (ConnGPU); device.go runs the native
// paths in device memory, on one GPU, over the node's GPUs on NCCL, across
// nodes through the engine (the host path's calls) or on NCCL across nodes,
// and stages the rest through host memory onto the host path. Package exec
// describes which response takes which path.
package device
