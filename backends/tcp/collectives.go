package tcp

import (
	"context"
	"fmt"

	"github.com/hvdd/hvdd/tensor"
)

// checkCounts validates the per-rank counts of a v-collective.
func (b *Backend) checkCounts(name string, counts []int) error {
	if len(counts) != b.size {
		return fmt.Errorf("%s has %d entries for %d ranks", name, len(counts), b.size)
	}
	for r, c := range counts {
		if c < 0 {
			return fmt.Errorf("%s[%d] = %d is negative", name, r, c)
		}
	}
	return nil
}

// Allgatherv gathers every rank's in into out in rank order. Results of at
// most Config.SmallBytes are exchanged directly (every rank sends its piece
// to every other: one round); larger ones go round a pipelined ring on
// every channel, each rank forwarding the piece it received in the previous
// step, so every rank sends and receives (n-1)/n of the result.
func (b *Backend) Allgatherv(ctx context.Context, in, out []byte, counts []int) error {
	return b.do(ctx, "Allgatherv", func() error {
		if err := b.checkCounts("counts", counts); err != nil {
			return err
		}
		off := offsets(counts)
		if len(in) != counts[b.rank] || len(out) != off[b.size] {
			return fmt.Errorf("len(in) = %d, len(out) = %d; counts want %d and %d", len(in), len(out), counts[b.rank], off[b.size])
		}
		copy(out[off[b.rank]:], in)
		switch {
		case b.size == 1 || len(out) == 0:
			return nil
		case len(out) <= b.tuning().SmallBytes:
			return b.allgatherDirect(out, off)
		}
		return b.allgatherRing(out, off)
	})
}

// allgatherDirect sends this rank's piece of out to every peer, then reads
// theirs. The writes go first and inline when they fit the socket buffers
// (see exchange); otherwise a goroutine writes while this one reads.
func (b *Backend) allgatherDirect(out []byte, off []int) error {
	n, r := b.size, b.rank
	mine := out[off[r]:off[r+1]]
	sendAll := func() error {
		for d := 1; d < n; d++ { // r+1 first: it reads from r-1 first
			if err := b.send(b.peers[mod(r+d, n)], 0, mine); err != nil {
				return err
			}
		}
		return nil
	}
	errc := make(chan error, 1)
	if len(mine) <= b.inlineMax {
		errc <- sendAll()
	} else {
		go func() { errc <- sendAll() }()
	}
	var rerr error
	for d := 1; d < n && rerr == nil; d++ {
		q := mod(r-d, n)
		rerr = b.recv(b.peers[q], 0, out[off[q]:off[q+1]])
	}
	if serr := <-errc; rerr == nil {
		return serr
	}
	return rerr
}

// allgatherRing is the ring allgather with blocks of uneven size: block k
// is rank k's piece, out[off[k]:off[k+1]], dealt into channels by bytes. At
// step s = 0 .. n-2 rank r sends block r-s and receives block r-s-1 straight
// into out, so its own piece leaves first and each received piece is
// forwarded one step later.
func (b *Backend) allgatherRing(out []byte, off []int) error {
	n, r := b.size, b.rank
	nch := b.tuning().Streams
	seg := segBytes(b.tuning().ChunkBytes, 1)
	maxBlock := 0
	for k := range n {
		maxBlock = max(maxBlock, off[k+1]-off[k])
	}
	next, prev := b.peers[mod(r+1, n)], b.peers[mod(r-1, n)]
	return channels(nch, func(c int) error {
		block := func(k int) []byte {
			k = mod(k, n)
			lo, hi := part(off[k+1]-off[k], nch, c)
			return out[off[k]+lo : off[k]+hi]
		}
		p := &ringPass{
			b: b, stream: c, next: next, prev: prev,
			steps: n - 1,
			seg:   seg,
			nseg:  ceilDiv(ceilDiv(maxBlock, nch), seg),
			send:  func(s int) []byte { return block(r - s) },
			recv:  func(s int) ([]byte, []byte) { return block(r - s - 1), nil },
		}
		return p.run()
	})
}

