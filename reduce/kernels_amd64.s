//go:build amd64 && !purego

#include "textflag.h"

// AVX2 reduction loops; see the declarations in kernels_amd64.go.
//
// Register use:
//   DI = d0, DX = d1 (0: none), SI = &srcs[0], CX = ns,
//   AX = byte offset, BX = end offset, R8 = srcs[0],
//   R9 = source index, R10 = srcs[R9],
//   Y0-Y3 = the accumulator block (4 vectors = 128 bytes),
//   Y4-Y7 = the block of the current source, Y14 = pre, Y15 = post.
//
// For each 128-byte block the loop loads srcs[0], folds in srcs[1..ns) one
// after another (the same left-to-right order as the Go code), then stores
// to d0 and d1. All loads of a block precede its stores, which is what makes
// d0/d1 == some src safe. The accumulator stays in registers, so a block of
// the fused case dsts == srcs == {a, b} costs exactly two loads and two
// stores per vector: the 4 bytes of memory traffic per tensor byte that the
// operation needs.
//
// OPR(t, acc) folds the new vector t into acc:
//   Sum:     acc = acc + t          (VADDPS t, acc, acc)
//   Product: acc = acc * t
//   Min:     acc = t < acc ? t : acc  (VMINPS acc, t, acc: Intel's MINPS
//            returns its second operand unless first < second, so t must be
//            the first operand to get the Go code's "if b < a { a = b }")
//   Max:     acc = t > acc ? t : acc
// Multiplies by pre/post never fuse with the op (no FMA), matching Go.

#define ADDPS(t, acc) VADDPS t, acc, acc
#define MULPS(t, acc) VMULPS t, acc, acc
#define MINPS(t, acc) VMINPS acc, t, acc
#define MAXPS(t, acc) VMAXPS acc, t, acc
#define ADDPD(t, acc) VADDPD t, acc, acc
#define MULPD(t, acc) VMULPD t, acc, acc
#define MINPD(t, acc) VMINPD acc, t, acc
#define MAXPD(t, acc) VMAXPD acc, t, acc

// BODY is the whole function body. MOVU/MUL/BCAST are the PS or PD forms of
// load/store, multiply and broadcast; PRE and POST are the argument
// addresses of the scale factors.
#define BODY(OPR, MOVU, MUL, BCAST, PRE, POST) \
	MOVQ d0+0(FP), DI \
	MOVQ d1+8(FP), DX \
	MOVQ srcs+16(FP), SI \
	MOVQ ns+24(FP), CX \
	MOVQ off+32(FP), AX \
	MOVQ end+40(FP), BX \
	MOVQ (SI), R8 \
	MOVBLZX scaled+48(FP), R11 \
	TESTQ R11, R11 \
	JNZ scaledSetup \
plain: \
	CMPQ AX, BX \
	JAE done \
	MOVU (R8)(AX*1), Y0 \
	MOVU 32(R8)(AX*1), Y1 \
	MOVU 64(R8)(AX*1), Y2 \
	MOVU 96(R8)(AX*1), Y3 \
	MOVQ $1, R9 \
plainSrc: \
	CMPQ R9, CX \
	JAE plainStore \
	MOVQ (SI)(R9*8), R10 \
	MOVU (R10)(AX*1), Y4 \
	MOVU 32(R10)(AX*1), Y5 \
	MOVU 64(R10)(AX*1), Y6 \
	MOVU 96(R10)(AX*1), Y7 \
	OPR(Y4, Y0) \
	OPR(Y5, Y1) \
	OPR(Y6, Y2) \
	OPR(Y7, Y3) \
	INCQ R9 \
	JMP plainSrc \
plainStore: \
	MOVU Y0, (DI)(AX*1) \
	MOVU Y1, 32(DI)(AX*1) \
	MOVU Y2, 64(DI)(AX*1) \
	MOVU Y3, 96(DI)(AX*1) \
	TESTQ DX, DX \
	JZ plainNext \
	MOVU Y0, (DX)(AX*1) \
	MOVU Y1, 32(DX)(AX*1) \
	MOVU Y2, 64(DX)(AX*1) \
	MOVU Y3, 96(DX)(AX*1) \
