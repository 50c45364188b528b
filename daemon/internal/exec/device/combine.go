package device

import (
	"fmt"

	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/kernels"
	"github.com/hvdd/hvdd/tensor"
)

// The combine kernel (gpu/kernels: combine_<op>_<dtype>) is how ranks that
// share a GPU meet: one launch per fused response reads each rank's input
// once and writes each output once (2N·S bytes of memory traffic for N
// ranks and S bytes, where a copy into a fusion buffer, a reduce per
// further rank and a copy back per rank moved (5N−1)·S), with the
// prescale and postscale folded in. Its table of segments (one per tensor:
// count, input pointers, output pointers) is copied to the GPU ahead of
// the launch, into the response's part of the GPU's table buffer.

// tables are a GPU's combine tables: the host bytes of each launch of the
// running response (not rewritten until the response's streams are
// synchronised: a queued copy may read them until then), and the device
// area they are copied to, where each table stays for the launches after
// it with the same table (cached): a training step's in-place allreduce of
// the same tensors launches with no copy. Used by the executor goroutine
// only.
type tables struct {
	host    [][]byte // one per launch of the response, kept for the next ones
	next    int      // host[next] is the next launch's
	dev     gpu.DevicePtr
	devN    int
	used    int                      // bytes of dev holding tables
	cached  map[string]gpu.DevicePtr // table bytes -> where in dev
	retired []gpu.DevicePtr          // outgrown areas a queued launch may still read
	// copied is set once the running response queued a table copy from
	// host: completed ordered on the GPU (no synchronisation), the
	// response then leaves its host bytes to that copy (finishOrdered).
	copied bool
}

// minTable is the first table area's size (room for a fused response of
// about a hundred tensors over two ranks), maxTable the size beyond which
// a full area is replaced, not grown.
const (
	minTable = 8 << 10
	maxTable = 1 << 20
)

// combine enqueues one combine launch on d over segs, each of nin inputs
// and nout outputs, reducing with op, each input scaled by pre and the
// total by post.
func (d *gpuDev) combine(segs []kernels.Segment, nin, nout int, dt tensor.DType, op tensor.ReduceOp, pre, post float64) error {
	if len(segs) == 0 {
		return nil
	}
	fn, err := d.combineFn(op, dt)
	if err != nil {
		return err
	}
	t := &d.tab
	if t.next == len(t.host) {
		t.host = append(t.host, nil)
	}
	b := t.host[t.next][:0]
	most := uint64(0)
	for _, s := range segs {
		b = kernels.AppendTable(b, s)
		most = max(most, s.Count)
	}
	t.host[t.next] = b
	t.next++
	table, err := d.tableAt(b)
	if err != nil {
		return err
	}
	if err := fn.Launch(d.stream, kernels.CombineGrid(int(most), dt), kernels.BlockSize, table, uint64(len(segs)), uint64(nin), uint64(nout), pre, post); err != nil {
		return fmt.Errorf("GPU %s: combine %v %v: %w", d.info.UUID, op, dt, err)
	}
	return nil
}

// combineFn returns d's combine kernel for op and dt, looked up once.
func (d *gpuDev) combineFn(op tensor.ReduceOp, dt tensor.DType) (gpu.Function, error) {
	k, err := d.kernels()
	if err != nil {
		return nil, err
	}
	key := combineKey{op, dt}
	if f, ok := k.combines[key]; ok {
		return f, nil
	}
	name, err := kernels.CombineName(op, dt)
	if err != nil {
		return nil, err
	}
	f, err := k.fn(name)
	if err != nil {
		return nil, err
	}
	if k.combines == nil {
		k.combines = make(map[combineKey]gpu.Function)
	}
	k.combines[key] = f
	return f, nil
}

// tableAt returns where table b is in d's table area: where it was put
// before, or copied there now (on d's stream). A full area is replaced by
// a new one (twice as large up to maxTable) and its tables forgotten, the
// old area kept until the response ends (endResponse).
func (d *gpuDev) tableAt(b []byte) (gpu.DevicePtr, error) {
	t := &d.tab
	if p, ok := t.cached[string(b)]; ok {
		return p, nil
	}
	if t.cached == nil {
		t.cached = make(map[string]gpu.DevicePtr)
	}
	need := (len(b) + 255) &^ 255 // each table 256-byte aligned
	if t.used+need > t.devN {
		n := max(min(2*t.devN, maxTable), minTable)
		for n < need {
			n *= 2
		}
		p, err := d.dev.Alloc(n)
		if err != nil {
			return 0, fmt.Errorf("GPU %s: combine table of %d bytes: %w", d.info.UUID, n, err)
		}
		d.g.counts.allocs.Add(1)
		if t.devN > 0 {
			t.retired = append(t.retired, t.dev)
		}
		t.dev, t.devN, t.used = p, n, 0
		t.cached = make(map[string]gpu.DevicePtr)
	}
	at := t.dev.Add(t.used)
	if err := d.dev.CopyHtoD(d.stream, at, b); err != nil {
		return 0, fmt.Errorf("GPU %s: combine table: %w", d.info.UUID, err)
	}
	t.used += need
	t.copied = true
	t.cached[string(b)] = at
	return at, nil
}

// endResponse ends a response once d's stream is synchronised: its
// tables' host bytes are free for the next, its outgrown areas freed.
func (d *gpuDev) endResponse() {
	t := &d.tab
	t.next = 0
	t.copied = false
	for _, p := range t.retired {
		d.dev.Free(p)
	}
	t.retired = nil
}

// rankPtrs are the addresses, at byte at, of the device tensors of row
// (one tensor's ops, by rank) that are on d.
func rankPtrs(row []*job.Op, d *gpuDev, at int) []uint64 {
	var ps []uint64
	for _, o := range row {
		if o == nil {
			continue // another node's rank
		}
		if dv := devOf(o); dv.d == d {
			ps = append(ps, uint64(dv.ptr.Add(at)))
		}
	}
	return ps
}

// freeTables frees d's table buffers (the daemon stops).
func (d *gpuDev) freeTables() {
	d.endResponse()
	if d.tab.devN > 0 {
		d.dev.Free(d.tab.dev)
		d.tab.dev, d.tab.devN = 0, 0
	}
}
