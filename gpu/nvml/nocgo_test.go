//go:build !cgo

package nvml

import (
	"errors"
	"strings"
	"testing"
)

// TestNeedsCgo: a build without cgo has no NVML, and says so: Discover
// gives a CPU-only reason and ErrNeedsCgo, OpenSampler ErrNeedsCgo, and a
// zero Sampler's methods do nothing.
func TestNeedsCgo(t *testing.T) {
	r, err := Discover()
	if !errors.Is(err, ErrNeedsCgo) || r.Available || !strings.Contains(r.Reason, "needs a cgo build") ||
		!strings.HasSuffix(r.Reason, ": CPU-only") || r.Summary() != r.Reason {
		t.Errorf("Discover: %+v, %v", r, err)
	}
	if !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("the error %q does not say how the binary was built", err)
	}
	s, err := OpenSampler()
	if s != nil || !errors.Is(err, ErrNeedsCgo) {
		t.Errorf("OpenSampler: %v, %v", s, err)
	}
	var z Sampler
	if got, err := z.Sample(); got != nil || !errors.Is(err, ErrNeedsCgo) || z.Lost() != nil || z.Close() != nil {
		t.Error("a zero Sampler does something")
	}
}
