package tcp

import (
	"encoding/binary"
	"fmt"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/reduce"
	"github.com/hvdd/hvdd/tensor"
)

// Wire compression (Config.Compression): float32 data crosses the network
// in 16 bits, float16 or bfloat16, while every sum is accumulated in
// float32.
//
// What is compressed. Only float32 data reduced with Sum, that is the
// Allreduce and ReduceScatter of gradients (the daemon turns Average into
// Sum and scales afterwards); everything else travels as it is:
//
//   - other dtypes: float16 and bfloat16 are 16 bits already, float64 and
//     the integers would lose what their users chose them for;
//   - Min, Max and Product: their buffers are small (flags, norms, counts),
//     so 16 bits would save no time, and their users expect exact values:
//     a maximum compared with a threshold, a product that overflows float16
//     after a few factors;
//   - Broadcast and Allgatherv: not reductions, and their buffers carry no
//     dtype (backends.Backend). Horovod broadcasts initial parameters and
//     optimizer state with them; rounded, Adam's second moments (often
//     below float16's 6e-8) would turn to 0 and its steps blow up, and a
//     checkpoint restored on every rank would lose its low bits. So they
//     stay exact, as Horovod's hvd.Compression also leaves them.
//
// Messages. A compressed message carries one segment of a ring step, or a
// whole buffer of recursive doubling:
//
//	kind u8 | 0 0 0 | count u32 (little-endian) | payload
//
// kind wireHalf: count 16-bit values; kind wireFull: count float32 values,
// because narrowing them overflowed (a finite value beyond the format's
// range, |x| >= 65520 for float16, would have become ±Inf). The receiver
// knows count from the layout, as for bare bytes; it reads the header and
// 2·count bytes at once, and 2·count more for a full message. A header
// that is not one of these, or names another count, means the byte streams
// are out of step, and fails the collective.
//
// Overflow is decided per message, by its sender: a segment is sent full
// when any of its values would overflow, and whoever decodes it gets the
// sender's float32 bits. This keeps the results finite wherever float32's
// are (an all-or-nothing choice per segment costs only the segments that
// hold such values), rather than saturating at ±65504, which would be a
// silent error of any size. NaNs and infinities are not overflow: they
// travel in 16 bits and come back as NaN (quieted) and ±Inf.
//
// Agreement. Every rank must end with the same bits, so every value that
// more than one rank computes must be computed from the same operands:
//
//   - ring allreduce: each block's final value is computed by its owner
//     alone (reduce-scatter), then copied to every rank (allgather). The
//     owner narrows its block when it sends it at the first allgather step
//     and keeps what it sent: the widened 16-bit values for a half message,
//     its float32 values for a full one, exactly what every receiver
//     decodes (encode's keep). A rank forwarding a block encodes the
//     float32 values it decoded again: narrowing widened 16-bit values
//     gives the same bits and cannot overflow, and a full segment
//     overflows again, so every link carries the owner's message;
//   - recursive doubling: partners combine the same two operands, so each
//     rank keeps what it sends (its buffer rounded as the partner decodes
//     it) before it combines, and the lower rank's operand comes first as
//     without compression. The result is rounded once more at the end, on
//     every rank, because extra ranks (n not a power of two) receive it
//     in 16 bits.
//
// Reduce-scatter results have one owner each and are not rounded at the
// end: each rank keeps the float32 sum of the 16-bit partial sums it
// received and its own float32 input.
//
// Error. Along any input's path there are at most n roundings to 16 bits
// (the ring: n-1 partial sums, one per step, then the final value) and
// n-1 float32 additions, which gives backends.Compression.ErrorBound:
// |F - S| <= γ·Σ|x_i| + (2n-1)(1+γ)·η with γ = (1+u)^n (1+2^-24)^(n-1) - 1,
// u = 2^-11 (float16) or 2^-8 (bfloat16), η = 2^-25 or 2^-134 (half the
// smallest subnormal, for values below the normal range). The tests check
// it against float64 sums over rank counts 2 to 5.

