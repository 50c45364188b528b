package launch

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hvdd/hvdd/auth"
)

// DefaultRendezvousPort is node 0's rendezvous port when node 0 is another
// machine and --rendezvous-port is not given, in a job the elastic driver
// does not run (the driver serves the rendezvous itself, on a free port by
// default: elastic_rendezvous.go).
const DefaultRendezvousPort = 29500

// A job is one run of Config.Command: the nodes it was planned on (fixed by
// newJob), then the daemons and ranks Run starts on them. Only the goroutine
// running Run touches its fields, except the read-only plan that the
// goroutines waiting for daemons read.
type job struct {
	cfg   *Config
	nodes []node
	o     *output
	size  int // the ranks started first: their HVDD_SIZE

	// The fields below serve jobs whose nodes have daemons of their own
	// (see daemon.go); they are zero when the job's only node is this
	// machine's shared daemon.
	id         string // random, names the sockets' directories
	secret     string // hex, handed to every daemon on its stdin
	key        []byte // the secret's bytes (what the daemons decode it to)
	rendezvous string // node 0's HOST:PORT; unused when rdv is set
	// rdv is the rendezvous the elastic driver serves for the job, nil
	// when node 0's daemon serves it (elastic_rendezvous.go).
	rdv        *driverRendezvous
	grace      int    // the remote wrappers' kill grace, in whole seconds
	remoteHvdd string // hvdd on the remote hosts
	cwd        string // the remote ranks' working directory
	// dirs are the socket directories made on this machine, which
	// stopDaemons removes.
	dirs []string

	// torchMaster is torch's MASTER_ADDR and MASTER_PORT for the ranks
	// (torch.go); empty in jobs the elastic driver runs.
	torchMaster [2]string

	// daemons are the daemons this Run started (none if the shared one was
	// already running), ready or not; stopDaemons stops them.
	daemons []*daemonProc

	// The ranks, once started (ranks.go, supervise.go).
	workers []*exec.Cmd
	exited  []bool
	running int
	pumps   []*pump        // every rank's output copiers
	exits   chan exitEvent // one per started rank
	// stdins holds, per rank started through the agent (a remote host), the
	// write end of the agent's standard input: closing it makes the remote
	// wrapper stop the rank. Nil entries (and a nil slice) are local ranks.
	stdins []*os.File
	// hosts names the host of each rank started through the agent.
	hosts map[int]string
}

// newJob plans cfg's job: it places the ranks on nodes and, when they are
// not all on this machine, draws what the nodes' daemons share. A job on
// this machine only (no Config.Hosts, or every rank on one host that is this
// machine) is one node whose daemon is the machine's shared one on
// Config.Socket; otherwise every node gets a daemon of its own for the job.
// cfg must be valid; the exit code goes with a non-nil error.
func newJob(cfg *Config) (*job, int, error) {
	j := &job{cfg: cfg, size: cfg.NP}
	if len(cfg.Hosts) == 0 {
		j.nodes = []node{{Slots: cfg.NP, Local: true}}
	} else {
		nodes, err := layout(cfg.Hosts, cfg.NP)
		if err != nil {
			return nil, exitUsage, err
		}
		for i := range nodes {
			nodes[i].Local = j.isLocal(nodes[i].Host)
		}
		j.nodes = nodes
	}
	if len(j.nodes) == 1 && j.nodes[0].Local {
		j.nodes[0].Shared = true
		j.nodes[0].Socket = cfg.Socket
		if code, err := j.setTorchMaster(); err != nil {
			return nil, code, err
		}
		return j, 0, nil
	}

	if code, err := j.prepareOwnDaemons(); err != nil {
		return nil, code, err
	}
	for i := range j.nodes {
		j.nodes[i].Socket = j.socketPath(i)
	}
	if code, err := j.setRendezvous(); err != nil {
		return nil, code, err
	}
	if code, err := j.setTorchMaster(); err != nil {
		return nil, code, err
	}
	return j, 0, nil
}

// prepareOwnDaemons draws what the daemons of a job with daemons of its
// own share: the job id, the secret, and what remote hosts need. The exit
// code goes with a non-nil error.
func (j *job) prepareOwnDaemons() (int, error) {
	cfg := j.cfg
	if cfg.HvddPath == "" {
		return exitUsage, errors.New("no hvdd binary to start the daemons with (Config.HvddPath is empty)")
	}
	j.remoteHvdd, j.cwd = cfg.RemoteHvddPath, cfg.Dir
	if j.remoteHvdd == "" {
		j.remoteHvdd = cfg.HvddPath
	}
	if j.cwd == "" {
		wd, err := os.Getwd()
		if err != nil {
			return exitLaunchFailed, fmt.Errorf("find the working directory for remote ranks: %w", err)
		}
		j.cwd = wd
	}
	j.grace = int((cfg.KillGrace + time.Second - 1) / time.Second)
	j.key = auth.NewSecret()
	j.secret = hex.EncodeToString(j.key)
	var id [6]byte
	rand.Read(id[:]) // the job id is not secret: it only names the sockets
	j.id = hex.EncodeToString(id[:])
	return 0, nil
}

// socketPath is node i's per-job socket.
func (j *job) socketPath(i int) string {
	return fmt.Sprintf("/tmp/hvdd-run-%s-%d/hvdd.sock", j.id, i)
}

// setRendezvous picks node 0's rendezvous address: --rendezvous-port, else
// a free port when node 0 is this machine, else DefaultRendezvousPort.
func (j *job) setRendezvous() (int, error) {
	port := j.cfg.RendezvousPort
	if port == 0 {
		port = DefaultRendezvousPort
		if j.nodes[0].Local {
			p, err := freePort(j.nodes[0].Host)
			if err != nil {
				return exitLaunchFailed, fmt.Errorf("find a free rendezvous port on %s: %w; pass --rendezvous-port", j.nodes[0].Host, err)
			}
			port = p
		}
	}
	j.rendezvous = net.JoinHostPort(j.nodes[0].Host, strconv.Itoa(port))
	return 0, nil
}

// isLocal reports whether host is this machine (Config.localHost in tests).
func (j *job) isLocal(host string) bool {
	if j.cfg.localHost != nil {
		return j.cfg.localHost(host)
	}
	return isLocalHost(host)
}

// shared reports whether the job runs on this machine's shared daemon (its
// only node).
func (j *job) shared() bool { return j.nodes[0].Shared }

// hasLocal reports whether some node is this machine.
func (j *job) hasLocal() bool {
	for _, n := range j.nodes {
		if n.Local {
			return true
		}
	}
	return false
}

// warnLoopback warns about hosts named by a loopback address in a job that
// also has remote hosts: those cannot reach them.
func (j *job) warnLoopback() {
	remote := false
	for _, n := range j.nodes {
		remote = remote || !n.Local
	}
	for _, n := range j.nodes {
		if ip := net.ParseIP(n.Host); remote && (strings.EqualFold(n.Host, "localhost") || ip != nil && ip.IsLoopback()) {
			j.o.logf("warning: host %s is a loopback address, which the other hosts cannot reach; name it by an address they can", n.Host)
		}
	}
}

// mkSocketDir creates node i's per-job socket directory, to be removed by
// stopDaemons.
func (j *job) mkSocketDir(i int) error {
	dir := filepath.Dir(j.nodes[i].Socket)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("create the daemon's socket directory: %w", err)
	}
	j.dirs = append(j.dirs, dir)
	return nil
}

// freePort returns a TCP port nothing listens on at host.
func freePort(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
