package cuda

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/internal/dl"
)

// ipcHandle is CUipcMemHandle and CUipcEventHandle: struct { char
// reserved[64]; }, passed by value to cuIpcOpenMemHandle and
// cuIpcOpenEventHandle.
type ipcHandle struct{ Reserved [gpu.IpcMemHandleSize]byte }

// uniqueID is ncclUniqueId: struct { char internal[128]; }, passed by value
// to ncclCommInitRank.
type uniqueID struct{ Internal [gpu.UniqueIDSize]byte }

// cudaLib holds the driver API functions hvdd calls. The tag names the
// symbol; "a|b" tries a, then b. Every function returns a CUresult. Handles
// (CUcontext, CUstream, CUevent, CUmodule, CUfunction) are pointers, held
// as uintptr; CUdevice is an int; CUdeviceptr and size_t are 64-bit.
type cudaLib struct {
	cuInit                    func(flags uint32) int32                                                                             `sym:"cuInit"`
	cuDriverGetVersion        func(v *int32) int32                                                                                 `sym:"cuDriverGetVersion"`
	cuDeviceGetCount          func(n *int32) int32                                                                                 `sym:"cuDeviceGetCount"`
	cuDeviceGet               func(d *int32, ordinal int32) int32                                                                  `sym:"cuDeviceGet"`
	cuDeviceGetName           func(name *byte, n int32, dev int32) int32                                                           `sym:"cuDeviceGetName"`
	cuDeviceGetUuid           func(uuid *[16]byte, dev int32) int32                                                                `sym:"cuDeviceGetUuid_v2|cuDeviceGetUuid"`
	cuDeviceGetAttribute      func(v *int32, attr int32, dev int32) int32                                                          `sym:"cuDeviceGetAttribute"`
	cuDeviceTotalMem          func(b *uint64, dev int32) int32                                                                     `sym:"cuDeviceTotalMem_v2"`
	cuDeviceGetPCIBusID       func(id *byte, n int32, dev int32) int32                                                             `sym:"cuDeviceGetPCIBusId"`
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, dev int32) int32                                                                  `sym:"cuDevicePrimaryCtxRetain"`
	cuDevicePrimaryCtxRelease func(dev int32) int32                                                                                `sym:"cuDevicePrimaryCtxRelease_v2|cuDevicePrimaryCtxRelease"`
	cuCtxSetCurrent           func(ctx uintptr) int32                                                                              `sym:"cuCtxSetCurrent"`
	cuMemAlloc                func(p *uint64, n uint64) int32                                                                      `sym:"cuMemAlloc_v2"`
	cuMemFree                 func(p uint64) int32                                                                                 `sym:"cuMemFree_v2"`
	cuMemcpyHtoDAsync         func(dst uint64, src unsafe.Pointer, n uint64, s uintptr) int32                                      `sym:"cuMemcpyHtoDAsync_v2"`
	cuMemcpyDtoHAsync         func(dst unsafe.Pointer, src uint64, n uint64, s uintptr) int32                                      `sym:"cuMemcpyDtoHAsync_v2"`
	cuMemcpyDtoDAsync         func(dst, src uint64, n uint64, s uintptr) int32                                                     `sym:"cuMemcpyDtoDAsync_v2"`
	cuMemsetD8Async           func(dst uint64, v uint8, n uint64, s uintptr) int32                                                 `sym:"cuMemsetD8Async"`
	cuStreamCreate            func(s *uintptr, flags uint32) int32                                                                 `sym:"cuStreamCreate"`
	cuStreamWaitEvent         func(s, e uintptr, flags uint32) int32                                                               `sym:"cuStreamWaitEvent"`
	cuStreamSynchronize       func(s uintptr) int32                                                                                `sym:"cuStreamSynchronize"`
	cuStreamDestroy           func(s uintptr) int32                                                                                `sym:"cuStreamDestroy_v2"`
	cuEventCreate             func(e *uintptr, flags uint32) int32                                                                 `sym:"cuEventCreate"`
	cuEventRecord             func(e, s uintptr) int32                                                                             `sym:"cuEventRecord"`
	cuEventQuery              func(e uintptr) int32                                                                                `sym:"cuEventQuery"`
	cuEventSynchronize        func(e uintptr) int32                                                                                `sym:"cuEventSynchronize"`
	cuEventDestroy            func(e uintptr) int32                                                                                `sym:"cuEventDestroy_v2"`
	cuIpcGetMemHandle         func(h *gpu.IpcMemHandle, p uint64) int32                                                            `sym:"cuIpcGetMemHandle"`
	cuIpcOpenMemHandle        func(p *uint64, h ipcHandle, flags uint32) int32                                                     `sym:"cuIpcOpenMemHandle_v2|cuIpcOpenMemHandle"`
	cuIpcCloseMemHandle       func(p uint64) int32                                                                                 `sym:"cuIpcCloseMemHandle"`
	cuIpcGetEventHandle       func(h *gpu.IpcEventHandle, e uintptr) int32                                                         `sym:"cuIpcGetEventHandle"`
	cuIpcOpenEventHandle      func(e *uintptr, h ipcHandle) int32                                                                  `sym:"cuIpcOpenEventHandle"`
	cuModuleLoadData          func(m *uintptr, image unsafe.Pointer) int32                                                         `sym:"cuModuleLoadData"`
	cuModuleGetFunction       func(f *uintptr, m uintptr, name string) int32                                                       `sym:"cuModuleGetFunction"`
	cuModuleUnload            func(m uintptr) int32                                                                                `sym:"cuModuleUnload"`
	cuLaunchKernel            func(f uintptr, gx, gy, gz, bx, by, bz, shmem uint32, s uintptr, params, extra unsafe.Pointer) int32 `sym:"cuLaunchKernel"`
	cuGetErrorName            func(r int32, s **byte) int32                                                                        `sym:"cuGetErrorName"`
	cuGetErrorString          func(r int32, s **byte) int32                                                                        `sym:"cuGetErrorString"`
}

