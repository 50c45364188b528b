package nvml

import (
	"errors"
	"fmt"
	"strings"
)

// ErrNeedsCgo is what Discover and OpenSampler return in a build without
// cgo (CGO_ENABLED=0): the NVML binding, go-nvml, is cgo.
var ErrNeedsCgo = errors.New("nvml: " + needsCgo)

const needsCgo = "GPU discovery needs a cgo build (this hvdd was built with CGO_ENABLED=0)"

// ErrClosed is what a Sampler's Sample returns after Close.
var ErrClosed = errors.New("nvml: sampler closed")

// ErrGPULost matches every *LostError in errors.Is: a GPU that NVML says
// is lost (ERROR_GPU_IS_LOST) or that reported XID 79.
var ErrGPULost = errors.New("nvml: GPU is lost")

// XIDFallenOffBus is the XID the driver reports when a GPU has fallen off
// the bus (NVIDIA's XID catalogue, 79): the GPU is gone until the node is
// reset, and a Sampler counts it lost.
const XIDFallenOffBus = 79

// Fields is a set of a Sample's figures, one bit each.
type Fields uint16

// The figures of a Sample, by the NVML calls that read them.
const (
	// FieldUtilization: UtilizationGPU and UtilizationMemory
	// (nvmlDeviceGetUtilizationRates).
	FieldUtilization Fields = 1 << iota
	// FieldMemory: MemoryUsed and MemoryTotal (nvmlDeviceGetMemoryInfo).
	FieldMemory
	// FieldTemperature: Temperature (nvmlDeviceGetTemperature, the die).
	FieldTemperature
	// FieldPower: PowerMilliwatts (nvmlDeviceGetPowerUsage).
	FieldPower
	// FieldPCIe: PCIeTxBytesPerSecond and PCIeRxBytesPerSecond
	// (nvmlDeviceGetPcieThroughput).
	FieldPCIe
	// FieldNVLink: NVLinkTxBytes and NVLinkRxBytes
	// (nvmlDeviceGetFieldValues, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX
	// summed over the links). Not supported on GPUs without NVLink.
	FieldNVLink
	// FieldECC: ECCCorrected and ECCUncorrected
	// (nvmlDeviceGetTotalEccErrors, volatile counters). Not supported
	// where ECC is off or absent.
	FieldECC
	// FieldXID: XIDs. The GPU is registered for critical XID events
	// (nvmlDeviceRegisterEvents); without it, its XIDs are not seen.
	FieldXID
)

// AllFields is the set of every field.
const AllFields = FieldXID<<1 - 1

var fieldNames = [...]string{"utilization", "memory", "temperature", "power", "pcie", "nvlink", "ecc", "xid"}

// Has reports whether f holds every field of g.
func (f Fields) Has(g Fields) bool { return f&g == g }

// String names the fields of f, joined by "|"; "none" for none.
func (f Fields) String() string {
	var s []string
	for i, n := range fieldNames {
		if f&(1<<i) != 0 {
			s = append(s, n)
		}
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, "|")
}

// MarshalText writes f as String does, so that JSON names the fields.
func (f Fields) MarshalText() ([]byte, error) { return []byte(f.String()), nil }

