package bench

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/reduce"
	"github.com/hvdd/hvdd/tensor"
)

// The check data: rank r's element i is InputValue(op, dt, r, i), a small
// whole number every dtype holds exactly, and Reference computes what a
// reduction of such values must give, independently of the daemon's kernels.

// InputValue is the value rank r puts at element i when checking. Values are
// small whole numbers: 0 or 1 for bool, 1..3 for Product (so products stay
// representable), 0..8 for unsigned types and -4..4 otherwise.
func InputValue(op tensor.ReduceOp, dt tensor.DType, r int, i int64) int64 {
	k := (i*13 + int64(r)*7) % 36
	switch {
	case dt == tensor.Bool:
		if k%3 == 0 {
			return 1
		}
		return 0
	case op == tensor.Product:
		return [4]int64{1, 2, 1, 3}[k%4]
	case isUnsigned(dt):
		return k % 9
	}
	return k%9 - 4
}

func isUnsigned(dt tensor.DType) bool {
	return dt == tensor.Uint8 || dt == tensor.Uint16
}

// wrapInt truncates x to dt's width, as the daemon's integer arithmetic
// wraps (two's complement, like C).
func wrapInt(dt tensor.DType, x int64) int64 {
	switch dt {
	case tensor.Uint8:
		return int64(uint8(x))
	case tensor.Int8:
		return int64(int8(x))
	case tensor.Uint16:
		return int64(uint16(x))
	case tensor.Int16:
		return int64(int16(x))
	case tensor.Int32:
		return int64(int32(x))
	}
	return x
}

// Reference is the result of reducing n ranks' values with op in dtype dt,
// following Horovod's CPU semantics: integers wrap and Average is the
// wrapped sum times 1/n truncated toward zero; bool Sum, Max and Average are
// OR, Min and Product AND; floats are computed exactly in float64.
func Reference(op tensor.ReduceOp, dt tensor.DType, n int, value func(r int) int64) float64 {
	switch {
	case dt == tensor.Bool:
		and := op == tensor.Min || op == tensor.Product
		acc := value(0) != 0
		for r := 1; r < n; r++ {
			if and {
				acc = acc && value(r) != 0
			} else {
				acc = acc || value(r) != 0
			}
		}
		if acc {
			return 1
		}
		return 0
	case dt.IsFloat():
		acc := float64(value(0))
		for r := 1; r < n; r++ {
			acc = combine(op, acc, float64(value(r)))
		}
		if op == tensor.Average {
			acc /= float64(n)
		}
		return acc
	}
	acc := wrapInt(dt, value(0))
	for r := 1; r < n; r++ {
		v := value(r)
		switch op {
		case tensor.Sum, tensor.Average:
			acc = wrapInt(dt, acc+v)
		case tensor.Product:
			acc = wrapInt(dt, acc*v)
		case tensor.Min:
			acc = min(acc, v)
		case tensor.Max:
			acc = max(acc, v)
		}
	}
	if op == tensor.Average {
		acc = wrapInt(dt, int64(float64(acc)*(1/float64(n))))
	}
	return float64(acc)
}

func combine(op tensor.ReduceOp, a, b float64) float64 {
	switch op {
	case tensor.Product:
		return a * b
	case tensor.Min:
		return math.Min(a, b)
	case tensor.Max:
		return math.Max(a, b)
	}
	return a + b
}

// Tolerance is the relative error allowed for a result of dt reduced over n
// ranks: 0 (exact) for integers and bool, a few units in the last place of
// the type per rank for floats (Average divides, and half types round).
func Tolerance(dt tensor.DType, n int) float64 {
	var eps float64
	switch dt {
	case tensor.Float16:
		eps = 0x1p-10
	case tensor.BFloat16:
		eps = 0x1p-7
	case tensor.Float32:
		eps = 0x1p-23
	case tensor.Float64:
		eps = 0x1p-52
	default:
		return 0
	}
	return eps * float64(n+2)
}

// Close reports whether got is want within the relative tolerance tol (an
// absolute one for |want| < 1).
func Close(got, want, tol float64) bool {
	if tol == 0 {
		return got == want
	}
	return math.Abs(got-want) <= tol*math.Max(1, math.Abs(want))
}

// encodeRaw writes the small whole number v as one element of dtype dt at
// the start of b (bool: v != 0). Every check input and the poison is
// written through it, into buffers held as bytes.
func encodeRaw(dt tensor.DType, b []byte, v int64) {
	ne := binary.NativeEndian
	switch dt {
	case tensor.Uint8, tensor.Int8:
		b[0] = byte(v)
	case tensor.Uint16, tensor.Int16:
		ne.PutUint16(b, uint16(v))
	case tensor.Int32:
		ne.PutUint32(b, uint32(v))
	case tensor.Int64:
		ne.PutUint64(b, uint64(v))
	case tensor.Float16:
		ne.PutUint16(b, reduce.Float32ToFloat16(float32(v)))
	case tensor.BFloat16:
		ne.PutUint16(b, reduce.Float32ToBFloat16(float32(v)))
	case tensor.Float32:
		ne.PutUint32(b, math.Float32bits(float32(v)))
	case tensor.Float64:
		ne.PutUint64(b, math.Float64bits(float64(v)))
	case tensor.Bool:
		b[0] = 0
		if v != 0 {
			b[0] = 1
		}
	}
}

