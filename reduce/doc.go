// Package reduce implements the element-wise reduction kernels of hvdd: it
// combines k equally sized host buffers with Sum, Min, Max or Product, applies
// Horovod's prescale and postscale factors, and writes the result into one or
// more destination buffers, possibly in place.
//
// It also computes Horovod's Adasum over the buffers of a power-of-two
// number of ranks (Adasum, in adasum.go), which is not element-wise: it
// combines whole vectors pairwise with coefficients from their dot products.
// AdasumSpans, AdasumPartial and AdasumFinish compute the same tree in
// pieces, for ranks spread over nodes.
//
// It is pure computation over []byte memory. It does no I/O, owns no
// buffers, keeps no state between calls and knows nothing of collectives or
// fusion; the daemon's local (shared-memory) reduction and the TCP ring
// backend call it on buffers they already hold.
//
// Buffers hold elements in host byte order with no alignment requirement. The
// element semantics follow Horovod's CPU path:
//
//   - float32 and float64 are combined in their own precision, folding the
//     sources left to right: op(op(op(s0, s1), s2), ...). Prescale multiplies
//     each source by float32(prescale) (float64 for float64) before it is
//     combined; postscale multiplies the result. No fused multiply-add is ever
//     used, so every path rounds the same way and results are bit-identical
//     between the vector and the scalar code.
//   - float16 and bfloat16 are widened exactly to float32, reduced as float32
//     and rounded back to nearest-even once per element.
//   - Integer types are summed and multiplied with wrap-around, like C. A
//     scale factor f maps x to int64(trunc(float64(x)*f)), saturated to the
//     int64 range (NaN gives 0), then wrapped to the element width.
//   - bool bytes are read as false (0) or true (anything else): Sum and Max
//     are logical OR, Min and Product logical AND, scale factors are ignored,
//     and results are written as 0 or 1.
//   - Min and Max are the plain comparisons "if b < a { a = b }" and
//     "if b > a { a = b }", folded left to right. A NaN in the first source
//     therefore sticks, a NaN in a later source is skipped, and of -0 and +0
//     the earlier one wins. The AVX2 code reproduces this exactly (VMINPS
//     with the new value as the first operand).
//
// Reduce is the main entry point; Scale and Fill are the helpers the daemon
// needs around it (Average as Sum plus postscale 1/size, identity elements
// for joined ranks), and the half-precision conversions are exported for
// clients and tests. Narrow, Widen and AddWidened (wire.go) convert whole
// buffers between float32 and a 16-bit format, reporting overflow, for the
// engines that send float32 data across nodes in 16 bits. Average is deliberately not accepted by Reduce: it is
// Sum with postscale 1/size, and the caller knows the size. Adasum is not an
// element-wise reduction: Reduce rejects it, and Adasum computes it.
//
// On amd64 the float32 and float64 loops use AVX2 assembly, float16
// conversion uses F16C and bfloat16 conversion AVX2, when the CPU has them; other architectures, older
// CPUs and the purego build tag use the portable Go loops, which produce
// identical results.
package reduce
