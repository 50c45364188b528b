package backendtest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"github.com/hvdd/hvdd/reduce"
	"github.com/hvdd/hvdd/tensor"
)

// The references below are deliberately naive: one element at a time,
// decoded to float64, int64 or bool, folded in rank order and encoded back.
// They use the reduce package only for the half-precision conversions.

var le = binary.LittleEndian

// Fill returns count elements of dt drawn from r with values for which op is
// exact in any order of combination over up to 16 ranks: integers in [-4, 4]
// for float Sum, Min and Max; ±0.5, ±1, ±2 for float Product; any value for
// integer types (their arithmetic wraps, which is associative); 0 or 1 for
// bool.
func Fill(r *rand.Rand, dt tensor.DType, op tensor.ReduceOp, count int) []byte {
	sz := dt.Size()
	b := make([]byte, count*sz)
	for i := range count {
		e := b[i*sz : (i+1)*sz]
		switch {
		case dt == tensor.Bool:
			e[0] = byte(r.IntN(2))
		case dt.IsFloat():
			var v float64
			if op == tensor.Product {
				v = []float64{-2, -1, -0.5, 0.5, 1, 2}[r.IntN(6)]
			} else {
				v = float64(r.IntN(9) - 4)
			}
			putFloat(e, dt, v)
		default:
			for j := range e {
				e[j] = byte(r.Uint32())
			}
		}
	}
	return b
}

// Reduce is the reference reduction: element-wise op over the ranks' buffers
// (all of one length), folded in rank order.
func Reduce(in [][]byte, dt tensor.DType, op tensor.ReduceOp) []byte {
	sz := dt.Size()
	out := bytes.Clone(in[0])
	for i := 0; i < len(out)/sz; i++ {
		e := out[i*sz : (i+1)*sz]
		switch {
		case dt == tensor.Bool:
			acc := in[0][i] != 0
			for _, s := range in[1:] {
				v := s[i] != 0
				if op == tensor.Sum || op == tensor.Max {
					acc = acc || v
				} else {
					acc = acc && v
				}
			}
			if len(in) > 1 {
				e[0] = 0
				if acc {
					e[0] = 1
				}
			}
		case dt.IsFloat():
			acc := getFloat(in[0][i*sz:], dt)
			for _, s := range in[1:] {
				v := getFloat(s[i*sz:], dt)
				switch op {
				case tensor.Sum:
					acc += v
				case tensor.Product:
					acc *= v
				case tensor.Min:
					acc = math.Min(acc, v)
				case tensor.Max:
					acc = math.Max(acc, v)
				}
			}
			putFloat(e, dt, acc)
		default:
			acc := getInt(in[0][i*sz:], dt)
			for _, s := range in[1:] {
				v := getInt(s[i*sz:], dt)
				switch op {
				case tensor.Sum:
					acc += v
				case tensor.Product:
					acc *= v
				case tensor.Min:
					acc = min(acc, v)
				case tensor.Max:
					acc = max(acc, v)
				}
			}
			putInt(e, dt, acc)
		}
	}
	return out
}

func getFloat(b []byte, dt tensor.DType) float64 {
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

func putFloat(b []byte, dt tensor.DType, v float64) {
	switch dt {
	case tensor.Float16:
		le.PutUint16(b, reduce.Float32ToFloat16(float32(v)))
	case tensor.BFloat16:
		le.PutUint16(b, reduce.Float32ToBFloat16(float32(v)))
	case tensor.Float32:
		le.PutUint32(b, math.Float32bits(float32(v)))
	default:
		le.PutUint64(b, math.Float64bits(v))
	}
}

// getInt decodes an integer element, sign- or zero-extended to int64.
func getInt(b []byte, dt tensor.DType) int64 {
	switch dt {
	case tensor.Uint8:
		return int64(b[0])
	case tensor.Int8:
		return int64(int8(b[0]))
	case tensor.Uint16:
		return int64(le.Uint16(b))
	case tensor.Int16:
		return int64(int16(le.Uint16(b)))
	case tensor.Int32:
		return int64(int32(le.Uint32(b)))
	}
	return int64(le.Uint64(b))
}

// putInt encodes the low bits of v (wrap-around to the element width).
func putInt(b []byte, dt tensor.DType, v int64) {
	switch dt.Size() {
	case 1:
		b[0] = byte(v)
	case 2:
		le.PutUint16(b, uint16(v))
	case 4:
		le.PutUint32(b, uint32(v))
	default:
		le.PutUint64(b, uint64(v))
	}
}

// diff returns the index of the first element where got and want differ
// bitwise, or -1 when they are identical.
func diff(got, want []byte, dt tensor.DType) int {
	if len(got) != len(want) {
		return 0
	}
	sz := dt.Size()
	for i := 0; i < len(got); i += sz {
		if !bytes.Equal(got[i:i+sz], want[i:i+sz]) {
			return i / sz
		}
	}
	return -1
}

func elem(b []byte, dt tensor.DType, i int) []byte {
	if (i+1)*dt.Size() > len(b) {
		return nil
	}
	return b[i*dt.Size() : (i+1)*dt.Size()]
}

// column formats element i of every rank's input, for failure messages.
func column(in [][]byte, dt tensor.DType, i int) string {
	var s []string
	for _, b := range in {
		s = append(s, fmt.Sprintf("%x", elem(b, dt, i)))
	}
	return "[" + strings.Join(s, " ") + "]"
}
