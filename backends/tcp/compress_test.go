package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/backends/backendtest"
	"github.com/hvdd/hvdd/reduce"
	"github.com/hvdd/hvdd/tensor"
)

var compressions = []backends.Compression{backends.CompressFP16, backends.CompressBF16}

// TestConformanceCompressed runs the conformance suite with float16
// compression: its float Sum inputs are small integers, exact in 16 bits,
// so every result must still be bit for bit the reference, through the
// compressed rings (small segments, several channels) and recursive
// doubling. (bfloat16 takes the same code with another conversion; the
// bound and model tests below run it.)
func TestConformanceCompressed(t *testing.T) {
	t.Parallel()
	if testing.Short() || raceEnabled {
		t.Skip("TestConformance's matrix again, minutes under the race detector: scripts/test.sh runs it without -race; TestCompressedBound and TestCompressedModel cover the compressed paths here")
	}
	backendtest.Run(t, suite(func(cfg *Config) {
		cfg.ChunkBytes = 4 << 10
		cfg.SmallBytes = 512
		cfg.Streams = 3
		cfg.Compression = backends.CompressFP16
	}))
}

// TestCompressedBound runs backendtest.RunCompressed (results within the
// error bound of float64 sums, identical on every rank, overflow kept
// finite, NaN and Inf propagated, half the bytes) with both formats: with
// small segments and thresholds (rings, many segments, three channels),
// and with the defaults (recursive doubling up to 64 KiB).
func TestCompressedBound(t *testing.T) {
	t.Parallel()
	for _, c := range compressions {
		t.Run(c.String(), func(t *testing.T) {
			t.Run("rings", func(t *testing.T) {
				backendtest.RunCompressed(t, c, suite(func(cfg *Config) {
					cfg.ChunkBytes = 16 << 10
					cfg.SmallBytes = 512
					cfg.Streams = 3
					cfg.Compression = c
				}))
			})
			t.Run("defaults", func(t *testing.T) {
				backendtest.RunCompressed(t, c, suite(func(cfg *Config) { cfg.Compression = c }))
			})
		})
	}
}

// The tests below check the engine against a model of what it computes:
// emulateAllreduce and emulateReduceScatter follow each element's path
// through the ring or the doubling rounds (which rank adds what, in which
// order, where a value is rounded to 16 bits and which segments travel in
// float32 because they would overflow), in plain scalar Go on the float32
// inputs, and the engine must give the very same bits. So they pin the
// design: partial sums rounded once per step, the receiver's own input
// added in float32, the owner keeping what it sent.

// round16 is one trip through the wire format: narrow and widen one value.
func round16(c backends.Compression, f float32) float32 {
	if c == backends.CompressFP16 {
		return reduce.Float16ToFloat32(reduce.Float32ToFloat16(f))
	}
	return reduce.BFloat16ToFloat32(reduce.Float32ToBFloat16(f))
}

// overflows reports whether narrowing f makes a finite value infinite.
func overflows(c backends.Compression, f float32) bool {
	return !math.IsInf(float64(f), 0) && !math.IsNaN(float64(f)) && math.IsInf(float64(round16(c, f)), 0)
}

// send models one compressed message of values v: rounded, unless one of
// them overflows, in which case all travel as they are.
func send(c backends.Compression, v []float32) []float32 {
	out := make([]float32, len(v))
	for _, f := range v {
		if overflows(c, f) {
			copy(out, v)
			return out
		}
	}
	for i, f := range v {
		out[i] = round16(c, f)
	}
	return out
}

// ringModel models ring passes over one float32 buffer: cfg's channels,
// n blocks per channel, segments of seg elements.
type ringModel struct {
	c        backends.Compression
	n, nch   int
	seg      int
	elements int
}

// chain runs the reduce-scatter chain of one block [lo, hi) of a channel:
// first the rank starting it sends its input, then each next rank adds its
// input to what it received, n-1 steps, segment by segment. It returns the
// last rank's sum.
func (m ringModel) chain(in [][]float32, lo, hi, first int) []float32 {
	acc := append([]float32(nil), in[first][lo:hi]...)
	for step := 1; step < m.n; step++ {
		q := (first + step) % m.n
		for j := 0; j < len(acc); j += m.seg {
			s := acc[j:min(j+m.seg, len(acc))]
			got := send(m.c, s)
			for i := range s {
				s[i] = got[i] + in[q][lo+j+i]
			}
		}
	}
	return acc
}

