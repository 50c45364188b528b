// Package gputest is the conformance suite of the gpu seam: Run checks that
// a gpu.Driver and gpu.NCCL behave as gpu's doc comments (CUDA's and NCCL's
// semantics) say, for every method: allocation, copies and memset checked
// byte by byte, stream order, events across streams, IPC memory and event
// handles opened by another process, error cases, the kernels of
// gpu/kernels on every dtype against package reduce, and NCCL's collectives
// within a process and across two. gpu/fake's tests run it always,
// gpu/cuda's where a GPU is present.
//
// The cross-process tests re-execute the test binary as a child that the
// suite drives over its stdin and stdout; a package that calls Run must
// route its TestMain through Main.
package gputest

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/kernels"
	"github.com/hvdd/hvdd/reduce"
	"github.com/hvdd/hvdd/tensor"
)

// Run runs the suite on d and n. n may be nil (no NCCL): its tests skip.
// The NCCL tests within a process need two devices for two ranks (one rank
// per device, as NCCL requires) and skip on fewer.
func Run(t *testing.T, d gpu.Driver, n gpu.NCCL) {
	t.Run("Devices", func(t *testing.T) { testDevices(t, d) })
	t.Run("AllocFree", func(t *testing.T) { testAllocFree(t, d) })
	t.Run("Copies", func(t *testing.T) { testCopies(t, d) })
	t.Run("StreamOrder", func(t *testing.T) { testStreamOrder(t, d) })
	t.Run("Events", func(t *testing.T) { testEvents(t, d) })
	t.Run("IPC", func(t *testing.T) { testIPC(t, d) })
	t.Run("Errors", func(t *testing.T) { testErrors(t, d) })
	t.Run("Kernels", func(t *testing.T) { testKernels(t, d) })
	t.Run("NCCL", func(t *testing.T) {
		if n == nil {
			t.Skip("no NCCL library")
		}
		t.Run("InitAll", func(t *testing.T) { testNCCLInitAll(t, d, n) })
		t.Run("Processes", func(t *testing.T) { testNCCLProcesses(t, d, n) })
		t.Run("Abort", func(t *testing.T) { testNCCLAbort(t, d, n) })
	})
}

func ok(t *testing.T, err error, what string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(what, args...), err)
	}
}

// isGPUError checks that err is a *gpu.Error.
func isGPUError(t *testing.T, err error, what string) {
	t.Helper()
	var ge *gpu.Error
	if err == nil {
		t.Errorf("%s: no error", what)
	} else if !errors.As(err, &ge) {
		t.Errorf("%s: error %v (%T) is not a *gpu.Error", what, err, err)
	}
}

