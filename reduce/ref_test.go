package reduce

import (
	"encoding/binary"
	"math"

	"github.com/hvdd/hvdd/tensor"
)

// refReduce is the deliberately naive reference: one element at a time,
// decoded with encoding/binary, folded left to right, written to a fresh
// buffer. It shares only the half-precision conversions with the package
// (those are checked on their own in half_test.go).
func refReduce(srcs [][]byte, dt tensor.DType, op tensor.ReduceOp, pre, post float64) []byte {
	sz := dt.Size()
	n := len(srcs[0]) / sz
	out := make([]byte, n*sz)
	for i := 0; i < n; i++ {
		switch dt {
		case tensor.Float32, tensor.Float16, tensor.BFloat16:
			var acc float32
			for k, s := range srcs {
				v := refGetF32(s, i, dt)
				if pre != 1 {
					v = float32(v * float32(pre))
				}
				if k == 0 {
					acc = v
				} else {
					acc = refOpF32(op, acc, v)
				}
			}
			if post != 1 {
				acc = float32(acc * float32(post))
			}
			refPutF32(out, i, dt, acc)
		case tensor.Float64:
			var acc float64
			for k, s := range srcs {
				v := math.Float64frombits(binary.LittleEndian.Uint64(s[i*8:]))
				if pre != 1 {
					v = float64(v * pre)
				}
				if k == 0 {
					acc = v
				} else {
					switch op {
					case tensor.Sum:
						acc = acc + v
					case tensor.Product:
						acc = acc * v
					case tensor.Min:
						if v < acc {
							acc = v
						}
					case tensor.Max:
						if v > acc {
							acc = v
						}
					}
				}
			}
			if post != 1 {
				acc = float64(acc * post)
			}
			binary.LittleEndian.PutUint64(out[i*8:], math.Float64bits(acc))
		case tensor.Bool:
			acc := srcs[0][i] != 0
			for _, s := range srcs[1:] {
				if op == tensor.Sum || op == tensor.Max {
					acc = acc || s[i] != 0
				} else {
					acc = acc && s[i] != 0
				}
			}
			if acc {
				out[i] = 1
			}
		default: // integers: exact int64 arithmetic, wrapped to the width
			var acc int64
			for k, s := range srcs {
				v := refGetInt(s, i, dt)
				if pre != 1 {
					v = refWrap(refScaleInt(v, pre), dt)
				}
				if k == 0 {
					acc = v
					continue
				}
				switch op {
				case tensor.Sum:
					acc = refWrap(acc+v, dt)
				case tensor.Product:
					acc = refWrap(acc*v, dt)
				case tensor.Min:
					acc = min(acc, v)
				case tensor.Max:
					acc = max(acc, v)
				}
			}
			if post != 1 {
				acc = refWrap(refScaleInt(acc, post), dt)
			}
			refPutInt(out, i, dt, acc)
		}
	}
	return out
}

func refOpF32(op tensor.ReduceOp, a, b float32) float32 {
	switch op {
	case tensor.Sum:
		return a + b
	case tensor.Product:
		return a * b
	case tensor.Min:
		if b < a {
			return b
		}
	case tensor.Max:
		if b > a {
			return b
		}
	}
	return a
}

func refGetF32(s []byte, i int, dt tensor.DType) float32 {
	switch dt {
	case tensor.Float16:
		return Float16ToFloat32(binary.LittleEndian.Uint16(s[i*2:]))
	case tensor.BFloat16:
		return BFloat16ToFloat32(binary.LittleEndian.Uint16(s[i*2:]))
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(s[i*4:]))
}

func refPutF32(out []byte, i int, dt tensor.DType, v float32) {
	switch dt {
	case tensor.Float16:
		binary.LittleEndian.PutUint16(out[i*2:], Float32ToFloat16(v))
	case tensor.BFloat16:
		binary.LittleEndian.PutUint16(out[i*2:], Float32ToBFloat16(v))
	default:
		binary.LittleEndian.PutUint32(out[i*4:], math.Float32bits(v))
	}
}

func refGetInt(s []byte, i int, dt tensor.DType) int64 {
	switch dt {
	case tensor.Uint8:
		return int64(s[i])
	case tensor.Int8:
		return int64(int8(s[i]))
	case tensor.Uint16:
		return int64(binary.LittleEndian.Uint16(s[i*2:]))
	case tensor.Int16:
		return int64(int16(binary.LittleEndian.Uint16(s[i*2:])))
	case tensor.Int32:
		return int64(int32(binary.LittleEndian.Uint32(s[i*4:])))
	}
	return int64(binary.LittleEndian.Uint64(s[i*8:]))
}

func refPutInt(out []byte, i int, dt tensor.DType, v int64) {
	switch dt.Size() {
	case 1:
		out[i] = byte(v)
	case 2:
		binary.LittleEndian.PutUint16(out[i*2:], uint16(v))
	case 4:
		binary.LittleEndian.PutUint32(out[i*4:], uint32(v))
	default:
		binary.LittleEndian.PutUint64(out[i*8:], uint64(v))
	}
}

// refWrap reduces v modulo the width of dt into dt's range.
func refWrap(v int64, dt tensor.DType) int64 {
	switch dt {
	case tensor.Uint8:
		return v & 0xff
	case tensor.Int8:
		return int64(int8(v))
	case tensor.Uint16:
		return v & 0xffff
	case tensor.Int16:
		return int64(int16(v))
	case tensor.Int32:
		return int64(int32(v))
	}
	return v
}

func refScaleInt(v int64, f float64) int64 {
	x := math.Trunc(float64(v) * f)
	switch {
	case math.IsNaN(x):
		return 0
	case x >= math.MaxInt64:
		return math.MaxInt64
	case x <= math.MinInt64:
		return math.MinInt64
	}
	return int64(x)
}

// sameBits compares two encoded buffers element by element, treating any two
// NaNs of a float type as equal; it returns the first differing index or -1.
func sameBits(a, b []byte, dt tensor.DType) int {
	sz := dt.Size()
	for i := 0; i < len(a)/sz; i++ {
		x, y := a[i*sz:(i+1)*sz], b[i*sz:(i+1)*sz]
		if string(x) == string(y) {
			continue
		}
		if dt.IsFloat() && isNaNAt(x, dt) && isNaNAt(y, dt) {
			continue
		}
		return i
	}
	return -1
}

func isNaNAt(x []byte, dt tensor.DType) bool {
	switch dt {
	case tensor.Float64:
		return math.IsNaN(math.Float64frombits(binary.LittleEndian.Uint64(x)))
	case tensor.Float32:
		return math.IsNaN(float64(math.Float32frombits(binary.LittleEndian.Uint32(x))))
	}
	h := binary.LittleEndian.Uint16(x)
	if dt == tensor.Float16 {
		return h&0x7c00 == 0x7c00 && h&0x3ff != 0
	}
	return h&0x7f80 == 0x7f80 && h&0x7f != 0
}
