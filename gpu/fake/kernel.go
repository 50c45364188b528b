package fake

import (
	"bytes"
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
	var ptrs []gpu.DevicePtr
	var n uint64
	var factor float64
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
				n = v
			case int64:
				if v < 0 {
					return newErr(call, errInvalidValue, "%s parameter %d: negative count %d", f.k.Name, i, v)
				}
				n = uint64(v)
			default:
				return newErr(call, errInvalidValue, "%s parameter %d: %T given, a uint64 or int64 expected", f.k.Name, i, args[i])
			}
		case kernels.F64:
			v, ok := args[i].(float64)
			if !ok {
				return newErr(call, errInvalidValue, "%s parameter %d: %T given, a float64 expected", f.k.Name, i, args[i])
			}
			factor = v
		}
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
