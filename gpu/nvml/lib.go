package nvml

import (
	"fmt"
	"os"
	"strings"

	"github.com/hvdd/hvdd/gpu/internal/dl"
)

// NVML's C API, as much as discovery calls, bound at run time through
// purego (gpu/internal/dl): libnvidia-ml.so.1 is opened by Library.Init
// and closed by Shutdown, as go-nvml does it, with no cgo and no NVML
// header at build time. The types, constants and the go-nvml-style method
// names mirror nvml.h (NVML 12.x): go-nvml binds every NVML function to a
// package variable, which kept 1.7 MB of bindings for fifteen calls in
// hvdd's binary (docs/BENCHMARKS.md), and needed cgo.

// Return is nvmlReturn_t. It is an error; SUCCESS is not meant to be
// returned as one.
type Return int32

// The nvmlReturn_t values (nvml.h).
const (
	SUCCESS                         Return = 0
	ERROR_UNINITIALIZED             Return = 1
	ERROR_INVALID_ARGUMENT          Return = 2
	ERROR_NOT_SUPPORTED             Return = 3
	ERROR_NO_PERMISSION             Return = 4
	ERROR_ALREADY_INITIALIZED       Return = 5
	ERROR_NOT_FOUND                 Return = 6
	ERROR_INSUFFICIENT_SIZE         Return = 7
	ERROR_INSUFFICIENT_POWER        Return = 8
	ERROR_DRIVER_NOT_LOADED         Return = 9
	ERROR_TIMEOUT                   Return = 10
	ERROR_IRQ_ISSUE                 Return = 11
	ERROR_LIBRARY_NOT_FOUND         Return = 12
	ERROR_FUNCTION_NOT_FOUND        Return = 13
	ERROR_CORRUPTED_INFOROM         Return = 14
	ERROR_GPU_IS_LOST               Return = 15
	ERROR_RESET_REQUIRED            Return = 16
	ERROR_OPERATING_SYSTEM          Return = 17
	ERROR_LIB_RM_VERSION_MISMATCH   Return = 18
	ERROR_IN_USE                    Return = 19
	ERROR_MEMORY                    Return = 20
	ERROR_NO_DATA                   Return = 21
	ERROR_VGPU_ECC_NOT_SUPPORTED    Return = 22
	ERROR_INSUFFICIENT_RESOURCES    Return = 23
	ERROR_FREQ_NOT_SUPPORTED        Return = 24
	ERROR_ARGUMENT_VERSION_MISMATCH Return = 25
	ERROR_DEPRECATED                Return = 26
	ERROR_NOT_READY                 Return = 27
	ERROR_GPU_NOT_FOUND             Return = 28
	ERROR_INVALID_STATE             Return = 29
	ERROR_UNKNOWN                   Return = 999
)

var returnNames = map[Return]string{
	SUCCESS: "SUCCESS", ERROR_UNINITIALIZED: "ERROR_UNINITIALIZED", ERROR_INVALID_ARGUMENT: "ERROR_INVALID_ARGUMENT",
	ERROR_NOT_SUPPORTED: "ERROR_NOT_SUPPORTED", ERROR_NO_PERMISSION: "ERROR_NO_PERMISSION",
	ERROR_ALREADY_INITIALIZED: "ERROR_ALREADY_INITIALIZED", ERROR_NOT_FOUND: "ERROR_NOT_FOUND",
	ERROR_INSUFFICIENT_SIZE: "ERROR_INSUFFICIENT_SIZE", ERROR_INSUFFICIENT_POWER: "ERROR_INSUFFICIENT_POWER",
	ERROR_DRIVER_NOT_LOADED: "ERROR_DRIVER_NOT_LOADED", ERROR_TIMEOUT: "ERROR_TIMEOUT", ERROR_IRQ_ISSUE: "ERROR_IRQ_ISSUE",
	ERROR_LIBRARY_NOT_FOUND: "ERROR_LIBRARY_NOT_FOUND", ERROR_FUNCTION_NOT_FOUND: "ERROR_FUNCTION_NOT_FOUND",
	ERROR_CORRUPTED_INFOROM: "ERROR_CORRUPTED_INFOROM", ERROR_GPU_IS_LOST: "ERROR_GPU_IS_LOST",
	ERROR_RESET_REQUIRED: "ERROR_RESET_REQUIRED", ERROR_OPERATING_SYSTEM: "ERROR_OPERATING_SYSTEM",
	ERROR_LIB_RM_VERSION_MISMATCH: "ERROR_LIB_RM_VERSION_MISMATCH", ERROR_IN_USE: "ERROR_IN_USE", ERROR_MEMORY: "ERROR_MEMORY",
	ERROR_NO_DATA: "ERROR_NO_DATA", ERROR_VGPU_ECC_NOT_SUPPORTED: "ERROR_VGPU_ECC_NOT_SUPPORTED",
	ERROR_INSUFFICIENT_RESOURCES: "ERROR_INSUFFICIENT_RESOURCES", ERROR_FREQ_NOT_SUPPORTED: "ERROR_FREQ_NOT_SUPPORTED",
	ERROR_ARGUMENT_VERSION_MISMATCH: "ERROR_ARGUMENT_VERSION_MISMATCH", ERROR_DEPRECATED: "ERROR_DEPRECATED",
	ERROR_NOT_READY: "ERROR_NOT_READY", ERROR_GPU_NOT_FOUND: "ERROR_GPU_NOT_FOUND", ERROR_INVALID_STATE: "ERROR_INVALID_STATE",
	ERROR_UNKNOWN: "ERROR_UNKNOWN",
}

