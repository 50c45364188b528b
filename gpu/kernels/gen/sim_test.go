package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/hvdd/hvdd/gpu/kernels"
	"github.com/hvdd/hvdd/reduce"
	"github.com/hvdd/hvdd/tensor"
)

// A small interpreter for the PTX this generator writes (the instructions
// it uses, nothing more), so that the kernels' arithmetic is checked against
// package reduce without a GPU: ptxas checks the syntax, this the meaning.
// The conversions between float32 and float16 follow IEEE (round to
// nearest even) except on NaNs, where the interpreter returns deliberate
// junk NaNs (hardware gives canonical ones): the kernels must replace them
// with reduce's NaNs themselves.

type ptxFunc struct {
	params []string
	body   []insn         // the instructions, decoded
	labels map[string]int // label -> index in body
}

// insn is one decoded instruction: "@%p1 bra $L_loop" has pred "%p1",
// parts ["bra"] and ops ["$L_loop"]; "@!%p8 ..." has pred "%p8" and not
// set. A vector operand ("{%v0, %v1}") is one op, its braces kept.
type insn struct {
	text  string   // as written, without the ';'
	pred  string   // the guard predicate, or ""
	not   bool     // the guard is negated
	parts []string // the opcode split at '.'
	ops   []string // the operands, trimmed
}

func decode(l string) insn {
	in := insn{text: l}
	if strings.HasPrefix(l, "@") {
		in.pred, l, _ = strings.Cut(l[1:], " ")
		in.pred, in.not = strings.CutPrefix(in.pred, "!")
	}
	opc, rest, _ := strings.Cut(l, " ")
	for rest != "" {
		var o string
		if r := strings.TrimSpace(rest); strings.HasPrefix(r, "{") {
			o, rest, _ = strings.Cut(r, "}")
			o += "}"
			_, rest, _ = strings.Cut(rest, ",")
		} else {
			o, rest, _ = strings.Cut(rest, ",")
		}
		if o = strings.TrimSpace(o); o != "" {
			in.ops = append(in.ops, o)
		}
	}
	in.parts = strings.Split(opc, ".")
	return in
}

// elems splits a vector operand "{%v0, %v1}" into its registers.
func elems(op string) []string {
	var out []string
	for _, r := range strings.Split(strings.Trim(op, "{}"), ",") {
		out = append(out, strings.TrimSpace(r))
	}
	return out
}

func parsePTX(t *testing.T, src string) map[string]*ptxFunc {
	t.Helper()
	fns := map[string]*ptxFunc{}
	lines := strings.Split(src, "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		name, ok := strings.CutPrefix(l, ".visible .entry ")
		if !ok {
			continue
		}
		name = strings.TrimSuffix(name, "(")
		f := &ptxFunc{labels: map[string]int{}}
		for i++; !strings.HasPrefix(strings.TrimSpace(lines[i]), ")"); i++ {
			p := strings.Fields(strings.TrimSuffix(strings.TrimSpace(lines[i]), ","))
			f.params = append(f.params, p[len(p)-1])
		}
		for i++; strings.TrimSpace(lines[i]) != "}"; i++ {
			l := strings.TrimSpace(lines[i])
			if l == "{" || l == "" || strings.HasPrefix(l, ".reg") || strings.HasPrefix(l, "//") {
				continue
			}
			if strings.HasSuffix(l, ":") {
				f.labels[strings.TrimSuffix(l, ":")] = len(f.body)
				continue
			}
			f.body = append(f.body, decode(strings.TrimSuffix(l, ";")))
		}
		fns[name] = f
	}
	return fns
}

// machine is one thread's state plus the global memory (buffers at fixed
// bases).
type machine struct {
	t       *testing.T
	regs    map[string]uint64
	preds   map[string]bool
	params  map[string]uint64
	special map[string]uint64
	mem     map[uint64][]byte // base -> buffer
	stats   *launchStats
}

// launchStats counts what the threads of one launch did: the global loads
// and stores of data (the table's ld.global.nc loads are not counted), by
// vector (ld.global.v4) and by element, and the vectors that combine
// handed to its element loop for a NaN (branches to $V_nan).
type launchStats struct {
	vecLoads, vecStores, loads, stores, nanVectors int
}

func (m *machine) mem8(addr uint64, n int) []byte {
	for base, b := range m.mem {
		if addr >= base && addr+uint64(n) <= base+uint64(len(b)) {
			return b[addr-base : addr-base+uint64(n)]
		}
	}
	m.t.Fatalf("access of %d bytes at %#x outside every buffer", n, addr)
	return nil
}