plainNext: \
	ADDQ $128, AX \
	JMP plain \
scaledSetup: \
	BCAST PRE, Y14 \
	BCAST POST, Y15 \
scaledLoop: \
	CMPQ AX, BX \
	JAE done \
	MUL (R8)(AX*1), Y14, Y0 \
	MUL 32(R8)(AX*1), Y14, Y1 \
	MUL 64(R8)(AX*1), Y14, Y2 \
	MUL 96(R8)(AX*1), Y14, Y3 \
	MOVQ $1, R9 \
scaledSrc: \
	CMPQ R9, CX \
	JAE scaledStore \
	MOVQ (SI)(R9*8), R10 \
	MUL (R10)(AX*1), Y14, Y4 \
	MUL 32(R10)(AX*1), Y14, Y5 \
	MUL 64(R10)(AX*1), Y14, Y6 \
	MUL 96(R10)(AX*1), Y14, Y7 \
	OPR(Y4, Y0) \
	OPR(Y5, Y1) \
	OPR(Y6, Y2) \
	OPR(Y7, Y3) \
	INCQ R9 \
	JMP scaledSrc \
scaledStore: \
	MUL Y15, Y0, Y0 \
	MUL Y15, Y1, Y1 \
	MUL Y15, Y2, Y2 \
	MUL Y15, Y3, Y3 \
	MOVU Y0, (DI)(AX*1) \
	MOVU Y1, 32(DI)(AX*1) \
	MOVU Y2, 64(DI)(AX*1) \
	MOVU Y3, 96(DI)(AX*1) \
	TESTQ DX, DX \
	JZ scaledNext \
	MOVU Y0, (DX)(AX*1) \
	MOVU Y1, 32(DX)(AX*1) \
	MOVU Y2, 64(DX)(AX*1) \
	MOVU Y3, 96(DX)(AX*1) \
scaledNext: \
	ADDQ $128, AX \
	JMP scaledLoop \
done: \
	VZEROUPPER \
	RET

// DOTBODY is both dot kernels' body: LOAD widens (float32) or loads
// (float64) four elements at element AX into a vector; STEP is 16 for float32
// and 32 for float64, the bytes of four elements.
#define DOTBODY(LOAD, SCALE, STEP) \
	MOVQ a+0(FP), SI \
	MOVQ b+8(FP), DI \
	MOVQ n+16(FP), CX \
	MOVQ acc+24(FP), DX \
	VMOVUPD (DX), Y0 \
	VMOVUPD 32(DX), Y1 \
	VMOVUPD 64(DX), Y2 \
	VMOVUPD 96(DX), Y3 \
	VMOVUPD 128(DX), Y4 \
	VMOVUPD 160(DX), Y5 \
	XORQ AX, AX \
dotloop: \
	CMPQ AX, CX \
	JAE  dotdone \
	LOAD (SI)(AX*SCALE), Y6 \
	LOAD STEP(SI)(AX*SCALE), Y7 \
	LOAD (DI)(AX*SCALE), Y8 \
	LOAD STEP(DI)(AX*SCALE), Y9 \
	VMULPD Y6, Y8, Y10 \
	VMULPD Y7, Y9, Y11 \
	VADDPD Y10, Y0, Y0 \
	VADDPD Y11, Y1, Y1 \
	VMULPD Y6, Y6, Y12 \
	VMULPD Y7, Y7, Y13 \
	VADDPD Y12, Y2, Y2 \
	VADDPD Y13, Y3, Y3 \
	VMULPD Y8, Y8, Y14 \
	VMULPD Y9, Y9, Y15 \
	VADDPD Y14, Y4, Y4 \
	VADDPD Y15, Y5, Y5 \
	ADDQ $8, AX \
	JMP  dotloop \
dotdone: \
	VMOVUPD Y0, (DX) \
	VMOVUPD Y1, 32(DX) \
	VMOVUPD Y2, 64(DX) \
	VMOVUPD Y3, 96(DX) \
	VMOVUPD Y4, 128(DX) \
	VMOVUPD Y5, 160(DX) \
	VZEROUPPER \
	RET

