package devicetest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/backends/backendtest"
	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/reduce"
	"github.com/hvdd/hvdd/tensor"
)

// reduceDTypes are the dtypes an engine reduces (NCCL's); unreducible are
// those it must refuse to reduce with errors.ErrUnsupported (and still
// move).
var (
	reduceDTypes = []tensor.DType{tensor.Uint8, tensor.Int8, tensor.Int32, tensor.Int64,
		tensor.Float16, tensor.BFloat16, tensor.Float32, tensor.Float64}
	unreducible = []tensor.DType{tensor.Uint16, tensor.Int16, tensor.Bool}
)

// opsFor lists the reductions checked on dt: Average on float types only
// (NCCL's integer average rounds in ways the engines need not share).
func opsFor(dt tensor.DType) []tensor.ReduceOp {
	ops := []tensor.ReduceOp{tensor.Sum, tensor.Min, tensor.Max, tensor.Product}
	if dt.IsFloat() {
		ops = append(ops, tensor.Average)
	}
	return ops
}

// counts lists the element counts of the matrix for a world of n ranks:
// the edge cases, a count no world size divides, one past a power of two
// and a couple of MiB.
func counts(n int, dt tensor.DType) []int {
	return []int{0, 1, 4, 100, 1000, 10000, 7*n + 3, 1<<13 + 1, (2<<20 + 12345) / dt.Size()}
}

// keep reports whether a case of the matrix runs: full runs everything but
// the multi-MiB counts off float32 Sum (every op on float32 without
// light()); the grouped run takes a sample.
func keep(full bool, dt tensor.DType, op tensor.ReduceOp, count int) bool {
	large := count*dt.Size() > 1<<20
	if !full {
		return !large && (dt == tensor.Float32 || dt == tensor.Int32 || dt == tensor.BFloat16) &&
			(op == tensor.Sum || op == tensor.Max || op == tensor.Average) && (count <= 1 || count == 1000 || count%2 == 1)
	}
	if large {
		return dt == tensor.Float32 && (op == tensor.Sum || !light())
	}
	return true
}

// fill returns count elements of dt for op that reduce exactly
// (backendtest.Fill; Average's inputs are Sum's).
func fill(seed uint64, k int, dt tensor.DType, op tensor.ReduceOp, count int) []byte {
	if op == tensor.Average {
		op = tensor.Sum
	}
	return backendtest.Fill(backendtest.Rand(seed, k), dt, op, count)
}

// checkReduced compares every rank's got[k] with the reduction by op of
// in[k] (the ranks' inputs for k's result): bit for bit against
// backendtest.Reduce, or for Average within the rounding of a float
// average.
func checkReduced(t *testing.T, what string, got [][]byte, in func(k int) [][]byte, dt tensor.DType, op tensor.ReduceOp) {
	t.Helper()
	var want []byte // the last reference computed, and its inputs
	var wantOf [][]byte
	for k := range got {
		ins := in(k)
		if op == tensor.Average {
			if i, g, m, tol := averageDiff(got[k], ins, dt); i >= 0 {
				t.Fatalf("%s: rank %d element %d = %g, want %g within %g", what, k, i, g, m, tol)
			}
			continue
		}
		if want == nil || !sameSlices(ins, wantOf) {
			want, wantOf = backendtest.Reduce(ins, dt, op), ins
		}
		if !bytes.Equal(got[k], want) {
			i := backendtest.FirstDiff(got[k], want) / dt.Size()
			t.Fatalf("%s: rank %d element %d = %x, want %x", what, k, i, elem(got[k], dt, i), elem(want, dt, i))
		}
	}
}

// sameSlices reports whether a and b are the same slices (not copies).
func sameSlices(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if len(a[i]) != len(b[i]) || (len(a[i]) > 0 && &a[i][0] != &b[i][0]) {
			return false
		}
	}
	return true
}

func elem(b []byte, dt tensor.DType, i int) []byte {
	if (i+1)*dt.Size() > len(b) {
		return nil
	}
	return b[i*dt.Size() : (i+1)*dt.Size()]
}

