// Package deptest has no code: its test makes the map in
// docs/ARCHITECTURE.md enforce itself, in the manner of tailscale's
// deptest. It runs `go list -deps` on hvdd's packages and fails when
//
//   - daemon/plan (the pure negotiation core) imports anything but tensor
//     and the standard library;
//   - tensor, shm or ipc import the daemon (daemon/...) or any backend
//     (backends/...);
//   - auth or daemon/autotune (the pure autotuning core) import anything
//     from hvdd;
//   - daemon/metrics (the Prometheus families) imports anything from hvdd
//     but tensor and ipc/ipcpb: the daemon counts into it, it reads no
//     daemon state;
//   - gpu (the seam of the GPU path) imports anything but tensor and the
//     standard library, or gpu/nvml (discovery, the sampler) anything from
//     hvdd, or outside the standard library anything but go-nvml;
//   - the engines (backends, backends/nccl, backends/devicetest,
//     backends/tcp) import a GPU binding (gpu/cuda, gpu/fake): they take
//     the gpu interfaces;
//   - a package of the daemon's (daemon/internal/...) imports package daemon
//     or breaks its layer (daemon_test.go): loop and nodes import each
//     other, exec imports either, job a sibling, poll the daemon, an
//     engine, the control links or the GPU seam; or the loop imports the
//     executor's host path (exec/host) itself, which its build still pulls
//     in through the executor (the timeline's names it writes are job's);
//   - the default build of cmd/hvdd (no build tags) compiles cgo outside
//     the standard library and the dlopen loaders
//     (github.com/ebitengine/purego for CUDA and NCCL,
//     github.com/NVIDIA/go-nvml for NVML), which link nothing at build
//     time (an allowance the build no longer uses fails too): MPI, the
//     one cgo engine that needs its library to build, stays behind the
//     mpi build tag (cmd/hvdd/mpi_off.go, backends/mpi/nompi.go). The
//     standard library's own cgo (net's resolver, os/user) is allowed; it goes away with CGO_ENABLED=0;
//   - cmd/hvdd does not build with CGO_ENABLED=0, or its build then
//     compiles cgo, imports go-nvml, or lacks gpu/nvml (which then says
//     that discovery needs cgo) or the CUDA binding (gpu/cuda): purego
//     needs no cgo.
//
// The rules look at what a package's build pulls in, its own imports and
// theirs; tests may import what they need.
package deptest
