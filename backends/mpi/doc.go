// Package mpi is hvdd's MPI engine: the backends.Backend collectives mapped
// one to one onto MPI calls, for daemons started as MPI ranks by mpirun.
//
// # Builds
//
// The engine needs MPI headers and libraries, so it is compiled only with
// the build tag mpi, through cgo:
//
//	apt-get install -y openmpi-bin libopenmpi-dev   # Debian/Ubuntu
//	go build -tags mpi ./...
//
// cgo finds Open MPI through pkg-config (package ompi-c). Other MPIs build
// with a second tag that changes only where the flags come from:
//
//	go build -tags 'mpi mpich' ./...           # MPICH: pkg-config mpich
//	CGO_CFLAGS="$(mpicc -show -c | cut -d' ' -f2-)" \
//	CGO_LDFLAGS="-L/path/to/mpi/lib -lmpi" \
//	go build -tags 'mpi mpi_noconfig' ./...    # any MPI: flags from CGO_*
//
// (PKG_CONFIG_PATH selects which mpich.pc or ompi-c.pc is found.) The C
// code uses only MPI-3 calls and handles, no Open MPI internals, plus ULFM's
// MPIX_Comm_failure_ack where the library defines MPIX_ERR_PROC_FAILED.
// scripts/test.sh runs the conformance test on Open MPI and on MPICH. Where
// a library's built-in op is wrong the engine uses its own (MPI_Op_create):
// wrapping 8- and 16-bit sums (Open MPI 4.1's op/avx saturates them) and
// unsigned 8- and 16-bit Min and Max (MPICH 4.0.2 compares them as signed).
//
// Without the tag the package still exists, pure Go and cgo-free: Available
// reports false and New returns ErrUnavailable, so the daemon can name the
// engine in its flags and report "unavailable" as an ordinary error.
//
// # Processes and threads
//
// The first New initialises MPI (MPI_Init_thread asking for
// MPI_THREAD_MULTIPLE) on a dedicated goroutine locked to its OS thread,
// which becomes MPI's main thread and later runs MPI_Finalize; if MPI was
// already initialised by the process, New uses it as it is (and Finalize
// leaves it alone). Each New duplicates MPI_COMM_WORLD (collective: every
// rank must call New the same number of times, in the same order) into a
// private communicator with MPI_ERRORS_RETURN, so one process can hold
// several backends (the daemon's control and data planes) used from
// different goroutines at once.
//
// With MPI_THREAD_MULTIPLE every call is the blocking MPI call, made on the
// calling goroutine's thread; two backends used from two goroutines then
// block in MPI independently. Below that level (an MPI built without full
// thread support) MPI calls are serialised process-wide: at
// MPI_THREAD_SERIALIZED any goroutine makes them under one package-level
// mutex; at MPI_THREAD_FUNNELED (or SINGLE) they are handed to MPI's main
// thread, one at a time. A blocking collective holding that mutex (or the
// main thread) would deadlock two backends whose ranks issue their
// collectives in different orders, so below MULTIPLE each collective is
// started nonblocking (MPI_Iallreduce, ...) and polled with MPI_Testall,
// the mutex held only for each single call, and the buffers pinned
// (runtime.Pinner) until the request completes. This path costs latency
// (polling, and a thread hand-off per call when funnelled); Open MPI as
// packaged by Debian provides MPI_THREAD_MULTIPLE. Alltoallv there always
// takes pairwise MPI_Isend/MPI_Irecv (with Open MPI 4.1 at 2 ranks an
// MPI_Ialltoallv with empty pieces followed by an MPI_Iallreduce was seen
// to never complete). If MPI was initialised before New by someone else,
// New requires at least MPI_THREAD_SERIALIZED.
//
// # Groups
//
// Group (backends.Grouper) makes a communicator of some of the ranks with
// MPI_Comm_create_group, which only those ranks call, at the same point of
// the collectives they share; it needs MPI_THREAD_MULTIPLE (below it the
// blocking call would hold the process's MPI lock). Close frees the groups
// with their parent, and a failed rank a group's call reports is named by
// its rank in the parent.
//
// # Cancellation and failures
//
// MPI collectives cannot be cancelled. Every call checks ctx before each MPI
// call it makes, but a call blocked inside MPI returns only when its peers
// complete the collective, and Close does not interrupt it (it frees the
// communicator once the call returns). A call that gives up because ctx is
// done, or because its arguments are invalid, leaves the peers waiting in a
// collective this rank never entered, so it fails the backend: every later
// call returns the same error.
//
// MPI error codes become Errno values (Error uses MPI_Error_string), wrapped
// with the name of the failing MPI call. When the library reports a process
// failure and names the rank (ULFM, MPIX_ERR_PROC_FAILED) the error is a
// *backends.PeerError for that rank. Usually it will not get that far: Open
// MPI's mpirun (ORTE/PRRTE) aborts the whole job when any rank exits
// abnormally, so a lost peer normally kills every daemon of the job rather
// than returning an error, and the launcher must restart the job.
//
// Element types map to MPI_UINT8_T, MPI_INT8_T, MPI_UINT16_T, MPI_INT16_T,
// MPI_INT32_T, MPI_INT64_T, MPI_FLOAT, MPI_DOUBLE and MPI_C_BOOL (Sum and
// Max as MPI_LOR, Min and Product as MPI_LAND). float16 and bfloat16 use a
// 2-byte contiguous datatype with user-defined ops (MPI_Op_create) that widen
// to float32, combine and round back to nearest-even; MPI applies them one
// pair of operands at a time, so with more than two ranks a half-precision
// Sum is rounded after every step rather than once as package reduce does.
// 8- and 16-bit integer Sum also uses a user-defined op (wrap-around):
// Open MPI 4.1's op/avx component saturates those sums instead of wrapping,
// which the conformance test caught.
// Counts above MPI's int range are split into several calls or fall back to
// point-to-point and rooted collectives.
package mpi