// averageDiff checks a float average: got[i] may differ from the exact
// mean m of the inputs by the roundings of a sum of n terms each scaled by
// 1/n (NCCL's average premultiplies; others divide the sum): at most
// (n+2)·u·(Σ|x|/n) + u·|m| with u the format's unit roundoff. It returns
// the first element outside that, or -1.
func averageDiff(got []byte, in [][]byte, dt tensor.DType) (int, float64, float64, float64) {
	var u float64
	switch dt {
	case tensor.Float16:
		u = 0x1p-11
	case tensor.BFloat16:
		u = 0x1p-8
	case tensor.Float32:
		u = 0x1p-24
	default:
		u = 0x1p-53
	}
	n := float64(len(in))
	sz := dt.Size()
	for i := 0; i < len(got)/sz; i++ {
		var s, abs float64
		for _, b := range in {
			v := toFloat(b[i*sz:], dt)
			s += v
			abs += math.Abs(v)
		}
		m := s / n
		tol := (n+2)*u*(abs/n) + u*math.Abs(m)
		if g := toFloat(got[i*sz:], dt); math.Abs(g-m) > tol {
			return i, g, m, tol
		}
	}
	return -1, 0, 0, 0
}

func toFloat(b []byte, dt tensor.DType) float64 {
	le := binary.LittleEndian
	switch dt {
	case tensor.Float16:
		return float64(reduce.Float16ToFloat32(le.Uint16(b)))
	case tensor.BFloat16:
		return float64(reduce.BFloat16ToFloat32(le.Uint16(b)))
	case tensor.Float32:
		return float64(math.Float32frombits(le.Uint32(b)))
	}
	return math.Float64frombits(le.Uint64(b))
}

func testAllreduce(t *testing.T, w *world, drive driver, full bool) {
	n := w.n()
	seed := uint64(1)
	for _, dt := range reduceDTypes {
		es := dt.Size()
		for _, op := range opsFor(dt) {
			for i, count := range counts(n, dt) {
				if !keep(full, dt, op, count) {
					continue
				}
				seed++
				in := make([][]byte, n)
				out := make([][]byte, n)
				for k := range in {
					in[k] = fill(seed, k, dt, op, count)
					out[k] = make([]byte, count*es)
				}
				inPlace := i%2 == 1
				what := fmt.Sprintf("Allreduce(%v, %v, count=%d, in place %t)", dt, op, count, inPlace)
				dst := func(t *testing.T, x *rank) gpu.DevicePtr {
					if inPlace {
						return x.buf(t, &x.send, count*es)
					}
					return x.buf(t, &x.recv, count*es)
				}
				if !drive(t, w, job{what: what,
					pre: func(k int, x *rank) error {
						if !inPlace {
							// Garbage where the result goes.
							if err := x.put(dst(t, x), backendtest.RandBytes(backendtest.Rand(seed, k+100), count*es)); err != nil {
								return err
							}
						}
						return x.put(x.buf(t, &x.send, count*es), in[k])
					},
					call: func(k int, x *rank) error {
						return x.e.Allreduce(x.s, x.send.p, dst(t, x), count, dt, op)
					},
					post: func(k int, x *rank) error { return x.get(out[k], dst(t, x)) },
				}) {
					t.FailNow()
				}
				checkReduced(t, what, out, func(int) [][]byte { return in }, dt, op)
			}
		}
	}
}

