package fake_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/fake"
	"github.com/hvdd/hvdd/gpu/kernels"
	"github.com/hvdd/hvdd/reduce"
	"github.com/hvdd/hvdd/tensor"
)

// combineRef is one segment of combine_<op>_<dtype> the way the daemon
// computed it before the kernel existed: in[0] copied and scaled by pre,
// each further input scaled by pre in scratch and reduced in pairwise, the
// result scaled by post.
func combineRef(t *testing.T, ins [][]byte, dt tensor.DType, op tensor.ReduceOp, pre, post float64) []byte {
	t.Helper()
	acc := append([]byte(nil), ins[0]...)
	if err := reduce.Scale(acc, dt, pre); err != nil {
		t.Fatal(err)
	}
	for _, in := range ins[1:] {
		tmp := append([]byte(nil), in...)
		if err := reduce.Scale(tmp, dt, pre); err != nil {
			t.Fatal(err)
		}
		if err := reduce.Reduce([][]byte{acc}, [][]byte{acc, tmp}, dt, op, 1, 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := reduce.Scale(acc, dt, post); err != nil {
		t.Fatal(err)
	}
	return acc
}

// combineData returns n random elements of dt: arbitrary bits (NaNs,
// infinities, subnormals) for a third of them, small values for the rest.
func combineData(r *rand.Rand, dt tensor.DType, n int) []byte {
	b := make([]byte, n*dt.Size())
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	for i := range n {
		if r.IntN(3) == 0 {
			continue
		}
		x := b[i*dt.Size():]
		v := float32(r.NormFloat64() * 8)
		switch dt {
		case tensor.Float16:
			binary.LittleEndian.PutUint16(x, reduce.Float32ToFloat16(v))
		case tensor.BFloat16:
			binary.LittleEndian.PutUint16(x, reduce.Float32ToBFloat16(v))
		case tensor.Float32:
			binary.LittleEndian.PutUint32(x, math.Float32bits(v))
		case tensor.Float64:
			binary.LittleEndian.PutUint64(x, math.Float64bits(float64(v)))
		case tensor.Bool:
			x[0] = byte(r.IntN(2))
		}
	}
	return b
}

// TestCombine launches combine kernels on fake memory, with the table
// written by a copy queued just before the launch (the fake reads it when
// the kernel runs, so a stale table would show), and checks every output
// against combineRef bit for bit (the fake computes with package reduce).
func TestCombine(t *testing.T) {
	dev, s := openDev(t, fake.New(fake.Options{MaxDelay: 200 * time.Microsecond}), 0)
	m, err := dev.LoadModule(kernels.PTX())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unload()
	r := rand.New(rand.NewPCG(3, 4))
	tests := []struct {
		op        tensor.ReduceOp
		dt        tensor.DType
		nin, nout int
		inPlace   bool
		pre, post float64
	}{
		{tensor.Sum, tensor.Float16, 3, 3, true, 0.5, 1.0 / 3},
		{tensor.Sum, tensor.Float16, 4, 1, false, 3, 1},
		{tensor.Sum, tensor.Float16, 1, 2, false, 1.0 / 3, 3},
		{tensor.Max, tensor.Float16, 2, 2, true, 1, 1},
		{tensor.Product, tensor.BFloat16, 3, 1, false, 0.5, 3},
		{tensor.Sum, tensor.BFloat16, 2, 2, true, 1, 0.5},
		{tensor.Min, tensor.Float32, 4, 4, true, 1.0 / 3, 1},
		{tensor.Sum, tensor.Float32, 2, 1, false, 1, 1},
		{tensor.Product, tensor.Float64, 3, 2, false, 3, 0.5},
		{tensor.Sum, tensor.Int8, 4, 1, false, 0.5, 3},
		{tensor.Max, tensor.Uint16, 2, 3, true, 1.0 / 3, 1},
		{tensor.Product, tensor.Int64, 3, 3, true, 1, 1},
		{tensor.Sum, tensor.Int32, 2, 2, false, -2.5, 1e10},
		{tensor.Min, tensor.Bool, 3, 1, false, 3, 3},
		{tensor.Max, tensor.Bool, 1, 2, false, 1, 1}, // a copy: bytes not normalised
	}
	counts := []int{5, 0, 1000, 1}
	for _, tt := range tests {
		name, err := kernels.CombineName(tt.op, tt.dt)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(fmt.Sprintf("%s/nin=%d/nout=%d/inplace=%v/pre=%v/post=%v", name, tt.nin, tt.nout, tt.inPlace, tt.pre, tt.post), func(t *testing.T) {
			fn, err := m.Function(name)
			if err != nil {
				t.Fatal(err)
			}
			type segment struct {
				ins  [][]byte
				out  []gpu.DevicePtr
				want []byte
			}
			var segs []segment
			var table []byte
			var free []gpu.DevicePtr
			defer func() {
				for _, p := range free {
					dev.Free(p)
				}
			}()
			alloc := func(n int) gpu.DevicePtr {
				p, err := dev.Alloc(max(n, 1))
				if err != nil {
					t.Fatal(err)
				}
				free = append(free, p)
				return p
			}
			largest := 0
			for _, n := range counts {
				largest = max(largest, n)
				var sg segment
				var in []uint64
				for range tt.nin {
					b := combineData(r, tt.dt, n)
					p := alloc(len(b))
					if err := dev.CopyHtoD(s, p, b); err != nil {
						t.Fatal(err)
					}
					sg.ins = append(sg.ins, b)
					in = append(in, uint64(p))
				}
				var out []uint64
				for k := range tt.nout {
					p := gpu.DevicePtr(0)
					if tt.inPlace && k < tt.nin {
						p = gpu.DevicePtr(in[k])
					} else {
						p = alloc(n * tt.dt.Size())
						if err := dev.Memset8(s, p, 0x5a, n*tt.dt.Size()); err != nil {
							t.Fatal(err)
						}
					}
					sg.out = append(sg.out, p)
					out = append(out, uint64(p))
				}
				sg.want = combineRef(t, sg.ins, tt.dt, tt.op, tt.pre, tt.post)
				table = kernels.AppendTable(table, kernels.Segment{Count: uint64(n), In: in, Out: out})
				segs = append(segs, sg)
			}
			tp := alloc(len(table))
			if err := dev.CopyHtoD(s, tp, table); err != nil {
				t.Fatal(err)
			}
			if err := fn.Launch(s, kernels.Grid(largest), kernels.BlockSize, tp, uint64(len(segs)), uint64(tt.nin), int64(tt.nout), tt.pre, tt.post); err != nil {
				t.Fatal(err)
			}
			got := make([][][]byte, len(segs))
			for i, sg := range segs {
				for _, p := range sg.out {
					b := make([]byte, len(sg.want))
					if err := dev.CopyDtoH(s, b, p); err != nil {
						t.Fatal(err)
					}
					got[i] = append(got[i], b)
				}
			}
			if err := s.Synchronize(context.Background()); err != nil {
				t.Fatal(err)
			}
			for i, sg := range segs {
				for k, b := range got[i] {
					if !bytes.Equal(b, sg.want) {
						sz := tt.dt.Size()
						for e := 0; e < len(b); e += sz {
							if !bytes.Equal(b[e:e+sz], sg.want[e:e+sz]) {
								t.Fatalf("segment %d output %d element %d: got %x, want %x", i, k, e/sz, b[e:e+sz], sg.want[e:e+sz])
							}
						}
					}
				}
			}
		})
	}
}

// TestCombineRoundsEachStep: float16 2048 + 1 + 1 is 2048 when every step
// rounds (2049 is a tie, rounded to even), as the separate kernels
// computed it, and 2050 if the sum were rounded once.
func TestCombineRoundsEachStep(t *testing.T) {
	dev, s := openDev(t, fake.New(fake.Options{}), 0)
	m, err := dev.LoadModule(kernels.PTX())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unload()
	fn, err := m.Function("combine_sum_float16")
	if err != nil {
		t.Fatal(err)
	}
	h := func(f float32) []byte { return binary.LittleEndian.AppendUint16(nil, reduce.Float32ToFloat16(f)) }
	p, err := dev.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free(p)
	// Inputs at p, p+2 and p+4, the output at p+8, the table at p+64.
	in := []uint64{uint64(p), uint64(p) + 2, uint64(p) + 4}
	table := kernels.AppendTable(nil, kernels.Segment{Count: 1, In: in, Out: []uint64{uint64(p) + 8}})
	for i, b := range [][]byte{h(2048), h(1), h(1)} {
		if err := dev.CopyHtoD(s, p.Add(2*i), b); err != nil {
			t.Fatal(err)
		}
	}
	if err := dev.CopyHtoD(s, p.Add(64), table); err != nil {
		t.Fatal(err)
	}
	if err := fn.Launch(s, 1, 1, p.Add(64), uint64(1), uint64(3), uint64(1), 1.0, 1.0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 2)
	if err := dev.CopyDtoH(s, got, p.Add(8)); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, h(2048)) {
		t.Errorf("2048 + 1 + 1 = %x in float16, want %x (2048)", got, h(2048))
	}
}

// TestCombineErrors: bad arguments fail the launch with
// CUDA_ERROR_INVALID_VALUE; a pointer in the table that is no device
// memory when the kernel runs fails it with CUDA_ERROR_ILLEGAL_ADDRESS,
// the context's sticky error.
func TestCombineErrors(t *testing.T) {
	dev, s := openDev(t, fake.New(fake.Options{}), 0)
	m, err := dev.LoadModule(kernels.PTX())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unload()
	fn, err := m.Function("combine_sum_float32")
	if err != nil {
		t.Fatal(err)
	}
	p, err := dev.Alloc(256)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free(p)
	tests := []struct {
		name string
		args []any
	}{
		{"no inputs", []any{p, uint64(1), uint64(0), uint64(1), 1.0, 1.0}},
		{"no outputs", []any{p, uint64(1), uint64(1), uint64(0), 1.0, 1.0}},
		{"table past the allocation", []any{p, uint64(11), uint64(1), uint64(1), 1.0, 1.0}}, // 11*3*8 > 256
		{"table in no allocation", []any{gpu.DevicePtr(8), uint64(1), uint64(1), uint64(1), 1.0, 1.0}},
		{"huge table", []any{p, uint64(1) << 62, uint64(1), uint64(1), 1.0, 1.0}},
		{"negative count", []any{p, uint64(1), int64(-1), uint64(1), 1.0, 1.0}},
		{"a float32 factor", []any{p, uint64(1), uint64(1), uint64(1), float32(1), 1.0}},
		{"too few", []any{p, uint64(1), uint64(1), uint64(1), 1.0}},
	}
	for _, tt := range tests {
		if ge := gpuErr(t, fn.Launch(s, 1, 32, tt.args...)); ge.Code != 1 || ge.Call != "cuLaunchKernel" {
			t.Errorf("%s: %+v, want CUDA_ERROR_INVALID_VALUE from cuLaunchKernel", tt.name, ge)
		}
	}
	// A table whose input lies outside device memory: the launch is
	// accepted (the table is read when the kernel runs), the run fails.
	table := kernels.AppendTable(nil, kernels.Segment{Count: 4, In: []uint64{8}, Out: []uint64{uint64(p) + 64}})
	if err := dev.CopyHtoD(s, p, table); err != nil {
		t.Fatal(err)
	}
	if err := fn.Launch(s, 1, 32, p, uint64(1), uint64(1), uint64(1), 1.0, 1.0); err != nil {
		t.Fatalf("launch: %v", err)
	}
	if ge := gpuErr(t, s.Synchronize(context.Background())); ge.Name != "CUDA_ERROR_ILLEGAL_ADDRESS" {
		t.Errorf("a bad pointer in the table: %+v, want CUDA_ERROR_ILLEGAL_ADDRESS", ge)
	}
}
