package tcp

import (
	"github.com/hvdd/hvdd/reduce"
	"github.com/hvdd/hvdd/tensor"
)

// A ring pass is the engine of every large-message collective. The ranks
// form a ring r -> r+1 (mod n); in each of `steps` steps every rank sends
// one block to its successor and receives one block from its predecessor,
// either storing it (allgather) or combining it with its own copy of that
// block (reduce-scatter). Bandwidth-optimal collectives are sequences of
// such steps:
//
//	reduce-scatter   n-1 steps: rank r sends block r-s, receives r-s-1 and
//	                 reduces it; afterwards r holds the full reduction of
//	                 block r+1.
//	allgather        n-1 steps: rank r sends block r+1-s, receives r-s and
//	                 stores it; each finished block travels once round.
//	allreduce        reduce-scatter then allgather: 2(n-1) steps, and every
//	                 rank sends and receives 2(n-1)/n of the buffer, the
//	                 lower bound.
//
// In all of them the block sent at step s >= 1 is the block received at
// step s-1 (that is what makes it a ring). Pipelining exploits this at
// segment granularity: segment j of step s may go out as soon as segment j
// of step s-1 has arrived (and been reduced), without waiting for the rest
// of the block. A sender goroutine and a receiver (the caller) run each
// pass; the receiver posts one token per segment it completes and the
// sender takes one before each segment of steps s >= 1. Because both walk
// the (step, segment) grid in the same order, the k-th token is exactly the
// dependency of the sender's (k + nseg)-th segment, so a buffered channel is
// all the bookkeeping needed. The socket buffers on both ends keep the
// link busy while either side is reducing.
type ringPass struct {
	b      *Backend
	stream int   // data connection index used in both directions
	next   *peer // successor: we send to it
	prev   *peer // predecessor: we receive from it
	steps  int
	seg    int // segment bytes, whole elements
	nseg   int // segments of the largest block: ⌈maxBlock/seg⌉

	// send returns the bytes sent at step s (this channel's part of one
	// block). recv returns where the bytes received at step s go: with
	// nil, they are stored into dst; otherwise dst = op(received, with),
	// where with may be dst itself.
	send func(s int) []byte
	recv func(s int) (dst, with []byte)

	// overwrites, if set, returns the step whose sent block the receiver
	// overwrites at step s, or -1. The receiver then waits until the
	// sender has sent that step's segment j before receiving segment j.
	// The wait is for the record more than for safety: the bytes arriving
	// at step s causally depend on ours sent at that earlier step, so the
	// kernel has long copied them, but the race detector cannot see
	// through the network and needs the happens-before edge.
	overwrites func(s int) int

	dt tensor.DType
	op tensor.ReduceOp

	// z, if set, carries every segment as a compressed message
	// (compress.go): the sender encodes it, the receiver decodes it into
	// dst or accumulates it into dst in float32. keep, if set, reports
	// the steps whose sent block the sender replaces by what it sent, so
	// that it holds the receivers' bits (an allreduce owner's block).
	z    *codec
	keep func(s int) bool
}

// run executes the pass and returns the first error.
func (p *ringPass) run() error {
	if p.nseg == 0 || p.steps == 0 {
		return nil // every block is empty, on every rank
	}
	// Capacity for every token the receiver will ever post, so it never
	// blocks on a slow sender.
	ready := make(chan struct{}, (p.steps-1)*p.nseg)
	var sent chan struct{}
	if p.overwrites != nil {
		sent = make(chan struct{}, p.steps*p.nseg)
	}
	errc := make(chan error, 1)
	go func() { errc <- p.sender(ready, sent) }()
	rerr := p.receiver(ready, sent)
	serr := <-errc
	if rerr != nil {
		return rerr
	}
	return serr
}

func (p *ringPass) sender(ready <-chan struct{}, sent chan<- struct{}) error {
	b := p.b
	var wire *[]byte
	if p.z != nil {
		wire = b.getBuf(wireCap(p.seg / 4))
		defer b.putBuf(wire)
	}
	for s := range p.steps {
		src := p.send(s)
		keep := p.keep != nil && p.keep(s)
		for j := range p.nseg {
			if s > 0 {
				// Segment j of this step's block is segment j of the
				// block received at step s-1: wait until it is in.
				select {
				case <-ready:
				case <-b.failed:
					return b.failure()
				}
			}
			out := segment(src, p.seg, j)
			if p.z != nil && len(out) > 0 {
				var err error
				if out, err = p.z.encode(*wire, out, keep); err != nil {
					return err
				}
			}
			if err := b.send(p.next, p.stream, out); err != nil {
				return err
			}
			if sent != nil {
				sent <- struct{}{}
			}
		}
	}
	return nil
}

func (p *ringPass) receiver(ready chan<- struct{}, sent <-chan struct{}) error {
	b := p.b
	var scratch *[]byte
	nsent := 0 // tokens taken from sent: segments the sender has sent
	for s := range p.steps {
		dst, with := p.recv(s)
		if (with != nil || p.z != nil) && scratch == nil {
			scratch = b.getBuf(max(p.seg, wireCap(p.seg/4)))
			defer b.putBuf(scratch)
		}
		for j := range p.nseg {
			d := segment(dst, p.seg, j)
			if sent != nil {
				if t := p.overwrites(s); t >= 0 {
					for nsent <= t*p.nseg+j {
						select {
						case <-sent:
							nsent++
						case <-b.failed:
							return b.failure()
						}
					}
				}
			}
			if p.z != nil && len(d) > 0 {
				// A compressed message: decode it into d, or add
				// it to our own part in float32.
				payload, half, err := b.recvWire(p.prev, p.stream, len(d)/4, *scratch)
				if err == nil && with == nil {
					err = p.z.store(d, payload, half)
				} else if err == nil {
					err = p.z.accumulate(d, payload, half, segment(with, p.seg, j), &b.ropts)
				}
				if err != nil {
					return err
				}
			} else if with == nil {
				// Allgather: receive in place, no copy.
				if err := b.recv(p.prev, p.stream, d); err != nil {
					return err
				}
			} else if len(d) > 0 {
				// Reduce-scatter: receive the predecessor's partial
				// result for this segment, then fold in our own.
				in := (*scratch)[:len(d)]
				if err := b.recv(p.prev, p.stream, in); err != nil {
					return err
				}
				w := segment(with, p.seg, j)
				if err := reduce.Reduce([][]byte{d}, [][]byte{in, w}, p.dt, p.op, 1, 1, &b.ropts); err != nil {
					return err
				}
			}
			if s < p.steps-1 {
				ready <- struct{}{}
			}
		}
	}
	return nil
}

// channels runs f(c) for every channel c in [0, k) concurrently (c = 0 on
// the calling goroutine) and returns the first error.
func channels(k int, f func(c int) error) error {
	if k == 1 {
		return f(0)
	}
	errc := make(chan error, k-1)
	for c := 1; c < k; c++ {
		go func() { errc <- f(c) }()
	}
	err := f(0)
	for c := 1; c < k; c++ {
		if e := <-errc; err == nil {
			err = e
		}
	}
	return err
}
