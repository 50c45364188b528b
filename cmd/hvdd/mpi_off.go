//go:build !mpi

package main

import (
	"errors"

	"github.com/hvdd/hvdd/backends/mpi"
	"github.com/hvdd/hvdd/daemon"
)

// mpiFactory is nil in builds without the mpi tag.
func mpiFactory() daemon.BackendFactory { return nil }

// mpiControl is unavailable in builds without the mpi tag.
func mpiControl(int, int) (*mpi.Bridge, error) {
	return nil, errors.New("this hvdd was built without MPI; rebuild with `go build -tags mpi ./cmd/hvdd`")
}
