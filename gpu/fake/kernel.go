package fake

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"regexp"
	"sync/atomic"

	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/kernels"
	"github.com/hvdd/hvdd/reduce"
	"github.com/hvdd/hvdd/tensor"
)

// module is a loaded PTX image: the names of its entries.
type module struct {
	ctx      *devCtx
	entries  map[string]bool
	unloaded atomic.Bool
}

var entryRE = regexp.MustCompile(`\.entry\s+([A-Za-z_$][A-Za-z0-9_$]*)\s*\(`)

func (d *device) LoadModule(image []byte) (gpu.Module, error) {
	const call = "cuModuleLoadData"
	c, err := d.enter(call)
	if err != nil {
		return nil, err
	}
	image, _, _ = bytes.Cut(image, []byte{0})
	if !bytes.Contains(image, []byte(".version")) || !bytes.Contains(image, []byte(".target")) {
		return nil, newErr(call, errInvalidImage, "image of %d bytes is not PTX (no .version and .target)", len(image))
	}
	m := &module{ctx: c, entries: map[string]bool{}}
	for _, sm := range entryRE.FindAllSubmatch(image, -1) {
		m.entries[string(sm[1])] = true
	}
	return m, nil
}

func (m *module) Function(name string) (gpu.Function, error) {
	const call = "cuModuleGetFunction"
	if err := check(call); err != nil {
		return nil, err
	}
	if m.unloaded.Load() {
		return nil, newErr(call, errInvalidHandle, "module unloaded")
	}
	if err := m.ctx.err(call); err != nil {
		return nil, err
	}
	k, ok := kernels.Lookup(name)
	if !m.entries[name] {
		return nil, newErr(call, errNotFound, "no entry %q in the module", name)
	}
	if !ok {
		return nil, newErr(call, errNotFound, "entry %q has no Go implementation in the fake (not in gpu/kernels' Catalog)", name)
	}
	return &function{m: m, k: k}, nil
}

func (m *module) Unload() error {
	const call = "cuModuleUnload"
	if err := check(call); err != nil {
		return err
	}
	if m.unloaded.Swap(true) {
		return newErr(call, errInvalidHandle, "module unloaded twice")
	}
	return nil
}

// function is one kernel of a module, run in Go.
type function struct {
	m *module
	k kernels.Kernel
}

func (f *function) Launch(s gpu.Stream, grid, block int, args ...any) error {
	const call = "cuLaunchKernel"
	if err := check(call); err != nil {
		return err
	}
	if f.m.unloaded.Load() {
		return newErr(call, errInvalidHandle, "module unloaded")
	}
	c := f.m.ctx
	if err := c.err(call); err != nil {
		return err
	}
	fs, err := asStream(call, c, s)
	if err != nil {
		return err
	}
	if grid < 1 || block < 1 || block > 1024 {
		return newErr(call, errInvalidValue, "%s: grid %d x block %d", f.k.Name, grid, block)
	}
	if len(args) != len(f.k.Params) {
		return newErr(call, errInvalidValue, "%s takes %d parameters, %d given", f.k.Name, len(f.k.Params), len(args))
	}
	// The arguments by type, in parameter order.
	var ptrs []gpu.DevicePtr
	var u64s []uint64
	var f64s []float64
	for i, p := range f.k.Params {
		switch p {
		case kernels.Ptr:
			v, ok := args[i].(gpu.DevicePtr)
			if !ok {
				return newErr(call, errInvalidValue, "%s parameter %d: %T given, a gpu.DevicePtr expected", f.k.Name, i, args[i])
			}
			ptrs = append(ptrs, v)
		case kernels.U64:
			switch v := args[i].(type) {
			case uint64:
				u64s = append(u64s, v)
			case int64:
				if v < 0 {
					return newErr(call, errInvalidValue, "%s parameter %d: negative count %d", f.k.Name, i, v)
				}
				u64s = append(u64s, uint64(v))
			default:
				return newErr(call, errInvalidValue, "%s parameter %d: %T given, a uint64 or int64 expected", f.k.Name, i, args[i])
			}
		case kernels.F64:
			v, ok := args[i].(float64)
			if !ok {
				return newErr(call, errInvalidValue, "%s parameter %d: %T given, a float64 expected", f.k.Name, i, args[i])
			}
			f64s = append(f64s, v)
		}
	}
	if f.k.Kind == kernels.Combine {
		return f.launchCombine(fs, ptrs[0], u64s[0], u64s[1], u64s[2], f64s[0], f64s[1])
	}
	n := u64s[0]
	var factor float64
	if len(f64s) > 0 {
		factor = f64s[0]
	}
	if n > 1<<40 {
		return newErr(call, errInvalidValue, "%s: count %d", f.k.Name, n)
	}
	k := f.k
	// The sizes of the spans each pointer covers, in parameter order.
	var sizes []int
	switch k.Kind {
	case kernels.Reduce, kernels.Scale:
		sizes = []int{int(n) * k.DType.Size(), int(n) * k.DType.Size()}
	case kernels.Convert:
		sizes = []int{int(n) * k.To.Size(), int(n) * k.DType.Size()}
	}
	var spans []span
	done := func() {
		for _, sp := range spans {
			sp.release()
		}
	}
	for i, p := range ptrs {
		sp, err := hold(call, p, sizes[i])
		if err != nil {
			done()
			return newErr(call, errInvalidValue, "%s parameter %d: %s", k.Name, i, err.(*gpu.Error).Desc)
		}
		spans = append(spans, sp)
	}
	run := func(<-chan struct{}) error {
		if n == 0 {
			return nil
		}
		var err error
		switch k.Kind {
		case kernels.Reduce:
			dst := spans[0].bytes
			err = reduce.Reduce([][]byte{dst}, [][]byte{dst, spans[1].bytes}, k.DType, k.Op, 1, 1, nil)
		case kernels.Scale:
			err = reduce.Scale(spans[0].bytes, k.DType, factor)
		case kernels.Convert:
			if k.To == tensor.Float32 {
				err = reduce.Widen(spans[0].bytes, spans[1].bytes, k.DType)
			} else {
				_, err = reduce.Narrow(spans[0].bytes, spans[1].bytes, k.To)
			}
		}
		if err != nil {
			return newErr(call, 719, "%s: %v", k.Name, err) // CUDA_ERROR_LAUNCH_FAILED
		}
		return nil
	}
	return fs.enqueue(work{call: call, run: run, done: done})
}

