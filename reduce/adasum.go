package reduce

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/hvdd/hvdd/tensor"
)

// Adasum, the adaptive summation of Maleki et al. ("Scaling Distributed
// Training with Adaptive Summation", MLSys 2021), computed as Horovod's CPU
// code computes it (horovod/common/ops/adasum/adasum.h).
//
// The pairwise combination. For two vectors a and b,
//
//	adasum(a, b) = (1 - a·b / (2‖a‖²))·a + (1 - a·b / (2‖b‖²))·b
//
// It is a+b when a and b are orthogonal and a when they are equal (each
// gets weight 1/2): parallel gradients are averaged, orthogonal ones summed.
// A coefficient whose squared norm is below √DBL_MIN = 2^-511 is 1 instead,
// as in Horovod, so a zero vector (a joined rank's) leaves the other one
// unchanged rather than dividing by zero.
//
// Over ranks. Horovod reduces 2^k ranks by vector halving, distance
// doubling: at level L = 1, 2, 4, ..., rank r exchanges half of what it
// holds with rank r^L, the two ranks combine their halves, and the dot
// product and norms are summed over the 2L ranks that hold pieces of the
// same two vectors, so that the coefficients are those of the whole
// vectors. The halving only spreads the work; the values are those of the
// tree
//
//	level 1: x01 = adasum(x0, x1),  x23 = adasum(x2, x3),  ...
//	level 2: x0123 = adasum(x01, x23),  ...
//
// whose root every rank receives in the distance-halving phase. The lower
// group is always the first operand (it matters only for rounding: the
// combination is symmetric). Adasum is not associative, so this pairing
// order is part of the result, and so is the power-of-two rule: Horovod
// refuses other rank counts, and so does Adasum here.
//
// Rounding, as in Horovod:
//
//   - each level's result is stored in the tensor's dtype, so it is rounded
//     once per level;
//   - dot products and squared norms are accumulated in float64 over values
//     widened to float64 (products of float16 and float32 values are exact
//     there). Horovod adds the per-rank partial sums of a level with an MPI
//     allreduce, in an order that depends on the rank count; here a tensor is
//     cut into blocks of adasumBlock elements whose partial sums are added in
//     block order, so the result does not depend on the number of goroutines,
//     and within a block into 8 lanes (element i into lane i mod 8, the
//     lanes added last) that AVX2 computes four at a time
//     (adasum_kernels.go);
//   - float32 and float64: a' = ca·a + cb·b in float64, rounded to the dtype
//     once (each product is rounded to float64 first: no fused multiply-add);
//   - float16, as Horovod's F16C path: the coefficients are rounded to
//     float32, a·ca is rounded to float32, b·cb is added to it (Horovod uses
//     a float32 FMA; here the product is exact in float64 and the sum is
//     rounded through float64, which differs only in rare double-rounding
//     ties), and the sum is rounded to float16.
//
// Prescale multiplies every rank's input before the first level and
// postscale the result after the last, with Scale's rules, as Horovod's
// AdasumMPIAllreduceOp scales its fusion buffer around the reduction.

// adasumBlock is the number of elements one partial dot product covers.
const adasumBlock = 1 << 14

// adasumMinNormSq is √DBL_MIN, Horovod's threshold below which a squared
// norm leaves its coefficient at 1.
const adasumMinNormSq = 0x1p-511

// AdasumDType reports whether Adasum reduces elements of dt: float16,
// float32 and float64, the types Horovod's Adasum has.
func AdasumDType(dt tensor.DType) bool {
	return dt == tensor.Float16 || dt == tensor.Float32 || dt == tensor.Float64
}

// Adasum reduces bufs, one vector per rank in rank order, with Horovod's
// Adasum (see above) and writes the result into every non-nil buffer.
//
// len(bufs) must be a power of two. A nil buffer is a rank without data (a
// joined rank): a zero vector, which leaves its partner unchanged. The
// non-nil buffers hold the same number of elements of dt (float16, float32
// or float64) and must not overlap; they are used as scratch space for the
// levels of the tree, so every one of them is overwritten. prescale
// multiplies each input and postscale the result; factors of exactly 1 are
// skipped.
//
// Tensors of at least opts.ParallelMin bytes are cut across up to
// opts.Workers goroutines; the result is the same for any number of them.
func Adasum(bufs [][]byte, dt tensor.DType, prescale, postscale float64, opts *Options) error {
	n, err := checkAdasum(bufs, dt)
	if err != nil || n == 0 {
		return err
	}
	workers := adasumWorkers(n, dt, opts)
	if err := adasumPrescale(bufs, dt, prescale); err != nil {
		return err
	}
	if postscale == 1 {
		// The root goes to every buffer in the last level's pass.
		adasumTree(append([][]byte(nil), bufs...), nil, dt, n, workers, bufs)
		return nil
	}
	res := adasumTree(append([][]byte(nil), bufs...), nil, dt, n, workers, nil)
	if err := Scale(res, dt, postscale); err != nil {
		return err
	}
	for _, b := range bufs {
		if b != nil && !same(b, res) {
			copy(b, res)
		}
	}
	return nil
}

