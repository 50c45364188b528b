//go:build !mpi

package main

import "github.com/hvdd/hvdd/daemon"

// mpiFactory is nil in builds without the mpi tag.
func mpiFactory() daemon.BackendFactory { return nil }
