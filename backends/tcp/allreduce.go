package tcp

import (
	"context"
	"fmt"

	"github.com/hvdd/hvdd/reduce"
	"github.com/hvdd/hvdd/tensor"
)

// Allreduce reduces buf element-wise across ranks, in place. Buffers of at
// most Config.SmallBytes use recursive doubling (latency: ⌈log2 n⌉ rounds,
// two more when n is not a power of two); larger ones a pipelined ring
// reduce-scatter + allgather on Config.Streams channels (bandwidth: every
// rank moves 2(n-1)/n of the buffer each way). Either way every rank ends
// with bit-identical bytes.
func (b *Backend) Allreduce(ctx context.Context, buf []byte, dt tensor.DType, op tensor.ReduceOp) error {
	return b.do(ctx, "Allreduce", func() error {
		if err := checkReduce(len(buf), dt, op); err != nil {
			return err
		}
		switch {
		case b.size == 1 || len(buf) == 0:
			return nil
		case len(buf) <= b.tuning().SmallBytes:
			return b.allreduceDoubling(buf, dt, op)
		}
		return b.allreduceRing(buf, dt, op)
	})
}

func checkReduce(n int, dt tensor.DType, op tensor.ReduceOp) error {
	if !dt.Valid() {
		return fmt.Errorf("invalid dtype %v", dt)
	}
	if n%dt.Size() != 0 {
		return fmt.Errorf("buffer of %d bytes is not a whole number of %v elements", n, dt)
	}
	switch op {
	case tensor.Sum, tensor.Min, tensor.Max, tensor.Product:
		return nil
	}
	return fmt.Errorf("unsupported reduce op %v (want Sum, Min, Max or Product)", op)
}

// allreduceRing is the bandwidth-optimal allreduce: a reduce-scatter ring
// followed by an allgather ring, pipelined in segments, on every channel at
// once.
//
// The buffer of N elements is dealt into C = Config.Streams channels, and
// each channel's part into n blocks (part() in both cases). With blocks
// numbered mod n, at step s rank r
//
//	reduce-scatter (s = 0 .. n-2):  sends block r-s,
//	                                receives block r-s-1, reduces it in place;
//	allgather (s = n-1 .. 2n-3,     sends block r+1-t,
//	          t = s-(n-1)):         receives block r-t, stores it in place.
//
// After step n-2 the last block reduced, r-(n-2)-1 = r+1, has been through
// every rank once, so rank r owns its final value; the allgather then sends
// exactly that block first (t = 0: r+1) and forwards whatever it received
// in the step before. The final value of each block is computed once, by
// its owner, and copied everywhere else, so all ranks agree bit for bit.
//
// Example, n = 3, one channel, blocks A0 A1 A2 on rank 0 (B on 1, C on 2):
//
//	step 0: 0 sends A0 to 1, which makes A0+B0; likewise 1 makes B1+C1 on
//	        2 and 2 makes C2+A2 on 0
//	step 1: 1 sends A0+B0 to 2, which owns A0+B0+C0 (block r+1 = 0);
//	        0 comes to own block 1 and 1 block 2
//	steps 2, 3: the owned blocks go once round, stored, not reduced.
func (b *Backend) allreduceRing(buf []byte, dt tensor.DType, op tensor.ReduceOp) error {
	n, r := b.size, b.rank
	esz := dt.Size()
	elems := len(buf) / esz
	nch := b.tuning().Streams
	seg := segBytes(b.tuning().ChunkBytes, esz)
	next, prev := b.peers[mod(r+1, n)], b.peers[mod(r-1, n)]
	z := b.codecFor(dt, op)
	return channels(nch, func(c int) error {
		lo, hi := part(elems, nch, c)
		ch := buf[lo*esz : hi*esz]
		cn := hi - lo
		// block returns this channel's block k (mod n).
		block := func(k int) []byte {
			lo, hi := part(cn, n, mod(k, n))
			return ch[lo*esz : hi*esz]
		}
		p := &ringPass{
			b: b, stream: c, next: next, prev: prev,
			steps: 2 * (n - 1),
			seg:   seg,
			nseg:  ceilDiv(ceilDiv(cn, n)*esz, seg),
			dt:    dt, op: op,
			send: func(s int) []byte {
				if s < n-1 {
					return block(r - s)
				}
				return block(r + 1 - (s - (n - 1)))
			},
			recv: func(s int) ([]byte, []byte) {
				if s < n-1 {
					d := block(r - s - 1)
					return d, d
				}
				return block(r - (s - (n - 1))), nil
			},
			// Allgather step n-1+t overwrites block r-t, which
			// reduce-scatter step t sent.
			overwrites: func(s int) int { return s - (n - 1) },
			// Compressed, the owner keeps its block as it sends it
			// at the first allgather step (compress.go).
			z:    z,
			keep: func(s int) bool { return s == n-1 },
		}
		return p.run()
	})
}