const (
	wireHeader = 8 // bytes before a compressed message's payload
	wireHalf   = 1 // payload: count 16-bit values
	wireFull   = 2 // payload: count float32 values
)

// A codec encodes and decodes the compressed messages of one collective.
// A nil *codec means the collective's data travels as bare bytes.
type codec struct {
	format tensor.DType // tensor.Float16 or tensor.BFloat16
}

var codecs = [...]codec{backends.CompressFP16: {tensor.Float16}, backends.CompressBF16: {tensor.BFloat16}}

// codecFor returns the codec of a reduction of dt with op, or nil when its
// data travels as it is (see above).
func (e *engine) codecFor(dt tensor.DType, op tensor.ReduceOp) *codec {
	if e.cfg.Compression == backends.CompressNone || dt != tensor.Float32 || op != tensor.Sum {
		return nil
	}
	return &codecs[e.cfg.Compression]
}

// wireCap is the room a message of n float32 values may need: the header
// and the payload of a full message.
func wireCap(n int) int { return wireHeader + 4*n }

// encode writes the message carrying the float32 values of src into buf
// (at least wireCap(len(src)/4) bytes) and returns it. With keep, src is
// then replaced by what the receiver will decode, so that the sender holds
// the same bits (src changes only when the message is half).
func (z *codec) encode(buf, src []byte, keep bool) ([]byte, error) {
	n := len(src) / 4
	m := buf[:wireHeader+2*n]
	ovf, err := reduce.Narrow(m[wireHeader:], src, z.format)
	if err != nil {
		return nil, err
	}
	kind := byte(wireHalf)
	switch {
	case ovf:
		kind = wireFull
		m = buf[:wireHeader+4*n]
		copy(m[wireHeader:], src)
	case keep:
		if err := reduce.Widen(src, m[wireHeader:], z.format); err != nil {
			return nil, err
		}
	}
	m[0], m[1], m[2], m[3] = kind, 0, 0, 0
	binary.LittleEndian.PutUint32(m[4:], uint32(n))
	return m, nil
}

// store decodes a message's payload into dst (float32).
func (z *codec) store(dst, payload []byte, half bool) error {
	if !half {
		copy(dst, payload)
		return nil
	}
	return reduce.Widen(dst, payload, z.format)
}

// accumulate sets dst = decoded payload + with, in float32, the received
// operand first as in the uncompressed ring; dst may be with itself.
func (z *codec) accumulate(dst, payload []byte, half bool, with []byte, ropts *reduce.Options) error {
	if !half {
		return reduce.Reduce([][]byte{dst}, [][]byte{payload, with}, tensor.Float32, tensor.Sum, 1, 1, ropts)
	}
	return reduce.AddWidened(dst, payload, with, z.format)
}

// parseWireHeader checks the header h of a message that should carry n
// values and returns its kind, wireHalf or wireFull.
func parseWireHeader(h []byte, n int) (byte, error) {
	kind, count := h[0], binary.LittleEndian.Uint32(h[4:])
	if h[1]|h[2]|h[3] != 0 || count != uint32(n) || kind != wireHalf && kind != wireFull {
		return 0, fmt.Errorf("header %x, expected %d values", h[:wireHeader], n)
	}
	return kind, nil
}

// recvWire receives a message of n float32 values from p on stream s into
// buf (at least wireCap(n) bytes) and returns its payload and whether it is
// half.
func (b *Backend) recvWire(p *peer, s, n int, buf []byte) (payload []byte, half bool, err error) {
	m := buf[:wireHeader+2*n]
	if err := b.recv(p, s, m); err != nil {
		return nil, false, err
	}
	kind, err := parseWireHeader(m[:wireHeader], n)
	if err != nil {
		return nil, false, fmt.Errorf("rank %d sent a malformed compressed message (%v): the byte streams are out of step; are both daemons the same hvdd version?", p.rank, err)
	}
	if kind == wireHalf {
		return m[wireHeader:], true, nil
	}
	if err := b.recv(p, s, buf[wireHeader+2*n:wireHeader+4*n]); err != nil {
		return nil, false, err
	}
	return buf[wireHeader : wireHeader+4*n], false, nil
}