// decodeRaw converts the element of dtype dt at the start of b to float64
// (bool as 0 or 1).
func decodeRaw(dt tensor.DType, b []byte) float64 {
	ne := binary.NativeEndian
	switch dt {
	case tensor.Uint8:
		return float64(b[0])
	case tensor.Int8:
		return float64(int8(b[0]))
	case tensor.Uint16:
		return float64(ne.Uint16(b))
	case tensor.Int16:
		return float64(int16(ne.Uint16(b)))
	case tensor.Int32:
		return float64(int32(ne.Uint32(b)))
	case tensor.Int64:
		return float64(int64(ne.Uint64(b)))
	case tensor.Float16:
		return float64(reduce.Float16ToFloat32(ne.Uint16(b)))
	case tensor.BFloat16:
		return float64(reduce.BFloat16ToFloat32(ne.Uint16(b)))
	case tensor.Float32:
		return float64(math.Float32frombits(ne.Uint32(b)))
	case tensor.Float64:
		return math.Float64frombits(ne.Uint64(b))
	case tensor.Bool:
		if b[0] != 0 {
			return 1
		}
	}
	return 0
}

// encode converts a small whole number to T.
func encode[T hvdd.Elem](v int64) T {
	var x T
	encodeRaw(hvdd.DTypeOf[T](), unsafe.Slice((*byte)(unsafe.Pointer(&x)), unsafe.Sizeof(x)), v)
	return x
}

// decode converts an element to float64 (bool as 0 or 1).
func decode[T hvdd.Elem](v T) float64 {
	return decodeRaw(hvdd.DTypeOf[T](), unsafe.Slice((*byte)(unsafe.Pointer(&v)), unsafe.Sizeof(v)))
}

// Expect describes what one rank must see from one collective when checking.
type Expect struct {
	Op     tensor.OpType
	Reduce tensor.ReduceOp
	DType  tensor.DType
	Ranks  int
	Rank   int
	Count  int64 // elements of the sweep size (see Config and the help)
}

// InputLen is the number of elements this rank submits.
func (e Expect) InputLen() int64 {
	if e.Op == tensor.Allgather {
		return e.Count / int64(e.Ranks)
	}
	return e.Count
}

// OutputLen is the number of elements of this rank's result.
func (e Expect) OutputLen() int64 {
	if e.Op == tensor.Reducescatter {
		return e.Count / int64(e.Ranks)
	}
	return e.Count
}

// Input is this rank's input at element i.
func (e Expect) Input(i int64) int64 { return InputValue(e.Reduce, e.DType, e.Rank, i) }

// Want is the expected result at element j of this rank's output.
func (e Expect) Want(j int64) float64 {
	n := e.Ranks
	val := func(r int, i int64) int64 { return InputValue(e.Reduce, e.DType, r, i) }
	blk := e.Count / int64(n)
	switch e.Op {
	case tensor.Broadcast:
		return Reference(tensor.Sum, e.DType, 1, func(int) int64 { return val(0, j) })
	case tensor.Allgather:
		return Reference(tensor.Sum, e.DType, 1, func(int) int64 { return val(int(j/blk), j%blk) })
	case tensor.Alltoall:
		return Reference(tensor.Sum, e.DType, 1, func(int) int64 { return val(int(j/blk), int64(e.Rank)*blk+j%blk) })
	case tensor.Reducescatter:
		return Reference(e.Reduce, e.DType, n, func(r int) int64 { return val(r, int64(e.Rank)*blk+j) })
	}
	return Reference(e.Reduce, e.DType, n, func(r int) int64 { return val(r, j) })
}

// Fill writes this rank's check input into in.
func Fill[T hvdd.Elem](e Expect, in []T) { fillRaw(e, hvdd.DTypeOf[T](), hostBytes(in)) }

// fillRaw writes this rank's check input into b, elements of dtype dt.
func fillRaw(e Expect, dt tensor.DType, b []byte) {
	es := dt.Size()
	for i := 0; i < len(b)/es; i++ {
		encodeRaw(dt, b[i*es:], e.Input(int64(i)))
	}
}

// poison overwrites b, elements of dtype dt, with a value no check input
// holds (99; true for bool).
func poison(dt tensor.DType, b []byte) {
	var v [8]byte
	es := dt.Size()
	encodeRaw(dt, v[:], 99)
	for i := 0; i+es <= len(b); i += es {
		copy(b[i:i+es], v[:es])
	}
}

// Verify compares out with the expected result and returns the number of
// wrong elements and a description of the first.
func Verify[T hvdd.Elem](e Expect, out []T) (bad int64, first string) {
	return verifyRaw(e, hvdd.DTypeOf[T](), hostBytes(out))
}

// verifyRaw is Verify of out, elements of dtype dt.
func verifyRaw(e Expect, dt tensor.DType, out []byte) (bad int64, first string) {
	es := dt.Size()
	n := int64(len(out) / es)
	if n != e.OutputLen() {
		return max(e.OutputLen(), 1), fmt.Sprintf("result has %d elements, want %d", n, e.OutputLen())
	}
	tol := Tolerance(e.DType, e.Ranks)
	for j := range n {
		got, want := decodeRaw(dt, out[j*int64(es):]), e.Want(j)
		if !Close(got, want, tol) {
			if bad == 0 {
				first = fmt.Sprintf("element %d is %v, want %v", j, got, want)
			}
			bad++
		}
	}
	return bad, first
}
