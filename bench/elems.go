package bench

import (
	"context"
	"fmt"
	"unsafe"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/tensor"
)

// The sweep and the profiles are written once, on buffers held as bytes.
// Only what needs the Go element type of the dtype (the Go client's
// collectives take a []T) sits behind elems, which typed, a small type
// instantiated for each dtype (picks), implements: allocation and the
// collectives, each viewing the bytes as the []T they are and back.
// Filling, checking and poisoning work on the bytes (check.go). Go compiles
// a generic function again for each element shape: written generic, the
// sweep and the profiles cost the hvdd binary some 250 KB more.

// elems is the part of hvdd bench that depends on the element type: buffers
// of it and the client's typed collectives, on buffers given as their
// bytes.
type elems interface {
	// alloc returns the bytes of n elements: shared memory from
	// hvdd.Alloc when shared, else a Go slice.
	alloc(c *hvdd.Client, n int, shared bool) ([]byte, error)
	// free gives b, from alloc with shared, back to the arena.
	free(c *hvdd.Client, b []byte)
	// run performs one collective of op on b (reducing with red; a
	// broadcast is rank 0's) and returns this rank's result: b itself
	// for the in-place allreduce and broadcast, else new bytes.
	run(ctx context.Context, c *hvdd.Client, op tensor.OpType, b []byte, red hvdd.Option) ([]byte, error)
	// allreduceAsync starts an in-place allreduce of b.
	allreduceAsync(c *hvdd.Client, b []byte, options ...hvdd.Option) (*hvdd.Handle, error)
}

// typed is elems for element type T.
type typed[T hvdd.Elem] struct{}

func (*typed[T]) alloc(c *hvdd.Client, n int, shared bool) ([]byte, error) {
	if !shared {
		return hostBytes(make([]T, n)), nil
	}
	s, err := hvdd.Alloc[T](c, n)
	return hostBytes(s), err
}

func (*typed[T]) free(c *hvdd.Client, b []byte) { hvdd.Free(c, view[T](b)) }

func (*typed[T]) run(ctx context.Context, c *hvdd.Client, op tensor.OpType, b []byte, red hvdd.Option) ([]byte, error) {
	in := view[T](b)
	var out []T
	var err error
	switch op {
	case tensor.Allreduce:
		return b, hvdd.Allreduce(ctx, c, in, red)
	case tensor.Broadcast:
		return b, hvdd.Broadcast(ctx, c, in, 0)
	case tensor.Allgather:
		out, err = hvdd.Allgather(ctx, c, in)
	case tensor.Alltoall:
		out, _, err = hvdd.Alltoall(ctx, c, in, nil)
	case tensor.Reducescatter:
		out, err = hvdd.Reducescatter(ctx, c, in, red)
	default:
		return nil, fmt.Errorf("unsupported op %s", op)
	}
	return hostBytes(out), err
}

func (*typed[T]) allreduceAsync(c *hvdd.Client, b []byte, options ...hvdd.Option) (*hvdd.Handle, error) {
	return hvdd.AllreduceAsync(c, view[T](b), options...)
}

// hostBytes views a typed slice as bytes (nil for an empty one).
func hostBytes[T hvdd.Elem](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(z)))
}

// view is the inverse of hostBytes: b, which hostBytes made from a []T,
// as that slice again (its whole elements; nil for none).
func view[T hvdd.Elem](b []byte) []T {
	var z T
	n := len(b) / int(unsafe.Sizeof(z))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), n)
}