// Error names r as nvml.h does, without the NVML_ prefix.
func (r Return) Error() string {
	if s, ok := returnNames[r]; ok {
		return s
	}
	return fmt.Sprintf("unknown NVML return value %d", int32(r))
}

// PciInfo is nvmlPciInfo_t (the v3 layout nvmlDeviceGetPciInfo_v3 fills;
// older drivers fill BusIdLegacy only).
type PciInfo struct {
	BusIdLegacy    [16]int8
	Domain         uint32
	Bus            uint32
	Device         uint32
	PciDeviceId    uint32
	PciSubSystemId uint32
	BusId          [32]int8
}

// Memory is nvmlMemory_t (bytes).
type Memory struct {
	Total uint64
	Free  uint64
	Used  uint64
}

// EnableState is nvmlEnableState_t.
type EnableState int32

// The nvmlEnableState_t values.
const (
	FEATURE_DISABLED EnableState = 0
	FEATURE_ENABLED  EnableState = 1
)

// GpuTopologyLevel is nvmlGpuTopologyLevel_t.
type GpuTopologyLevel int32

// The nvmlGpuTopologyLevel_t values.
const (
	TOPOLOGY_INTERNAL   GpuTopologyLevel = 0
	TOPOLOGY_SINGLE     GpuTopologyLevel = 10
	TOPOLOGY_MULTIPLE   GpuTopologyLevel = 20
	TOPOLOGY_HOSTBRIDGE GpuTopologyLevel = 30
	TOPOLOGY_NODE       GpuTopologyLevel = 40
	TOPOLOGY_SYSTEM     GpuTopologyLevel = 50
)

// GpuP2PCapsIndex is nvmlGpuP2PCapsIndex_t.
type GpuP2PCapsIndex int32

// The nvmlGpuP2PCapsIndex_t values discovery asks about.
const (
	P2P_CAPS_INDEX_READ   GpuP2PCapsIndex = 0
	P2P_CAPS_INDEX_WRITE  GpuP2PCapsIndex = 1
	P2P_CAPS_INDEX_NVLINK GpuP2PCapsIndex = 2
)

// GpuP2PStatus is nvmlGpuP2PStatus_t.
type GpuP2PStatus int32

// The nvmlGpuP2PStatus_t values.
const (
	P2P_STATUS_OK                         GpuP2PStatus = 0
	P2P_STATUS_CHIPSET_NOT_SUPPORTED      GpuP2PStatus = 1
	P2P_STATUS_GPU_NOT_SUPPORTED          GpuP2PStatus = 2
	P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED GpuP2PStatus = 3
	P2P_STATUS_DISABLED_BY_REGKEY         GpuP2PStatus = 4
	P2P_STATUS_NOT_SUPPORTED              GpuP2PStatus = 5
	P2P_STATUS_UNKNOWN                    GpuP2PStatus = 6
)

// NVML's buffer sizes and limits (nvml.h).
const (
	NVLINK_MAX_LINKS                  = 36 // links asked about per GPU (NVML answers INVALID_ARGUMENT past its last)
	DEVICE_UUID_V2_BUFFER_SIZE        = 96
	DEVICE_NAME_V2_BUFFER_SIZE        = 96
	SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80
)

