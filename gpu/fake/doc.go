// Package fake is an in-process fake of the CUDA driver and NCCL behind the
// gpu seam (gpu.Driver and gpu.NCCL), for tests and CI machines without a
// GPU. It passes the same conformance suite as gpu/cuda (gpu/gputest). It is
// not a simulator: there is no parallelism model, no timing and no
// performance to speak of; it reproduces what the daemon's correctness
// depends on.
//
// # Device memory
//
// Every Alloc is a memfd of its own (named "hvdd-fake-mem-<pid>-<id>"),
// mapped into this process, at a fake address: the first allocation of the
// process is at 0x7f0000000000 and each next one starts past the previous
// one's end rounded up to 2 MiB plus a 2 MiB guard, so addresses are never
// reused within a process (a stale pointer does not alias a new block) and
// an access just past an allocation's end is an error. A DevicePtr anywhere
// inside an allocation resolves, so pointer arithmetic works. The daemon
// never dereferences a DevicePtr; only Device's copies and kernels touch the
// bytes. Memory freed while work that uses it is still queued stays mapped
// until that work has run.
//
// # Streams and events
//
// A stream runs its work later, in order, on a goroutine of its own: a
// caller that forgets Synchronize or WaitEvent sees stale data. With
// Options.MaxDelay (or HVDD_FAKE_GPU_DELAY, a Go duration) each piece of
// work first sleeps a random time up to that bound, to provoke such races
// in tests. Events have CUDA's semantics: Record captures the work enqueued
// on a stream so far; WaitEvent, Query and Synchronize look at the last
// Record made before them (an event never recorded is complete).
//
// An event is two uint64 words, little-endian: [recorded][completed].
// Record increments recorded (atomically) to k and enqueues work that raises
// completed to k (never lowers it) and wakes futex waiters on completed's
// low 32-bit half. A wait reads recorded r at the time of the wait and
// blocks until completed >= r, sleeping on the futex (with a 20 ms timeout
// to watch its context; no busy spinning). An interprocess event keeps the
// words at offset 0 of a 16-byte memfd ("hvdd-fake-event-<pid>-<n>") that
// every process which opened the handle maps, so Record and waits work the
// same from any of them. Another implementation sharing these words (the
// Python client's tests) increments recorded with an atomic add and raises
// completed with a compare-and-swap loop; waking the futex is optional, as
// waiters look again every 20 ms.
//
// # IPC handle layouts
//
// Both handles are 64 bytes; all integers little-endian; unused bytes zero.
//
//	memory handle (gpu.IpcMemHandle):
//	  [0:8]   "HVDDFAKE"
//	  [8:12]  uint32 pid of the exporting process
//	  [12:16] int32  fd of the allocation's memfd in that process
//	  [16:24] uint64 size of the allocation in bytes
//	  [24:32] uint64 allocation id (unique within the exporting process)
//	  [32:64] zero
//
//	event handle (gpu.IpcEventHandle):
//	  [0:8]   "HVDDFEVT"
//	  [8:12]  uint32 pid of the exporting process
//	  [12:16] int32  fd of the event's 16-byte memfd in that process
//	  [16:64] zero
//
// OpenMemHandle opens /proc/<pid>/fd/<fd> (which needs the same user as the
// exporter, or root), checks that it is a memfd of the handle's size (and,
// when its name has the form "hvdd-fake-mem-<pid>-<id>", that pid and id
// match, so a closed and reused fd number is caught), and maps it at a new
// fake address. A process may open its own handles (real CUDA refuses;
// the conformance suite does not rely on either). Opening the same handle
// again in a process returns the same address and counts references;
// CloseMemHandle unmaps at the last close. OpenEventHandle does the same
// with the event's memfd. A client that exports memory for this fake (the
// Python client's tests do) creates a memfd, keeps it open while the handle
// is in use, and writes these bytes.
//
// # Kernels
//
// LoadModule accepts any PTX image and remembers its ".entry" names;
// Function returns, for a name that is both an entry of the image and a
// kernel of gpu/kernels' Catalog, a Go implementation with the kernel's
// semantics (package reduce's arithmetic), run on the stream in order.
// Launch checks the arguments against the kernel's parameters. A combine
// kernel reads its table of segments, and checks the pointers in it, when
// it runs on the stream, not at launch: the table's copy to the device is
// queued just before the launch, as the daemon queues it.
//
// # NCCL
//
// NCCL is a fake of the collectives over Unix sockets. GetUniqueID starts a
// hub in the calling process listening on a Unix socket (a file in the
// temporary directory, removed once every rank joined, so that ranks in
// other network namespaces reach it; "@name" in the abstract namespace if
// that path is too long); the UniqueID is "HVDDNCID", a length byte and the
// socket's address, zeros after.
// Every rank (CommInitRank, in any process; CommInitAll, one goroutine per
// device) connects to the hub; the hub is a star: it gathers each
// collective's contributions (matched by their order on the communicator,
// as NCCL requires), computes the result with package reduce and sends it
// back, and forwards Send's data to the Recv of its peer. Collectives run on
// their stream, in order, and block that stream until the peers took part.
// Like NCCL, the fake refuses dtypes NCCL lacks (uint16, int16, bool) with
// ncclInvalidArgument, and ops other than Sum, Min, Max, Product and
// Average. Abort makes every blocked peer fail promptly: their AsyncError
// turns to ncclRemoteError and their pending work completes without
// touching the output; a broken connection (a peer process died) does the
// same. GroupStart/GroupEnd collect the calls in between and issue them per
// stream at GroupEnd, sends first, so a group of Send and Recv on one
// stream cannot deadlock (NCCL's reason for groups).
//
// # Failure injection
//
// FailNext makes the next calls of a named driver or NCCL function fail
// with a *gpu.Error; LoseDevice makes every later call fail, as a GPU that
// fell off the bus does; BreakComm gives one communicator an asynchronous
// error (ncclCommGetAsyncError), as a broken link does. A process started by a test is told with the
// environment (read once, at the first New or NewNCCL):
//
//	HVDD_FAKE_GPUS=N                   number of devices (default 1)
//	HVDD_FAKE_GPU_DELAY=5ms            random delay bound for stream work
//	HVDD_FAKE_GPU_FAIL=call:count[:code],...
//	                                   the next count calls of call fail
//	                                   (code defaults to CUDA_ERROR_UNKNOWN,
//	                                   999, or ncclSystemError, 2)
//	HVDD_FAKE_GPU_LOSE_AT=call:n       the n-th call of call (1-based)
//	                                   loses the device
//
// Call names are those of the CUDA driver API and NCCL functions the
// methods stand for, without version suffixes: cuMemAlloc, cuMemFree,
// cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcCloseMemHandle,
// cuIpcGetEventHandle, cuIpcOpenEventHandle, cuStreamCreate,
// cuStreamWaitEvent, cuStreamSynchronize, cuStreamDestroy, cuEventCreate,
// cuEventRecord, cuEventQuery, cuEventSynchronize, cuEventDestroy,
// cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuMemcpyDtoDAsync, cuMemsetD8Async,
// cuModuleLoadData, cuModuleGetFunction, cuModuleUnload, cuLaunchKernel,
// cuDriverGetVersion, cuDeviceGetCount, cuDevicePrimaryCtxRetain,
// cuDevicePrimaryCtxRelease, ncclGetVersion, ncclGetUniqueId,
// ncclCommInitRank, ncclCommInitAll, ncclGroupStart, ncclGroupEnd,
// ncclAllReduce, ncclBroadcast, ncclReduce, ncclAllGather,
// ncclReduceScatter, ncclSend, ncclRecv, ncclCommGetAsyncError,
// ncclCommAbort, ncclCommDestroy. gpu/cuda uses the same names in its
// errors. These variables are for tests and unstable.
package fake
