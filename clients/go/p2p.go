package hvdd

import (
	"context"

	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

// WithTag sets a send's or recv's tag (default 0). A send matches the recv
// of the same sender, receiver, process set and tag; on each such channel
// sends and recvs match in the order each side made them.
func WithTag(tag int64) Option { return func(o *opts) { o.tag = tag } }

// p2pEnqueue is the Enqueue of a send or recv of data with rank peer.
func p2pEnqueue[T Elem](op tensor.OpType, data []T, peer int, o *opts) *ipcpb.Enqueue {
	e := enqueue(op, data, o)
	e.ReduceOp, e.Prescale, e.Postscale = 0, 0, 0
	e.PeerRank, e.Tag = int32(peer), o.tag
	return e
}

// SendAsync starts sending data to rank dst (a global rank; with
// WithProcessSet both ranks must be members of the set). Only the two ranks
// take part: the transfer completes when dst has posted the matching recv
// (RecvAsync with this rank as src, the same tag and process set) and the
// daemon has copied the bytes. data must not change until Wait returns.
// Unnamed sends are named from this client's call order; the name only has
// to be unique among this client's ops in flight, it plays no part in
// matching. A dst on another node works the same (the daemons negotiate the
// transfer as a broadcast from this rank to dst alone); GPU memory is not
// supported (ErrUnimplemented).
func SendAsync[T Elem](c *Client, data []T, dst int, options ...Option) (*Handle, error) {
	o := apply(options)
	return c.submit(p2pEnqueue(tensor.Send, data, dst, &o), bytesOf(data), false)
}

// Send sends data to rank dst and waits until dst has received it (see
// SendAsync).
func Send[T Elem](ctx context.Context, c *Client, data []T, dst int, options ...Option) error {
	h, err := SendAsync(c, data, dst, options...)
	if err != nil {
		return err
	}
	return h.Wait(ctx)
}

// RecvAsync starts receiving into data, in place, what rank src (a global
// rank) sends with the same tag and process set (see SendAsync). The two
// sides must agree: the same element type and the same byte length, else
// both fail with ErrMismatch. A recv from any source is not supported
// (src must name the sender).
func RecvAsync[T Elem](c *Client, data []T, src int, options ...Option) (*Handle, error) {
	o := apply(options)
	return c.submit(p2pEnqueue(tensor.Recv, data, src, &o), bytesOf(data), true)
}

// Recv receives into data what rank src sends (see RecvAsync) and waits for
// it.
func Recv[T Elem](ctx context.Context, c *Client, data []T, src int, options ...Option) error {
	h, err := RecvAsync(c, data, src, options...)
	if err != nil {
		return err
	}
	return h.Wait(ctx)
}