// val reads an operand: a register, a special register, or an immediate
// (decimal, or 0d followed by a float64's hex bits).
func (m *machine) val(op string) uint64 {
	switch {
	case strings.HasPrefix(op, "%p"):
		if m.preds[op] {
			return 1
		}
		return 0
	case strings.HasPrefix(op, "%"):
		if v, ok := m.special[op]; ok {
			return v
		}
		v, ok := m.regs[op]
		if !ok {
			m.t.Fatalf("read of unset register %s", op)
		}
		return v
	case strings.HasPrefix(op, "0d"), strings.HasPrefix(op, "0x"):
		v, err := strconv.ParseUint(op[2:], 16, 64)
		if err != nil {
			m.t.Fatal(err)
		}
		return v
	}
	v, err := strconv.ParseInt(op, 10, 64)
	if err != nil {
		m.t.Fatalf("operand %q: %v", op, err)
	}
	return uint64(v)
}

func f32(v uint64) float32 { return math.Float32frombits(uint32(v)) }
func f64(v uint64) float64 { return math.Float64frombits(v) }
func b32(f float32) uint64 { return uint64(math.Float32bits(f)) }
func b64(f float64) uint64 { return math.Float64bits(f) }

// width returns the bits of an instruction type (u32 -> 32).
func width(typ string) int { n, _ := strconv.Atoi(typ[1:]); return n }

func signExt(v uint64, bits int) int64 { return int64(v<<(64-bits)) >> (64 - bits) }

func mask(v uint64, bits int) uint64 {
	if bits == 64 {
		return v
	}
	return v & (1<<bits - 1)
}

func (m *machine) compare(cmp, typ string, a, b uint64) bool {
	var lt, eq, unordered bool
	switch typ[0] {
	case 'u', 'b':
		a, b = mask(a, width(typ)), mask(b, width(typ))
		lt, eq = a < b, a == b
	case 's':
		x, y := signExt(a, width(typ)), signExt(b, width(typ))
		lt, eq = x < y, x == y
	case 'f':
		var x, y float64
		if typ == "f32" {
			x, y = float64(f32(a)), float64(f32(b))
		} else {
			x, y = f64(a), f64(b)
		}
		lt, eq, unordered = x < y, x == y, x != x || y != y
	}
	switch cmp {
	case "nan":
		return unordered
	case "lt":
		return lt
	case "ge":
		return !lt && !unordered
	case "gt":
		return !lt && !eq && !unordered
	case "eq":
		return eq
	case "ne":
		return !eq && !unordered || (typ[0] != 'f' && !eq)
	}
	m.t.Fatalf("comparison %s", cmp)
	return false
}

// Junk NaNs the interpreter's conversions give, as hardware gives
// canonical ones: the kernels must not let them through. An add or a
// multiply that makes a NaN gives the canonical NaN, as hardware does
// (all ones but the sign: the NaN a rounding that adds to the bits is
// likeliest to carry out of).
const (
	junkF32NaN = 0x7fbadbad
	junkF16NaN = 0x7d11
	hwF32NaN   = 0x7fffffff
	hwF64NaN   = 0x7fffffffffffffff
)

// arith32 and arith64 return the bits of an add's or a multiply's result.
func arith32(f float32) uint64 {
	if f != f {
		return hwF32NaN
	}
	return b32(f)
}

func arith64(f float64) uint64 {
	if f != f {
		return hwF64NaN
	}
	return b64(f)
}