// emulateAllreduce models the ring allreduce: block k of each channel is
// started by rank k and owned by rank k-1, which sends it (and keeps it)
// as one message per segment.
func (m ringModel) emulateAllreduce(in [][]float32) []float32 {
	out := make([]float32, m.elements)
	for c := range m.nch {
		clo, chi := part(m.elements, m.nch, c)
		for k := range m.n {
			lo, hi := part(chi-clo, m.n, k)
			lo, hi = clo+lo, clo+hi
			acc := m.chain(in, lo, hi, k)
			for j := 0; j < len(acc); j += m.seg {
				copy(out[lo+j:], send(m.c, acc[j:min(j+m.seg, len(acc))]))
			}
		}
	}
	return out
}

// emulateReduceScatter models the ring reduce-scatter of blocks of cnt
// elements: block k (dealt into channels) is started by rank k+1 and ends,
// unrounded, on rank k.
func (m ringModel) emulateReduceScatter(in [][]float32, cnt []int) [][]float32 {
	off := offsets(cnt)
	out := make([][]float32, m.n)
	for k := range m.n {
		out[k] = make([]float32, cnt[k])
		for c := range m.nch {
			lo, hi := part(cnt[k], m.nch, c)
			copy(out[k][lo:], m.chain(in, off[k]+lo, off[k]+hi, (k+1)%m.n))
		}
	}
	return out
}

// emulateDoubling models recursive doubling: extra ranks' data sent to
// their partners, rounds in which both partners round their buffer as they
// send it and add, lower rank first, and the result rounded once more.
func emulateDoubling(c backends.Compression, in [][]float32) []float32 {
	n := len(in)
	p2 := 1
	for p2*2 <= n {
		p2 *= 2
	}
	buf := make([][]float32, p2)
	for r := range p2 {
		buf[r] = append([]float32(nil), in[r]...)
		if r+p2 < n {
			got := send(c, in[r+p2])
			for i := range buf[r] {
				buf[r][i] += got[i]
			}
		}
	}
	for mask := 1; mask < p2; mask <<= 1 {
		next := make([][]float32, p2)
		for r := range p2 {
			lo, hi := min(r, r^mask), max(r, r^mask)
			a, b := send(c, buf[lo]), send(c, buf[hi])
			next[r] = make([]float32, len(a))
			for i := range a {
				next[r][i] = a[i] + b[i]
			}
		}
		buf = next
	}
	return send(c, buf[0])
}

// modelInputs returns n buffers of count values of mixed magnitudes, some
// of them beyond float16's range (1e5) so that some segments travel in
// float32, and values with bits below 16-bit precision, which must reach
// the sums unrounded on the rank that adds them.
func modelInputs(seed uint64, n, count int) [][]float32 {
	r := rand.New(rand.NewPCG(seed, 3))
	in := make([][]float32, n)
	for k := range in {
		in[k] = make([]float32, count)
		for i := range in[k] {
			v := float32((1 + 9*r.Float64()) * math.Pow(10, float64(r.IntN(12)-7)))
			if r.IntN(2) == 0 {
				v = -v
			}
			if r.IntN(5000) == 0 {
				v = 1e5
			}
			in[k][i] = v
		}
	}
	return in
}

func floatsOf(b []byte) []float32 {
	f := make([]float32, len(b)/4)
	for i := range f {
		f[i] = math.Float32frombits(binary.NativeEndian.Uint32(b[4*i:]))
	}
	return f
}

