//go:build mpi && mpich && !mpi_noconfig

package mpi

// #cgo pkg-config: mpich
import "C"
