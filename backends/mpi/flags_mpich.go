//go:build mpi && mpich && !mpi_noconfig

package mpi

// /* MPICH's MPI_STATUSES_IGNORE trips gcc 12's -Wstringop-overflow. */
// #cgo pkg-config: mpich
// #cgo CFLAGS: -Wno-stringop-overflow
import "C"