func bytesOf(f []float32) []byte {
	b := make([]byte, 4*len(f))
	for i, v := range f {
		binary.NativeEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// onGroup runs f on every rank of g at once and fails t with the errors.
func onGroup(t *testing.T, g []*Backend, f func(ctx context.Context, r int, b *Backend) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(g))
	for r, b := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(context.Background(), r, b)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func sameFloats(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: element %d of %d = %v (%#08x), the model computes %v (%#08x)", what, i, len(want), got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

// TestCompressedModel checks Allreduce (ring and doubling) and
// ReduceScatter (ring) bit for bit against the models, for both formats,
// 2 to 5 ranks and 1 or 2 channels.
func TestCompressedModel(t *testing.T) {
	t.Parallel()
	const chunk = 4 << 10 // 1024 float32 per segment
	for _, c := range compressions {
		for n := 2; n <= 5; n++ {
			for _, nch := range []int{1, 2} {
				t.Run(fmt.Sprintf("%v/n=%d/streams=%d", c, n, nch), func(t *testing.T) {
					g := group(t, n, func(cfg *Config) {
						cfg.Compression, cfg.Streams, cfg.ChunkBytes = c, nch, chunk
						cfg.SmallBytes = 16 << 10
					})
					m := ringModel{c: c, n: n, nch: nch, seg: chunk / 4}
					for _, count := range []int{3, 1000, 4095, 50000 + n} {
						in := modelInputs(uint64(count*n), n, count)
						bufs := make([][]byte, n)
						for r := range bufs {
							bufs[r] = bytesOf(in[r])
						}
						onGroup(t, g, func(ctx context.Context, r int, b *Backend) error {
							return b.Allreduce(ctx, bufs[r], tensor.Float32, tensor.Sum)
						})
						var want []float32
						if 4*count <= 16<<10 {
							want = emulateDoubling(c, in)
						} else {
							m.elements = count
							want = m.emulateAllreduce(in)
						}
						for r := range n {
							sameFloats(t, fmt.Sprintf("Allreduce of %d on rank %d", count, r), floatsOf(bufs[r]), want)
						}

						if 4*count <= 16<<10 {
							continue // ReduceScatter takes the doubling too
						}
						cnt := make([]int, n)
						for k := range cnt {
							cnt[k] = count / n
						}
						cnt[n-1] += count % n
						bcnt := make([]int, n)
						for k := range cnt {
							bcnt[k] = 4 * cnt[k]
						}
						outs := make([][]byte, n)
						onGroup(t, g, func(ctx context.Context, r int, b *Backend) error {
							outs[r] = make([]byte, bcnt[r])
							return b.ReduceScatter(ctx, bytesOf(in[r]), outs[r], bcnt, tensor.Float32, tensor.Sum)
						})
						wantRS := m.emulateReduceScatter(in, cnt)
						for r := range n {
							sameFloats(t, fmt.Sprintf("ReduceScatter of %d on rank %d", count, r), floatsOf(outs[r]), wantRS[r])
						}
					}
				})
			}
		}
	}
}

// TestCompressedOverflow sends float16 data whose sums leave its range
// (65504) in the first half of the buffer, and 1.5 per rank in the second:
// the first half must come back as the exact float32 sum (not Inf, nor
// 65504 from saturating), the second as 1.5n. With 2 ranks the halves are
// the two blocks of the ring, so the bytes sent tell which messages went
// in 16 bits: with 40000 per rank only the final sum (80000) overflows,
// and the owner of the first block sends it in float32 once (5/8 of an
// uncompressed ring's bytes); with 70000 the inputs overflow already, and
// the first block travels in float32 both ways (3/4). With 3 ranks the
// partial sums overflow half way round the ring.
func TestCompressedOverflow(t *testing.T) {
	const count = 1 << 16
	tests := []struct {
		n     int
		big   float32
		ratio float64 // of an uncompressed ring's bytes; 0: not checked
	}{
		{2, 40000, 0.625},
		{2, 70000, 0.75},
		{3, 40000, 0},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("n=%d/%v", tc.n, tc.big), func(t *testing.T) {
			g := group(t, tc.n, func(cfg *Config) {
				cfg.Compression, cfg.Streams, cfg.ChunkBytes, cfg.SmallBytes = backends.CompressFP16, 1, 16<<10, 512
			})
			in := make([]float32, count)
			for i := range in {
				in[i] = 1.5
				if i < count/2 {
					in[i] = tc.big
				}
			}
			bufs := make([][]byte, tc.n)
			for r := range bufs {
				bufs[r] = bytesOf(in)
			}
			onGroup(t, g, func(ctx context.Context, r int, b *Backend) error {
				return b.Allreduce(ctx, bufs[r], tensor.Float32, tensor.Sum)
			})
			for r := range bufs {
				for i, v := range floatsOf(bufs[r]) {
					want := 1.5 * float32(tc.n)
					if i < count/2 {
						want = tc.big * float32(tc.n)
					}
					if v != want {
						t.Fatalf("rank %d element %d = %v, want %v", r, i, v, want)
					}
				}
			}
			if tc.ratio == 0 {
				return
			}
			var sent int64
			for _, b := range g {
				for _, v := range b.Stats().SentBytes {
					sent += v
				}
			}
			plain := float64(2 * (tc.n - 1) * 4 * count)
			if f := float64(sent) / plain; math.Abs(f-tc.ratio) > 0.002 {
				t.Errorf("sent %.4f of an uncompressed ring's bytes, want %.4f (and headers)", f, tc.ratio)
			}
		})
	}
}

// TestMalformedWireMessage feeds a receiver a header that does not match
// what the layout expects, as a peer out of step would, and expects an
// error naming the peer rather than garbage in the buffer.
func TestMalformedWireMessage(t *testing.T) {
	g := group(t, 2, func(cfg *Config) { cfg.Compression = backends.CompressFP16 })
	bad := make([]byte, wireHeader+2*10)
	bad[0] = wireHalf
	binary.LittleEndian.PutUint32(bad[4:], 11) // 11 values, not 10
	errc := make(chan error, 1)
	go func() { errc <- g[0].send(g[0].peers[1], 0, bad) }()
	_, _, err := g[1].recvWire(g[1].peers[0], 0, 10, make([]byte, wireCap(10)))
	if err == nil || !strings.Contains(err.Error(), "rank 0 sent a malformed compressed message") {
		t.Errorf("recvWire: %v, want the malformed message named", err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestUncompressedOps checks that Min, Max, Product and other dtypes
// travel as they are: a float32 Max of values with bits below 16-bit
// precision comes back exact, and float64 Sum bytes are not halved.
func TestUncompressedOps(t *testing.T) {
	g := group(t, 2, func(cfg *Config) { cfg.Compression = backends.CompressBF16 })
	v := []float32{1 + 0x1p-20, -3.14159, 1e-30}
	bufs := [][]byte{bytesOf(v), bytesOf([]float32{0, -4, 0})}
	onGroup(t, g, func(ctx context.Context, r int, b *Backend) error {
		return b.Allreduce(ctx, bufs[r], tensor.Float32, tensor.Max)
	})
	for r := range bufs {
		if !bytes.Equal(bufs[r], bytesOf(v)) {
			t.Errorf("rank %d: Max = %v, want %v exactly", r, floatsOf(bufs[r]), v)
		}
	}
	before := g[0].Stats().SentBytes[1]
	onGroup(t, g, func(ctx context.Context, r int, b *Backend) error {
		return b.Allreduce(ctx, make([]byte, 8<<10), tensor.Float64, tensor.Sum)
	})
	if got := g[0].Stats().SentBytes[1] - before; got != 8<<10 {
		t.Errorf("float64 Sum of 8 KiB sent %d bytes, want 8192 (as it is)", got)
	}
}

// FuzzWireMessage encodes fuzzer-chosen float32 values (data) as a message,
// with the owner's keep, and decodes it as a receiver would: the header
// must parse, the receiver must get exactly the bits the sender kept, and
// a message is half unless some finite value overflows the format. Any
// 8 bytes given as a header (hdr) must parse only when they are one.
func FuzzWireMessage(f *testing.F) {
	f.Add(bytesOf([]float32{1, 65504, 65520, float32(math.NaN()), float32(math.Inf(-1)), 1e-9}), []byte{1, 0, 0, 0, 6, 0, 0, 0}, uint8(0))
	f.Add(bytesOf([]float32{3.3961e38, -1, 0}), []byte{2, 0, 0, 0, 3, 0, 0, 1}, uint8(1))
	f.Fuzz(func(t *testing.T, data, hdr []byte, sel uint8) {
		z := &codecs[compressions[sel%2]]
		c := compressions[sel%2]
		n := len(data) / 4
		src := append([]byte(nil), data[:4*n]...)
		kept := append([]byte(nil), src...)
		msg, err := z.encode(make([]byte, wireCap(n)), kept, true)
		if err != nil {
			t.Fatal(err)
		}
		kind, err := parseWireHeader(msg, n)
		if err != nil {
			t.Fatalf("encode's header does not parse: %v", err)
		}
		over := false
		for _, f := range floatsOf(src) {
			over = over || overflows(c, f)
		}
		if want := map[bool]byte{false: wireHalf, true: wireFull}[over]; kind != want || len(msg) != wireHeader+2*n*int(kind) {
			t.Fatalf("%d values (overflow %v): message kind %d of %d bytes", n, over, kind, len(msg))
		}
		got := make([]byte, 4*n)
		if err := z.store(got, msg[wireHeader:], kind == wireHalf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, kept) {
			t.Fatalf("receiver decodes %x, the sender kept %x", got, kept)
		}
		if kind == wireHalf {
			for i, f := range floatsOf(src) {
				if g := floatsOf(kept)[i]; math.Float32bits(g) != math.Float32bits(round16(c, f)) {
					t.Fatalf("value %d: kept %v, one rounding of %v gives %v", i, g, f, round16(c, f))
				}
			}
		} else if !bytes.Equal(kept, src) {
			t.Fatalf("a full message changed the sender's values")
		}
		if len(hdr) >= wireHeader {
			k, err := parseWireHeader(hdr, n)
			valid := (hdr[0] == wireHalf || hdr[0] == wireFull) && hdr[1]|hdr[2]|hdr[3] == 0 && binary.LittleEndian.Uint32(hdr[4:]) == uint32(n)
			if (err == nil) != valid || err == nil && k != hdr[0] {
				t.Fatalf("header %x for %d values: kind %d, %v", hdr[:wireHeader], n, k, err)
			}
		}
	})
}