func testReduceScatter(t *testing.T, w *world, drive driver, full bool) {
	n := w.n()
	seed := uint64(1000)
	for _, dt := range reduceDTypes {
		es := dt.Size()
		for _, op := range opsFor(dt) {
			for i, count := range counts(n, dt) {
				if !keep(full, dt, op, count) {
					continue
				}
				count = (count + n - 1) / n // per rank: the input, n times as long, is about count
				seed++
				in := make([][]byte, n)
				out := make([][]byte, n)
				for k := range in {
					in[k] = fill(seed, k, dt, op, n*count)
					out[k] = make([]byte, count*es)
				}
				// In place: recv is rank k's block of send.
				inPlace := i%2 == 1
				what := fmt.Sprintf("ReduceScatter(%v, %v, count=%d, in place %t)", dt, op, count, inPlace)
				dst := func(t *testing.T, k int, x *rank) gpu.DevicePtr {
					if inPlace {
						return x.buf(t, &x.send, n*count*es).Add(k * count * es)
					}
					return x.buf(t, &x.recv, count*es)
				}
				if !drive(t, w, job{what: what,
					pre: func(k int, x *rank) error {
						if !inPlace {
							if err := x.put(dst(t, k, x), backendtest.RandBytes(backendtest.Rand(seed, k+100), count*es)); err != nil {
								return err
							}
						}
						return x.put(x.buf(t, &x.send, n*count*es), in[k])
					},
					call: func(k int, x *rank) error {
						return x.e.ReduceScatter(x.s, x.send.p, dst(t, k, x), count, dt, op)
					},
					post: func(k int, x *rank) error { return x.get(out[k], dst(t, k, x)) },
				}) {
					t.FailNow()
				}
				checkReduced(t, what, out, func(k int) [][]byte {
					block := make([][]byte, n)
					for q := range in {
						block[q] = in[q][k*count*es : (k+1)*count*es]
					}
					return block
				}, dt, op)
			}
		}
	}
}

// moveDTypes are the dtypes the moving collectives take in turn: every
// dtype, NCCL's or not.
var moveDTypes = tensor.DTypes()

func testBroadcast(t *testing.T, w *world, drive driver, full bool) {
	n := w.n()
	for i, size := range []int{0, 1, 100, 65536, 3<<20 + 7} {
		if !full && size > 65536 {
			continue
		}
		dt := moveDTypes[i%len(moveDTypes)]
		es := dt.Size()
		count := size / es
		for root := range n {
			if size > 1<<20 && root > 0 && light() {
				continue
			}
			r := backendtest.Rand(uint64(200+i), root)
			want := backendtest.RandBytes(r, count*es)
			out := make([][]byte, n)
			for k := range out {
				out[k] = make([]byte, count*es)
			}
			inPlace := (i+root)%2 == 1
			what := fmt.Sprintf("Broadcast(%v, count=%d, root=%d, in place %t)", dt, count, root, inPlace)
			dst := func(t *testing.T, x *rank) gpu.DevicePtr {
				if inPlace {
					return x.buf(t, &x.send, count*es)
				}
				return x.buf(t, &x.recv, count*es)
			}
			if !drive(t, w, job{what: what,
				pre: func(k int, x *rank) error {
					// Garbage everywhere but root's input.
					if err := x.put(dst(t, x), backendtest.RandBytes(backendtest.Rand(uint64(300+i), k), count*es)); err != nil {
						return err
					}
					if k == root {
						return x.put(x.buf(t, &x.send, count*es), want)
					}
					return nil
				},
				call: func(k int, x *rank) error {
					return x.e.Broadcast(x.s, x.buf(t, &x.send, count*es), dst(t, x), count, dt, root)
				},
				post: func(k int, x *rank) error { return x.get(out[k], dst(t, x)) },
			}) {
				t.FailNow()
			}
			for k := range out {
				if !bytes.Equal(out[k], want) {
					t.Fatalf("%s: rank %d differs from the root at byte %d", what, k, backendtest.FirstDiff(out[k], want))
				}
			}
		}
	}
}