// func sumF32(d0, d1 unsafe.Pointer, srcs *unsafe.Pointer, ns, off, end int, scaled bool, pre, post float32)
TEXT ·sumF32(SB), NOSPLIT, $0-60
	BODY(ADDPS, VMOVUPS, VMULPS, VBROADCASTSS, pre+52(FP), post+56(FP))

// func prodF32(d0, d1 unsafe.Pointer, srcs *unsafe.Pointer, ns, off, end int, scaled bool, pre, post float32)
TEXT ·prodF32(SB), NOSPLIT, $0-60
	BODY(MULPS, VMOVUPS, VMULPS, VBROADCASTSS, pre+52(FP), post+56(FP))

// func minF32(d0, d1 unsafe.Pointer, srcs *unsafe.Pointer, ns, off, end int, scaled bool, pre, post float32)
TEXT ·minF32(SB), NOSPLIT, $0-60
	BODY(MINPS, VMOVUPS, VMULPS, VBROADCASTSS, pre+52(FP), post+56(FP))

// func maxF32(d0, d1 unsafe.Pointer, srcs *unsafe.Pointer, ns, off, end int, scaled bool, pre, post float32)
TEXT ·maxF32(SB), NOSPLIT, $0-60
	BODY(MAXPS, VMOVUPS, VMULPS, VBROADCASTSS, pre+52(FP), post+56(FP))

// func sumF64(d0, d1 unsafe.Pointer, srcs *unsafe.Pointer, ns, off, end int, scaled bool, pre, post float64)
TEXT ·sumF64(SB), NOSPLIT, $0-72
	BODY(ADDPD, VMOVUPD, VMULPD, VBROADCASTSD, pre+56(FP), post+64(FP))

// func prodF64(d0, d1 unsafe.Pointer, srcs *unsafe.Pointer, ns, off, end int, scaled bool, pre, post float64)
TEXT ·prodF64(SB), NOSPLIT, $0-72
	BODY(MULPD, VMOVUPD, VMULPD, VBROADCASTSD, pre+56(FP), post+64(FP))

// func minF64(d0, d1 unsafe.Pointer, srcs *unsafe.Pointer, ns, off, end int, scaled bool, pre, post float64)
TEXT ·minF64(SB), NOSPLIT, $0-72
	BODY(MINPD, VMOVUPD, VMULPD, VBROADCASTSD, pre+56(FP), post+64(FP))

// func maxF64(d0, d1 unsafe.Pointer, srcs *unsafe.Pointer, ns, off, end int, scaled bool, pre, post float64)
TEXT ·maxF64(SB), NOSPLIT, $0-72
	BODY(MAXPD, VMOVUPD, VMULPD, VBROADCASTSD, pre+56(FP), post+64(FP))

