//go:build !amd64 || purego

package reduce

import "github.com/hvdd/hvdd/tensor"

// haveAVX2 and haveF16C are false without the amd64 assembly; they are
// variables only so tests can set them on every architecture.
var (
	haveAVX2 = false
	haveF16C = false
)

func vecChunk[T float](j *job, c, e int) int { return 0 }

func f16ToF32(dst []float32, src []uint16) { f16ToF32Go(dst, src) }

func f32ToF16(dst []uint16, src []float32) { f32ToF16Go(dst, src) }

func combineF32(op tensor.ReduceOp, acc, a, b []float32) { combine(op, acc, a, b) }

func adasumDotF32(a, b *float32, n int, acc *adasumAcc)   { panic("reduce: no assembly") }
func adasumDotF64(a, b *float64, n int, acc *adasumAcc)   { panic("reduce: no assembly") }
func adasumAxpbyF32(a, b *float32, n int, ca, cb float64) { panic("reduce: no assembly") }
func adasumAxpbyF64(a, b *float64, n int, ca, cb float64) { panic("reduce: no assembly") }

func toF16(dst []uint16, src []float32) bool             { return toF16Go(dst, src) }
func toBF16(dst []uint16, src []float32) bool            { return toBF16Go(dst, src) }
func bf16ToF32(dst []float32, src []uint16)              { bf16ToF32Go(dst, src) }
func addF16(dst []float32, src []uint16, add []float32)  { addF16Go(dst, src, add) }
func addBF16(dst []float32, src []uint16, add []float32) { addBF16Go(dst, src, add) }