func testAllgather(t *testing.T, w *world, drive driver, full bool) {
	n := w.n()
	for i, count := range []int{0, 1, 5, 100, 4096, 100003} {
		if !full && count > 4096 {
			continue
		}
		dt := moveDTypes[(i+3)%len(moveDTypes)]
		es := dt.Size()
		in := make([][]byte, n)
		out := make([][]byte, n)
		for k := range in {
			in[k] = backendtest.RandBytes(backendtest.Rand(uint64(400+i), k), count*es)
			out[k] = make([]byte, n*count*es)
		}
		want := bytes.Join(in, nil)
		// In place: send is rank k's block of recv.
		inPlace := i%2 == 1
		what := fmt.Sprintf("Allgather(%v, count=%d, in place %t)", dt, count, inPlace)
		src := func(t *testing.T, k int, x *rank) gpu.DevicePtr {
			if inPlace {
				return x.buf(t, &x.recv, n*count*es).Add(k * count * es)
			}
			return x.buf(t, &x.send, count*es)
		}
		if !drive(t, w, job{what: what,
			pre: func(k int, x *rank) error {
				if err := x.put(x.buf(t, &x.recv, n*count*es), backendtest.RandBytes(backendtest.Rand(uint64(500+i), k), n*count*es)); err != nil {
					return err
				}
				return x.put(src(t, k, x), in[k])
			},
			call: func(k int, x *rank) error {
				return x.e.Allgather(x.s, src(t, k, x), x.recv.p, count, dt)
			},
			post: func(k int, x *rank) error { return x.get(out[k], x.recv.p) },
		}) {
			t.FailNow()
		}
		for k := range out {
			if !bytes.Equal(out[k], want) {
				t.Fatalf("%s: rank %d differs from the concatenation at byte %d", what, k, backendtest.FirstDiff(out[k], want))
			}
		}
	}
}

// unevenCounts returns per-rank element counts: uneven, with zeros.
func unevenCounts(seed uint64, k, n, base int) []int {
	r := backendtest.Rand(seed, k)
	c := make([]int, n)
	for i := range c {
		if (i+k)%3 != 1 {
			c[i] = base + r.IntN(base+1)
		}
	}
	return c
}

func testAlltoallv(t *testing.T, w *world, drive driver, full bool) {
	n := w.n()
	for i, base := range []int{0, 1, 5, 100, 4096, 50000} {
		if !full && base > 4096 {
			continue
		}
		dt := moveDTypes[(i+5)%len(moveDTypes)]
		es := dt.Size()
		// send[k][q] is the number of elements rank k sends to rank q.
		send := make([][]int, n)
		for k := range send {
			send[k] = unevenCounts(uint64(600+i), k, n, base)
		}
		recv := make([][]int, n)
		in := make([][]byte, n)
		out := make([][]byte, n)
		for k := range recv {
			recv[k] = make([]int, n)
			for q := range n {
				recv[k][q] = send[q][k]
			}
			in[k] = backendtest.RandBytes(backendtest.Rand(uint64(700+i), k), sum(send[k])*es)
			out[k] = make([]byte, sum(recv[k])*es)
		}
		what := fmt.Sprintf("Alltoallv(%v, base=%d)", dt, base)
		if !drive(t, w, job{what: what,
			pre: func(k int, x *rank) error {
				if err := x.put(x.buf(t, &x.recv, len(out[k])), backendtest.RandBytes(backendtest.Rand(uint64(800+i), k), len(out[k]))); err != nil {
					return err
				}
				return x.put(x.buf(t, &x.send, len(in[k])), in[k])
			},
			call: func(k int, x *rank) error {
				return x.e.Alltoallv(x.s, x.send.p, send[k], x.recv.p, recv[k], dt)
			},
			post: func(k int, x *rank) error { return x.get(out[k], x.recv.p) },
		}) {
			t.FailNow()
		}
		for k := range out {
			off := 0
			for q := range n {
				// Rank q's block for k starts at the running sum of q's
				// send counts before k.
				src := in[q][sum(send[q][:k])*es:][:send[q][k]*es]
				if got := out[k][off : off+recv[k][q]*es]; !bytes.Equal(got, src) {
					t.Fatalf("%s: rank %d's block from rank %d differs at byte %d", what, k, q, backendtest.FirstDiff(got, src))
				}
				off += recv[k][q] * es
			}
		}
	}
}

