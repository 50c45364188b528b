package launch

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// With --backend mpi the daemons are the ranks of one mpirun, one per host,
// started as an MPMD job so that each gets its own slot count and address:
//
//	mpirun --allow-run-as-root --bind-to none -x HVDD_SECRET --mca plm_rsh_agent AGENT \
//	    -np 1 --host H0 hvdd serve --slots S0 --nodes N --node-rank 0 ... : \
//	    -np 1 --host H1 hvdd serve --slots S1 --nodes N --node-rank 1 ...
//
// MPI ranks follow the order of the app contexts, so node i is MPI rank i (the
// daemon checks it). The secret travels in mpirun's environment (-x), never on
// a command line. Each daemon may use every core of its host: mpirun would
// otherwise bind it to one (its default for two ranks or fewer). As with
// horovodrun, root may launch (containers often run as root), which Open
// MPI refuses unless told. The ranks of the job are started as with the tcp
// engine.

// mpiDaemonArgs is node i's `hvdd serve` argument list under mpirun.
func (j *job) mpiDaemonArgs(i int) []string {
	n := j.nodes[i]
	args := []string{"serve", "--slots", strconv.Itoa(n.Slots), "--nodes", strconv.Itoa(len(j.nodes)),
		"--node-rank", strconv.Itoa(i), "--rendezvous", j.rendezvous,
		"--socket", n.Socket, "--backend", "mpi"}
	return append(args, j.serveFlags(i)...)
}

// mpirunArgs is the whole mpirun command line.
func (j *job) mpirunArgs() []string {
	args := []string{"--allow-run-as-root", "--bind-to", "none", "-x", secretEnv}
	if os.Getenv("HVDD_CONTROL") != "" {
		// The daemons' --control default (auto, which is tcp here since
		// they get a rendezvous; or mpi for control over MPI).
		args = append(args, "-x", "HVDD_CONTROL")
	}
	// mpirun reaches the hosts as hvdd run would: the agent, or our ssh
	// command with its port and key (mpirun's own ssh would stop at a host
	// key it has not seen).
	args = append(args, "--mca", "plm_rsh_agent", j.agentString())
	for i, n := range j.nodes {
		if i > 0 {
			args = append(args, ":")
		}
		exe := j.remoteHvdd
		if n.Local {
			exe = j.cfg.HvddPath
		}
		args = append(args, "-np", "1", "--host", n.Host+":1", exe)
		args = append(args, j.mpiDaemonArgs(i)...)
	}
	return args
}

// startMPIDaemons runs the daemons under one mpirun (in j.daemons) and waits
// until every socket answers (local hosts: a dial; remote ones: `test -S`
// through the agent), the mpirun exits, or the start timeout passes.
func (j *job) startMPIDaemons(ctx context.Context) error {
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		return fmt.Errorf("--backend mpi needs mpirun: %w (apt-get install openmpi-bin libopenmpi-dev, and build hvdd with -tags mpi)", err)
	}
	if err := checkOpenMPI(mpirun); err != nil {
		return err
	}
	for i, n := range j.nodes {
		if n.Local {
			if err := j.mkSocketDir(i); err != nil {
				return err
			}
		}
	}
	cmd := exec.Command(mpirun, j.mpirunArgs()...)
	cmd.Env = append(environ(), secretEnv+"="+j.secret)
	d, err := startDaemonProc(j.o, cmd, "mpirun", "[hvdd mpirun] ", "")
	if err != nil {
		return fmt.Errorf("start mpirun: %w", err)
	}
	j.daemons = []*daemonProc{d}
	deadline := time.Now().Add(j.cfg.StartTimeout)
	for i, n := range j.nodes {
		switch d.await(ctx, deadline, func() bool { return j.socketUp(i) }) {
		case daemonExited:
			_, how := describeExit(d.cmd.ProcessState)
			tail := d.tail.lines(10)
			return fmt.Errorf("mpirun %s before the daemon on %s was ready; its last output:\n%s\n%s", how, n.Host, tail, mpirunHint(tail))
		case waitCancelled:
			return fmt.Errorf("waiting for the hvdd daemon on %s to start: %w", n.Host, context.Cause(ctx))
		case waitTimedOut:
			return fmt.Errorf("the hvdd daemon on %s was not ready within %v under mpirun; its last output:\n%s", n.Host, j.cfg.StartTimeout, d.tail.lines(10))
		}
	}
	return nil
}

// socketUp reports whether node i's daemon socket accepts (local) or exists
// (remote, checked through the agent).
func (j *job) socketUp(i int) bool {
	n := j.nodes[i]
	if n.Local {
		return probe(n.Socket) == nil
	}
	return j.agent(n.Host, "test -S "+shellQuote(n.Socket)).Run() == nil
}

// mpirunHint says what to do about an mpirun that failed before the daemons
// were up, judging by the tail of its output.
func mpirunHint(tail string) string {
	if strings.Contains(tail, "ORTE was unable to reliably start") || strings.Contains(tail, "ORTE does not know how to route") {
		return "mpirun could not start its daemon (orted) on every host: check that each host reaches the others and has Open MPI installed"
	}
	return "is hvdd built with -tags mpi on every host?"
}

// checkOpenMPI refuses an mpirun that is not Open MPI's: the command line
// above uses its flags (-x, --mca, --bind-to none, --allow-run-as-root).
// With another MPI (MPICH's hydra) the daemons can still be started by hand
// (clients/go's TestMPICHMultiNodeCollectives does).
func checkOpenMPI(mpirun string) error {
	out, _ := exec.Command(mpirun, "--version").CombinedOutput()
	if bytes.Contains(out, []byte("Open MPI")) || bytes.Contains(out, []byte("OpenRTE")) {
		return nil
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return fmt.Errorf("hvdd run --backend mpi launches through Open MPI's mpirun, and %s is not (it says %q); "+
		"install openmpi-bin and put its mpirun first on PATH, or start one daemon per node with your MPI's launcher "+
		"(hvdd built for that MPI: -tags 'mpi mpich' for MPICH): "+
		"mpiexec -n NODES hvdd serve --slots S --nodes -1 --node-rank -1 --backend mpi "+
		"(control over MPI; add --rendezvous HOST0:PORT and HVDD_SECRET in its environment for faster TCP control; "+
		"see hvdd serve --help), then the ranks on each node's socket", mpirun, first)
}
