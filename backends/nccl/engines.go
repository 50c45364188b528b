package nccl

import (
	"context"
	"errors"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/gpu"
)

// Engines makes NCCL's engines over lib (backends.DeviceEngines): NewLocal,
// NewUniqueID and Join, their engines returned as backends.DeviceEngine
// (each an *Engine, so also a DeviceGrouper and a DevicePeer).
type Engines struct{ lib gpu.NCCL }

var _ backends.DeviceEngines = Engines{}

// NewEngines returns the engines' factory over lib; nil (no device engine)
// for a nil lib, so that a node without NCCL has none.
func NewEngines(lib gpu.NCCL) backends.DeviceEngines {
	if lib == nil {
		return nil
	}
	return Engines{lib: lib}
}

// Name returns "nccl".
func (f Engines) Name() string { return "nccl" }

// Version is NCCL's (ncclGetVersion).
func (f Engines) Version() (int, error) {
	if f.lib == nil {
		return 0, errors.New("nccl: no NCCL library")
	}
	return f.lib.Version()
}

// NewLocal is the package's NewLocal.
func (f Engines) NewLocal(devs []gpu.Device) ([]backends.DeviceEngine, error) {
	es, err := NewLocal(f.lib, devs)
	if err != nil {
		return nil, err
	}
	out := make([]backends.DeviceEngine, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out, nil
}

// NewUniqueID is the package's NewUniqueID.
func (f Engines) NewUniqueID() ([]byte, error) { return NewUniqueID(f.lib) }

// Join is the package's Join.
func (f Engines) Join(ctx context.Context, dev gpu.Device, id []byte, rank, size int) (backends.DeviceEngine, error) {
	e, err := Join(ctx, f.lib, dev, id, rank, size)
	if err != nil {
		return nil, err
	}
	return e, nil
}