// Adasum across nodes. A node holds a contiguous run of ranks, and the
// tree's value does not change when its subtrees are computed in separate
// places: only which pairs meet, and in which order, matters. So a node
// computes the subtrees that lie wholly inside its run (AdasumPartial: the
// tree's lower levels there), the nodes exchange those values, and every
// node finishes the upper levels from them (AdasumFinish), each one the
// same way, so every node gets the same bits, the bits Adasum would give on
// one node.
//
// The subtrees of the tree over 2^k ranks are the aligned runs: [s, s+L)
// with L a power of two and s a multiple of L. AdasumSpans cuts a node's
// run into the fewest of them, greedily: from s, the longest aligned run
// that fits. Nodes of equal power-of-two sizes in a power-of-two job give
// one span each; uneven ones a few (at most two per level): ranks [0, 3)
// of four are [0, 2) and [2, 3).

// AdasumSpan is the subtree of Adasum's tree over the ranks [Start,
// Start+Len): Len is a power of two and Start a multiple of it.
type AdasumSpan struct {
	Start, Len int
}

// AdasumSpans cuts the ranks [lo, hi) into the fewest subtrees of Adasum's
// tree, in rank order (see above). It returns nil when hi <= lo.
func AdasumSpans(lo, hi int) []AdasumSpan {
	var spans []AdasumSpan
	for s := lo; s < hi; {
		l := 1
		for (s%(2*l) == 0) && s+2*l <= hi {
			l *= 2
		}
		spans = append(spans, AdasumSpan{s, l})
		s += l
	}
	return spans
}

// AdasumPartial computes the value of one subtree of Adasum's tree from
// its ranks' buffers (a power-of-two number of them, in rank order, with
// Adasum's rules: nil is a joined rank's zero vector, the others have equal
// lengths and do not overlap), each prescaled first. It returns the buffer
// that holds the value, one of bufs, or nil when every buffer is nil or
// empty; the other buffers are overwritten with intermediate levels. No
// postscale: that belongs after the root (AdasumFinish).
func AdasumPartial(bufs [][]byte, dt tensor.DType, prescale float64, opts *Options) ([]byte, error) {
	n, err := checkAdasum(bufs, dt)
	if err != nil || n == 0 {
		return nil, err
	}
	if err := adasumPrescale(bufs, dt, prescale); err != nil {
		return nil, err
	}
	return adasumTree(append([][]byte(nil), bufs...), nil, dt, n, adasumWorkers(n, dt, opts), nil), nil
}

