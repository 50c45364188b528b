// Package nccl is hvdd's device-memory engine on NCCL: a
// backends.DeviceEngine per rank of an NCCL communicator, for the
// collectives on buffers in GPU memory, within a node and across nodes.
//
// It reaches NCCL only through the gpu seam (gpu.NCCL, gpu.Comm), never a
// binding: the daemon passes gpu/cuda's library on a GPU machine and tests
// pass gpu/fake's, and the conformance suite backends/devicetest runs on
// both (on gpu/fake in every CI run, on gpu/cuda from scripts/gpu-check.sh).
//
// # Communicators
//
// NewLocal makes the node-local engines: one communicator over the node's
// GPUs (ncclCommInitAll), one engine per GPU, all in this process. They
// fail together, and the one goroutine that drives them issues their calls
// inside Group, as NCCL requires of a thread driving several GPUs:
//
//	es, err := nccl.NewLocal(lib, devs)
//	...
//	err = es[0].Group(func() error {
//		for i, e := range es {
//			if err := e.Allreduce(streams[i], bufs[i], bufs[i], n, tensor.Float32, tensor.Sum); err != nil {
//				return err
//			}
//		}
//		return nil
//	})
//	for i, e := range es {
//		err = errors.Join(err, e.Wait(ctx, streams[i]))
//	}
//
// Join makes this node's rank of a communicator across nodes from a unique
// id (NewUniqueID on rank 0) that the caller carried over its control
// plane; NCCL bootstraps the communicator itself from there. JoinWith
// carries the id through a host engine (backends.Backend) over the same
// nodes.
//
// # Failure
//
// The collectives only enqueue. Wait synchronises a stream while it polls
// ncclCommGetAsyncError every WatchInterval, since NCCL reports a failed
// peer there and not through the stream, and a kernel that waits for a
// dead peer ends only when the communicator is aborted. An asynchronous
// error, the end of Wait's ctx, a failed library call, Abort or Close (from
// any goroutine) end the engines made together: their communicators are
// aborted (ncclCommAbort), a Wait in progress returns, and later calls fail
// with an error wrapping backends.ErrAborted or backends.ErrClosed. An
// ended engine is not revived: the caller makes new ones.
//
// The package does not choose between NCCL and the host engines, stage
// host memory, fuse tensors or scale averages: the daemon does that.
package nccl