// open opens device i with a stream, closed at the end of the test.
func open(t *testing.T, d gpu.Driver, i int) (gpu.Device, gpu.Stream) {
	t.Helper()
	dev, err := d.Open(i)
	ok(t, err, "Open(%d)", i)
	s, err := dev.NewStream()
	ok(t, err, "NewStream")
	t.Cleanup(func() {
		s.Destroy()
		if err := dev.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return dev, s
}

func alloc(t *testing.T, dev gpu.Device, n int) gpu.DevicePtr {
	t.Helper()
	p, err := dev.Alloc(n)
	ok(t, err, "Alloc(%d)", n)
	t.Cleanup(func() { dev.Free(p) })
	return p
}

func syncStream(t *testing.T, s gpu.Stream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ok(t, s.Synchronize(ctx), "Synchronize")
}

// read copies n bytes at p to the host (synchronising s).
func read(t *testing.T, dev gpu.Device, s gpu.Stream, p gpu.DevicePtr, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	ok(t, dev.CopyDtoH(s, b, p), "CopyDtoH")
	syncStream(t, s)
	return b
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func diff(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d bytes, want %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: byte %d is %#02x, want %#02x (%d bytes differ in all)", what, i, got[i], want[i], countDiff(got, want))
		}
	}
}

func countDiff(a, b []byte) int {
	n := 0
	for i := range a {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}

func testDevices(t *testing.T, d gpu.Driver) {
	v, err := d.Version()
	ok(t, err, "Version")
	if v < 1000 {
		t.Errorf("Version = %d", v)
	}
	infos, err := d.Devices()
	ok(t, err, "Devices")
	if len(infos) == 0 {
		t.Fatal("no devices")
	}
	seen := map[string]bool{}
	for i, in := range infos {
		if in.Index != i || in.UUID == "" || in.Name == "" || in.PCIBusID == "" || in.MemoryBytes == 0 || in.ComputeCapability < 30 {
			t.Errorf("device %d: incomplete %+v", i, in)
		}
		if len(in.UUID) < 4 || in.UUID[:4] != "GPU-" || seen[in.UUID] {
			t.Errorf("device %d: UUID %q (not GPU-..., or a duplicate)", i, in.UUID)
		}
		seen[in.UUID] = true
	}
	dev, _ := open(t, d, 0)
	if got := dev.Info(); got != infos[0] {
		t.Errorf("Info() = %+v, Devices()[0] = %+v", got, infos[0])
	}
	// Two Opens of one index share the context: memory of one is usable
	// through the other.
	dev2, s2 := open(t, d, 0)
	p := alloc(t, dev, 64)
	ok(t, dev2.Memset8(s2, p, 7, 64), "Memset8 through the second Device")
	diff(t, "memory shared by two Opens", read(t, dev2, s2, p, 64), bytes.Repeat([]byte{7}, 64))
	if _, err := d.Open(len(infos)); err == nil {
		t.Errorf("Open(%d) of %d devices succeeded", len(infos), len(infos))
	}
}

func testAllocFree(t *testing.T, d gpu.Driver) {
	dev, _ := open(t, d, 0)
	type blk struct {
		p gpu.DevicePtr
		n int
	}
	var blks []blk
	for _, n := range []int{1, 255, 256, 4096, 1 << 20, 3<<20 + 5} {
		p, err := dev.Alloc(n)
		ok(t, err, "Alloc(%d)", n)
		if p == 0 || p%256 != 0 {
			t.Errorf("Alloc(%d) = %#x: not 256-byte aligned", n, uint64(p))
		}
		for _, b := range blks {
			if p < b.p+gpu.DevicePtr(b.n) && b.p < p+gpu.DevicePtr(n) {
				t.Errorf("Alloc(%d) = %#x overlaps [%#x, +%d)", n, uint64(p), uint64(b.p), b.n)
			}
		}
		blks = append(blks, blk{p, n})
	}
	for _, b := range blks {
		ok(t, dev.Free(b.p), "Free(%#x)", uint64(b.p))
	}
	if err := dev.Free(blks[0].p); err == nil {
		t.Error("Free of a freed pointer succeeded")
	}
	if _, err := dev.Alloc(0); err == nil {
		t.Error("Alloc(0) succeeded")
	}
	p := alloc(t, dev, 4096)
	if err := dev.Free(p.Add(256)); err == nil {
		t.Error("Free of a pointer inside an allocation succeeded")
	}
}

func testCopies(t *testing.T, d gpu.Driver) {
	dev, s := open(t, d, 0)
	r := rand.New(rand.NewPCG(1, 2))
	const n = 1<<16 + 37
	a, b := alloc(t, dev, n), alloc(t, dev, n)
	data := randBytes(r, n)
	ok(t, dev.CopyHtoD(s, a, data), "CopyHtoD")
	diff(t, "HtoD then DtoH", read(t, dev, s, a, n), data)

	// b: 0xEE everywhere, then a's [100, 100+m) copied to b's [1000, ...),
	// then bytes [5000, 5010) set to 0x42: every byte checked.
	ok(t, dev.Memset8(s, b, 0xee, n), "Memset8")
	const m = 30000
	ok(t, dev.CopyDtoD(s, b.Add(1000), a.Add(100), m), "CopyDtoD")
	ok(t, dev.Memset8(s, b.Add(5000), 0x42, 10), "Memset8")
	want := bytes.Repeat([]byte{0xee}, n)
	copy(want[1000:], data[100:100+m])
	copy(want[5000:5010], bytes.Repeat([]byte{0x42}, 10))
	diff(t, "DtoD and memset at offsets", read(t, dev, s, b, n), want)

	// Host to device at an offset, device to host from an offset.
	small := randBytes(r, 77)
	ok(t, dev.CopyHtoD(s, a.Add(n-77), small), "CopyHtoD at the end")
	diff(t, "DtoH of the last bytes", read(t, dev, s, a.Add(n-77), 77), small)
	// Zero-byte copies are allowed.
	ok(t, dev.CopyHtoD(s, a, nil), "CopyHtoD of 0 bytes")
	ok(t, dev.CopyDtoD(s, b, a, 0), "CopyDtoD of 0 bytes")
	syncStream(t, s)
}

func testStreamOrder(t *testing.T, d gpu.Driver) {
	dev, s := open(t, d, 0)
	r := rand.New(rand.NewPCG(3, 4))
	const n = 4096
	bufs := []gpu.DevicePtr{alloc(t, dev, n), alloc(t, dev, n), alloc(t, dev, n)}
	host := make([][]byte, len(bufs))
	for i := range host {
		host[i] = make([]byte, n)
		ok(t, dev.Memset8(s, bufs[i], 0, n), "Memset8")
	}
	// 200 random operations queued without a synchronisation in between;
	// the host model applies them in order. Each HtoD source stays
	// untouched until the end.
	for k := 0; k < 200; k++ {
		i, j := r.IntN(3), r.IntN(3)
		off, cnt := r.IntN(n/2), 1+r.IntN(n/2)
		switch r.IntN(3) {
		case 0:
			src := randBytes(r, cnt)
			ok(t, dev.CopyHtoD(s, bufs[i].Add(off), src), "CopyHtoD")
			copy(host[i][off:], src)
		case 1:
			if i == j {
				j = (i + 1) % 3
			}
			off2 := r.IntN(n / 2)
			ok(t, dev.CopyDtoD(s, bufs[i].Add(off), bufs[j].Add(off2), cnt), "CopyDtoD")
			copy(host[i][off:off+cnt], host[j][off2:off2+cnt])
		case 2:
			v := byte(r.Uint32())
			ok(t, dev.Memset8(s, bufs[i].Add(off), v, cnt), "Memset8")
			for x := off; x < off+cnt; x++ {
				host[i][x] = v
			}
		}
	}
	outs := make([][]byte, 3)
	for i := range bufs {
		outs[i] = make([]byte, n)
		ok(t, dev.CopyDtoH(s, outs[i], bufs[i]), "CopyDtoH")
	}
	syncStream(t, s)
	for i := range bufs {
		diff(t, fmt.Sprintf("buffer %d after 200 queued operations", i), outs[i], host[i])
	}
}

func testEvents(t *testing.T, d gpu.Driver) {
	dev, s1 := open(t, d, 0)
	s2, err := dev.NewStream()
	ok(t, err, "NewStream")
	defer s2.Destroy()
	e, err := dev.NewEvent(false)
	ok(t, err, "NewEvent")
	defer e.Destroy()
	done, err := e.Query()
	ok(t, err, "Query")
	if !done {
		t.Error("Query of an event never recorded: not complete")
	}
	const n = 1 << 20
	r := rand.New(rand.NewPCG(5, 6))
	a, b := alloc(t, dev, n), alloc(t, dev, n)
	for round := 0; round < 10; round++ {
		// s1 writes a; s2 copies a to b after e, then reads b.
		// (In pieces: s1 has more to do than s2, so s2 overtakes it unless
		// WaitEvent holds it back.)
		data := randBytes(r, n)
		for off := 0; off < n; off += n / 16 {
			ok(t, dev.CopyHtoD(s1, a.Add(off), data[off:off+n/16]), "CopyHtoD")
		}
		ok(t, e.Record(s1), "Record")
		ok(t, s2.WaitEvent(e), "WaitEvent")
		ok(t, dev.CopyDtoD(s2, b, a, n), "CopyDtoD")
		got := make([]byte, n)
		ok(t, dev.CopyDtoH(s2, got, b), "CopyDtoH")
		syncStream(t, s2)
		diff(t, fmt.Sprintf("round %d: data read on s2 after WaitEvent", round), got, data)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		ok(t, e.Synchronize(ctx), "Event.Synchronize")
		cancel()
		done, err := e.Query()
		ok(t, err, "Query")
		if !done {
			t.Fatalf("round %d: Query after Synchronize: not complete", round)
		}
	}
	// A Synchronize that cannot finish in time returns ctx's error: s1 waits
	// for an event of s2, which waits for one recorded on s1 after that
	// wait (so never, until it is recorded) — not possible in CUDA's
	// model; instead check an expired ctx on pending work does not hang.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s1.Synchronize(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Synchronize with a cancelled ctx: %v", err)
	}
	syncStream(t, s1)
}

func testIPC(t *testing.T, d gpu.Driver) {
	dev, s := open(t, d, 0)
	r := rand.New(rand.NewPCG(7, 8))
	const n = 3<<20 + 100
	p := alloc(t, dev, n)
	h, err := dev.IpcMemHandle(p)
	ok(t, err, "IpcMemHandle")
	ev, err := dev.NewEvent(true)
	ok(t, err, "NewEvent(interprocess)")
	defer ev.Destroy()
	eh, err := ev.IpcHandle()
	ok(t, err, "Event.IpcHandle")

	c := startChild(t)
	childEv := c.do("dev 0")
	c.do("open %s %d", hex.EncodeToString(h[:]), n)
	c.do("evopen %s", hex.EncodeToString(eh[:]))
	var ceh gpu.IpcEventHandle
	copy(ceh[:], childEv)
	cev, err := dev.OpenEventHandle(ceh)
	ok(t, err, "OpenEventHandle of the child's event")
	defer cev.Destroy()

	for round := 0; round < 5; round++ {
		// Parent writes, records its event, does not synchronise; the child
		// waits for the event and reads.
		data := randBytes(r, n)
		ok(t, dev.CopyHtoD(s, p, data), "CopyHtoD")
		ok(t, ev.Record(s), "Record")
		got := c.do("read 0 %d", n)
		diff(t, fmt.Sprintf("round %d: the child's view of the parent's writes", round), got, data)

		// The child writes at an offset and records its event without
		// synchronising; the parent waits for that event and reads.
		patch := randBytes(r, 4096)
		off := r.IntN(n - len(patch))
		c.do("write %d %s", off, hex.EncodeToString(patch))
		ok(t, s.WaitEvent(cev), "WaitEvent on the child's event")
		copy(data[off:], patch)
		diff(t, fmt.Sprintf("round %d: the parent's view of the child's writes", round), read(t, dev, s, p, n), data)
	}
	c.do("close")
	c.do("exit")
}

func testErrors(t *testing.T, d gpu.Driver) {
	dev, s := open(t, d, 0)
	p := alloc(t, dev, 4096)
	var zero gpu.IpcMemHandle
	_, err := dev.OpenMemHandle(zero, 4096)
	isGPUError(t, err, "OpenMemHandle of a zero handle")
	garbage := zero
	for i := range garbage {
		garbage[i] = byte(i*7 + 1)
	}
	_, err = dev.OpenMemHandle(garbage, 4096)
	isGPUError(t, err, "OpenMemHandle of a garbage handle")
	_, err = dev.OpenEventHandle(gpu.IpcEventHandle{})
	isGPUError(t, err, "OpenEventHandle of a zero handle")
	if d.Name() == "fake" {
		// CUDA checks no bounds within its allocation granularity, and a
		// wild address may fault only when the copy runs, which breaks
		// the context for every later test: the fake alone is held to it.
		isGPUError(t, dev.CopyHtoD(s, p.Add(4000), make([]byte, 200)), "CopyHtoD past the end")
		isGPUError(t, dev.CopyDtoD(s, p, p.Add(1<<40), 16), "CopyDtoD from an unmapped address")
	}
	e, err := dev.NewEvent(false)
	ok(t, err, "NewEvent")
	_, err = e.IpcHandle()
	isGPUError(t, err, "IpcHandle of an event made without interprocess")
	ok(t, e.Destroy(), "Event.Destroy")
	m, err := dev.LoadModule(kernels.PTX())
	ok(t, err, "LoadModule")
	defer m.Unload()
	_, err = m.Function("no_such_kernel")
	isGPUError(t, err, "Function of an unknown name")
	_, err = dev.LoadModule([]byte("not ptx\x00"))
	isGPUError(t, err, "LoadModule of garbage")
	// The device still works after all that.
	ok(t, dev.Memset8(s, p, 1, 16), "Memset8 after errors")
	diff(t, "memset after errors", read(t, dev, s, p, 16), bytes.Repeat([]byte{1}, 16))
}

// fillFloats writes random values of dt into b: mostly small and exact,
// some arbitrary bit patterns (NaNs, infinities, subnormals, zeros of both
// signs).
func fillFloats(r *rand.Rand, b []byte, dt tensor.DType) {
	sz := dt.Size()
	for i := 0; i+sz <= len(b); i += sz {
		special := r.IntN(8) == 0
		switch dt {
		case tensor.Float32:
			v := math.Float32bits(float32(r.NormFloat64() * 100))
			if special {
				v = r.Uint32()
			}
			binary.LittleEndian.PutUint32(b[i:], v)
		case tensor.Float64:
			v := math.Float64bits(r.NormFloat64() * 1e6)
			if special {
				v = r.Uint64()
			}
			binary.LittleEndian.PutUint64(b[i:], v)
		case tensor.Float16, tensor.BFloat16:
			f := float32(r.NormFloat64() * 10)
			v := reduce.Float32ToFloat16(f)
			if dt == tensor.BFloat16 {
				v = reduce.Float32ToBFloat16(f)
			}
			if special {
				v = uint16(r.Uint32())
			}
			binary.LittleEndian.PutUint16(b[i:], v)
		}
	}
}

// sameValues compares element by element, NaN equal to any NaN for float
// types (payloads of computed NaNs are the hardware's business).
func sameValues(dt tensor.DType, got, want []byte) (int, bool) {
	sz := dt.Size()
	for i := 0; i+sz <= len(got); i += sz {
		if bytes.Equal(got[i:i+sz], want[i:i+sz]) {
			continue
		}
		if isNaN(dt, got[i:]) && isNaN(dt, want[i:]) {
			continue
		}
		return i / sz, false
	}
	return 0, true
}

func isNaN(dt tensor.DType, b []byte) bool {
	switch dt {
	case tensor.Float32:
		return math.IsNaN(float64(math.Float32frombits(binary.LittleEndian.Uint32(b))))
	case tensor.Float64:
		return math.IsNaN(math.Float64frombits(binary.LittleEndian.Uint64(b)))
	case tensor.Float16:
		v := binary.LittleEndian.Uint16(b)
		return v&0x7c00 == 0x7c00 && v&0x3ff != 0
	case tensor.BFloat16:
		v := binary.LittleEndian.Uint16(b)
		return v&0x7f80 == 0x7f80 && v&0x7f != 0
	}
	return false
}

func testKernels(t *testing.T, d gpu.Driver) {
	dev, s := open(t, d, 0)
	m, err := dev.LoadModule(kernels.PTX())
	ok(t, err, "LoadModule")
	defer func() { ok(t, m.Unload(), "Unload") }()
	r := rand.New(rand.NewPCG(9, 10))
	for _, k := range kernels.Catalog() {
		t.Run(k.Name, func(t *testing.T) {
			fn, err := m.Function(k.Name)
			ok(t, err, "Function")
			// n = 1 with one thread; n = 1000 with a grid far smaller than
			// n (the grid-stride loop must cover the rest); n = 70001 with
			// Grid's launch.
			for _, c := range []struct{ n, grid, block int }{{1, 1, 1}, {1000, 2, 32}, {70001, kernels.Grid(70001), kernels.BlockSize}} {
				if k.Kind == kernels.Combine {
					testCombine(t, dev, s, fn, k, r, c.n, c.grid, c.block)
					continue
				}
				n := c.n
				in := k.DType.Size() * n
				out := in
				if k.Kind == kernels.Convert {
					out = k.To.Size() * n
				}
				a, b := randBytes(r, out), randBytes(r, in)
				if k.DType.IsFloat() {
					fillFloats(r, b, k.DType)
					if k.Kind != kernels.Convert {
						fillFloats(r, a, k.DType)
					}
				}
				pa, pb := alloc(t, dev, out+64), alloc(t, dev, in+64)
				// A guard of 64 bytes past each buffer must stay untouched.
				ok(t, dev.Memset8(s, pa, 0x5a, out+64), "Memset8")
				ok(t, dev.CopyHtoD(s, pa, a), "CopyHtoD")
				ok(t, dev.CopyHtoD(s, pb, b), "CopyHtoD")
				want := append([]byte(nil), a...)
				var f float64
				switch k.Kind {
				case kernels.Reduce:
					ok(t, fn.Launch(s, c.grid, c.block, pa, pb, uint64(n)), "Launch")
					ok(t, reduce.Reduce([][]byte{want}, [][]byte{want, b}, k.DType, k.Op, 1, 1, nil), "reference")
				case kernels.Scale:
					f = []float64{0.37, -2.5, 1e10, 3, 1}[r.IntN(5)]
					ok(t, fn.Launch(s, c.grid, c.block, pa, uint64(n), f), "Launch")
					ok(t, reduce.Scale(want, k.DType, f), "reference")
				case kernels.Convert:
					ok(t, fn.Launch(s, c.grid, c.block, pa, pb, uint64(n)), "Launch")
					if k.To == tensor.Float32 {
						ok(t, reduce.Widen(want, b, k.DType), "reference")
					} else {
						_, err := reduce.Narrow(want, b, k.To)
						ok(t, err, "reference")
					}
				}
				got := read(t, dev, s, pa, out+64)
				dt := k.DType
				if k.Kind == kernels.Convert {
					dt = k.To
				}
				if i, same := sameValues(dt, got[:out], want); !same {
					sz := dt.Size()
					var src string
					if k.Kind != kernels.Scale {
						isz := k.DType.Size()
						src = fmt.Sprintf(" src %x", b[i*isz:(i+1)*isz])
					}
					t.Fatalf("n=%d grid=%d block=%d f=%v: element %d is %x, want %x (dst was %x%s)", n, c.grid, c.block, f, i,
						got[i*sz:(i+1)*sz], want[i*sz:(i+1)*sz], a[i*sz:(i+1)*sz], src)
				}
				diff(t, "guard bytes past the output", got[out:], bytes.Repeat([]byte{0x5a}, 64))
			}
		})
	}
	// Wrong arguments are refused at launch (both implementations check
	// the kernels of gpu/kernels against their signatures).
	fn, err := m.Function(kernels.Catalog()[0].Name)
	ok(t, err, "Function")
	p := alloc(t, dev, 64)
	if err := fn.Launch(s, 1, 1, p); err == nil {
		t.Error("Launch with too few arguments succeeded")
	}
	syncStream(t, s)
}

// ncclDTypes are the dtypes NCCL has.
var ncclDTypes = []tensor.DType{tensor.Uint8, tensor.Int8, tensor.Int32, tensor.Int64, tensor.Float16, tensor.BFloat16, tensor.Float32, tensor.Float64}

// smallInts fills count elements of dt with small integers (exact in every
// dtype, so any reduction order gives the same result) derived from seed.
func smallInts(dt tensor.DType, count, seed int) []byte {
	b := make([]byte, count*dt.Size())
	for i := 0; i < count; i++ {
		v := (i*7+seed*13)%9 + 1 // 1..9: sums and products of 2 stay small
		x := b[i*dt.Size():]
		switch dt {
		case tensor.Uint8, tensor.Int8, tensor.Bool:
			x[0] = byte(v)
		case tensor.Uint16, tensor.Int16:
			binary.LittleEndian.PutUint16(x, uint16(v))
		case tensor.Int32:
			binary.LittleEndian.PutUint32(x, uint32(v))
		case tensor.Int64:
			binary.LittleEndian.PutUint64(x, uint64(v))
		case tensor.Float16:
			binary.LittleEndian.PutUint16(x, reduce.Float32ToFloat16(float32(v)))
		case tensor.BFloat16:
			binary.LittleEndian.PutUint16(x, reduce.Float32ToBFloat16(float32(v)))
		case tensor.Float32:
			binary.LittleEndian.PutUint32(x, math.Float32bits(float32(v)))
		case tensor.Float64:
			binary.LittleEndian.PutUint64(x, math.Float64bits(float64(v)))
		}
	}
	return b
}

// refReduce is the expected reduction of srcs with op (Average: Sum then
// 1/len(srcs)).
func refReduce(t *testing.T, srcs [][]byte, dt tensor.DType, op tensor.ReduceOp) []byte {
	t.Helper()
	out := make([]byte, len(srcs[0]))
	post := 1.0
	if op == tensor.Average {
		op, post = tensor.Sum, 1/float64(len(srcs))
	}
	ok(t, reduce.Reduce([][]byte{out}, srcs, dt, op, 1, post, nil), "reference")
	return out
}

// ranks is a communicator of this process under test: its comms, devices
// and streams.
type ranks struct {
	comms []gpu.Comm
	devs  []gpu.Device
	ss    []gpu.Stream
}

func initAll(t *testing.T, d gpu.Driver, n gpu.NCCL, k int) *ranks {
	t.Helper()
	infos, err := d.Devices()
	ok(t, err, "Devices")
	if len(infos) < k {
		t.Skipf("%d devices, %d needed (one NCCL rank per GPU)", len(infos), k)
	}
	rs := &ranks{}
	for i := 0; i < k; i++ {
		dev, s := open(t, d, i)
		rs.devs, rs.ss = append(rs.devs, dev), append(rs.ss, s)
	}
	rs.comms, err = n.CommInitAll(rs.devs)
	ok(t, err, "CommInitAll")
	t.Cleanup(func() {
		for _, c := range rs.comms {
			c.Destroy()
		}
	})
	return rs
}

// run issues f for every rank in one group and synchronises every stream.
func (rs *ranks) run(t *testing.T, n gpu.NCCL, f func(r int) error) {
	t.Helper()
	ok(t, n.GroupStart(), "GroupStart")
	var errs []error
	for r := range rs.comms {
		errs = append(errs, f(r))
	}
	ok(t, n.GroupEnd(), "GroupEnd")
	ok(t, errors.Join(errs...), "collective")
	for r, s := range rs.ss {
		syncStream(t, s)
		ok(t, rs.comms[r].AsyncError(), "AsyncError of rank %d", r)
	}
}

func testNCCLInitAll(t *testing.T, d gpu.Driver, n gpu.NCCL) {
	v, err := n.Version()
	ok(t, err, "Version")
	if v < 20000 {
		t.Errorf("NCCL Version = %d", v)
	}
	const k = 2
	rs := initAll(t, d, n, k)
	for r, c := range rs.comms {
		if c.Rank() != r || c.Size() != k || c.Device().Info().Index != r {
			t.Fatalf("comm %d: rank %d of %d on device %d", r, c.Rank(), c.Size(), c.Device().Info().Index)
		}
	}
	const count = 1000
	// Per rank: a send buffer, a recv buffer of k*count elements.
	for _, dt := range ncclDTypes {
		sz := dt.Size()
		send := make([]gpu.DevicePtr, k)
		recv := make([]gpu.DevicePtr, k)
		srcs := make([][]byte, k)
		for r := 0; r < k; r++ {
			send[r] = alloc(t, rs.devs[r], k*count*sz)
			recv[r] = alloc(t, rs.devs[r], k*count*sz)
			srcs[r] = smallInts(dt, k*count, r)
			ok(t, rs.devs[r].CopyHtoD(rs.ss[r], send[r], srcs[r]), "CopyHtoD")
		}
		firsts := make([][]byte, k)
		for r := range firsts {
			firsts[r] = srcs[r][:count*sz]
		}
		for _, op := range []tensor.ReduceOp{tensor.Sum, tensor.Min, tensor.Max, tensor.Product, tensor.Average} {
			if op == tensor.Average && !dt.IsFloat() {
				continue // NCCL's integer average divides in integers; not compared
			}
			rs.run(t, n, func(r int) error { return rs.comms[r].Allreduce(rs.ss[r], send[r], recv[r], count, dt, op) })
			want := refReduce(t, firsts, dt, op)
			for r := 0; r < k; r++ {
				diff(t, fmt.Sprintf("Allreduce %v %v rank %d", dt, op, r), read(t, rs.devs[r], rs.ss[r], recv[r], count*sz), want)
			}
		}
		// ReduceScatter: rank r gets slice r of the sum of the full buffers.
		rs.run(t, n, func(r int) error {
			return rs.comms[r].ReduceScatter(rs.ss[r], send[r], recv[r], count, dt, tensor.Sum)
		})
		full := refReduce(t, srcs, dt, tensor.Sum)
		for r := 0; r < k; r++ {
			diff(t, fmt.Sprintf("ReduceScatter %v rank %d", dt, r), read(t, rs.devs[r], rs.ss[r], recv[r], count*sz), full[r*count*sz:(r+1)*count*sz])
		}
		// AllGather: the first count elements of every rank, rank order.
		rs.run(t, n, func(r int) error { return rs.comms[r].AllGather(rs.ss[r], send[r], recv[r], count, dt) })
		var gathered []byte
		for r := 0; r < k; r++ {
			gathered = append(gathered, firsts[r]...)
		}
		for r := 0; r < k; r++ {
			diff(t, fmt.Sprintf("AllGather %v rank %d", dt, r), read(t, rs.devs[r], rs.ss[r], recv[r], k*count*sz), gathered)
		}
		// Broadcast and Reduce from root 1.
		rs.run(t, n, func(r int) error { return rs.comms[r].Broadcast(rs.ss[r], send[r], recv[r], count, dt, 1) })
		for r := 0; r < k; r++ {
			diff(t, fmt.Sprintf("Broadcast %v rank %d", dt, r), read(t, rs.devs[r], rs.ss[r], recv[r], count*sz), firsts[1])
		}
		marker := bytes.Repeat([]byte{0xab}, count*sz)
		ok(t, rs.devs[0].CopyHtoD(rs.ss[0], recv[0], marker), "CopyHtoD")
		rs.run(t, n, func(r int) error {
			return rs.comms[r].Reduce(rs.ss[r], send[r], recv[r], count, dt, tensor.Max, 1)
		})
		diff(t, fmt.Sprintf("Reduce %v at root 1", dt), read(t, rs.devs[1], rs.ss[1], recv[1], count*sz), refReduce(t, firsts, dt, tensor.Max))
		diff(t, fmt.Sprintf("Reduce %v: rank 0's recv (not the root) untouched", dt), read(t, rs.devs[0], rs.ss[0], recv[0], count*sz), marker)
	}
	// Send and Recv in a group on one stream per rank, each to the other:
	// no deadlock, and the bytes cross.
	for _, dt := range []tensor.DType{tensor.Uint8, tensor.Float32} {
		bufs := make([]gpu.DevicePtr, k)
		datas := make([][]byte, k)
		for r := 0; r < k; r++ {
			bufs[r] = alloc(t, rs.devs[r], 2*count*dt.Size())
			datas[r] = smallInts(dt, count, 100+r)
			ok(t, rs.devs[r].CopyHtoD(rs.ss[r], bufs[r], datas[r]), "CopyHtoD")
		}
		rs.run(t, n, func(r int) error {
			peer := 1 - r
			err1 := rs.comms[r].Recv(rs.ss[r], bufs[r].Add(count*dt.Size()), count, dt, peer)
			err2 := rs.comms[r].Send(rs.ss[r], bufs[r], count, dt, peer)
			return errors.Join(err1, err2)
		})
		for r := 0; r < k; r++ {
			diff(t, fmt.Sprintf("Recv %v on rank %d", dt, r), read(t, rs.devs[r], rs.ss[r], bufs[r].Add(count*dt.Size()), count*dt.Size()), datas[1-r])
		}
	}
	// dtypes NCCL lacks are refused.
	p := alloc(t, rs.devs[0], 64)
	for _, dt := range []tensor.DType{tensor.Uint16, tensor.Int16, tensor.Bool} {
		if err := rs.comms[0].Allreduce(rs.ss[0], p, p, 4, dt, tensor.Sum); err == nil {
			t.Errorf("Allreduce of %v succeeded: NCCL has no such type", dt)
		}
	}
	if err := rs.comms[0].Allreduce(rs.ss[0], p, p, 4, tensor.Float32, tensor.Adasum); err == nil {
		t.Error("Allreduce with Adasum succeeded")
	}
}

func testNCCLProcesses(t *testing.T, d gpu.Driver, n gpu.NCCL) {
	infos, err := d.Devices()
	ok(t, err, "Devices")
	if len(infos) < 2 {
		t.Skipf("%d devices, 2 needed (one NCCL rank per GPU)", len(infos))
	}
	dev, s := open(t, d, 0)
	id, err := n.GetUniqueID()
	ok(t, err, "GetUniqueID")
	c := startChild(t)
	c.do("dev 1")
	c.send("nccl %s 2 1", hex.EncodeToString(id[:]))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	comm, err := n.CommInitRank(ctx, dev, 2, id, 0)
	ok(t, err, "CommInitRank(rank 0)")
	if _, err := c.answer(); err != nil {
		t.Fatalf("child CommInitRank: %v", err)
	}
	defer comm.Destroy()
	for _, dt := range []tensor.DType{tensor.Float32, tensor.Int32, tensor.BFloat16} {
		for _, op := range []tensor.ReduceOp{tensor.Sum, tensor.Max} {
			const count = 5000
			mine, theirs := smallInts(dt, count, 0), smallInts(dt, count, 1)
			c.send("allreduce %v %v %s", dt, op, hex.EncodeToString(theirs))
			p := alloc(t, dev, len(mine))
			ok(t, dev.CopyHtoD(s, p, mine), "CopyHtoD")
			ok(t, comm.Allreduce(s, p, p, count, dt, op), "Allreduce")
			got := read(t, dev, s, p, len(mine))
			ok(t, comm.AsyncError(), "AsyncError")
			want := refReduce(t, [][]byte{mine, theirs}, dt, op)
			diff(t, fmt.Sprintf("Allreduce %v %v across processes, rank 0", dt, op), got, want)
			childGot, err := c.answer()
			ok(t, err, "child Allreduce")
			diff(t, fmt.Sprintf("Allreduce %v %v across processes, rank 1", dt, op), childGot, want)
		}
	}
	// Send/Recv across the processes.
	mine, theirs := smallInts(tensor.Uint8, 777, 3), smallInts(tensor.Uint8, 777, 4)
	c.send("sendrecv 0 %s", hex.EncodeToString(theirs))
	p := alloc(t, dev, 2*len(mine))
	ok(t, dev.CopyHtoD(s, p, mine), "CopyHtoD")
	ok(t, sendRecv(n, comm, s, p, p.Add(len(mine)), len(mine), 1), "Send/Recv")
	diff(t, "Recv across processes, rank 0", read(t, dev, s, p.Add(len(mine)), len(mine)), theirs)
	childGot, err := c.answer()
	ok(t, err, "child Send/Recv")
	diff(t, "Recv across processes, rank 1", childGot, mine)
	c.do("destroy")
	c.do("exit")
}

func testNCCLAbort(t *testing.T, d gpu.Driver, n gpu.NCCL) {
	rs := initAll(t, d, n, 2)
	// Rank 0 starts an allreduce that rank 1 never joins; aborting rank 0's
	// communicator must end it (the stream drains), not hang.
	p := alloc(t, rs.devs[0], 4096)
	ok(t, rs.comms[0].Allreduce(rs.ss[0], p, p, 1024, tensor.Float32, tensor.Sum), "Allreduce")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ok(t, rs.comms[0].Abort(), "Abort")
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rs.ss[0].Synchronize(ctx); errors.Is(err, context.DeadlineExceeded) {
		t.Fatal("rank 0's stream still blocked 30 s after Abort")
	}
	wg.Wait()
	ok(t, rs.comms[1].Abort(), "Abort of rank 1")
	rs.comms = nil // aborted: no Destroy
}

// testCombine launches combine kernel k over three inputs of n elements
// into two outputs, the first of them input 0 itself (in place), with a
// prescale and a postscale, and checks both outputs against package
// reduce: each input scaled, folded in rank order, the total scaled.
func testCombine(t *testing.T, dev gpu.Device, s gpu.Stream, fn gpu.Function, k kernels.Kernel, r *rand.Rand, n, grid, block int) {
	t.Helper()
	dt := k.DType
	size := dt.Size() * n
	ins := make([][]byte, 3)
	ptrs := make([]gpu.DevicePtr, 3)
	for j := range ins {
		ins[j] = randBytes(r, size)
		if dt.IsFloat() {
			fillFloats(r, ins[j], dt)
		}
		ptrs[j] = alloc(t, dev, size+64)
		ok(t, dev.Memset8(s, ptrs[j], 0x5a, size+64), "Memset8")
		ok(t, dev.CopyHtoD(s, ptrs[j], ins[j]), "CopyHtoD")
	}
	out1 := alloc(t, dev, size+64)
	ok(t, dev.Memset8(s, out1, 0x5a, size+64), "Memset8")
	pre, post := []float64{1, 0.5, 3}[r.IntN(3)], []float64{1, 0.25, -2.5}[r.IntN(3)]
	if dt == tensor.Bool {
		pre, post = 1, 1
	}
	table := kernels.AppendTable(nil, kernels.Segment{Count: uint64(n),
		In: []uint64{uint64(ptrs[0]), uint64(ptrs[1]), uint64(ptrs[2])}, Out: []uint64{uint64(ptrs[0]), uint64(out1)}})
	pt := alloc(t, dev, len(table))
	ok(t, dev.CopyHtoD(s, pt, table), "CopyHtoD table")
	ok(t, fn.Launch(s, grid, block, pt, uint64(1), uint64(3), uint64(2), pre, post), "Launch")
	want := append([]byte(nil), ins[0]...)
	ok(t, reduce.Scale(want, dt, pre), "reference")
	for _, in := range ins[1:] {
		x := append([]byte(nil), in...)
		ok(t, reduce.Scale(x, dt, pre), "reference")
		ok(t, reduce.Reduce([][]byte{want}, [][]byte{want, x}, dt, k.Op, 1, 1, nil), "reference")
	}
	ok(t, reduce.Scale(want, dt, post), "reference")
	for i, p := range []gpu.DevicePtr{ptrs[0], out1} {
		got := read(t, dev, s, p, size+64)
		if e, same := sameValues(dt, got[:size], want); !same {
			sz := dt.Size()
			t.Fatalf("n=%d grid=%d block=%d pre=%v post=%v: output %d element %d is %x, want %x", n, grid, block, pre, post, i, e,
				got[e*sz:(e+1)*sz], want[e*sz:(e+1)*sz])
		}
		diff(t, "guard bytes past the output", got[size:], bytes.Repeat([]byte{0x5a}, 64))
	}
}
