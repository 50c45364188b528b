//go:build !mpi

package mpi

import (
	"errors"
	"testing"

	"github.com/hvdd/hvdd/backends"
)

var _ backends.Backend = (*Backend)(nil)

func TestUnavailable(t *testing.T) {
	if Available() {
		t.Fatal("Available() in a build without the mpi tag")
	}
	if _, err := New(Config{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("New: %v, want ErrUnavailable", err)
	}
	if _, err := New(Config{Comm: "self"}); err == nil || errors.Is(err, ErrUnavailable) {
		t.Fatalf("New(Comm: self): %v, want a validation error", err)
	}
}