// exchangeWire sends msg to p and receives p's message of n values into
// in, on stream 0, as exchange does with bare bytes.
func (b *Backend) exchangeWire(p *peer, msg []byte, n int, in []byte) ([]byte, bool, error) {
	if len(msg) <= b.inlineMax {
		if err := b.send(p, 0, msg); err != nil {
			return nil, false, err
		}
		return b.recvWire(p, 0, n, in)
	}
	errc := make(chan error, 1)
	go func() { errc <- b.send(p, 0, msg) }()
	payload, half, rerr := b.recvWire(p, 0, n, in)
	if serr := <-errc; rerr == nil && serr != nil {
		return nil, false, serr
	}
	return payload, half, rerr
}

// allreduceDoublingWire is allreduceDoubling with compressed messages (see
// the agreement rules above): each round every rank encodes its buffer,
// keeps what it sent, and combines it with what its partner sent, lower
// rank first; extra ranks send their data compressed and get the result
// compressed, which every rank rounds the same way.
func (b *Backend) allreduceDoublingWire(buf []byte, z *codec) error {
	n, r := b.size, b.rank
	p2 := 1
	for p2*2 <= n {
		p2 *= 2
	}
	rem := n - p2
	elems := len(buf) / 4
	outp, inp, tmpp := b.getBuf(wireCap(elems)), b.getBuf(wireCap(elems)), b.getBuf(len(buf))
	defer b.putBuf(outp)
	defer b.putBuf(inp)
	defer b.putBuf(tmpp)
	out, in, tmp := *outp, *inp, *tmpp
	const s = 0

	// decode returns a received message's values as float32: a full
	// payload as it is, a half one widened into tmp.
	decode := func(payload []byte, half bool) ([]byte, error) {
		if !half {
			return payload, nil
		}
		return tmp, reduce.Widen(tmp, payload, z.format)
	}
	combine := func(lower, higher []byte) error {
		return reduce.Reduce([][]byte{buf}, [][]byte{lower, higher}, tensor.Float32, tensor.Sum, 1, 1, &b.ropts)
	}

	// Pre-step: extra ranks hand their data to their partner below p2,
	// and wait for the result.
	switch {
	case r >= p2:
		partner := b.peers[r-p2]
		msg, err := z.encode(out, buf, false)
		if err != nil {
			return err
		}
		if err := b.send(partner, s, msg); err != nil {
			return err
		}
		payload, half, err := b.recvWire(partner, s, elems, in)
		if err != nil {
			return err
		}
		return z.store(buf, payload, half)
	case r < rem:
		payload, half, err := b.recvWire(b.peers[r+p2], s, elems, in)
		if err != nil {
			return err
		}
		v, err := decode(payload, half)
		if err != nil {
			return err
		}
		if err := combine(buf, v); err != nil {
			return err
		}
	}

	for mask := 1; mask < p2; mask <<= 1 {
		partner := b.peers[r^mask]
		msg, err := z.encode(out, buf, true)
		if err != nil {
			return err
		}
		payload, half, err := b.exchangeWire(partner, msg, elems, in)
		if err != nil {
			return err
		}
		v, err := decode(payload, half)
		if err != nil {
			return err
		}
		if partner.rank < r {
			err = combine(v, buf)
		} else {
			err = combine(buf, v)
		}
		if err != nil {
			return err
		}
	}

	// Every rank rounds the result as it travels to the extra ranks.
	msg, err := z.encode(out, buf, true)
	if err != nil {
		return err
	}
	if r < rem {
		return b.send(b.peers[r+p2], s, msg)
	}
	return nil
}