// func cvtF16ToF32(dst *float32, src *uint16, n int)
TEXT ·cvtF16ToF32(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	XORQ AX, AX
	CMPQ CX, $32
	JB   tail8

loop32:
	VCVTPH2PS (SI)(AX*2), Y0
	VCVTPH2PS 16(SI)(AX*2), Y1
	VCVTPH2PS 32(SI)(AX*2), Y2
	VCVTPH2PS 48(SI)(AX*2), Y3
	VMOVUPS   Y0, (DI)(AX*4)
	VMOVUPS   Y1, 32(DI)(AX*4)
	VMOVUPS   Y2, 64(DI)(AX*4)
	VMOVUPS   Y3, 96(DI)(AX*4)
	ADDQ      $32, AX
	LEAQ      32(AX), R8
	CMPQ      R8, CX
	JBE       loop32

tail8:
	CMPQ AX, CX
	JAE  cvt1done
	VCVTPH2PS (SI)(AX*2), Y0
	VMOVUPS   Y0, (DI)(AX*4)
	ADDQ      $8, AX
	JMP       tail8

cvt1done:
	VZEROUPPER
	RET

// func cvtF32ToF16(dst *uint16, src *float32, n int)
TEXT ·cvtF32ToF16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	XORQ AX, AX
	CMPQ CX, $32
	JB   tail8

loop32:
	VMOVUPS   (SI)(AX*4), Y0
	VMOVUPS   32(SI)(AX*4), Y1
	VMOVUPS   64(SI)(AX*4), Y2
	VMOVUPS   96(SI)(AX*4), Y3
	VCVTPS2PH $0, Y0, (DI)(AX*2)
	VCVTPS2PH $0, Y1, 16(DI)(AX*2)
	VCVTPS2PH $0, Y2, 32(DI)(AX*2)
	VCVTPS2PH $0, Y3, 48(DI)(AX*2)
	ADDQ      $32, AX
	LEAQ      32(AX), R8
	CMPQ      R8, CX
	JBE       loop32

tail8:
	CMPQ AX, CX
	JAE  cvt2done
	VMOVUPS   (SI)(AX*4), Y0
	VCVTPS2PH $0, Y0, (DI)(AX*2)
	ADDQ      $8, AX
	JMP       tail8

cvt2done:
	VZEROUPPER
	RET

// Adasum's kernels. Lanes: Y0/Y1 = dot lanes 0-3/4-7, Y2/Y3 = ‖a‖² lanes,
// Y4/Y5 = ‖b‖² lanes (acc[0:8], acc[8:16], acc[16:24]). Products are rounded
// before they are added (VMULPD then VADDPD, no FMA), as the Go loops do.

// func adasumDotF32(a, b *float32, n int, acc *adasumAcc)
TEXT ·adasumDotF32(SB), NOSPLIT, $0-32
	DOTBODY(VCVTPS2PD, 4, 16)

// func adasumDotF64(a, b *float64, n int, acc *adasumAcc)
TEXT ·adasumDotF64(SB), NOSPLIT, $0-32
	DOTBODY(VMOVUPD, 8, 32)

// func adasumAxpbyF32(a, b *float32, n int, ca, cb float64)
TEXT ·adasumAxpbyF32(SB), NOSPLIT, $0-40
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DI
	MOVQ n+16(FP), CX
	VBROADCASTSD ca+24(FP), Y14
	VBROADCASTSD cb+32(FP), Y15
	XORQ AX, AX
axf32loop:
	CMPQ AX, CX
	JAE  axf32done
	VCVTPS2PD (SI)(AX*4), Y0
	VCVTPS2PD 16(SI)(AX*4), Y1
	VCVTPS2PD (DI)(AX*4), Y2
	VCVTPS2PD 16(DI)(AX*4), Y3
	VMULPD Y14, Y0, Y0
	VMULPD Y14, Y1, Y1
	VMULPD Y15, Y2, Y2
	VMULPD Y15, Y3, Y3
	VADDPD Y2, Y0, Y0
	VADDPD Y3, Y1, Y1
	VCVTPD2PSY Y0, X0
	VCVTPD2PSY Y1, X1
	VMOVUPS X0, (SI)(AX*4)
	VMOVUPS X1, 16(SI)(AX*4)
	ADDQ $8, AX
	JMP  axf32loop
axf32done:
	VZEROUPPER
	RET

// func adasumAxpbyF64(a, b *float64, n int, ca, cb float64)
TEXT ·adasumAxpbyF64(SB), NOSPLIT, $0-40
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DI
	MOVQ n+16(FP), CX
	VBROADCASTSD ca+24(FP), Y14
	VBROADCASTSD cb+32(FP), Y15
	XORQ AX, AX
axf64loop:
	CMPQ AX, CX
	JAE  axf64done
	VMULPD (SI)(AX*8), Y14, Y0
	VMULPD 32(SI)(AX*8), Y14, Y1
	VMULPD (DI)(AX*8), Y15, Y2
	VMULPD 32(DI)(AX*8), Y15, Y3
	VADDPD Y2, Y0, Y0
	VADDPD Y3, Y1, Y1
	VMOVUPD Y0, (SI)(AX*8)
	VMOVUPD Y1, 32(SI)(AX*8)
	ADDQ $8, AX
	JMP  axf64loop
axf64done:
	VZEROUPPER
	RET

// Wire conversions (wire.go): float32 <-> float16/bfloat16 batches for the
// cross-node engines' 16-bit transport, with the overflow check the
// narrowing ones need.
//
// A float32 x overflows a 16-bit format when it is finite and rounds to
// ±Inf: |x| >= 65520 (0x477ff000) for float16, |x| >= 0x7f7f8000 (bits) for
// bfloat16 (both ties to the even Inf). On the bit patterns with the sign
// cleared, which order like the magnitudes as signed 32-bit integers, that is
// lo <= |x| < 0x7f800000, two VPCMPGTD. The narrowing kernels OR the
// per-lane results into Y12 and report whether any lane was set.

// func narrowF16(dst *uint16, src *float32, n int) bool
TEXT ·narrowF16(SB), NOSPLIT, $0-25
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL $0x7fffffff, AX
	VMOVD AX, X13
	VPBROADCASTD X13, Y13 // sign mask
	MOVL $0x477fefff, AX
	VMOVD AX, X14
	VPBROADCASTD X14, Y14 // overflow threshold - 1
	MOVL $0x7f800000, AX
	VMOVD AX, X15
	VPBROADCASTD X15, Y15 // +Inf
	VPXOR Y12, Y12, Y12
	XORQ AX, AX

nf16loop:
	CMPQ AX, CX
	JAE  nf16done
	VMOVUPS   (SI)(AX*4), Y0
	VMOVUPS   32(SI)(AX*4), Y4
	VCVTPS2PH $0, Y0, (DI)(AX*2)
	VCVTPS2PH $0, Y4, 16(DI)(AX*2)
	VPAND     Y13, Y0, Y1
	VPAND     Y13, Y4, Y5
	VPCMPGTD  Y14, Y1, Y2 // |x| > threshold-1
	VPCMPGTD  Y14, Y5, Y6
	VPCMPGTD  Y1, Y15, Y3 // Inf > |x|: finite
	VPCMPGTD  Y5, Y15, Y7
	VPAND     Y3, Y2, Y2
	VPAND     Y7, Y6, Y6
	VPOR      Y2, Y12, Y12
	VPOR      Y6, Y12, Y12
	ADDQ      $16, AX
	JMP       nf16loop

nf16done:
	VPTEST Y12, Y12
	SETNE  ret+24(FP)
	VZEROUPPER
	RET

// NARROWBF16(x, t, u) rounds the eight float32 lanes of x to bfloat16 in the
// low words of its dwords and accumulates their overflow into Y12; t and u
// are scratch. With b the bits of x:
//
//	rounded = (b + 0x7fff + ((b >> 16) & 1)) >> 16   nearest, ties to even
//	nan     = ((b >> 16) | 0x40)                      when |b| > 0x7f800000
//
// as Float32ToBFloat16 computes (the carry of the rounding add runs into the
// exponent, up to Inf, which is right). Y8 = 1, Y9 = 0x7fff, Y10 = 0x40,
// Y11 = the overflow threshold - 1, Y13 = sign mask, Y15 = +Inf.
#define NARROWBF16(x, t, u) \
	VPSRLD    $16, x, t \
	VPAND     Y8, t, t \
	VPADDD    Y9, t, t \
	VPADDD    x, t, t \
	VPSRLD    $16, t, t \
	VPAND     Y13, x, u \
	VPCMPGTD  Y11, u, Y2 \
	VPCMPGTD  u, Y15, Y3 \
	VPAND     Y3, Y2, Y2 \
	VPOR      Y2, Y12, Y12 \
	VPCMPGTD  Y15, u, u \
	VPSRLD    $16, x, x \
	VPOR      Y10, x, x \
	VPBLENDVB u, x, t, x

// func narrowBF16(dst *uint16, src *float32, n int) bool
TEXT ·narrowBF16(SB), NOSPLIT, $0-25
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL $1, AX
	VMOVD AX, X8
	VPBROADCASTD X8, Y8
	MOVL $0x7fff, AX
	VMOVD AX, X9
	VPBROADCASTD X9, Y9
	MOVL $0x40, AX
	VMOVD AX, X10
	VPBROADCASTD X10, Y10
	MOVL $0x7f7f7fff, AX
	VMOVD AX, X11
	VPBROADCASTD X11, Y11
	MOVL $0x7fffffff, AX
	VMOVD AX, X13
	VPBROADCASTD X13, Y13
	MOVL $0x7f800000, AX
	VMOVD AX, X15
	VPBROADCASTD X15, Y15
	VPXOR Y12, Y12, Y12
	XORQ AX, AX

nbf16loop:
	CMPQ AX, CX
	JAE  nbf16done
	VMOVDQU (SI)(AX*4), Y0
	VMOVDQU 32(SI)(AX*4), Y4
	NARROWBF16(Y0, Y1, Y5)
	NARROWBF16(Y4, Y6, Y7)
	// Each dword now holds a bfloat16 in its low word. VPACKUSDW packs
	// within 128-bit lanes (Y0 lo, Y4 lo, Y0 hi, Y4 hi); VPERMQ puts the
	// quadwords back in order.
	VPACKUSDW Y4, Y0, Y0
	VPERMQ    $0xd8, Y0, Y0
	VMOVDQU   Y0, (DI)(AX*2)
	ADDQ      $16, AX
	JMP       nbf16loop

nbf16done:
	VPTEST Y12, Y12
	SETNE  ret+24(FP)
	VZEROUPPER
	RET

// func widenBF16(dst *float32, src *uint16, n int)
TEXT ·widenBF16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	XORQ AX, AX

wbf16loop:
	CMPQ AX, CX
	JAE  wbf16done
	VPMOVZXWD (SI)(AX*2), Y0
	VPMOVZXWD 16(SI)(AX*2), Y1
	VPSLLD    $16, Y0, Y0
	VPSLLD    $16, Y1, Y1
	VMOVDQU   Y0, (DI)(AX*4)
	VMOVDQU   Y1, 32(DI)(AX*4)
	ADDQ      $16, AX
	JMP       wbf16loop

wbf16done:
	VZEROUPPER
	RET

// The adding widenings compute dst = widen(src) + add, the widened value
// the first operand of VADDPS (Intel's src1), as Go's widen(h) + w: of two
// NaNs the widened one's payload wins.

// func addWidenF16(dst *float32, src *uint16, add *float32, n int)
TEXT ·addWidenF16(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ add+16(FP), DX
	MOVQ n+24(FP), CX
	XORQ AX, AX

awf16loop:
	CMPQ AX, CX
	JAE  awf16done
	VCVTPH2PS (SI)(AX*2), Y0
	VCVTPH2PS 16(SI)(AX*2), Y1
	VADDPS    (DX)(AX*4), Y0, Y0
	VADDPS    32(DX)(AX*4), Y1, Y1
	VMOVUPS   Y0, (DI)(AX*4)
	VMOVUPS   Y1, 32(DI)(AX*4)
	ADDQ      $16, AX
	JMP       awf16loop

awf16done:
	VZEROUPPER
	RET

// func addWidenBF16(dst *float32, src *uint16, add *float32, n int)
TEXT ·addWidenBF16(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ add+16(FP), DX
	MOVQ n+24(FP), CX
	XORQ AX, AX

awbf16loop:
	CMPQ AX, CX
	JAE  awbf16done
	VPMOVZXWD (SI)(AX*2), Y0
	VPMOVZXWD 16(SI)(AX*2), Y1
	VPSLLD    $16, Y0, Y0
	VPSLLD    $16, Y1, Y1
	VADDPS    (DX)(AX*4), Y0, Y0
	VADDPS    32(DX)(AX*4), Y1, Y1
	VMOVUPS   Y0, (DI)(AX*4)
	VMOVUPS   Y1, 32(DI)(AX*4)
	ADDQ      $16, AX
	JMP       awbf16loop

awbf16done:
	VZEROUPPER
	RET