// nvmlLib holds the NVML functions discovery calls; each returns an
// nvmlReturn_t. nvmlDevice_t is a pointer (uintptr); enums are C ints.
// The versioned symbols are tried newest first, as go-nvml does.
type nvmlLib struct {
	nvmlInit                            func() Return                                                 `sym:"nvmlInit_v2|nvmlInit"`
	nvmlShutdown                        func() Return                                                 `sym:"nvmlShutdown"`
	nvmlSystemGetDriverVersion          func(v *byte, n uint32) Return                                `sym:"nvmlSystemGetDriverVersion"`
	nvmlSystemGetCudaDriverVersion      func(v *int32) Return                                         `sym:"nvmlSystemGetCudaDriverVersion_v2|nvmlSystemGetCudaDriverVersion"`
	nvmlDeviceGetCount                  func(n *uint32) Return                                        `sym:"nvmlDeviceGetCount_v2|nvmlDeviceGetCount"`
	nvmlDeviceGetHandleByIndex          func(i uint32, d *uintptr) Return                             `sym:"nvmlDeviceGetHandleByIndex_v2|nvmlDeviceGetHandleByIndex"`
	nvmlDeviceGetUUID                   func(d uintptr, s *byte, n uint32) Return                     `sym:"nvmlDeviceGetUUID"`
	nvmlDeviceGetName                   func(d uintptr, s *byte, n uint32) Return                     `sym:"nvmlDeviceGetName"`
	nvmlDeviceGetPciInfo                func(d uintptr, p *PciInfo) Return                            `sym:"nvmlDeviceGetPciInfo_v3|nvmlDeviceGetPciInfo_v2|nvmlDeviceGetPciInfo"`
	nvmlDeviceGetMemoryInfo             func(d uintptr, m *Memory) Return                             `sym:"nvmlDeviceGetMemoryInfo"`
	nvmlDeviceGetCudaComputeCapability  func(d uintptr, major, minor *int32) Return                   `sym:"nvmlDeviceGetCudaComputeCapability"`
	nvmlDeviceGetNvLinkState            func(d uintptr, link uint32, st *EnableState) Return          `sym:"nvmlDeviceGetNvLinkState"`
	nvmlDeviceGetNvLinkRemotePciInfo    func(d uintptr, link uint32, p *PciInfo) Return               `sym:"nvmlDeviceGetNvLinkRemotePciInfo_v2|nvmlDeviceGetNvLinkRemotePciInfo"`
	nvmlDeviceGetTopologyCommonAncestor func(a, b uintptr, l *GpuTopologyLevel) Return                `sym:"nvmlDeviceGetTopologyCommonAncestor"`
	nvmlDeviceGetP2PStatus              func(a, b uintptr, i GpuP2PCapsIndex, s *GpuP2PStatus) Return `sym:"nvmlDeviceGetP2PStatus"`
}

// libraryPaths lists where libnvidia-ml.so.1 is looked for:
// HVDD_NVML_LIBRARY alone if set (tests point it at a stub), else the
// dynamic linker's search.
func libraryPaths() []string {
	if p := os.Getenv("HVDD_NVML_LIBRARY"); p != "" {
		return []string{p}
	}
	return []string{"libnvidia-ml.so.1"}
}

// library is the real NVML: a Library loaded by Init and unloaded by
// Shutdown. Not safe for concurrent use (Discover serialises).
type library struct {
	handle uintptr
	lib    *nvmlLib
	// missing lists the functions the loaded library lacks: calls to them
	// return ERROR_FUNCTION_NOT_FOUND.
	missing []string
}

// newLibrary returns NVML, not yet loaded.
func newLibrary() *library { return &library{} }

// Init loads libnvidia-ml.so.1 and calls nvmlInit: ERROR_LIBRARY_NOT_FOUND
// when it does not load; ERROR_FUNCTION_NOT_FOUND when it lacks nvmlInit
// or nvmlShutdown.
func (l *library) Init() Return {
	if l.lib != nil {
		return l.lib.nvmlInit()
	}
	h, _, err := dl.Open(libraryPaths())
	if err != nil {
		return ERROR_LIBRARY_NOT_FOUND
	}
	lib := &nvmlLib{}
	missing := dl.Bind(h, lib)
	if lib.nvmlInit == nil || lib.nvmlShutdown == nil {
		dl.Close(h)
		return ERROR_FUNCTION_NOT_FOUND
	}
	ret := lib.nvmlInit()
	if ret != SUCCESS {
		dl.Close(h)
		return ret
	}
	l.handle, l.lib, l.missing = h, lib, missing
	return SUCCESS
}

// Shutdown calls nvmlShutdown and unloads the library.
func (l *library) Shutdown() Return {
	if l.lib == nil {
		return ERROR_UNINITIALIZED
	}
	ret := l.lib.nvmlShutdown()
	dl.Close(l.handle)
	l.handle, l.lib, l.missing = 0, nil, nil
	return ret
}

// bufString is the text an NVML call wrote into b (NUL-terminated).
func bufString(b []byte) string {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		return string(b[:i])
	}
	return string(b)
}

func (l *library) SystemGetDriverVersion() (string, Return) {
	if l.lib == nil || l.lib.nvmlSystemGetDriverVersion == nil {
		return "", l.absent()
	}
	b := make([]byte, SYSTEM_DRIVER_VERSION_BUFFER_SIZE)
	ret := l.lib.nvmlSystemGetDriverVersion(&b[0], uint32(len(b)))
	return bufString(b), ret
}

