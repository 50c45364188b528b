package metrics_test

import (
	"reflect"
	"testing"

	"github.com/hvdd/hvdd/daemon/metrics"
	"github.com/hvdd/hvdd/gpu/nvml"
)

// statsOf is what the daemon hands SetGPUs for a gpu/nvml Sample (a test
// may import gpu/nvml; the package may not: deptest). The daemon's own
// copy of it should read the same.
func statsOf(s nvml.Sample) metrics.GPUStats {
	return metrics.GPUStats{
		Index: s.Index, UUID: s.UUID, Has: metrics.GPUFigures(s.Valid),
		UtilizationGPU: s.UtilizationGPU, UtilizationMemory: s.UtilizationMemory,
		MemoryUsed: s.MemoryUsed, MemoryTotal: s.MemoryTotal,
		Temperature: s.Temperature, PowerMilliwatts: s.PowerMilliwatts,
		PCIeTxBytesPerSecond: s.PCIeTxBytesPerSecond, PCIeRxBytesPerSecond: s.PCIeRxBytesPerSecond,
		NVLinkTxBytes: s.NVLinkTxBytes, NVLinkRxBytes: s.NVLinkRxBytes,
		ECCCorrected: s.ECCCorrected, ECCUncorrected: s.ECCUncorrected,
		XIDs: s.XIDs, Lost: s.Lost != nil,
	}
}

// TestGPUFiguresAreNVMLFields: GPUFigures has gpu/nvml's Fields' bits, so
// that GPUFigures(sample.Valid) converts them.
func TestGPUFiguresAreNVMLFields(t *testing.T) {
	for f, g := range map[nvml.Fields]metrics.GPUFigures{
		nvml.FieldUtilization: metrics.GPUUtilization, nvml.FieldMemory: metrics.GPUMemory,
		nvml.FieldTemperature: metrics.GPUTemperature, nvml.FieldPower: metrics.GPUPower,
		nvml.FieldPCIe: metrics.GPUPCIe, nvml.FieldNVLink: metrics.GPUNVLink,
		nvml.FieldECC: metrics.GPUECC, nvml.FieldXID: metrics.GPUXID,
	} {
		if metrics.GPUFigures(f) != g {
			t.Errorf("nvml %v is GPUFigures %#x, want %#x", f, uint16(f), uint16(g))
		}
	}
	if metrics.GPUFigures(nvml.AllFields) != metrics.GPUXID<<1-1 {
		t.Errorf("nvml has fields that GPUFigures lacks: %v", nvml.AllFields)
	}
	// Every figure of a Sample reaches GPUStats under the same name.
	st := reflect.TypeOf(metrics.GPUStats{})
	sa := reflect.TypeOf(nvml.Sample{})
	for i := range st.NumField() {
		f := st.Field(i)
		if f.Name == "Has" || f.Name == "Lost" {
			continue
		}
		if g, ok := sa.FieldByName(f.Name); !ok || g.Type != f.Type {
			t.Errorf("GPUStats.%s (%v) has no Sample field of its name and type", f.Name, f.Type)
		}
	}
	s := nvml.Sample{Index: 3, UUID: "GPU-c", Valid: nvml.FieldPower | nvml.FieldXID, PowerMilliwatts: 7, XIDs: []uint64{79},
		Lost: &nvml.LostError{Index: 3, Reason: "XID 79 (fallen off the bus)", XID: 79}}
	want := metrics.GPUStats{Index: 3, UUID: "GPU-c", Has: metrics.GPUPower | metrics.GPUXID, PowerMilliwatts: 7, XIDs: []uint64{79}, Lost: true}
	if got := statsOf(s); !reflect.DeepEqual(got, want) {
		t.Errorf("statsOf = %+v, want %+v", got, want)
	}
}
