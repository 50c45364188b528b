//go:build mpi

package main

import (
	"context"
	"fmt"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/backends/mpi"
	"github.com/hvdd/hvdd/daemon"
)

// mpiFactory returns the MPI engine: the daemons are MPI ranks (started by
// mpirun, one per node); each job duplicates MPI_COMM_WORLD. The node rank the
// daemon was given must be its MPI rank.
func mpiFactory() daemon.BackendFactory {
	return func(ctx context.Context, j daemon.ClusterJob) (backends.Backend, error) {
		b, err := mpi.New(mpi.Config{})
		if err != nil {
			return nil, err
		}
		if err := sameRank(b.Rank(), b.Size(), j.NodeRank, j.Nodes); err != nil {
			b.Close()
			return nil, err
		}
		return b, nil
	}
}

// mpiControl starts the MPI bridge that carries the daemons' control links,
// so that with --backend mpi MPI carries control and data and the nodes need
// no rendezvous (nor a secret: the bridge has one). Every daemon of the mpirun
// job starts it at once.
func mpiControl(nodeRank, nodes int) (*mpi.Bridge, error) {
	b, err := mpi.NewBridge()
	if err != nil {
		return nil, err
	}
	if err := sameRank(b.Rank(), b.Size(), nodeRank, nodes); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// sameRank checks that the daemon's MPI rank is the node rank it was given.
func sameRank(rank, size, nodeRank, nodes int) error {
	if rank != nodeRank || size != nodes {
		return fmt.Errorf("MPI rank %d of %d does not match --node-rank %d of --nodes %d: start one daemon per node with mpirun and --node-rank -1", rank, size, nodeRank, nodes)
	}
	return nil
}