// ncclLib holds NCCL's functions; each returns an ncclResult_t. ncclComm_t
// and cudaStream_t are pointers (uintptr); buffers are device addresses.
type ncclLib struct {
	ncclGetVersion        func(v *int32) int32                                                             `sym:"ncclGetVersion"`
	ncclGetUniqueID       func(id *gpu.UniqueID) int32                                                     `sym:"ncclGetUniqueId"`
	ncclCommInitRank      func(comm *uintptr, nranks int32, id uniqueID, rank int32) int32                 `sym:"ncclCommInitRank"`
	ncclCommInitAll       func(comms *uintptr, ndev int32, devlist *int32) int32                           `sym:"ncclCommInitAll"`
	ncclGroupStart        func() int32                                                                     `sym:"ncclGroupStart"`
	ncclGroupEnd          func() int32                                                                     `sym:"ncclGroupEnd"`
	ncclAllReduce         func(send, recv uint64, count uint64, dt, op int32, comm, s uintptr) int32       `sym:"ncclAllReduce"`
	ncclBroadcast         func(send, recv uint64, count uint64, dt, root int32, comm, s uintptr) int32     `sym:"ncclBroadcast"`
	ncclReduce            func(send, recv uint64, count uint64, dt, op, root int32, comm, s uintptr) int32 `sym:"ncclReduce"`
	ncclAllGather         func(send, recv uint64, count uint64, dt int32, comm, s uintptr) int32           `sym:"ncclAllGather"`
	ncclReduceScatter     func(send, recv uint64, count uint64, dt, op int32, comm, s uintptr) int32       `sym:"ncclReduceScatter"`
	ncclSend              func(buf uint64, count uint64, dt, peer int32, comm, s uintptr) int32            `sym:"ncclSend"`
	ncclRecv              func(buf uint64, count uint64, dt, peer int32, comm, s uintptr) int32            `sym:"ncclRecv"`
	ncclCommGetAsyncError func(comm uintptr, r *int32) int32                                               `sym:"ncclCommGetAsyncError"`
	ncclCommAbort         func(comm uintptr) int32                                                         `sym:"ncclCommAbort"`
	ncclCommDestroy       func(comm uintptr) int32                                                         `sym:"ncclCommDestroy"`
	ncclGetErrorString    func(r int32) string                                                             `sym:"ncclGetErrorString"`
}

// bind fills the func fields of the struct lib points to with lib's
// symbols in handle (dl.Bind), failing when any is missing.
func bind(handle uintptr, lib any) error {
	if missing := dl.Bind(handle, lib); len(missing) > 0 {
		return fmt.Errorf("missing symbols %s", strings.Join(missing, ", "))
	}
	return nil
}

// dlopen opens the first of paths that loads (dl.Open).
func dlopen(paths []string) (uintptr, string, error) { return dl.Open(paths) }

// ncclPaths lists where libnccl.so.2 is looked for: HVDD_NCCL_LIBRARY
// alone if set; else the dynamic linker's search (LD_LIBRARY_PATH, the
// system's directories), then the nvidia-nccl-cu12 (or -cu11, -cu13) pip
// wheel's nvidia/nccl/lib in the site-packages of $VIRTUAL_ENV,
// $CONDA_PREFIX, $PYTHONPATH, ~/.local and /usr{,/local}/lib*/python3*.
func ncclPaths() []string {
	if p := os.Getenv("HVDD_NCCL_LIBRARY"); p != "" {
		return []string{p}
	}
	paths := []string{"libnccl.so.2"}
	var sites []string
	for _, env := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if root := os.Getenv(env); root != "" {
			sites = append(sites, filepath.Join(root, "lib", "python3*", "site-packages"))
		}
	}
	for _, p := range filepath.SplitList(os.Getenv("PYTHONPATH")) {
		if p != "" {
			sites = append(sites, p)
		}
	}
	if home, err := os.UserHomeDir(); err == nil {
		sites = append(sites, filepath.Join(home, ".local", "lib", "python3*", "site-packages"))
	}
	sites = append(sites, "/usr/local/lib/python3*/site-packages", "/usr/local/lib/python3*/dist-packages",
		"/usr/lib/python3*/site-packages", "/usr/lib/python3/dist-packages", "/usr/lib64/python3*/site-packages")
	for _, s := range sites {
		m, _ := filepath.Glob(filepath.Join(s, "nvidia", "nccl", "lib", "libnccl.so.2"))
		paths = append(paths, m...)
	}
	return paths
}

// cudaPaths lists where libcuda.so.1 is looked for: HVDD_CUDA_LIBRARY alone
// if set, else the dynamic linker's search.
func cudaPaths() []string {
	if p := os.Getenv("HVDD_CUDA_LIBRARY"); p != "" {
		return []string{p}
	}
	return []string{"libcuda.so.1"}
}

// goString copies the NUL-terminated C string at p.
func goString(p *byte) string { return dl.GoString(p) }