// run runs one thread of f to its ret.
func (m *machine) run(f *ptxFunc) {
	for pc, steps := 0, 0; ; steps++ {
		if steps > 1e7 {
			m.t.Fatal("runaway kernel")
		}
		in := &f.body[pc]
		pc++
		if in.pred != "" && m.preds[in.pred] == in.not {
			continue
		}
		ins, parts, ops := in.text, in.parts, in.ops
		set := func(v uint64) { m.regs[ops[0]] = v }
		switch parts[0] {
		case "ret":
			return
		case "bra":
			l, ok := f.labels[ops[0]]
			if !ok {
				m.t.Fatalf("branch to unknown label %s", ops[0])
			}
			pc = l
			if ops[0] == "$V_nan" {
				m.stats.nanVectors++
			}
		case "mov":
			switch {
			case parts[1] == "pred":
				m.preds[ops[0]] = m.val(ops[1]) != 0
			case strings.HasPrefix(ops[0], "{"): // {lo, hi} = halves of a b32
				rs, v := elems(ops[0]), m.val(ops[1])
				m.regs[rs[0]], m.regs[rs[1]] = v&0xffff, v>>16&0xffff
			case strings.HasPrefix(ops[1], "{"):
				rs := elems(ops[1])
				set(m.val(rs[0])&0xffff | (m.val(rs[1])&0xffff)<<16)
			default:
				set(m.val(ops[1]))
			}
		case "cvta":
			set(m.val(ops[1]))
		case "ld":
			addr := strings.Trim(ops[1], "[]")
			typ := parts[len(parts)-1]
			if parts[1] == "param" {
				set(m.params[addr])
				continue
			}
			dst := []string{ops[0]}
			if vec := strings.HasPrefix(ops[0], "{"); vec {
				dst = elems(ops[0])
				m.stats.vecLoads++
			} else if parts[2] != "nc" {
				m.stats.loads++
			}
			n := width(typ) / 8
			if m.val(addr)%uint64(n*len(dst)) != 0 {
				m.t.Fatalf("%s: misaligned address %#x", ins, m.val(addr))
			}
			all := m.mem8(m.val(addr), n*len(dst))
			for j, r := range dst {
				b := all[j*n : (j+1)*n]
				var v uint64
				for i := len(b) - 1; i >= 0; i-- {
					v = v<<8 | uint64(b[i])
				}
				if typ[0] == 's' {
					v = uint64(signExt(v, width(typ)))
					if !strings.HasPrefix(r, "%rd") {
						v = mask(v, 32)
					}
				}
				m.regs[r] = v
			}
		case "st":
			typ := parts[len(parts)-1]
			src := []string{ops[1]}
			if strings.HasPrefix(ops[1], "{") {
				src = elems(ops[1])
				m.stats.vecStores++
			} else {
				m.stats.stores++
			}
			n := width(typ) / 8
			addr := m.val(strings.Trim(ops[0], "[]"))
			if addr%uint64(n*len(src)) != 0 {
				m.t.Fatalf("%s: misaligned address %#x", ins, addr)
			}
			all := m.mem8(addr, n*len(src))
			for j, r := range src {
				v := m.val(r)
				for i := range n {
					all[j*n+i] = byte(v >> (8 * i))
				}
			}
		case "add", "mul":
			typ := parts[len(parts)-1]
			a, b := m.val(ops[1]), m.val(ops[2])
			switch {
			case typ == "f32" && parts[0] == "add":
				set(arith32(f32(a) + f32(b)))
			case typ == "f32":
				set(arith32(f32(a) * f32(b)))
			case typ == "f64" && parts[0] == "add":
				set(arith64(f64(a) + f64(b)))
			case typ == "f64":
				set(arith64(f64(a) * f64(b)))
			case parts[0] == "add":
				set(mask(a+b, width(typ)))
			case parts[1] == "wide":
				set(mask(a, 32) * mask(b, 32))
			default: // mul.lo
				set(mask(a*b, width(typ)))
			}
		case "and", "or":
			if parts[1] == "pred" {
				x, y := m.preds[ops[1]], m.preds[ops[2]]
				if parts[0] == "and" {
					m.preds[ops[0]] = x && y
				} else {
					m.preds[ops[0]] = x || y
				}
				continue
			}
			w := width(parts[1])
			if parts[0] == "and" {
				set(mask(m.val(ops[1])&m.val(ops[2]), w))
			} else {
				set(mask(m.val(ops[1])|m.val(ops[2]), w))
			}
		case "shl":
			set(mask(m.val(ops[1])<<m.val(ops[2]), width(parts[1])))
		case "shr":
			w := width(parts[1])
			if parts[1][0] == 's' {
				set(mask(uint64(signExt(m.val(ops[1]), w)>>m.val(ops[2])), w))
			} else {
				set(mask(m.val(ops[1]), w) >> m.val(ops[2]))
			}
		case "bfe": // bfe.u32 d, a, pos, len
			if parts[1] != "u32" {
				m.t.Fatalf("unknown instruction %q", ins)
			}
			set(mask(mask(m.val(ops[1]), 32)>>m.val(ops[2]), int(m.val(ops[3]))))
		case "prmt": // prmt.b32 d, a, b, c: byte i of d is byte c[4i:4i+4] of b:a
			ab := mask(m.val(ops[1]), 32) | mask(m.val(ops[2]), 32)<<32
			c, d := m.val(ops[3]), uint64(0)
			for i := range 4 {
				sel := c >> (4 * i) & 15
				if sel&8 != 0 {
					m.t.Fatalf("%s: sign-replicating selector", ins)
				}
				d |= ab >> (8 * sel) & 0xff << (8 * i)
			}
			set(d)
		case "setp":
			m.preds[ops[0]] = m.compare(parts[1], parts[2], m.val(ops[1]), m.val(ops[2]))
		case "selp":
			if m.preds[ops[3]] {
				set(m.val(ops[1]))
			} else {
				set(m.val(ops[2]))
			}
		case "cvt":
			m.cvt(parts[1:], ops)
		default:
			m.t.Fatalf("unknown instruction %q", ins)
		}
	}
}