// testUnsupported: reductions on dtypes or ops the engine lacks fail with
// errors.ErrUnsupported, enqueue nothing, and leave the engine usable.
func testUnsupported(t *testing.T, w *world) {
	for _, x := range w.ranks {
		p := x.buf(t, &x.send, 4096)
		for _, dt := range unreducible {
			if err := x.e.Allreduce(x.s, p, p, 16, dt, tensor.Sum); !errors.Is(err, errors.ErrUnsupported) {
				t.Errorf("rank %d: Allreduce of %v returned %v, want an error wrapping errors.ErrUnsupported", x.e.Rank(), dt, err)
			}
			if err := x.e.ReduceScatter(x.s, p, p, 1, dt, tensor.Max); !errors.Is(err, errors.ErrUnsupported) {
				t.Errorf("rank %d: ReduceScatter of %v returned %v, want an error wrapping errors.ErrUnsupported", x.e.Rank(), dt, err)
			}
		}
		if err := x.e.Allreduce(x.s, p, p, 16, tensor.Float32, tensor.Adasum); !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("rank %d: Allreduce with Adasum returned %v, want an error wrapping errors.ErrUnsupported", x.e.Rank(), err)
		}
	}
	usable(t, w, "after unsupported calls")
}

// testBadArguments: calls with bad counts, roots or peers fail, enqueue
// nothing and leave the engine usable.
func testBadArguments(t *testing.T, w *world) {
	n := w.n()
	for _, x := range w.ranks {
		p := x.buf(t, &x.send, 4096)
		bad := map[string]error{
			"Allreduce(count -1)":          x.e.Allreduce(x.s, p, p, -1, tensor.Float32, tensor.Sum),
			"Broadcast(root -1)":           x.e.Broadcast(x.s, p, p, 4, tensor.Float32, -1),
			"Broadcast(root Size())":       x.e.Broadcast(x.s, p, p, 4, tensor.Float32, n),
			"Allgather(count -1)":          x.e.Allgather(x.s, p, p, -1, tensor.Uint8),
			"ReduceScatter(count -1)":      x.e.ReduceScatter(x.s, p, p, -1, tensor.Int32, tensor.Sum),
			"Alltoallv(Size()+1 counts)":   x.e.Alltoallv(x.s, p, make([]int, n+1), p, make([]int, n+1), tensor.Uint8),
			"Alltoallv(a negative count)":  x.e.Alltoallv(x.s, p, slices.Repeat([]int{-1}, n), p, make([]int, n), tensor.Uint8),
			"Allreduce(an invalid dtype)":  x.e.Allreduce(x.s, p, p, 4, tensor.Invalid, tensor.Sum),
			"Broadcast(an invalid dtype)":  x.e.Broadcast(x.s, p, p, 4, tensor.Invalid, 0),
			"Allgather(an invalid dtype)":  x.e.Allgather(x.s, p, p, 4, tensor.DType(200)),
			"Alltoallv(an invalid dtype)":  x.e.Alltoallv(x.s, p, make([]int, n), p, make([]int, n), tensor.Invalid),
			"ReduceScatter(invalid dtype)": x.e.ReduceScatter(x.s, p, p, 4, tensor.Invalid, tensor.Sum),
		}
		if pe, ok := x.e.(backends.DevicePeer); ok {
			bad["Send(peer Size())"] = pe.Send(x.s, p, 1, tensor.Uint8, n)
			bad["Recv(peer -1)"] = pe.Recv(x.s, p, 1, tensor.Uint8, -1)
		}
		for what, err := range bad {
			if err == nil {
				t.Errorf("rank %d: %s succeeded", x.e.Rank(), what)
			}
		}
	}
	usable(t, w, "after bad calls")
}

// usable checks that w's engines still run an allreduce.
func usable(t *testing.T, w *world, why string) {
	t.Helper()
	const count = 64
	n := w.n()
	out := make([][]byte, n)
	for k := range out {
		out[k] = make([]byte, 4*count)
	}
	in := make([][]byte, n)
	for k := range in {
		in[k] = fill(uint64(900), k, tensor.Int32, tensor.Sum, count)
	}
	what := "Allreduce " + why
	if !apart(t, w, job{what: what,
		pre: func(k int, x *rank) error { return x.put(x.buf(t, &x.send, 4*count), in[k]) },
		call: func(k int, x *rank) error {
			return x.e.Allreduce(x.s, x.send.p, x.send.p, count, tensor.Int32, tensor.Sum)
		},
		post: func(k int, x *rank) error { return x.get(out[k], x.send.p) },
	}) {
		t.FailNow()
	}
	checkReduced(t, what, out, func(int) [][]byte { return in }, tensor.Int32, tensor.Sum)
}