// ReduceScatter reduces in element-wise across ranks and leaves block r of
// the result in rank r's out; in is not modified. Results of at most
// Config.SmallBytes are reduced whole by recursive doubling (see
// allreduceDoubling) and rank r keeps its block; larger ones run the
// reduce-scatter half of the ring (see ReduceScatter's ring below).
func (b *Backend) ReduceScatter(ctx context.Context, in, out []byte, counts []int, dt tensor.DType, op tensor.ReduceOp) error {
	return b.do(ctx, "ReduceScatter", func() error {
		if err := checkReduce(len(in), dt, op); err != nil {
			return err
		}
		if err := b.checkCounts("counts", counts); err != nil {
			return err
		}
		off := offsets(counts)
		if len(in) != off[b.size] || len(out) != counts[b.rank] {
			return fmt.Errorf("len(in) = %d, len(out) = %d; counts want %d and %d", len(in), len(out), off[b.size], counts[b.rank])
		}
		for k, c := range counts {
			if c%dt.Size() != 0 {
				return fmt.Errorf("counts[%d] = %d is not a whole number of %v elements", k, c, dt)
			}
		}
		switch {
		case b.size == 1 || len(in) == 0:
			copy(out, in)
			return nil
		case len(in) <= b.tuning().SmallBytes:
			tmp := b.getBuf(len(in))
			defer b.putBuf(tmp)
			copy(*tmp, in)
			if err := b.allreduceDoubling(*tmp, dt, op); err != nil {
				return err
			}
			copy(out, (*tmp)[off[b.rank]:])
			return nil
		}
		return b.reduceScatterRing(in, out, off, dt, op)
	})
}

// reduceScatterRing is the ring reduce-scatter with uneven blocks, block k
// being in[off[k]:off[k+1]] (dealt into channels by elements). It is the
// first half of allreduceRing shifted by one block, so that rank r ends up
// owning block r rather than r+1: at step s = 0 .. n-2 rank r
//
//	sends block r-s-1      (its own input at step 0, then the partial
//	                        result it received at step s-1),
//	receives block r-s-2   and combines it with its own input,
//
// into a work buffer, except at the last step, where the block received is
// r-(n-2)-2 = r (mod n) and the result goes straight into out. The work
// buffer keeps in unmodified; each block is written once and sent once
// afterwards, so the sender and receiver never touch the same bytes at the
// same time.
func (b *Backend) reduceScatterRing(in, out []byte, off []int, dt tensor.DType, op tensor.ReduceOp) error {
	n, r := b.size, b.rank
	esz := dt.Size()
	nch := b.tuning().Streams
	seg := segBytes(b.tuning().ChunkBytes, esz)
	maxBlock := 0
	for k := range n {
		maxBlock = max(maxBlock, off[k+1]-off[k])
	}
	work := b.getBuf(len(in))
	defer b.putBuf(work)
	next, prev := b.peers[mod(r+1, n)], b.peers[mod(r-1, n)]
	return channels(nch, func(c int) error {
		// bounds returns block k's part for this channel, in bytes
		// relative to the start of in.
		bounds := func(k int) (lo, hi int) {
			lo, hi = part((off[k+1]-off[k])/esz, nch, c)
			return off[k] + lo*esz, off[k] + hi*esz
		}
		p := &ringPass{
			b: b, stream: c, next: next, prev: prev,
			steps: n - 1,
			seg:   seg,
			nseg:  ceilDiv(ceilDiv(maxBlock/esz, nch)*esz, seg),
			dt:    dt, op: op,
			z: b.codecFor(dt, op),
			send: func(s int) []byte {
				lo, hi := bounds(mod(r-s-1, n))
				if s == 0 {
					return in[lo:hi]
				}
				return (*work)[lo:hi]
			},
			recv: func(s int) ([]byte, []byte) {
				lo, hi := bounds(mod(r-s-2, n))
				if s == n-2 {
					// Block r: this channel's part of out.
					return out[lo-off[r] : hi-off[r]], in[lo:hi]
				}
				return (*work)[lo:hi], in[lo:hi]
			},
		}
		return p.run()
	})
}

// Broadcast copies root's buf to every rank. Buffers of at most
// Config.SmallBytes are sent by the root to each rank directly (one round).
// Larger ones flow down a pipelined chain root -> root+1 -> ... -> root-1
// on every channel: each rank forwards segment j as soon as it has it, so
// after the chain fills every link carries the whole buffer at once and
// the time approaches that of a single transfer.
func (b *Backend) Broadcast(ctx context.Context, buf []byte, root int) error {
	return b.do(ctx, "Broadcast", func() error {
		if root < 0 || root >= b.size {
			return fmt.Errorf("root %d is outside [0, %d)", root, b.size)
		}
		switch {
		case b.size == 1 || len(buf) == 0:
			return nil
		case len(buf) <= b.tuning().SmallBytes:
			return b.broadcastDirect(buf, root)
		}
		return b.broadcastChain(buf, root)
	})
}