// maxTableWords bounds a combine table (nseg*(1+nin+nout) words), and with
// it each of nseg, nin and nout, so that no size computed from them
// overflows.
const maxTableWords = 1 << 36

// launchCombine enqueues combine_<op>_<dtype>(table, nseg, nin, nout, pre,
// post). The table is device memory that earlier work on the stream
// typically writes (a CopyHtoD just before the launch), so only the table's
// span is resolved and held at launch; its words are read, and the spans
// of the pointers in them resolved and held, when the kernel runs, as a
// GPU reads them. A pointer whose span is not device memory then (never
// was, or was freed after the launch: unlike the other kernels' buffers,
// these are not held from the launch on) fails the kernel with
// CUDA_ERROR_ILLEGAL_ADDRESS, the context's sticky error, as a GPU's fault
// would.
func (f *function) launchCombine(fs *stream, table gpu.DevicePtr, nseg, nin, nout uint64, pre, post float64) error {
	const call = "cuLaunchKernel"
	k := f.k
	if nin < 1 || nout < 1 {
		return newErr(call, errInvalidValue, "%s: %d inputs and %d outputs, at least 1 of each expected", k.Name, nin, nout)
	}
	if nin > maxTableWords || nout > maxTableWords || nseg > maxTableWords/(1+nin+nout) {
		return newErr(call, errInvalidValue, "%s: a table of %d segments of %d inputs and %d outputs", k.Name, nseg, nin, nout)
	}
	words := int(1 + nin + nout)
	tab, err := hold(call, table, int(nseg)*words*8)
	if err != nil {
		return newErr(call, errInvalidValue, "%s table: %s", k.Name, err.(*gpu.Error).Desc)
	}
	run := func(<-chan struct{}) error {
		seg := make([]uint64, words)
		for s := range int(nseg) {
			for w := range seg {
				seg[w] = binary.LittleEndian.Uint64(tab.bytes[(s*words+w)*8:])
			}
			where := fmt.Sprintf("%s segment %d of %d", k.Name, s, nseg)
			if err := combineSegment(where, k, seg[0], seg[1:1+nin], seg[1+nin:], pre, post); err != nil {
				return err
			}
		}
		return nil
	}
	return fs.enqueue(work{call: call, run: run, done: tab.release})
}

// combineSegment computes one segment of a combine (where names it in
// errors) as the daemon's former sequence of kernels did: a scaled copy of
// in[0], each further input scaled (in scratch) and reduced into it in
// order, the result scaled by post and copied to every output. Every input
// is read before any output is written, so an output may be an input (in
// place).
func combineSegment(where string, k kernels.Kernel, count uint64, in, out []uint64, pre, post float64) error {
	const call = "cuLaunchKernel"
	const illegalAddress, launchFailed = 700, 719 // CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_LAUNCH_FAILED
	if count > 1<<40 {
		return newErr(call, illegalAddress, "%s: count %d runs past any buffer", where, count)
	}
	if count == 0 {
		return nil
	}
	n := int(count) * k.DType.Size()
	var spans []span
	defer func() {
		for _, sp := range spans {
			sp.release()
		}
	}()
	bufs := func(what string, ptrs []uint64) ([][]byte, error) {
		var bs [][]byte
		for j, p := range ptrs {
			sp, err := hold(call, gpu.DevicePtr(p), n)
			if err != nil {
				return nil, newErr(call, illegalAddress, "%s: %s %d: %s", where, what, j, err.(*gpu.Error).Desc)
			}
			spans = append(spans, sp)
			bs = append(bs, sp.bytes)
		}
		return bs, nil
	}
	ins, err := bufs("input", in)
	if err != nil {
		return err
	}
	outs, err := bufs("output", out)
	if err != nil {
		return err
	}
	acc := append([]byte(nil), ins[0]...)
	err = reduce.Scale(acc, k.DType, pre)
	var tmp []byte
	for _, b := range ins[1:] {
		if err != nil {
			break
		}
		src := b
		if pre != 1 {
			tmp = append(tmp[:0], b...)
			if err = reduce.Scale(tmp, k.DType, pre); err != nil {
				break
			}
			src = tmp
		}
		// Two sources: reduce rounds float16 and bfloat16 once per call,
		// so after every step here, as the separate kernels did.
		err = reduce.Reduce([][]byte{acc}, [][]byte{acc, src}, k.DType, k.Op, 1, 1, nil)
	}
	if err == nil {
		err = reduce.Scale(acc, k.DType, post)
	}
	if err != nil {
		return newErr(call, launchFailed, "%s: %v", where, err)
	}
	for _, b := range outs {
		copy(b, acc)
	}
	return nil
}
