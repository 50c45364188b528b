package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/backends/mpi"
	"github.com/hvdd/hvdd/backends/tcp"
	"github.com/hvdd/hvdd/daemon"
)

// tcpSettings are the tcp engine's settings from hvdd serve's flags; zero
// chunk and small mean the engine's defaults. Every node must use the same.
type tcpSettings struct {
	streams      int // data connections per peer
	chunk, small int // tcp.Config.ChunkBytes and SmallBytes
	// compression is --wire-compression; only the tcp engine can do it.
	compression backends.Compression
}

// backendFactory returns the constructor of the named cross-node engine;
// tcp is the tcp engine's settings, of which the MPI engine takes none but
// must refuse a compression it cannot do.
func backendFactory(name string, tcpSet tcpSettings) (daemon.BackendFactory, error) {
	switch name {
	case "tcp":
		streams := tcpSet.streams
		if streams < 1 || streams > tcp.MaxStreams {
			return nil, fmt.Errorf("--tcp-streams %d is outside [1, %d]", streams, tcp.MaxStreams)
		}
		if c := tcpSet.chunk; c != 0 && c < 64 {
			return nil, fmt.Errorf("--tcp-chunk-bytes %d is below 64", c)
		}
		return func(ctx context.Context, j daemon.MultiNodeJob) (backends.Backend, error) {
			b, err := tcp.New(ctx, tcp.Config{
				Rank: j.NodeRank, Size: j.Nodes, Store: j.Store, Prefix: j.ID,
				ListenAddr: net.JoinHostPort(j.Host, "0"), Secret: j.Secret, Logger: j.Logger,
				Streams: streams, ChunkBytes: tcpSet.chunk, SmallBytes: tcpSet.small,
				Compression: tcpSet.compression,
			})
			if err != nil {
				// Not a typed nil in the interface.
				return nil, err
			}
			return b, nil
		}, nil
	case "mpi":
		if c := tcpSet.compression; c != backends.CompressNone {
			return nil, fmt.Errorf("--wire-compression %v needs --backend tcp: the MPI engine sends data in its own type (MPI_Allreduce reduces in it, so it cannot accumulate 16-bit data in float32); use --backend tcp, or --wire-compression none", c)
		}
		if !mpi.Available() {
			return nil, fmt.Errorf("--backend mpi: %s (needs libopenmpi-dev)", noMPI)
		}
		return mpiFactory, nil
	}
	return nil, fmt.Errorf("unknown --backend %q (want tcp or mpi)", name)
}

// noMPI says what to do about a build without the MPI engine (package mpi's
// stubs, built without the mpi tag).
const noMPI = "this hvdd was built without MPI; rebuild with `go build -tags mpi ./cmd/hvdd`"

// mpiFactory is the MPI engine's BackendFactory: the daemons are MPI ranks
// (started by mpirun, one per node); each job duplicates MPI_COMM_WORLD. The
// node rank the daemon was given must be its MPI rank.
func mpiFactory(ctx context.Context, j daemon.MultiNodeJob) (backends.Backend, error) {
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

// mpiControl starts the MPI bridge that carries the daemons' control links,
// so that with --backend mpi MPI carries control and data and the nodes need
// no rendezvous (nor a secret: the bridge has one). Every daemon of the mpirun
// job starts it at once.
func mpiControl(nodeRank, nodes int) (*mpi.Bridge, error) {
	b, err := mpi.NewBridge()
	if errors.Is(err, mpi.ErrUnavailable) {
		return nil, errors.New(noMPI)
	}
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

// launcherRank reads the process count and rank an MPI launcher gave us.
func launcherRank() (size, rank int, ok bool) {
	for _, k := range [][2]string{{"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"}, {"PMI_SIZE", "PMI_RANK"}} {
		s, err1 := strconv.Atoi(os.Getenv(k[0]))
		r, err2 := strconv.Atoi(os.Getenv(k[1]))
		if err1 == nil && err2 == nil {
			return s, r, true
		}
	}
	return 0, 0, false
}

// routeTo returns the local address the kernel would use to reach addr
// (host:port), or "" if there is none.
func routeTo(addr string) string {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return ""
	}
	defer c.Close()
	host, _, _ := net.SplitHostPort(c.LocalAddr().String())
	return host
}

// boundWarning is the warning for a daemon that its launcher bound to fewer
// CPUs than the machine has online, or "" when it is not: mpirun binds each
// rank to one core by default when it starts two or fewer, and the daemon's
// threads (event loop, reductions, engine streams) would then share it.
// Only a single CPU out of several counts, so that a cpuset a container or
// a deliberate --bind-to socket gives is left alone.
func boundWarning(allowed, online int) string {
	if allowed != 1 || online <= 1 {
		return ""
	}
	return fmt.Sprintf("this daemon is bound to 1 of %d CPUs (mpirun binds each rank to a core by default when it starts 2 or fewer), so all its threads share one core; start it with mpirun --bind-to none (hvdd run does)", online)
}

// onlineCPUs counts the CPUs in a list such as /sys/devices/system/cpu/online
// holds ("0-3,8,10-11"); 0 if the list does not parse.
func onlineCPUs(list string) int {
	n := 0
	for _, part := range strings.Split(strings.TrimSpace(list), ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return 0
			}
		}
		n += b - a + 1
	}
	return n
}

// warnIfBound logs boundWarning for this process under an MPI launcher.
func warnIfBound(log *slog.Logger) {
	if _, _, ok := launcherRank(); !ok {
		return
	}
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) != nil {
		return
	}
	list, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return
	}
	if w := boundWarning(set.Count(), onlineCPUs(string(list))); w != "" {
		log.Warn(w)
	}
}