func (m *machine) cvt(parts, ops []string) {
	set := func(v uint64) { m.regs[ops[0]] = v }
	v := m.val(ops[1])
	rnd := ""
	if parts[0] == "rn" || parts[0] == "rzi" {
		rnd, parts = parts[0], parts[1:]
	}
	to, from := parts[0], parts[1]
	switch {
	case to == "f32" && from == "f16":
		if h := uint16(v); h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			set(junkF32NaN)
		} else {
			set(b32(reduce.Float16ToFloat32(h)))
		}
	case to == "f16" && from == "f32":
		if x := f32(v); x != x {
			set(junkF16NaN)
		} else {
			set(uint64(reduce.Float32ToFloat16(x)))
		}
	case to == "f32" && from == "f64":
		set(b32(float32(f64(v))))
	case to == "f64" && from == "s32":
		set(b64(float64(int32(uint32(v)))))
	case to == "f64" && from == "u32":
		set(b64(float64(uint32(v))))
	case to == "f64" && from == "s64":
		set(b64(float64(int64(v))))
	case to == "s64" && from == "f64" && rnd == "rzi":
		x := f64(v)
		switch {
		case x != x:
			set(0)
		case x >= 0x1p63:
			set(math.MaxInt64)
		case x <= -0x1p63:
			set(1 << 63)
		default:
			set(uint64(int64(x)))
		}
	case to[0] == 'u' && from[0] == 'u':
		set(mask(v, min(width(to), width(from))))
	case to == "s32" && (from == "s8" || from == "s16"):
		set(mask(uint64(signExt(v, width(from))), 32))
	default:
		m.t.Fatalf("cvt %v", parts)
	}
}

// launch runs f over a grid, one thread after another, and returns what
// its threads did.
func launch(t *testing.T, f *ptxFunc, grid, block int, mem map[uint64][]byte, args ...uint64) *launchStats {
	params := map[string]uint64{}
	for i, p := range f.params {
		params[p] = args[i]
	}
	st := &launchStats{}
	for b := 0; b < grid; b++ {
		for th := 0; th < block; th++ {
			m := &machine{t: t, regs: map[string]uint64{}, preds: map[string]bool{}, params: params, mem: mem, stats: st,
				special: map[string]uint64{"%ctaid.x": uint64(b), "%ntid.x": uint64(block), "%tid.x": uint64(th), "%nctaid.x": uint64(grid)}}
			m.run(f)
		}
	}
	return st
}

func randomData(r *rand.Rand, dt tensor.DType, n int) []byte {
	b := make([]byte, n*dt.Size())
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	sz := dt.Size()
	for i := 0; i < n; i++ {
		x := b[i*sz:]
		switch c := r.IntN(3); {
		case c == 0:
			continue // arbitrary bits: NaNs, infinities, subnormals, extremes
		case c == 1 && dt == tensor.Float32:
			binary.LittleEndian.PutUint32(x, specialF32(r))
			continue
		case c == 1 && (dt == tensor.Float16 || dt == tensor.BFloat16):
			exp := uint16(0x7c00)
			if dt == tensor.BFloat16 {
				exp = 0x7f80
			}
			// NaNs with payloads, infinities, zeros and subnormals.
			v := []uint16{exp | uint16(r.Uint32())&^exp | 1, exp, 0, uint16(r.Uint32()) &^ exp}[r.IntN(4)]
			binary.LittleEndian.PutUint16(x, v|uint16(r.IntN(2))<<15)
			continue
		}
		switch dt {
		case tensor.Float32:
			binary.LittleEndian.PutUint32(x, math.Float32bits(float32(r.NormFloat64()*100)))
		case tensor.Float64:
			binary.LittleEndian.PutUint64(x, math.Float64bits(r.NormFloat64()*1e6))
		case tensor.Float16:
			binary.LittleEndian.PutUint16(x, reduce.Float32ToFloat16(float32(r.NormFloat64()*10)))
		case tensor.BFloat16:
			binary.LittleEndian.PutUint16(x, reduce.Float32ToBFloat16(float32(r.NormFloat64()*10)))
		case tensor.Bool:
			x[0] = byte(r.IntN(2))
		}
	}
	return b
}

func isNaN(dt tensor.DType, b []byte) bool {
	switch dt {
	case tensor.Float32:
		v := binary.LittleEndian.Uint32(b)
		return v&0x7fffffff > 0x7f800000
	case tensor.Float64:
		v := binary.LittleEndian.Uint64(b)
		return v&(1<<63-1) > 0x7ff0000000000000
	case tensor.Float16:
		v := binary.LittleEndian.Uint16(b)
		return v&0x7fff > 0x7c00
	case tensor.BFloat16:
		v := binary.LittleEndian.Uint16(b)
		return v&0x7fff > 0x7f80
	}
	return false
}

// skipUnderRace skips a simulator test under -race: the interpreter is
// this test file's own single-threaded code, which the race detector slows
// eightfold and has nothing to check in; scripts/test.sh runs these tests
// without -race, after the -race stage.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("the PTX interpreter is single-threaded test code: scripts/test.sh runs it without -race")
	}
}

