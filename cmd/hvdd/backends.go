package main

import (
	"context"
	"fmt"
	"net"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/backends/tcp"
	"github.com/hvdd/hvdd/daemon"
)

// backendFactory returns the constructor of the named cross-node engine.
func backendFactory(name string) (daemon.BackendFactory, error) {
	switch name {
	case "tcp":
		return func(ctx context.Context, j daemon.ClusterJob) (backends.Backend, error) {
			return tcp.New(ctx, tcp.Config{
				Rank: j.NodeRank, Size: j.Nodes, Store: j.Store, Prefix: j.ID,
				ListenAddr: net.JoinHostPort(j.Host, "0"), Secret: j.Secret, Logger: j.Logger,
			})
		}, nil
	case "mpi":
		if f := mpiFactory(); f != nil {
			return f, nil
		}
		return nil, fmt.Errorf("--backend mpi: this hvdd was built without MPI; rebuild with `go build -tags mpi ./cmd/hvdd` (needs libopenmpi-dev)")
	}
	return nil, fmt.Errorf("unknown --backend %q (want tcp or mpi)", name)
}