// Sample is one GPU's figures from one sampling round (Sampler.Sample).
// A figure outside Valid is zero: the GPU does not support it
// (Unsupported), its call failed (Errors), or the GPU is lost (Lost).
type Sample struct {
	// Index is NVML's index of the GPU (the node's, as in Report).
	Index int `json:"index"`
	// UUID and PCIBusID identify the GPU as Report does ("GPU-...",
	// "0000:3b:00.0"); empty when NVML did not give them at OpenSampler.
	UUID     string `json:"uuid"`
	PCIBusID string `json:"pci_bus_id"`
	// Valid holds the figures read; Unsupported those NVML answers
	// ERROR_NOT_SUPPORTED for on this GPU (asked once, then no more).
	Valid       Fields `json:"valid"`
	Unsupported Fields `json:"unsupported"`

	// UtilizationGPU is the percentage of NVML's last sample period (1/6
	// to 1 s, by product) during which a kernel ran; UtilizationMemory,
	// during which device memory was read or written.
	UtilizationGPU    uint32 `json:"utilization_gpu"`
	UtilizationMemory uint32 `json:"utilization_memory"`
	// MemoryUsed and MemoryTotal are bytes of device memory.
	MemoryUsed  uint64 `json:"memory_used"`
	MemoryTotal uint64 `json:"memory_total"`
	// Temperature is the die's, in degrees Celsius.
	Temperature uint32 `json:"temperature"`
	// PowerMilliwatts is the board's power draw.
	PowerMilliwatts uint32 `json:"power_milliwatts"`
	// PCIeTxBytesPerSecond and PCIeRxBytesPerSecond are the PCIe
	// throughput over NVML's 20 ms window (NVML's KB/s, taken as KiB/s).
	PCIeTxBytesPerSecond uint64 `json:"pcie_tx_bytes_per_second"`
	PCIeRxBytesPerSecond uint64 `json:"pcie_rx_bytes_per_second"`
	// NVLinkTxBytes and NVLinkRxBytes count the data bytes sent and
	// received over all the GPU's NVLinks (NVML counts KiB) since the
	// driver loaded: counters, not rates.
	NVLinkTxBytes uint64 `json:"nvlink_tx_bytes"`
	NVLinkRxBytes uint64 `json:"nvlink_rx_bytes"`
	// ECCCorrected and ECCUncorrected count the GPU's memory errors since
	// the driver loaded (NVML's volatile counters).
	ECCCorrected   uint64 `json:"ecc_corrected"`
	ECCUncorrected uint64 `json:"ecc_uncorrected"`

	// XIDs lists the XID errors the driver reported for the GPU since the
	// previous Sample, in order (each once).
	XIDs []uint64 `json:"xids,omitempty"`
	// Lost is set once the GPU is lost; it then stays lost, and the
	// Sampler asks NVML nothing more about it.
	Lost *LostError `json:"lost,omitempty"`
	// Errors names the calls that failed this round, otherwise than
	// NOT_SUPPORTED ("GetPowerUsage: Insufficient Permissions").
	Errors []string `json:"errors,omitempty"`
}

// LostError says that a GPU is lost: NVML answered ERROR_GPU_IS_LOST for
// it, or the driver reported XID 79 (fallen off the bus). errors.Is(err,
// ErrGPULost) holds for it; Unwrap gives NVML's error where there is one.
type LostError struct {
	// Index is NVML's index of the GPU; UUID and PCIBusID are as in
	// Sample, empty when unknown.
	Index    int    `json:"index"`
	UUID     string `json:"uuid,omitempty"`
	PCIBusID string `json:"pci_bus_id,omitempty"`
	// Reason says how the loss was seen: "XID 79 (fallen off the bus)",
	// or the call and NVML's answer ("GetPowerUsage: GPU is lost").
	Reason string `json:"reason"`
	// XID is the XID that said so (XIDFallenOffBus), 0 when NVML did.
	XID uint64 `json:"xid,omitempty"`
	// Err is NVML's error (ERROR_GPU_IS_LOST), nil for an XID.
	Err error `json:"-"`
}

func (e *LostError) Error() string {
	id := e.UUID
	if e.PCIBusID != "" {
		if id != "" {
			id += ", "
		}
		id += e.PCIBusID
	}
	if id != "" {
		id = " (" + id + ")"
	}
	return fmt.Sprintf("nvml: GPU %d%s is lost: %s", e.Index, id, e.Reason)
}

// Unwrap returns NVML's error, nil for an XID.
func (e *LostError) Unwrap() error { return e.Err }

// Is reports whether target is ErrGPULost.
func (e *LostError) Is(target error) bool { return target == ErrGPULost }

// IsLost reports whether err says a GPU is lost (a *LostError in its
// chain).
func IsLost(err error) bool { return errors.Is(err, ErrGPULost) }
