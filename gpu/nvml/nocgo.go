//go:build !cgo

package nvml

// Without cgo there is no go-nvml (its binding is cgo), so no NVML: hvdd
// built with CGO_ENABLED=0 runs CPU-only as far as NVML goes, and says so.
// The GPU path proper (gpu/cuda, through purego) works in such a build.

// Discover returns a Report whose Reason says that GPU discovery needs a
// cgo build, and ErrNeedsCgo.
func Discover() (Report, error) {
	return Report{Reason: needsCgo + ": CPU-only"}, ErrNeedsCgo
}

// OpenSampler returns ErrNeedsCgo.
func OpenSampler() (*Sampler, error) { return nil, ErrNeedsCgo }

// Sampler is never opened in a build without cgo: OpenSampler fails. Its
// methods exist so that callers build either way; on a nil or zero
// Sampler they do nothing.
type Sampler struct{}

// Sample returns ErrNeedsCgo.
func (s *Sampler) Sample() ([]Sample, error) { return nil, ErrNeedsCgo }

// Lost returns nil.
func (s *Sampler) Lost() []LostError { return nil }

// Close returns nil.
func (s *Sampler) Close() error { return nil }
