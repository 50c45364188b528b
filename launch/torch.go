package launch

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// torchRankVars are the variables of torch.distributed's env:// rendezvous
// (and torchrun's) that Run sets for every rank, besides MASTER_ADDR and
// MASTER_PORT.
var torchRankVars = []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"}

// torchVars is torch.distributed's variables for a rank on node i at slot
// s, so that a program calling init_process_group("hvdd") (or "gloo")
// under hvdd run finds its place as under torchrun: RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (i, the node's index), and
// MASTER_ADDR and MASTER_PORT (torchMaster) where the job has them. torch
// loads the hvdd backend's entry point only after the env:// rendezvous,
// too late for the backend to set them itself. A variable the user set
// (in our environment or Config.Env) is left to the user's value, and so
// is one of s's that is not known yet (negative: an elastic rank before
// its assignment). Elastic ranks get their values at start; after a reset
// hvd's (hvd.rank(), ...) are the current ones.
func (j *job) torchVars(i int, s slotInfo) []string {
	vals := []int{s.rank, s.size, s.local, s.localSize, i}
	var env []string
	for k, name := range torchRankVars {
		if vals[k] >= 0 && !j.userSet(name) {
			env = append(env, name+"="+strconv.Itoa(vals[k]))
		}
	}
	for k, name := range []string{"MASTER_ADDR", "MASTER_PORT"} {
		if v := j.torchMaster[k]; v != "" && !j.userSet(name) {
			env = append(env, name+"="+v)
		}
	}
	return env
}

// userSet reports whether the variable name is set in our environment or
// in Config.Env.
func (j *job) userSet(name string) bool {
	if _, ok := os.LookupEnv(name); ok {
		return true
	}
	for _, kv := range j.cfg.Env {
		if strings.HasPrefix(kv, name+"=") {
			return true
		}
	}
	return false
}

// setTorchMaster picks torch's MASTER_ADDR and MASTER_PORT, where rank 0's
// TCPStore (torch's env:// rendezvous) listens: 127.0.0.1 and a free port
// on a job on this machine only; else node 0's host and a free port there
// when node 0 is this machine, else the rendezvous port + 1 (node 0's
// daemon has the rendezvous port itself). Jobs the elastic driver runs get
// none: their rank 0 moves, and hvdd.torch.distributed finds the store
// through the daemon. Nothing is picked when the user set both. The exit
// code goes with a non-nil error.
func (j *job) setTorchMaster() (int, error) {
	if j.userSet("MASTER_ADDR") && j.userSet("MASTER_PORT") {
		return 0, nil
	}
	host := "127.0.0.1"
	if !j.shared() {
		host = j.nodes[0].Host
	}
	var port int
	switch {
	case j.shared() || j.nodes[0].Local:
		for {
			p, err := freePort(host)
			if err != nil {
				return exitLaunchFailed, fmt.Errorf("find a free port for torch's MASTER_PORT on %s: %w; set MASTER_ADDR and MASTER_PORT", host, err)
			}
			if j.shared() || !strings.HasSuffix(j.rendezvous, ":"+strconv.Itoa(p)) {
				port = p
				break
			}
		}
	default:
		_, rp, err := net.SplitHostPort(j.rendezvous)
		if err != nil {
			return exitLaunchFailed, err
		}
		p, _ := strconv.Atoi(rp)
		port = p + 1
	}
	j.torchMaster = [2]string{host, strconv.Itoa(port)}
	return 0, nil
}
