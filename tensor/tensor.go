// Package tensor defines the vocabulary every other hvdd package shares: element
// types, reduction ops and collective kinds, with their sizes and names.
//
// It does no I/O and holds no state. The numbering of DType, OpType and ReduceOp
// is the same as the wire enums in ipc/ipcpb, so conversion is a cast.
package tensor

import (
	"fmt"
	"strconv"
	"strings"
)

// DType is an element type.
type DType uint8

// Element types. The values equal ipcpb.DType's.
const (
	Invalid DType = iota
	Uint8
	Int8
	Uint16
	Int16
	Int32
	Int64
	Float16
	BFloat16
	Float32
	Float64
	Bool
	numDTypes
)

var dtypeInfo = [numDTypes]struct {
	name string
	size int
}{
	Invalid:  {"invalid", 0},
	Uint8:    {"uint8", 1},
	Int8:     {"int8", 1},
	Uint16:   {"uint16", 2},
	Int16:    {"int16", 2},
	Int32:    {"int32", 4},
	Int64:    {"int64", 8},
	Float16:  {"float16", 2},
	BFloat16: {"bfloat16", 2},
	Float32:  {"float32", 4},
	Float64:  {"float64", 8},
	Bool:     {"bool", 1},
}

// Size is the element size in bytes; 0 for an invalid type.
func (d DType) Size() int {
	if d >= numDTypes {
		return 0
	}
	return dtypeInfo[d].size
}

// Valid reports whether d names a real element type.
func (d DType) Valid() bool { return d > Invalid && d < numDTypes }

// String returns Horovod's name for the type ("float32").
func (d DType) String() string {
	if d >= numDTypes {
		return fmt.Sprintf("dtype(%d)", uint8(d))
	}
	return dtypeInfo[d].name
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool {
	return d == Float16 || d == BFloat16 || d == Float32 || d == Float64
}

// DTypes lists every valid element type.
func DTypes() []DType {
	out := make([]DType, 0, numDTypes-1)
	for d := Uint8; d < numDTypes; d++ {
		out = append(out, d)
	}
	return out
}

// ParseDType parses a type name as String prints it; "fp32", "f32", "float",
// "half", "bf16" and similar short forms are accepted too.
func ParseDType(s string) (DType, error) {
	switch strings.ToLower(s) {
	case "f16", "fp16", "half":
		return Float16, nil
	case "bf16":
		return BFloat16, nil
	case "f32", "fp32", "float":
		return Float32, nil
	case "f64", "fp64", "double":
		return Float64, nil
	case "i8":
		return Int8, nil
	case "u8", "byte":
		return Uint8, nil
	case "i16":
		return Int16, nil
	case "u16":
		return Uint16, nil
	case "i32", "int":
		return Int32, nil
	case "i64", "long":
		return Int64, nil
	}
	for d := Uint8; d < numDTypes; d++ {
		if dtypeInfo[d].name == strings.ToLower(s) {
			return d, nil
		}
	}
	return Invalid, fmt.Errorf("unknown dtype %q (want one of uint8, int8, uint16, int16, int32, int64, float16, bfloat16, float32, float64, bool)", s)
}

// ReduceOp is a reduction. The values are Horovod's (Average = 0 ... Product = 5).
type ReduceOp uint8

// Reductions, numbered as in Horovod.
const (
	Average ReduceOp = iota
	Sum
	Adasum
	Min
	Max
	Product
	numReduceOps
)

var reduceNames = [numReduceOps]string{"Average", "Sum", "Adasum", "Min", "Max", "Product"}

// String returns Horovod's name for the op ("Sum").
func (r ReduceOp) String() string {
	if r >= numReduceOps {
		return fmt.Sprintf("reduceop(%d)", uint8(r))
	}
	return reduceNames[r]
}

// Valid reports whether r names a real reduction.
func (r ReduceOp) Valid() bool { return r < numReduceOps }

// ParseReduceOp parses a reduction name, case-insensitively.
func ParseReduceOp(s string) (ReduceOp, error) {
	for r := ReduceOp(0); r < numReduceOps; r++ {
		if strings.EqualFold(reduceNames[r], s) {
			return r, nil
		}
	}
	return 0, fmt.Errorf("unknown reduce op %q (want Average, Sum, Adasum, Min, Max or Product)", s)
}

// OpType is a collective kind. The values equal ipcpb.OpType's.
type OpType uint8

// Collective kinds.
const (
	OpInvalid OpType = iota
	Allreduce
	Allgather
	Broadcast
	Alltoall
	Reducescatter
	Barrier
	Join
	// Send and Recv are point to point: two ranks take part (daemon/p2p).
	Send
	Recv
	numOpTypes
)

var opNames = [numOpTypes]string{"INVALID", "ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER", "BARRIER", "JOIN", "SEND", "RECV"}

// String returns Horovod's upper-case name ("ALLREDUCE").
func (o OpType) String() string {
	if o >= numOpTypes {
		return fmt.Sprintf("optype(%d)", uint8(o))
	}
	return opNames[o]
}

// Lower returns the name in lower case ("allreduce"), as Horovod's messages
// and tensor-name prefixes spell it.
func (o OpType) Lower() string { return strings.ToLower(o.String()) }

// Valid reports whether o names a real collective.
func (o OpType) Valid() bool { return o > OpInvalid && o < numOpTypes }

// ParseOpType parses a collective's name, case-insensitively ("allreduce"):
// one of the ops every rank of a set takes part in (not Send or Recv).
func ParseOpType(s string) (OpType, error) {
	for o := Allreduce; o <= Join; o++ {
		if strings.EqualFold(opNames[o], s) {
			return o, nil
		}
	}
	return OpInvalid, fmt.Errorf("unknown collective %q (want allreduce, allgather, broadcast, alltoall, reducescatter, barrier or join)", s)
}

// Shape is a tensor shape.
type Shape []int64

// NumElements is the product of the dimensions (1 for a scalar).
func (s Shape) NumElements() int64 {
	n := int64(1)
	for _, d := range s {
		n *= d
	}
	return n
}

// RowElements is the number of elements per first-dimension row (the product
// of every dimension but the first; 1 for a scalar or a vector).
func (s Shape) RowElements() int64 {
	if len(s) <= 1 {
		return 1
	}
	return Shape(s[1:]).NumElements()
}

// Equal reports whether two shapes are identical.
func (s Shape) Equal(o Shape) bool {
	if len(s) != len(o) {
		return false
	}
	for i := range s {
		if s[i] != o[i] {
			return false
		}
	}
	return true
}

// String formats the shape as Horovod does: "[17, 17, 17]".
func (s Shape) String() string {
	b := make([]byte, 0, 2+len(s)*6)
	b = append(b, '[')
	for i, d := range s {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendInt(b, d, 10)
	}
	return string(append(b, ']'))
}
