package launch

import (
	"flag"
	"fmt"
)

// horovodrun's flags that mean nothing to hvdd run, and why. ParseArgs
// refuses each with its reason (exit status 2, nothing started) rather than
// "flag provided but not defined", so that a horovodrun command line
// brought over says what to change. The flags are registered (taking a
// value where horovodrun's does), so that parsing reaches the end of the
// flags and a refusal names the first such flag given.
var refusedFlags = []struct {
	names []string
	value bool // takes a value
	why   string
}{
	{[]string{"gloo"}, false, "hvdd's own daemons play Gloo's part (the controller and the engine between processes and hosts); drop --gloo"},
	{[]string{"mpi"}, false, "hvdd run starts the ranks itself, never under mpirun; for MPI between the hosts' daemons pass --backend mpi"},
	{[]string{"jsrun"}, false, "hvdd run does not launch through LSF's jsrun; pass the hosts with -H or --hostfile"},
	{[]string{"tcp"}, false, "hvdd's engine between hosts (--backend tcp, the default) is TCP already, and hvdd has no NCCL or InfiniBand transport to turn off; drop --tcp"},
	{[]string{"mpi-args"}, true, "hvdd run starts no MPI job for the ranks; with --backend mpi, mpirun starts only the daemons: set its options through OMPI_MCA_* variables in hvdd run's environment"},
	{[]string{"binding-args"}, true, "hvdd run binds no process; bind the ranks in COMMAND (numactl, taskset)"},
	{[]string{"num-nccl-streams"}, true, "hvdd does not use NCCL; its daemons move the tensors; drop --num-nccl-streams"},
	{[]string{"thread-affinity"}, true, "hvdd's ranks have no Horovod background thread to pin: the node's daemon does their communication (pin it with taskset if you need to); drop --thread-affinity"},
	{[]string{"gloo-timeout-seconds"}, true, "there is no Gloo in hvdd; the daemons notice a lost host by their heartbeats, and a stalled collective by --stall-check-shutdown-time-seconds; drop --gloo-timeout-seconds"},
	{[]string{"mpi-threads-disable", "no-mpi-threads-disable"}, false, "hvdd's ranks never initialise MPI, so mpi4py can run in them as it likes; drop the flag"},
}

// refusal records the first refused flag given.
type refusal struct {
	err error
}

// refusedValue is the flag.Value of a refused flag.
type refusedValue struct {
	r    *refusal
	name string
	why  string
	bool bool
}

func (v refusedValue) String() string   { return "" }
func (v refusedValue) IsBoolFlag() bool { return v.bool }
func (v refusedValue) Set(string) error {
	if v.r.err == nil {
		v.r.err = fmt.Errorf("--%s is not supported: %s", v.name, v.why)
	}
	return nil
}

// refuseFlags registers the refused flags on fs; after parsing, r.err
// names the first one given.
func refuseFlags(fs *flag.FlagSet, r *refusal) {
	for _, f := range refusedFlags {
		for _, n := range f.names {
			fs.Var(refusedValue{r: r, name: n, why: f.why, bool: !f.value}, n, "")
		}
	}
}