// testBackToBack enqueues a chain of collectives on each rank's stream
// with one Wait at the end: each reads what the one before wrote, so an
// engine that does not order its work after the stream's shows wrong
// data. Every element starts at 1; each of the rounds of Sum multiplies
// it by n, a broadcast from a rotating root leaves it, and the final
// allgather repeats it n times.
func testBackToBack(t *testing.T, w *world) {
	n := w.n()
	const count, rounds = 3000, 6
	ones := make([]byte, 4*count)
	for i := range count {
		binary.LittleEndian.PutUint32(ones[4*i:], 1)
	}
	out := make([][]byte, n)
	for k := range out {
		out[k] = make([]byte, 4*n*count)
	}
	if !apart(t, w, job{what: "back-to-back",
		pre: func(k int, x *rank) error {
			x.buf(t, &x.recv, 4*n*count)
			return x.put(x.buf(t, &x.send, 4*count), ones)
		},
		call: func(k int, x *rank) error {
			for j := range rounds {
				if err := x.e.Allreduce(x.s, x.send.p, x.send.p, count, tensor.Int32, tensor.Sum); err != nil {
					return err
				}
				if err := x.e.Broadcast(x.s, x.send.p, x.send.p, count, tensor.Int32, j%n); err != nil {
					return err
				}
			}
			return x.e.Allgather(x.s, x.send.p, x.recv.p, count, tensor.Int32)
		},
		post: func(k int, x *rank) error { return x.get(out[k], x.recv.p) },
	}) {
		t.FailNow()
	}
	want := uint32(1)
	for range rounds {
		want *= uint32(n)
	}
	for k := range out {
		for i := 0; i < len(out[k]); i += 4 {
			if got := binary.LittleEndian.Uint32(out[k][i:]); got != want {
				t.Fatalf("back-to-back: rank %d element %d = %d, want %d", k, i/4, got, want)
			}
		}
	}
}

// testSendRecv passes each rank's buffer around the ring with
// backends.DevicePeer's Send and Recv, grouped on each rank.
func testSendRecv(t *testing.T, w *world) {
	n := w.n()
	if _, ok := w.ranks[0].e.(backends.DevicePeer); !ok {
		t.Skip("the engine has no Send and Recv")
	}
	if _, ok := w.ranks[0].e.(backends.DeviceGrouper); !ok {
		t.Skip("the engine has no Group")
	}
	const count = 1001
	dt := tensor.Float64
	in := make([][]byte, n)
	out := make([][]byte, n)
	for k := range in {
		in[k] = backendtest.RandBytes(backendtest.Rand(950, k), count*dt.Size())
		out[k] = make([]byte, count*dt.Size())
	}
	if !apart(t, w, job{what: "ring of Send and Recv",
		pre: func(k int, x *rank) error {
			x.buf(t, &x.recv, count*dt.Size())
			return x.put(x.buf(t, &x.send, count*dt.Size()), in[k])
		},
		call: func(k int, x *rank) error {
			pe := x.e.(backends.DevicePeer)
			return x.e.(backends.DeviceGrouper).Group(func() error {
				if err := pe.Send(x.s, x.send.p, count, dt, (k+1)%n); err != nil {
					return err
				}
				return pe.Recv(x.s, x.recv.p, count, dt, (k+n-1)%n)
			})
		},
		post: func(k int, x *rank) error { return x.get(out[k], x.recv.p) },
	}) {
		t.FailNow()
	}
	for k := range out {
		if want := in[(k+n-1)%n]; !bytes.Equal(out[k], want) {
			t.Fatalf("ring: rank %d differs from rank %d's buffer at byte %d", k, (k+n-1)%n, backendtest.FirstDiff(out[k], want))
		}
	}
}
