package reduce

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/hvdd/hvdd/tensor"
)

// Options tunes Reduce. A nil *Options and zero fields mean the defaults.
type Options struct {
	// Workers is the most goroutines one call uses, the caller's included.
	// Zero or negative means runtime.GOMAXPROCS(0).
	Workers int
	// ParallelMin is the buffer size in bytes below which the calling
	// goroutine does all the work. Zero or negative means 1 MiB.
	ParallelMin int
	// ChunkBytes is how many bytes of each buffer one chunk covers (rounded
	// down to a multiple of 256 bytes, at least 256). Zero or negative means
	// 32 KiB, which keeps a chunk of a few sources plus the float32 scratch
	// of the half-precision path inside L2.
	ChunkBytes int
}

const (
	defaultParallelMin = 1 << 20
	defaultChunkBytes  = 32 << 10
	// chunkAlign is the granule of chunks and of worker ranges, in bytes: a
	// multiple of the 128-byte vector block of the assembly loops and of the
	// 64-byte cache line, so two workers never write the same line (as long
	// as the buffers start line-aligned, which shared memory does).
	chunkAlign = 256
	// minWorkerBytes keeps each worker busy long enough to repay starting it.
	minWorkerBytes = 64 << 10
)

// Reduce computes, element-wise, r = postscale * op(prescale*srcs[0], ...,
// prescale*srcs[k-1]) and writes r into every buffer of dsts.
//
// All buffers hold n elements of dt (len(buf) == n*dt.Size()); k = len(srcs)
// >= 1 and len(dsts) >= 1. A dst may be the very same slice as a src (same
// backing array, offset and length), which is how the daemon reduces client
// buffers in place, and the same slice may appear several times in either
// list; any other overlap between a dst and a src or another dst is an error.
//
// op is Sum, Min, Max or Product; Average (Sum with postscale 1/size) and
// Adasum (not element-wise: see the Adasum function) are errors. Scale
// factors of exactly 1 are skipped. See the package documentation for the
// per-type rules (integer wrap-around and truncation, half-precision
// rounding, bool logic, NaN order for Min and Max).
//
// Buffers of at least opts.ParallelMin bytes are split into contiguous
// ranges, one per worker goroutine; Reduce returns once all of them are done.
// The srcs are only read. Reduce does not retain any buffer after it returns.
func Reduce(dsts, srcs [][]byte, dt tensor.DType, op tensor.ReduceOp, prescale, postscale float64, opts *Options) error {
	n, err := check(dsts, srcs, dt, op)
	if err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	workers, parallelMin, chunkBytes := runtime.GOMAXPROCS(0), defaultParallelMin, defaultChunkBytes
	if opts != nil {
		if opts.Workers > 0 {
			workers = opts.Workers
		}
		if opts.ParallelMin > 0 {
			parallelMin = opts.ParallelMin
		}
		if opts.ChunkBytes > 0 {
			chunkBytes = max(opts.ChunkBytes/chunkAlign*chunkAlign, chunkAlign)
		}
	}
	nbytes := len(srcs[0])
	if nbytes < parallelMin {
		workers = 1
	}
	workers = min(workers, max(nbytes/minWorkerBytes, 1))

	if workers <= 1 {
		j := newJob(dsts, srcs, dt, op, prescale, postscale, chunkBytes)
		j.run(0, n)
		return nil
	}

	// Split [0, n) into workers contiguous ranges whose boundaries fall on
	// chunkAlign-byte multiples. Elements are independent, so ranges need no
	// coordination; the caller does the last range itself.
	p, _ := parallelPool.Get().(*parallelJob)
	if p == nil {
		p = new(parallelJob)
	}
	p.job = newJob(dsts, srcs, dt, op, prescale, postscale, chunkBytes)
	align := chunkAlign / dt.Size()
	per := (n/workers + align - 1) / align * align
	lo := 0
	for w := 0; w < workers-1 && lo+per < n; w++ {
		p.wg.Add(1)
		go p.runPart(lo, lo+per)
		lo += per
	}
	p.job.run(lo, n)
	p.wg.Wait()
	p.job = job{} // drop the buffers before pooling
	parallelPool.Put(p)
	return nil
}

// Scale multiplies every element of buf by f in place, with the same per-type
// rules as Reduce's scale factors (bool buffers and f == 1 are left alone).
func Scale(buf []byte, dt tensor.DType, f float64) error {
	if !dt.Valid() {
		return fmt.Errorf("reduce: invalid dtype %v", dt)
	}
	if len(buf)%dt.Size() != 0 {
		return fmt.Errorf("reduce: buffer of %d bytes is not a whole number of %v elements", len(buf), dt)
	}
	if f == 1 || dt == tensor.Bool || len(buf) == 0 {
		return nil
	}
	// A one-source Sum with prescale f is exactly a scale.
	bufs := [1][]byte{buf}
	j := newJob(bufs[:], bufs[:], dt, tensor.Sum, f, 1, defaultChunkBytes)
	j.run(0, len(buf)/dt.Size())
	return nil
}