// TestSimulate runs every kernel of the PTX in the interpreter against
// package reduce: bit for bit, except that a NaN made by an add or a
// multiply may be any NaN.
func TestSimulate(t *testing.T) {
	skipUnderRace(t)
	src, err := os.ReadFile("../kernels.ptx")
	if err != nil {
		t.Fatal(err)
	}
	fns := parsePTX(t, string(src))
	r := rand.New(rand.NewPCG(11, 12))
	for _, k := range kernels.Catalog() {
		if k.Kind == kernels.Combine {
			continue // TestSimulateCombine
		}
		t.Run(k.Name, func(t *testing.T) {
			f := fns[k.Name]
			if f == nil {
				t.Fatal("not in the PTX")
			}
			const n = 300
			const dstBase, srcBase = 0x10000000, 0x20000000
			for _, f64arg := range []float64{0.37, -2.5, 1e10, 1, 3} {
				if k.Kind != kernels.Scale && f64arg != 0.37 {
					continue
				}
				out := k.DType
				if k.Kind == kernels.Convert {
					out = k.To
				}
				dst := randomData(r, out, n)
				if k.Kind == kernels.Convert {
					dst = bytes.Repeat([]byte{0x5a}, n*out.Size())
				}
				src := randomData(r, k.DType, n)
				want := append([]byte(nil), dst...)
				// A guard element past the end must stay.
				mem := map[uint64][]byte{dstBase: append(append([]byte(nil), dst...), 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee),
					srcBase: append([]byte(nil), src...)}
				switch k.Kind {
				case kernels.Reduce:
					launch(t, f, 3, 7, mem, dstBase, srcBase, n)
					if err := reduce.Reduce([][]byte{want}, [][]byte{want, src}, k.DType, k.Op, 1, 1, nil); err != nil {
						t.Fatal(err)
					}
				case kernels.Scale:
					launch(t, f, 3, 7, mem, dstBase, n, math.Float64bits(f64arg))
					if err := reduce.Scale(want, k.DType, f64arg); err != nil {
						t.Fatal(err)
					}
				case kernels.Convert:
					launch(t, f, 3, 7, mem, dstBase, srcBase, n)
					if k.To == tensor.Float32 {
						err = reduce.Widen(want, src, k.DType)
					} else {
						_, err = reduce.Narrow(want, src, k.To)
					}
					if err != nil {
						t.Fatal(err)
					}
				}
				got := mem[dstBase]
				if !bytes.Equal(got[len(want):], bytes.Repeat([]byte{0xee}, 8)) {
					t.Fatalf("wrote past the end: %x", got[len(want):])
				}
				// An add or a multiply makes any NaN; min, max, the
				// conversions and bool/integer ops must match exactly.
				arith := k.Kind == kernels.Scale || k.Op == tensor.Sum || k.Op == tensor.Product
				sz := out.Size()
				for i := 0; i < n; i++ {
					g, w := got[i*sz:(i+1)*sz], want[i*sz:(i+1)*sz]
					if bytes.Equal(g, w) || arith && isNaN(out, g) && isNaN(out, w) {
						continue
					}
					extra := ""
					if k.Kind != kernels.Convert {
						extra = fmt.Sprintf(" dst was %x", dst[i*sz:(i+1)*sz])
					}
					t.Fatalf("f=%v element %d: got %x, want %x (src %x%s)", f64arg, i, g, w,
						src[i*k.DType.Size():(i+1)*k.DType.Size()], extra)
				}
			}
		})
	}
}

// specialF32 returns a float32 that tests a narrowing's edges: NaNs with
// payloads, infinities, exact ties of the float16 and bfloat16 roundings,
// values at float16's overflow and underflow thresholds.
func specialF32(r *rand.Rand) uint32 {
	sign := uint32(r.IntN(2)) << 31
	switch r.IntN(7) {
	case 0:
		return sign | 0x7f800000 | (r.Uint32()&0x7fffff | 1) // NaN
	case 1:
		return sign | 0x7f800000 // Inf
	case 2:
		return sign | r.Uint32()&0x7fff0000 | 0x8000 // a bfloat16 tie
	case 3:
		// A float16 tie in the normal range: exponent 113..142, the low 13
		// mantissa bits 0x1000.
		return sign | uint32(113+r.IntN(30))<<23 | r.Uint32()&0x7fe000 | 0x1000
	case 4:
		return sign | math.Float32bits(65504+float32(r.IntN(40))) // around float16's overflow
	case 5:
		// Around float16's subnormals: exponents 100..113.
		return sign | uint32(100+r.IntN(14))<<23 | r.Uint32()&0x7fffff
	}
	return sign | r.Uint32()&0x7fffff // float32 subnormal
}

// combineFactors are the (pre, post) pairs TestSimulateCombine tries: every
// pair of 1 (no scaling), 0.5 (exact), 3 (rounds, overflows float16
// sooner) and 1/3 (not exact in any float type), and factors that saturate
// integers and flip signs.
var combineFactors = func() [][2]float64 {
	fs := []float64{1, 0.5, 3, 1.0 / 3}
	var out [][2]float64
	for _, pre := range fs {
		for _, post := range fs {
			out = append(out, [2]float64{pre, post})
		}
	}
	return append(out, [2]float64{-2.5, 1e10}, [2]float64{1e10, -1.0 / 3})
}()

// combineSeg is one segment of every TestSimulateCombine launch.
type combineSeg struct {
	count  int
	skew   skew
	finite bool // inputs without NaNs, so that float16's vectors stay on the vector path
}

