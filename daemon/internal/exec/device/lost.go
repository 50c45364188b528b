package device

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/timeline"
)

// Lost GPUs. The Server samples the node's GPUs through NVML on a
// goroutine of its own; when a round reports one of them lost (NVML's
// ERROR_GPU_IS_LOST, or XID 79: fallen off the bus) it calls MarkLost. From
// then on, for the daemon's life:
//
//   - Resolve refuses a new device tensor on the GPU (CODE_INTERNAL, the
//     loop's answer to a GPU that failed rather than a bad request);
//   - the executor fails a response that has a tensor on it before it
//     touches any GPU (Path.Lost, Path.FailLost): on one node its ops
//     answer CODE_INTERNAL; across nodes the job fails, as after any
//     device failure, since the other nodes wait in the engine.
//
// Both errors name the GPU by index, UUID and PCI bus id. Host tensors,
// and tensors on the other GPUs, go on as before. A collective that is
// already running on the GPU when it is lost fails where the CUDA driver
// says so (deviceFailed).

// ErrGPULost matches every *LostError in errors.Is.
var ErrGPULost = errors.New("the GPU is lost")

// LostError says that one of the daemon's GPUs is lost, and how that was
// seen.
type LostError struct {
	// Index is the GPU's index as the daemon lists it (gpu.Info.Index);
	// UUID and PCIBusID identify it as nvidia-smi does.
	Index    int
	UUID     string
	PCIBusID string
	// Cause says how the loss was seen (the sampler's word: "XID 79
	// (fallen off the bus)"); never nil.
	Cause error
}

func (e *LostError) Error() string {
	return fmt.Sprintf("GPU %d (%s, PCI %s) is lost: %v", e.Index, e.UUID, e.PCIBusID, e.Cause)
}

// Unwrap returns the cause.
func (e *LostError) Unwrap() error { return e.Cause }

// Is reports whether target is ErrGPULost.
func (e *LostError) Is(target error) bool { return target == ErrGPULost }

// lostErr returns d's LostError, nil while d is not lost.
func (d *gpuDev) lostErr() *LostError { return d.lost.Load() }

// MarkLost records that the daemon's GPU of this UUID (or, failing that,
// of this PCI bus id) is lost, cause saying how that was seen, and logs it
// once at error level. It returns the GPU's LostError, and whether this
// call marked it (false when it was lost already, or is not one of the
// daemon's: nil then). Safe from any goroutine; g may be nil (CPU-only).
func (g *GPUs) MarkLost(uuid, pciBusID string, cause error) (*LostError, bool) {
	if g == nil {
		return nil, false
	}
	d := g.by[uuid]
	if d == nil && pciBusID != "" {
		for _, c := range g.devs {
			if sameBus(c.info.PCIBusID, pciBusID) {
				d = c
				break
			}
		}
	}
	if d == nil {
		return nil, false
	}
	if cause == nil {
		cause = errors.New("lost")
	}
	e := &LostError{Index: d.info.Index, UUID: d.info.UUID, PCIBusID: d.info.PCIBusID, Cause: cause}
	if !d.lost.CompareAndSwap(nil, e) {
		return d.lost.Load(), false
	}
	g.anyLost.Store(true)
	g.log.Error("GPU lost: its device tensors fail from now on", "index", e.Index, "uuid", e.UUID, "pci", e.PCIBusID, "cause", cause)
	return e, true
}

// sameBus reports whether two PCI bus ids name one device: case aside,
// and with NVML's eight-digit domain ("00000000:3B:00.0") against CUDA's
// four ("0000:3b:00.0").
func sameBus(a, b string) bool {
	norm := func(s string) string {
		s = strings.ToLower(s)
		if dom, rest, ok := strings.Cut(s, ":"); ok && len(dom) > 4 && strings.Trim(dom[:len(dom)-4], "0") == "" {
			s = dom[len(dom)-4:] + ":" + rest
		}
		return s
	}
	return a != "" && norm(a) == norm(b)
}

// LostErr returns the LostError of the daemon's GPU idx (its position in
// UUIDs), nil while it is not lost or when there is no such GPU.
func (g *GPUs) LostErr(idx int) error {
	if g == nil || idx < 0 || idx >= len(g.devs) {
		return nil
	}
	if e := g.devs[idx].lostErr(); e != nil {
		return e
	}
	return nil
}

// Lost returns the LostError of the first lost GPU that a tensor of w is
// on; nil when none is (at once, while no GPU is lost).
func (x *Path) Lost(w *job.Work) error {
	if x.gpu == nil || !x.gpu.anyLost.Load() {
		return nil
	}
	for _, row := range w.Ops {
		for _, o := range row {
			if o == nil || o.Dev == nil {
				continue
			}
			if e := devOf(o).d.lostErr(); e != nil {
				return e
			}
		}
	}
	return nil
}

// FailLost answers w's ops, one of whose GPUs is lost (err, from Lost),
// without running it: on one node with CODE_INTERNAL naming the GPU; across
// nodes through the loop, which fails the job (the other nodes would wait
// in the engine for this one), as deviceFailed does. Unlike deviceFailed it
// leaves the GPUs' streams and communicators alone: nothing ran.
func (x *Path) FailLost(w job.Work, err error) {
	r := &w.Resp
	msg := fmt.Sprintf("%v of %d GPU tensor(s) failed: %v", r.Op, len(r.Tensors), err)
	// The loss itself was logged once (MarkLost).
	x.log.Debug("GPU collective on a lost GPU failed", "op", r.Op, "tensors", len(r.Tensors), "err", err)
	if w.Trace != nil {
		// The response's top-level phase (tracer.responded) ends once
		// every rank has its answer.
		defer job.TraceAll(w.Trace, r, timeline.End, "")
	}
	x.fail(w, msg, false, 0)
}