// Fill writes the identity element of op into every element of buf: 0 for
// Sum (and Average), the largest value (+Inf for floats) for Min, the
// smallest (-Inf for floats, 0 for unsigned types) for Max, 1 for Product;
// for bool, false for Sum and Max and true for Min and Product.
func Fill(buf []byte, dt tensor.DType, op tensor.ReduceOp) error {
	if !dt.Valid() {
		return fmt.Errorf("reduce: invalid dtype %v", dt)
	}
	if len(buf)%dt.Size() != 0 {
		return fmt.Errorf("reduce: buffer of %d bytes is not a whole number of %v elements", len(buf), dt)
	}
	var v uint64 // the element's bit pattern, little end first in memory
	switch op {
	case tensor.Sum, tensor.Average:
		v = 0
	case tensor.Min, tensor.Max, tensor.Product:
		v = identity(dt, op)
	default:
		return fmt.Errorf("reduce: %v has no identity element", op)
	}
	if len(buf) == 0 {
		return nil
	}
	sz := dt.Size()
	for i := 0; i < sz; i++ {
		buf[i] = byte(v >> (8 * i))
	}
	// Double the filled prefix until the buffer is full.
	for filled := sz; filled < len(buf); filled *= 2 {
		copy(buf[filled:], buf[:filled])
	}
	return nil
}

// identity returns the bit pattern of op's identity for dt (Min, Max, Product).
func identity(dt tensor.DType, op tensor.ReduceOp) uint64 {
	type ids struct{ min, max, one uint64 }
	var t ids
	switch dt {
	case tensor.Uint8:
		t = ids{0xff, 0, 1}
	case tensor.Int8:
		t = ids{0x7f, 0x80, 1}
	case tensor.Uint16:
		t = ids{0xffff, 0, 1}
	case tensor.Int16:
		t = ids{0x7fff, 0x8000, 1}
	case tensor.Int32:
		t = ids{0x7fffffff, 0x80000000, 1}
	case tensor.Int64:
		t = ids{1<<63 - 1, 1 << 63, 1}
	case tensor.Float16:
		t = ids{0x7c00, 0xfc00, 0x3c00}
	case tensor.BFloat16:
		t = ids{0x7f80, 0xff80, 0x3f80}
	case tensor.Float32:
		t = ids{0x7f800000, 0xff800000, 0x3f800000}
	case tensor.Float64:
		t = ids{0x7ff0000000000000, 0xfff0000000000000, 0x3ff0000000000000}
	case tensor.Bool:
		t = ids{1, 0, 1}
	}
	switch op {
	case tensor.Min:
		return t.min
	case tensor.Max:
		return t.max
	}
	return t.one
}

// check validates Reduce's arguments and returns the element count.
func check(dsts, srcs [][]byte, dt tensor.DType, op tensor.ReduceOp) (int, error) {
	if !dt.Valid() {
		return 0, fmt.Errorf("reduce: invalid dtype %v", dt)
	}
	switch op {
	case tensor.Sum, tensor.Min, tensor.Max, tensor.Product:
	case tensor.Average:
		return 0, errors.New("reduce: Average is not an element-wise op; use Sum with postscale 1/size")
	case tensor.Adasum:
		return 0, errAdasumElementwise
	default:
		return 0, fmt.Errorf("reduce: invalid op %v", op)
	}
	if len(srcs) == 0 {
		return 0, errors.New("reduce: no source buffers")
	}
	if len(dsts) == 0 {
		return 0, errors.New("reduce: no destination buffers")
	}
	size := len(srcs[0])
	if size%dt.Size() != 0 {
		return 0, fmt.Errorf("reduce: srcs[0] has %d bytes, not a whole number of %v elements", size, dt)
	}
	for i, s := range srcs {
		if len(s) != size {
			return 0, fmt.Errorf("reduce: srcs[%d] has %d bytes, srcs[0] has %d", i, len(s), size)
		}
	}
	for i, d := range dsts {
		if len(d) != size {
			return 0, fmt.Errorf("reduce: dsts[%d] has %d bytes, srcs[0] has %d", i, len(d), size)
		}
		for k, s := range srcs {
			if overlap(d, s) && !same(d, s) {
				return 0, fmt.Errorf("reduce: dsts[%d] partly overlaps srcs[%d]", i, k)
			}
		}
		for k, e := range dsts[:i] {
			if overlap(d, e) && !same(d, e) {
				return 0, fmt.Errorf("reduce: dsts[%d] partly overlaps dsts[%d]", i, k)
			}
		}
	}
	return size / dt.Size(), nil
}

// same reports whether a and b are the very same non-empty buffer.
func same(a, b []byte) bool {
	return len(a) == len(b) && len(a) > 0 && unsafe.SliceData(a) == unsafe.SliceData(b)
}

// overlap reports whether a and b share any byte.
func overlap(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	alo := uintptr(unsafe.Pointer(unsafe.SliceData(a)))
	blo := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return alo < blo+uintptr(len(b)) && blo < alo+uintptr(len(a))
}