// AdasumFinish completes Adasum's tree over the ranks [0, m), m a power of
// two, from the values of spans that tile it in rank order (AdasumSpans of
// each node's run, concatenated): vals[k] is the value of spans[k], as
// AdasumPartial returned it (nil: a zero vector). It postscales the root and
// returns the buffer that holds it, one of vals, or nil when every value is
// nil or empty; the other values are overwritten.
func AdasumFinish(spans []AdasumSpan, vals [][]byte, dt tensor.DType, postscale float64, opts *Options) ([]byte, error) {
	if len(vals) != len(spans) {
		return nil, fmt.Errorf("reduce: %d values for %d spans", len(vals), len(spans))
	}
	m := 0
	for k, s := range spans {
		if s.Start != m || s.Len < 1 || s.Len&(s.Len-1) != 0 || s.Start%s.Len != 0 {
			return nil, fmt.Errorf("reduce: span %d is [%d, %d), not an aligned power-of-two run from %d", k, s.Start, s.Start+s.Len, m)
		}
		m += s.Len
	}
	// cur and held index ranks: cur[s.Start] is span s's value, which holds
	// the s.Len ranks from there; other entries are unused.
	cur, held := make([][]byte, m), make([]int, m)
	for k, s := range spans {
		cur[s.Start], held[s.Start] = vals[k], s.Len
	}
	n, err := checkAdasum(cur, dt)
	if err != nil || n == 0 {
		return nil, err
	}
	res := adasumTree(cur, held, dt, n, adasumWorkers(n, dt, opts), nil)
	if postscale != 1 && res != nil {
		if err := Scale(res, dt, postscale); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// adasumWorkers is the number of goroutines for n elements of dt.
func adasumWorkers(n int, dt tensor.DType, opts *Options) int {
	workers, parallelMin := runtime.GOMAXPROCS(0), defaultParallelMin
	if opts != nil {
		if opts.Workers > 0 {
			workers = opts.Workers
		}
		if opts.ParallelMin > 0 {
			parallelMin = opts.ParallelMin
		}
	}
	if n*dt.Size() < parallelMin {
		return 1
	}
	return workers
}

// adasumPrescale multiplies every non-nil buffer by f (nothing when f is 1).
func adasumPrescale(bufs [][]byte, dt tensor.DType, f float64) error {
	if f == 1 {
		return nil
	}
	for _, b := range bufs {
		if b != nil {
			if err := Scale(b, dt, f); err != nil {
				return err
			}
		}
	}
	return nil
}

// adasumTree runs the levels of the tree over len(cur) (a power of two)
// ranks of n elements and returns the root's buffer. cur[i] holds the
// value of the group of ranks that starts at i (nil: a zero vector); a
// level combines the groups at i and i+level into i's. held[i], when held
// is not nil, is how many ranks cur[i] already covers: levels inside such a
// group are done and skipped (AdasumFinish); nil means one rank each. The
// root's value is also written into every buffer of outs that is not the
// root's own.
//
// The passes are fused block by block: the dot products and norms of
// level 1 take one pass; then each level's scaled adds run per block, and
// while that block is in cache the next level's dot products are taken on
// it, or, after the last level, the root is copied out. The values are the
// level-by-level ones (per-block partial sums in the same lane order, added
// in block order).
func adasumTree(cur [][]byte, held []int, dt tensor.DType, n, workers int, outs [][]byte) []byte {
	// The pairs each level combines: nil operands need no arithmetic, so
	// the plan is known before any data is read.
	var levels [][]adasumPairRef
	for level := 1; level < len(cur); level *= 2 {
		var pairs []adasumPairRef
		for i := 0; i < len(cur); i += 2 * level {
			if held != nil && held[i] >= 2*level {
				continue
			}
			a, b := cur[i], cur[i+level]
			switch {
			case b == nil:
			case a == nil:
				cur[i] = b
			default:
				pairs = append(pairs, adasumPairRef{a: a, b: b})
			}
		}
		if len(pairs) > 0 {
			levels = append(levels, pairs)
		}
	}
	root := cur[0]
	var copies [][]byte
	for _, o := range outs {
		if o != nil && !same(o, root) {
			copies = append(copies, o)
		}
	}
	if len(levels) == 0 {
		for _, o := range copies {
			copy(o, root)
		}
		return root
	}
	blocks := (n + adasumBlock - 1) / adasumBlock
	bounds := func(k int) (int, int) { return k * adasumBlock, min((k+1)*adasumBlock, n) }
	parts := make([][3]float64, blocks*len(levels[0]))
	forBlocks(blocks, workers, func(k int) {
		lo, hi := bounds(k)
		for p, pr := range levels[0] {
			parts[k*len(levels[0])+p] = dotNorms(pr.a, pr.b, dt, lo, hi)
		}
	})
	for l, pairs := range levels {
		adasumSetCoeffs(pairs, parts, blocks)
		var next []adasumPairRef
		if l+1 < len(levels) {
			next = levels[l+1]
			parts = make([][3]float64, blocks*len(next))
		}
		last := l+1 == len(levels)
		forBlocks(blocks, workers, func(k int) {
			lo, hi := bounds(k)
			for _, pr := range pairs {
				scaledAdd(pr.a, pr.b, dt, lo, hi, pr.ca, pr.cb)
			}
			for q, pr := range next {
				parts[k*len(next)+q] = dotNorms(pr.a, pr.b, dt, lo, hi)
			}
			if last {
				sz := dt.Size()
				for _, o := range copies {
					copy(o[lo*sz:hi*sz], root[lo*sz:hi*sz])
				}
			}
		})
	}
	return root
}

// adasumPairRef is one combination a = adasum(a, b) of a level, with its
// coefficients once the level's dot products are known.
type adasumPairRef struct {
	a, b   []byte
	ca, cb float64
}

// adasumSetCoeffs adds each pair's per-block partial sums (parts[k*len(pairs)+p])
// in block order and sets its coefficients.
func adasumSetCoeffs(pairs []adasumPairRef, parts [][3]float64, blocks int) {
	for p := range pairs {
		var dot, anormsq, bnormsq float64
		for k := range blocks {
			s := parts[k*len(pairs)+p]
			dot += s[0]
			anormsq += s[1]
			bnormsq += s[2]
		}
		pairs[p].ca, pairs[p].cb = adasumCoeffs(dot, anormsq, bnormsq)
	}
}

// checkAdasum validates Adasum's arguments and returns the element count
// (0 when every buffer is nil or empty).
func checkAdasum(bufs [][]byte, dt tensor.DType) (int, error) {
	if !AdasumDType(dt) {
		return 0, fmt.Errorf("reduce: Adasum reduces float16, float32 and float64, not %v", dt)
	}
	k := len(bufs)
	if k == 0 || k&(k-1) != 0 {
		return 0, fmt.Errorf("reduce: Adasum needs a power-of-two number of buffers, got %d", k)
	}
	size := -1
	for i, b := range bufs {
		if b == nil {
			continue
		}
		if size < 0 {
			size = len(b)
			if size%dt.Size() != 0 {
				return 0, fmt.Errorf("reduce: bufs[%d] has %d bytes, not a whole number of %v elements", i, size, dt)
			}
		} else if len(b) != size {
			return 0, fmt.Errorf("reduce: bufs[%d] has %d bytes, the first buffer %d", i, len(b), size)
		}
		for j, c := range bufs[:i] {
			if overlap(b, c) {
				return 0, fmt.Errorf("reduce: bufs[%d] overlaps bufs[%d]", i, j)
			}
		}
	}
	if size <= 0 {
		return 0, nil
	}
	return size / dt.Size(), nil
}

// adasumCoeffs returns the coefficients of a and b, written as Horovod
// writes them (1 - dot/‖·‖² · 0.5) so that they round the same way. A NaN
// norm fails the comparison and leaves its coefficient at 1, as in Horovod.
func adasumCoeffs(dot, anormsq, bnormsq float64) (ca, cb float64) {
	ca, cb = 1, 1
	if anormsq >= adasumMinNormSq {
		ca = 1 - dot/anormsq*0.5
	}
	if bnormsq >= adasumMinNormSq {
		cb = 1 - dot/bnormsq*0.5
	}
	return ca, cb
}

// dotNorms returns a·b, ‖a‖² and ‖b‖² over elements [lo, hi), accumulated
// in float64 in adasum_kernels.go's lane order.
func dotNorms(a, b []byte, dt tensor.DType, lo, hi int) [3]float64 {
	var acc adasumAcc
	switch dt {
	case tensor.Float64:
		dotLanesF64(view[float64](a, lo, hi), view[float64](b, lo, hi), &acc)
	case tensor.Float32:
		dotLanesF32(view[float32](a, lo, hi), view[float32](b, lo, hi), &acc)
	case tensor.Float16:
		// Widened (exactly) to float32 a chunk at a time; chunks are whole
		// groups of lanes, so the lane order runs on across them.
		var xa, xb [1024]float32
		av, bv := view[uint16](a, lo, hi), view[uint16](b, lo, hi)
		for c := 0; c < len(av); c += len(xa) {
			e := min(c+len(xa), len(av))
			f16ToF32(xa[:e-c], av[c:e])
			f16ToF32(xb[:e-c], bv[c:e])
			dotLanesF32(xa[:e-c], xb[:e-c], &acc)
		}
	}
	return acc.sums()
}

// scaledAdd sets a[i] = ca·a[i] + cb·b[i] for i in [lo, hi), with the
// rounding described at the top of this file.
func scaledAdd(a, b []byte, dt tensor.DType, lo, hi int, ca, cb float64) {
	switch dt {
	case tensor.Float64:
		axpbyF64(view[float64](a, lo, hi), view[float64](b, lo, hi), ca, cb)
	case tensor.Float32:
		axpbyF32(view[float32](a, lo, hi), view[float32](b, lo, hi), ca, cb)
	case tensor.Float16:
		ca32, cb32 := float32(ca), float32(cb)
		av, bv := view[uint16](a, lo, hi), view[uint16](b, lo, hi)
		for i, h := range av {
			t := float32(ca32 * Float16ToFloat32(h))
			r := float32(float64(cb32)*float64(Float16ToFloat32(bv[i])) + float64(t))
			av[i] = Float32ToFloat16(r)
		}
	}
}

// forBlocks runs f(0) ... f(blocks-1) on up to workers goroutines, the
// caller's included, and returns when all are done.
func forBlocks(blocks, workers int, f func(k int)) {
	workers = min(workers, blocks)
	if workers <= 1 {
		for k := 0; k < blocks; k++ {
			f(k)
		}
		return
	}
	var next atomic.Int64
	work := func() {
		for {
			k := int(next.Add(1) - 1)
			if k >= blocks {
				return
			}
			f(k)
		}
	}
	var wg sync.WaitGroup
	for w := 1; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work()
		}()
	}
	work()
	wg.Wait()
}

// errAdasumElementwise is Reduce's answer to Adasum.
var errAdasumElementwise = errors.New("reduce: Adasum is not an element-wise op; use Adasum")