// skew says which buffers of a segment lie off 16-byte alignment (by a
// whole number of elements), so that the element loop does the segment
// whole.
type skew uint8

const (
	aligned skew = iota // none
	skewIn              // the last input's
	skewOut             // the last output's (and so the input's it is, in place)
	skewAll             // all, by the same amount
)

func (s skew) String() string {
	return [...]string{"aligned", "last input off", "last output off", "all off"}[s]
}

// combineSegs are the segments of every TestSimulateCombine launch, aligned
// (vector loop, then element loop for the tail) and not (element loop):
// empty, one element, counts that are no multiple of the block nor of any
// vector's lanes (a tail: 37, 300 for float16 and bfloat16, 301), one that
// is a multiple of both (64), inputs with NaNs and without, and segments
// with one buffer or all of them unaligned, in one table.
var combineSegs = []combineSeg{
	{count: 37}, {count: 0}, {count: 300}, {count: 1},
	{count: 64, finite: true}, {count: 301, finite: true},
	{count: 45, skew: skewIn}, {count: 40, skew: skewOut, finite: true}, {count: 33, skew: skewAll},
}

// finiteData is randomData with every NaN made an infinity of its sign.
func finiteData(r *rand.Rand, dt tensor.DType, n int) []byte {
	b := randomData(r, dt, n)
	sz := dt.Size()
	for i := range n {
		x := b[i*sz : (i+1)*sz]
		if !isNaN(dt, x) {
			continue
		}
		switch dt {
		case tensor.Float16:
			binary.LittleEndian.PutUint16(x, binary.LittleEndian.Uint16(x)&0xfc00)
		case tensor.BFloat16:
			binary.LittleEndian.PutUint16(x, binary.LittleEndian.Uint16(x)&0xff80)
		case tensor.Float32:
			binary.LittleEndian.PutUint32(x, binary.LittleEndian.Uint32(x)&0xff800000)
		case tensor.Float64:
			binary.LittleEndian.PutUint64(x, binary.LittleEndian.Uint64(x)&0xfff0000000000000)
		}
	}
	return b
}