// allreduceDoubling is the latency-oriented allreduce for small buffers:
// recursive doubling, in ⌈log2 n⌉ rounds of whole-buffer exchanges.
//
// Let p2 be the largest power of two <= n and rem = n - p2. Ranks p2 .. n-1
// are "extra": first each extra rank e folds its buffer into rank e-p2 and
// waits. The p2 remaining ranks then run rounds k = 0 .. log2(p2)-1: rank r
// exchanges its buffer with partner r XOR 2^k, and both combine the two
// buffers. After round k each rank holds the reduction over its aligned
// group of 2^(k+1) ranks, and after the last over all p2 of them (which
// include the extras' contributions). Finally rank e-p2 sends the result
// back to each extra rank e.
//
// Partners combine as op(lower group, higher group), the lower rank's data
// first, so both compute the same bits from the same operands: every rank
// ends with identical bytes, as with the ring. The pre- and post-steps cost
// two rounds only when n is not a power of two (Rabenseifner's and MPICH's
// treatment of the remainder).
func (b *Backend) allreduceDoubling(buf []byte, dt tensor.DType, op tensor.ReduceOp) error {
	if z := b.codecFor(dt, op); z != nil {
		return b.allreduceDoublingWire(buf, z)
	}
	n, r := b.size, b.rank
	p2 := 1
	for p2*2 <= n {
		p2 *= 2
	}
	rem := n - p2
	tmp := b.getBuf(len(buf))
	defer b.putBuf(tmp)
	in := *tmp
	const s = 0 // small messages use the first data connection

	combine := func(lower, higher []byte) error {
		return reduce.Reduce([][]byte{buf}, [][]byte{lower, higher}, dt, op, 1, 1, &b.ropts)
	}

	// Pre-step: extra ranks hand their data to their partner below p2.
	switch {
	case r >= p2:
		partner := b.peers[r-p2]
		if err := b.send(partner, s, buf); err != nil {
			return err
		}
		return b.recv(partner, s, buf) // post-step: the result
	case r < rem:
		if err := b.recv(b.peers[r+p2], s, in); err != nil {
			return err
		}
		if err := combine(buf, in); err != nil {
			return err
		}
	}

	// Doubling rounds among ranks 0 .. p2-1.
	for mask := 1; mask < p2; mask <<= 1 {
		partner := b.peers[r^mask]
		if err := b.exchange(partner, buf, partner, in, s); err != nil {
			return err
		}
		var err error
		if partner.rank < r {
			err = combine(in, buf)
		} else {
			err = combine(buf, in)
		}
		if err != nil {
			return err
		}
	}

	// Post-step: return the result to the extra rank.
	if r < rem {
		return b.send(b.peers[r+p2], s, buf)
	}
	return nil
}

// Barrier returns when every rank has entered it. It is a dissemination
// barrier: in round k = 0 .. ⌈log2 n⌉-1 rank r sends one byte to r+2^k and
// waits for one from r-2^k. After round k, rank r has heard (directly or
// through the chain) from the 2^(k+1)-1 ranks before it, so after the last
// round from all n-1 others, and no rank can leave before the last one has
// arrived.
func (b *Backend) Barrier(ctx context.Context) error {
	return b.do(ctx, "Barrier", func() error {
		n, r := b.size, b.rank
		var token, in [1]byte
		for dist := 1; dist < n; dist <<= 1 {
			if err := b.exchange(b.peers[mod(r+dist, n)], token[:], b.peers[mod(r-dist, n)], in[:], 0); err != nil {
				return err
			}
		}
		return nil
	})
}