func (b *Backend) broadcastDirect(buf []byte, root int) error {
	if b.rank != root {
		return b.recv(b.peers[root], 0, buf)
	}
	// Each non-root reads only this one message, so blocking writes
	// in rank order cannot deadlock.
	for d := 1; d < b.size; d++ {
		if err := b.send(b.peers[mod(root+d, b.size)], 0, buf); err != nil {
			return err
		}
	}
	return nil
}

// broadcastChain: the rank at chain position pos = r-root (mod n) receives
// from position pos-1 and forwards to pos+1; the root only sends and the
// last rank only receives. Segment j is forwarded once received; the
// forwarding goroutine follows the receiver with one token per segment,
// as in ringPass.
func (b *Backend) broadcastChain(buf []byte, root int) error {
	n := b.size
	pos := mod(b.rank-root, n)
	var prev, next *peer
	if pos > 0 {
		prev = b.peers[mod(b.rank-1, n)]
	}
	if pos < n-1 {
		next = b.peers[mod(b.rank+1, n)]
	}
	nch := b.tuning().Streams
	seg := segBytes(b.tuning().ChunkBytes, 1)
	return channels(nch, func(c int) error {
		lo, hi := part(len(buf), nch, c)
		ch := buf[lo:hi]
		nseg := ceilDiv(len(ch), seg)
		var ready chan struct{}
		errc := make(chan error, 1)
		if next != nil {
			if prev != nil {
				ready = make(chan struct{}, nseg)
			}
			go func() {
				for j := range nseg {
					if ready != nil {
						select {
						case <-ready:
						case <-b.failed:
							errc <- b.failure()
							return
						}
					}
					if err := b.send(next, c, segment(ch, seg, j)); err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
		} else {
			errc <- nil
		}
		var rerr error
		if prev != nil {
			for j := 0; j < nseg && rerr == nil; j++ {
				if rerr = b.recv(prev, c, segment(ch, seg, j)); rerr == nil && ready != nil {
					ready <- struct{}{}
				}
			}
		}
		if serr := <-errc; rerr == nil {
			return serr
		}
		return rerr
	})
}

// Alltoallv sends each rank its piece of in and receives each rank's piece
// for us into out, by pairwise exchange: in step s = 1 .. n-1 rank r sends
// to r+s and receives from r-s, so every step is a perfect matching and
// every link is used once. Senders and receivers run in separate goroutines
// and do not wait for each other between steps: by induction on s, the
// receivers of step s only wait for senders of step s, which only wait (for
// socket buffer space) on receivers of step s, so the schedule cannot
// deadlock, and a slow pair does not hold up the others' early steps.
//
// Pieces larger than Config.SmallBytes are dealt over all channels; smaller
// ones travel whole on channel 0. Both ends know the piece size, so both
// cut it alike.
func (b *Backend) Alltoallv(ctx context.Context, in []byte, sendCounts []int, out []byte, recvCounts []int) error {
	return b.do(ctx, "Alltoallv", func() error {
		if err := b.checkCounts("sendCounts", sendCounts); err != nil {
			return err
		}
		if err := b.checkCounts("recvCounts", recvCounts); err != nil {
			return err
		}
		soff, roff := offsets(sendCounts), offsets(recvCounts)
		if len(in) != soff[b.size] || len(out) != roff[b.size] {
			return fmt.Errorf("len(in) = %d, len(out) = %d; counts want %d and %d", len(in), len(out), soff[b.size], roff[b.size])
		}
		n, r := b.size, b.rank
		if sendCounts[r] != recvCounts[r] {
			return fmt.Errorf("sendCounts[%d] = %d but recvCounts[%d] = %d", r, sendCounts[r], r, recvCounts[r])
		}
		copy(out[roff[r]:roff[r+1]], in[soff[r]:soff[r+1]])
		if n == 1 {
			return nil
		}
		nch := b.tuning().Streams
		// piece returns channel c's part of a piece of m bytes.
		piece := func(m, c int) (lo, hi int) {
			if m <= b.tuning().SmallBytes {
				if c == 0 {
					return 0, m
				}
				return m, m
			}
			return part(m, nch, c)
		}
		errc := make(chan error, 2*nch)
		for c := range nch {
			go func() {
				for s := 1; s < n; s++ {
					q := mod(r+s, n)
					lo, hi := piece(sendCounts[q], c)
					if err := b.send(b.peers[q], c, in[soff[q]+lo:soff[q]+hi]); err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
			go func() {
				for s := 1; s < n; s++ {
					q := mod(r-s, n)
					lo, hi := piece(recvCounts[q], c)
					if err := b.recv(b.peers[q], c, out[roff[q]+lo:roff[q]+hi]); err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
		}
		var err error
		for range 2 * nch {
			if e := <-errc; err == nil {
				err = e
			}
		}
		return err
	})
}
