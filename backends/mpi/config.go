package mpi

import (
	"errors"
	"fmt"
)

// Config configures New.
type Config struct {
	// Comm names the communicator the backend duplicates. Only "world"
	// (MPI_COMM_WORLD) exists; empty means "world".
	Comm string
}

func (c Config) validate() error {
	if c.Comm != "" && c.Comm != "world" {
		return fmt.Errorf("mpi: unknown communicator %q (want \"world\")", c.Comm)
	}
	return nil
}

// ErrUnavailable is returned by New in a build without the mpi tag.
var ErrUnavailable = errors.New("mpi: backend unavailable: hvdd was built without -tags mpi")

// ErrFinalized is returned by New after Finalize: MPI cannot be initialised
// twice in one process.
var ErrFinalized = errors.New("mpi: MPI is finalized")
