//go:build !mpi

package mpi

import (
	"context"
	"net"

	"github.com/hvdd/hvdd/tensor"
)

// Available reports whether the engine was compiled in (the mpi build tag).
func Available() bool { return false }

// New returns ErrUnavailable: this build has no MPI.
func New(cfg Config) (*Backend, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return nil, ErrUnavailable
}

// Finalize does nothing in a build without MPI.
func Finalize() error { return nil }

// Backend is never created in a build without MPI; its methods return
// ErrUnavailable.
type Backend struct{}

func (*Backend) Name() string { return "mpi" }
func (*Backend) Rank() int    { return 0 }
func (*Backend) Size() int    { return 0 }
func (*Backend) Allreduce(context.Context, []byte, tensor.DType, tensor.ReduceOp) error {
	return ErrUnavailable
}
func (*Backend) Allgatherv(context.Context, []byte, []byte, []int) error { return ErrUnavailable }
func (*Backend) Broadcast(context.Context, []byte, int) error            { return ErrUnavailable }
func (*Backend) Alltoallv(context.Context, []byte, []int, []byte, []int) error {
	return ErrUnavailable
}
func (*Backend) ReduceScatter(context.Context, []byte, []byte, []int, tensor.DType, tensor.ReduceOp) error {
	return ErrUnavailable
}
func (*Backend) Barrier(context.Context) error { return ErrUnavailable }
func (*Backend) Close() error                  { return nil }

// ThreadLevel returns "" in a build without MPI.
func (*Backend) ThreadLevel() string { return "" }

// LibraryVersion returns "" in a build without MPI.
func LibraryVersion() string { return "" }

// Bridge is never created in a build without MPI.
type Bridge struct{}

// NewBridge returns ErrUnavailable: this build has no MPI.
func NewBridge() (*Bridge, error) { return nil, ErrUnavailable }

func (*Bridge) Rank() int                                   { return 0 }
func (*Bridge) Secret() []byte                              { return nil }
func (*Bridge) Size() int                                   { return 0 }
func (*Bridge) Dial(context.Context, int) (net.Conn, error) { return nil, ErrUnavailable }
func (*Bridge) Accept() (net.Conn, int, error)              { return nil, -1, ErrUnavailable }
func (*Bridge) Close() error                                { return nil }