// A job is one validated Reduce call, shared read-only by its workers.
type job struct {
	dsts, srcs [][]byte
	dt         tensor.DType
	op         tensor.ReduceOp
	pre, post  float64
	// scaled is pre != 1 || post != 1; bool jobs are never scaled.
	scaled bool
	// accDst says dsts[0] may hold the running result of the scalar loops;
	// see runGeneric.
	accDst bool
	// chunk is the number of elements per chunk.
	chunk int
	// srcPtrs holds the base address of every src for the assembly loops
	// when there are more than len(ptrs) of them, ptrs otherwise. (A slice
	// of ptrs would point j at itself and force it onto the heap.)
	srcPtrs []unsafe.Pointer
	ptrs    [8]unsafe.Pointer
}

// newJob returns the job for validated arguments. It returns a value, not a
// pointer, so that a serial call keeps the job (and the caller's slices of
// buffers) on the stack.
func newJob(dsts, srcs [][]byte, dt tensor.DType, op tensor.ReduceOp, pre, post float64, chunkBytes int) (j job) {
	j.dsts, j.srcs, j.dt, j.op, j.pre, j.post = dsts, srcs, dt, op, pre, post
	j.scaled = dt != tensor.Bool && (pre != 1 || post != 1)
	j.chunk = chunkBytes / dt.Size()
	// The scalar loops fold into dsts[0] in place: pass 1 computes
	// d0 = op(s0, s1), which is safe when d0 is s0 or s1 because each
	// element is read before it is written, and pass j >= 2 computes
	// d0 = op(d0, sj), which would read a clobbered sj if d0 were sj. So
	// dsts[0] can accumulate unless it is one of srcs[2:].
	j.accDst = true
	for _, s := range srcs[min(2, len(srcs)):] {
		if same(dsts[0], s) {
			j.accDst = false
		}
	}
	if (dt == tensor.Float32 || dt == tensor.Float64) && haveAVX2 {
		p := j.ptrs[:]
		if len(srcs) > len(j.ptrs) {
			j.srcPtrs = make([]unsafe.Pointer, len(srcs))
			p = j.srcPtrs
		}
		for i, s := range srcs {
			p[i] = unsafe.Pointer(unsafe.SliceData(s))
		}
	}
	return j
}

// parallelPool recycles parallelJobs, leaving the go statement's closure
// as the only allocation of a parallel call.
var parallelPool sync.Pool

// parallelJob is a job shared by several worker goroutines.
type parallelJob struct {
	job job
	wg  sync.WaitGroup
}

// srcBase returns &srcs[0]'s base address slot for the assembly loops.
func (j *job) srcBase() *unsafe.Pointer {
	if j.srcPtrs != nil {
		return &j.srcPtrs[0]
	}
	return &j.ptrs[0]
}

// runPart is run on a worker goroutine.
func (p *parallelJob) runPart(lo, hi int) {
	defer p.wg.Done()
	p.job.run(lo, hi)
}

// run reduces elements [lo, hi) chunk by chunk.
//
// Chunking is what makes in-place reduction safe. Within a chunk, every
// loop reads all sources of an element (or of a 128-byte vector block, in
// the assembly) before it writes that element of any dst, and a chunk writes
// only its own elements. Because a dst is either the very same buffer as a
// src or disjoint from all of them, a write can only clobber source elements
// that have already been consumed. Chunks of ChunkBytes per buffer keep the
// chunk's data in L1/L2 while the scalar loops make their several passes
// over it (fold source after source, scale, narrow, copy to the other dsts),
// so memory is streamed about once per buffer.
func (j *job) run(lo, hi int) {
	switch j.dt {
	case tensor.Float32:
		runFloat[float32](j, lo, hi)
	case tensor.Float64:
		runFloat[float64](j, lo, hi)
	case tensor.Float16:
		runHalf(j, lo, hi)
	case tensor.BFloat16:
		runHalf(j, lo, hi)
	case tensor.Uint8:
		runGeneric[uint8](j, lo, hi, false)
	case tensor.Int8:
		runGeneric[int8](j, lo, hi, false)
	case tensor.Uint16:
		runGeneric[uint16](j, lo, hi, false)
	case tensor.Int16:
		runGeneric[int16](j, lo, hi, false)
	case tensor.Int32:
		runGeneric[int32](j, lo, hi, false)
	case tensor.Int64:
		runGeneric[int64](j, lo, hi, false)
	case tensor.Bool:
		runBool(j, lo, hi)
	}
}

// view returns elements [lo, hi) of b as a []T.
func view[T any](b []byte, lo, hi int) []T {
	var z T
	sz := int(unsafe.Sizeof(z))
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b[lo*sz:]))), hi-lo)
}

// scratch buffers for accumulators that cannot live in dsts[0]; pooled so a
// steady stream of calls does not allocate.
var scratchPool sync.Pool

type scratch struct{ buf []uint64 }

// getScratch returns a scratch buffer of at least n bytes, 8-byte aligned.
func getScratch(n int) *scratch {
	s, _ := scratchPool.Get().(*scratch)
	if s == nil {
		s = new(scratch)
	}
	if len(s.buf)*8 < n {
		s.buf = make([]uint64, (n+7)/8)
	}
	return s
}

func (s *scratch) bytes() []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s.buf))), len(s.buf)*8)
}