func (l *library) SystemGetCudaDriverVersion() (int, Return) {
	if l.lib == nil || l.lib.nvmlSystemGetCudaDriverVersion == nil {
		return 0, l.absent()
	}
	var v int32
	ret := l.lib.nvmlSystemGetCudaDriverVersion(&v)
	return int(v), ret
}

func (l *library) DeviceGetCount() (int, Return) {
	if l.lib == nil || l.lib.nvmlDeviceGetCount == nil {
		return 0, l.absent()
	}
	var n uint32
	ret := l.lib.nvmlDeviceGetCount(&n)
	return int(n), ret
}

func (l *library) DeviceGetHandleByIndex(i int) (Device, Return) {
	if l.lib == nil || l.lib.nvmlDeviceGetHandleByIndex == nil {
		return nil, l.absent()
	}
	var h uintptr
	if ret := l.lib.nvmlDeviceGetHandleByIndex(uint32(i), &h); ret != SUCCESS {
		return nil, ret
	}
	return &device{l: l, h: h}, SUCCESS
}

// absent is the error of a call NVML cannot take: not loaded, or the
// function missing from the loaded library.
func (l *library) absent() Return {
	if l.lib == nil {
		return ERROR_UNINITIALIZED
	}
	return ERROR_FUNCTION_NOT_FOUND
}

// device is a GPU's nvmlDevice_t.
type device struct {
	l *library
	h uintptr
}

func (d *device) fn() *nvmlLib {
	if d.l.lib == nil {
		return &nvmlLib{} // unloaded: every function absent
	}
	return d.l.lib
}

func (d *device) GetUUID() (string, Return) {
	f := d.fn().nvmlDeviceGetUUID
	if f == nil {
		return "", d.l.absent()
	}
	b := make([]byte, DEVICE_UUID_V2_BUFFER_SIZE)
	ret := f(d.h, &b[0], uint32(len(b)))
	return bufString(b), ret
}

func (d *device) GetName() (string, Return) {
	f := d.fn().nvmlDeviceGetName
	if f == nil {
		return "", d.l.absent()
	}
	b := make([]byte, DEVICE_NAME_V2_BUFFER_SIZE)
	ret := f(d.h, &b[0], uint32(len(b)))
	return bufString(b), ret
}

func (d *device) GetPciInfo() (PciInfo, Return) {
	var p PciInfo
	f := d.fn().nvmlDeviceGetPciInfo
	if f == nil {
		return p, d.l.absent()
	}
	ret := f(d.h, &p)
	return p, ret
}

func (d *device) GetMemoryInfo() (Memory, Return) {
	var m Memory
	f := d.fn().nvmlDeviceGetMemoryInfo
	if f == nil {
		return m, d.l.absent()
	}
	ret := f(d.h, &m)
	return m, ret
}

func (d *device) GetCudaComputeCapability() (int, int, Return) {
	f := d.fn().nvmlDeviceGetCudaComputeCapability
	if f == nil {
		return 0, 0, d.l.absent()
	}
	var major, minor int32
	ret := f(d.h, &major, &minor)
	return int(major), int(minor), ret
}

func (d *device) GetNvLinkState(link int) (EnableState, Return) {
	f := d.fn().nvmlDeviceGetNvLinkState
	if f == nil {
		return 0, d.l.absent()
	}
	var st EnableState
	ret := f(d.h, uint32(link), &st)
	return st, ret
}

func (d *device) GetNvLinkRemotePciInfo(link int) (PciInfo, Return) {
	var p PciInfo
	f := d.fn().nvmlDeviceGetNvLinkRemotePciInfo
	if f == nil {
		return p, d.l.absent()
	}
	ret := f(d.h, uint32(link), &p)
	return p, ret
}

// other is the handle of another device of the same library.
func (d *device) other(o Device) (uintptr, bool) {
	od, ok := o.(*device)
	if !ok || od == nil || od.l != d.l {
		return 0, false
	}
	return od.h, true
}

func (d *device) GetTopologyCommonAncestor(o Device) (GpuTopologyLevel, Return) {
	f := d.fn().nvmlDeviceGetTopologyCommonAncestor
	if f == nil {
		return 0, d.l.absent()
	}
	h, ok := d.other(o)
	if !ok {
		return 0, ERROR_INVALID_ARGUMENT
	}
	var lvl GpuTopologyLevel
	ret := f(d.h, h, &lvl)
	return lvl, ret
}

func (d *device) GetP2PStatus(o Device, idx GpuP2PCapsIndex) (GpuP2PStatus, Return) {
	f := d.fn().nvmlDeviceGetP2PStatus
	if f == nil {
		return 0, d.l.absent()
	}
	h, ok := d.other(o)
	if !ok {
		return 0, ERROR_INVALID_ARGUMENT
	}
	var st GpuP2PStatus
	ret := f(d.h, h, idx, &st)
	return st, ret
}
