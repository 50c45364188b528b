package daemontest

import (
	"fmt"
	"sync"

	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/gpu/fake"
	"github.com/hvdd/hvdd/gpu/nvml"
)

// GPUSampler is a daemon.GPUSampler of n GPUs that are gpu/fake's (their
// UUIDs and PCI bus ids), each answering the figures
// of its index (GPUFigures). Lose makes one report XID 79 in the next
// round and stay lost after, as gpu/nvml's Sampler does. Give its Open to
// daemon.Config.OpenGPUSampler. Safe for concurrent use.
type GPUSampler struct {
	n int

	// mu guards the fields that follow.
	mu     sync.Mutex
	lost   map[int]*nvml.LostError
	xids   map[int][]uint64 // XIDs for the next round
	opened bool
	closed bool
}

// NewGPUSampler returns a sampler of n fake GPUs.
func NewGPUSampler(n int) *GPUSampler {
	return &GPUSampler{n: n, lost: make(map[int]*nvml.LostError), xids: make(map[int][]uint64)}
}

// Open is daemon.Config.OpenGPUSampler: it returns the sampler itself.
func (s *GPUSampler) Open() (daemon.GPUSampler, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opened {
		return nil, fmt.Errorf("daemontest: GPUSampler opened twice")
	}
	s.opened = true
	return s, nil
}

// busID is fake GPU i's PCI bus id, as gpu/fake's and gpu/nvml's
// Sampler write it.
func busID(i int) string { return fmt.Sprintf("0000:%02x:00.0", i+1) }

// GPUFigures is the Sample GPU i answers while not lost, every figure
// valid: made from i, so that a test tells the GPUs apart.
func GPUFigures(i int) nvml.Sample {
	return nvml.Sample{
		Index: i, UUID: fake.UUID(i), PCIBusID: busID(i),
		Valid:          nvml.AllFields,
		UtilizationGPU: uint32(40 + i), UtilizationMemory: uint32(20 + i),
		MemoryUsed: uint64(1+i) << 30, MemoryTotal: 80 << 30,
		Temperature: uint32(50 + i), PowerMilliwatts: uint32(250000 + 1000*i),
		PCIeTxBytesPerSecond: uint64(10+i) << 20, PCIeRxBytesPerSecond: uint64(20+i) << 20,
		NVLinkTxBytes: uint64(3+i) << 40, NVLinkRxBytes: uint64(4+i) << 40,
		ECCCorrected: uint64(7 + i), ECCUncorrected: uint64(i),
	}
}

// Lose makes GPU i lost from the next round on (XID 79 in that round).
func (s *GPUSampler) Lose(i int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.xids[i] = append(s.xids[i], nvml.XIDFallenOffBus)
}

// XID makes GPU i report xid in the next round.
func (s *GPUSampler) XID(i int, xid uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.xids[i] = append(s.xids[i], xid)
}

// Sample is one round: every GPU's figures, a lost GPU's identity and
// LostError only.
func (s *GPUSampler) Sample() ([]nvml.Sample, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nvml.ErrClosed
	}
	out := make([]nvml.Sample, s.n)
	for i := range out {
		xids := s.xids[i]
		delete(s.xids, i)
		for _, x := range xids {
			if x == nvml.XIDFallenOffBus && s.lost[i] == nil {
				s.lost[i] = &nvml.LostError{Index: i, UUID: fake.UUID(i), PCIBusID: busID(i), Reason: "XID 79 (fallen off the bus)", XID: x}
			}
		}
		if e := s.lost[i]; e != nil {
			lost := *e
			out[i] = nvml.Sample{Index: i, UUID: fake.UUID(i), PCIBusID: busID(i), Valid: nvml.FieldXID, XIDs: xids, Lost: &lost}
			continue
		}
		out[i] = GPUFigures(i)
		out[i].XIDs = xids
	}
	return out, nil
}

// Close makes later Samples fail with nvml.ErrClosed.
func (s *GPUSampler) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// Closed reports whether the daemon closed the sampler.
func (s *GPUSampler) Closed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}