// combineWant computes one segment as the daemon's sequence of separate
// kernels did (and the CPU path does): a copy of ins[0] scaled by pre, each
// further input scaled by pre in scratch and reduced into it pairwise, in
// order, then the result scaled by post.
func combineWant(t *testing.T, ins [][]byte, dt tensor.DType, op tensor.ReduceOp, pre, post float64) []byte {
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

// TestSimulateCombine runs every combine kernel in the interpreter against
// combineWant: every kernel with nin 1..4 and nout 1 and 3, outputs apart
// from the inputs and in place (out_k == in_k), every (pre, post) pair of
// combineFactors, grids smaller than the largest segment (the grid-stride
// loops must cover the rest) and large enough, over the segments of
// combineSegs filled by randomData (NaNs, infinities, subnormals, rounding
// ties) or finiteData. Bit for bit, except that a NaN from an add or a
// multiply (a sum, a product or a scaling) may be any NaN. Each launch
// must also have done the elements it did by vector and by element as
// checkPaths says.
func TestSimulateCombine(t *testing.T) {
	skipUnderRace(t)
	src, err := os.ReadFile("../kernels.ptx")
	if err != nil {
		t.Fatal(err)
	}
	fns := parsePTX(t, string(src))
	var ks []kernels.Kernel
	for _, k := range kernels.Catalog() {
		if k.Kind == kernels.Combine {
			ks = append(ks, k)
		}
	}
	if len(ks) != 4*11 {
		t.Fatalf("%d combine kernels, want 44", len(ks))
	}
	var launches, segments, vectors, nanVectors atomic.Int64
	t.Cleanup(func() {
		t.Logf("%d launches of %d kernels, %d segments, %d vectors (%d of them float16 ones with a NaN, done by element)",
			launches.Load(), len(ks), segments.Load(), vectors.Load(), nanVectors.Load())
	})
	for ki, k := range ks {
		t.Run(k.Name, func(t *testing.T) {
			t.Parallel()
			f := fns[k.Name]
			if f == nil {
				t.Fatal("not in the PTX")
			}
			r := rand.New(rand.NewPCG(15, uint64(ki)))
			var sum launchStats
			// 36 launches: the 16 shapes (nin, nout, in place) twice and a
			// bit, each of the 18 factor pairs twice (5 is prime to 18),
			// the three grids in turn.
			for c := range 2 * len(combineFactors) {
				shape := c % 16
				nin, nout := 1+shape%4, []int{1, 3}[shape/4%2]
				inPlace := shape/8 == 1
				fac := combineFactors[(5*c+ki)%len(combineFactors)]
				grid, block := []int{2, 3, 10}[c%3], []int{32, 7, 32}[c%3]
				name := fmt.Sprintf("nin=%d nout=%d inplace=%v pre=%v post=%v grid=%dx%d", nin, nout, inPlace, fac[0], fac[1], grid, block)
				st := simulateCombine(t, f, r, k, nin, nout, inPlace, fac[0], fac[1], grid, block, name)
				launches.Add(1)
				segments.Add(int64(len(combineSegs)))
				vectors.Add(int64(st.vecStores/nout + st.nanVectors))
				nanVectors.Add(int64(st.nanVectors))
				sum.vecStores += st.vecStores
				sum.nanVectors += st.nanVectors
			}
			// float16's vectors take both ways.
			if v, ok := vecFor(k.DType); ok && v.fast && (sum.vecStores == 0 || sum.nanVectors == 0) {
				t.Errorf("%d vector stores, %d vectors with a NaN: want both", sum.vecStores, sum.nanVectors)
			}
		})
	}
}

// TestSimulateCombineRounding checks that combine rounds float16 and
// bfloat16 after every step, as the separate kernels did, where a single
// reduce.Reduce over all inputs rounds once: 2048 + 1 + 1 is 2048 in
// float16 step by step (2049 is a tie, rounded to even), 2050 at once;
// 256 + 1 + 1 likewise in bfloat16.
func TestSimulateCombineRounding(t *testing.T) {
	skipUnderRace(t)
	src, err := os.ReadFile("../kernels.ptx")
	if err != nil {
		t.Fatal(err)
	}
	fns := parsePTX(t, string(src))
	for _, c := range []struct {
		dt        tensor.DType
		big, want float32
	}{{tensor.Float16, 2048, 2048}, {tensor.BFloat16, 256, 256}} {
		name, err := kernels.CombineName(tensor.Sum, c.dt)
		if err != nil {
			t.Fatal(err)
		}
		enc := reduce.Float32ToFloat16
		if c.dt == tensor.BFloat16 {
			enc = reduce.Float32ToBFloat16
		}
		h := func(f float32) []byte { return binary.LittleEndian.AppendUint16(nil, enc(f)) }
		// Nine elements: a vector of eight and one by element.
		const in0, in1, in2, out = 0x20000000, 0x21000000, 0x22000000, 0x23000000
		x9 := func(b []byte) []byte { return bytes.Repeat(b, 9) }
		mem := map[uint64][]byte{in0: x9(h(c.big)), in1: x9(h(1)), in2: x9(h(1)), out: x9(h(0))}
		mem[0x10000000] = kernels.AppendTable(nil, kernels.Segment{Count: 9, In: []uint64{in0, in1, in2}, Out: []uint64{out}})
		st := launch(t, fns[name], 1, 1, mem, 0x10000000, 1, 3, 1, math.Float64bits(1), math.Float64bits(1))
		if got, want := mem[out], x9(h(c.want)); !bytes.Equal(got, want) {
			t.Errorf("%s: %v + 1 + 1 = %x, want %x", name, c.big, got, want)
		}
		if st.vecLoads != 3 || st.loads != 3 {
			t.Errorf("%s: %d vector loads and %d element loads, want 3 and 3", name, st.vecLoads, st.loads)
		}
		// The reference agrees, and one reduce.Reduce does not.
		if got := combineWant(t, [][]byte{h(c.big), h(1), h(1)}, c.dt, tensor.Sum, 1, 1); !bytes.Equal(got, h(c.want)) {
			t.Errorf("combineWant: %x", got)
		}
		once := h(0)
		if err := reduce.Reduce([][]byte{once}, [][]byte{h(c.big), h(1), h(1)}, c.dt, tensor.Sum, 1, 1, nil); err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(once, h(c.want)) {
			t.Errorf("one reduce.Reduce gives %x too: the case does not tell the roundings apart", once)
		}
	}
}

// guard is what follows every buffer of a simulated launch: a kernel that
// writes past a buffer's end changes it.
var guard = bytes.Repeat([]byte{0xee}, 8)

func simulateCombine(t *testing.T, f *ptxFunc, r *rand.Rand, k kernels.Kernel, nin, nout int, inPlace bool, pre, post float64, grid, block int, name string) *launchStats {
	t.Helper()
	dt := k.DType
	mem := map[uint64][]byte{}
	next := uint64(0x20000000)
	buffer := func(b []byte, off uint64) uint64 {
		p := next + off
		next += 0x1000000
		mem[p] = append(append([]byte(nil), b...), guard...)
		return p
	}
	type segment struct {
		combineSeg
		ins  [][]byte // the inputs as written
		in   []uint64
		out  []uint64
		want []byte
	}
	var segs []segment
	var table []byte
	for _, cs := range combineSegs {
		n := cs.count
		s := segment{combineSeg: cs}
		// The skew: a whole number of elements that is not of 16 bytes.
		off := uint64(dt.Size() * (1 + r.IntN(16/dt.Size()-1)))
		inOff, outOff := make([]uint64, nin), make([]uint64, nout)
		switch cs.skew {
		case skewIn:
			inOff[nin-1] = off
		case skewOut:
			if inPlace && nout-1 < nin {
				inOff[nout-1] = off
			} else {
				outOff[nout-1] = off
			}
		case skewAll:
			for j := range inOff {
				inOff[j] = off
			}
			for j := range outOff {
				outOff[j] = off
			}
		}
		for j := range nin {
			b := randomData(r, dt, n)
			if cs.finite {
				b = finiteData(r, dt, n)
			}
			s.ins = append(s.ins, b)
			s.in = append(s.in, buffer(b, inOff[j]))
		}
		for j := range nout {
			if inPlace && j < nin {
				s.out = append(s.out, s.in[j])
				continue
			}
			s.out = append(s.out, buffer(bytes.Repeat([]byte{0x5a}, n*dt.Size()), outOff[j]))
		}
		s.want = combineWant(t, s.ins, dt, k.Op, pre, post)
		table = kernels.AppendTable(table, kernels.Segment{Count: uint64(n), In: s.in, Out: s.out})
		segs = append(segs, s)
	}
	const tableBase = 0x10000000
	mem[tableBase] = append(table, guard...)
	st := launch(t, f, grid, block, mem, tableBase, uint64(len(segs)), uint64(nin), uint64(nout), math.Float64bits(pre), math.Float64bits(post))

	if !bytes.Equal(mem[tableBase][:len(table)], table) {
		t.Fatalf("%s: the table changed", name)
	}
	// An add or a multiply makes any NaN; min and max pass NaNs on as
	// reduce does, and so does a copy.
	arith := k.Op == tensor.Sum || k.Op == tensor.Product || pre != 1 || post != 1
	sz := dt.Size()
	for si, s := range segs {
		outs := map[uint64]bool{}
		for _, p := range s.out {
			outs[p] = true
			got := mem[p]
			if !bytes.Equal(got[len(s.want):], guard) {
				t.Fatalf("%s: segment %d: wrote past the end of an output: %x", name, si, got[len(s.want):])
			}
			for i := range len(s.want) / sz {
				g, w := got[i*sz:(i+1)*sz], s.want[i*sz:(i+1)*sz]
				if bytes.Equal(g, w) || arith && isNaN(dt, g) && isNaN(dt, w) {
					continue
				}
				var ins []string
				for _, in := range s.ins {
					ins = append(ins, fmt.Sprintf("%x", in[i*sz:(i+1)*sz]))
				}
				t.Fatalf("%s: segment %d (count %d, %v) element %d: got %x, want %x (inputs %s)", name, si, s.count, s.skew, i, g, w, strings.Join(ins, " "))
			}
		}
		for j, p := range s.in {
			if !outs[p] && !bytes.Equal(mem[p], append(append([]byte(nil), s.ins[j]...), guard...)) {
				t.Fatalf("%s: segment %d: input %d changed", name, si, j)
			}
		}
	}
	checkPaths(t, k, nin, nout, st, name)
	return st
}

// checkPaths checks that a combine launch over combineSegs did each
// element the way it should have: by vector (16 bytes a load, one load per
// input and one store per output for each vector) the whole vectors of the
// aligned segments, for the dtypes of vecFor, and all else by element.
// float16's vectors whose inputs hold a NaN are done by element instead:
// there each vector is either stored or handed over (st.nanVectors), a
// vector of NaN-free inputs always stored, and the loads of a vector
// handed over are those it made before it found the NaN.
func checkPaths(t *testing.T, k kernels.Kernel, nin, nout int, st *launchStats, name string) {
	t.Helper()
	v, vec := vecFor(k.DType)
	var want launchStats
	vectors, finite := 0, 0 // whole vectors in aligned segments, in those with finite inputs
	for _, cs := range combineSegs {
		nv := 0
		if vec && cs.skew == aligned {
			nv = cs.count / v.lanes
		}
		vectors += nv
		if cs.finite {
			finite += nv
		}
		rest := cs.count - nv*v.lanes
		want.vecLoads += nv * nin
		want.vecStores += nv * nout
		want.loads += rest * nin
		want.stores += rest * nout
	}
	if vec && (want.vecLoads == 0 || want.loads == 0) {
		t.Fatal("combineSegs take the vector loop or the element loop only")
	}
	if v.fast {
		stored := st.vecStores / nout
		if stored+st.nanVectors != vectors || stored < finite || st.vecStores != stored*nout ||
			st.vecLoads < stored*nin+st.nanVectors || st.vecLoads > vectors*nin {
			t.Fatalf("%s: %d vectors, %d with finite inputs; %d vector loads, %d vector stores, %d vectors handed to the element loop",
				name, vectors, finite, st.vecLoads, st.vecStores, st.nanVectors)
		}
		want.loads += st.nanVectors * v.lanes * nin
		want.stores += st.nanVectors * v.lanes * nout
		want.vecLoads, want.vecStores, want.nanVectors = st.vecLoads, st.vecStores, st.nanVectors
	}
	if *st != want {
		t.Fatalf("%s: %+v, want %+v", name, *st, want)
	}
}
