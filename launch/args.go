package launch

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hvdd/hvdd/ipc"
)

// Usage is the help text of `hvdd run`.
const Usage = `Usage: hvdd run -np N [flags] [--] COMMAND [ARGS...]
       hvdd run -np N -H HOST:SLOTS,... [flags] [--] COMMAND [ARGS...]
       hvdd run -np N --host-discovery-script SCRIPT [flags] [--] COMMAND [ARGS...]

Start N copies of COMMAND as one hvdd job, like horovodrun or mpirun.

On this node (no -H or --hostfile): if no hvdd daemon is listening on the
socket, one is started for the job and stopped when the job ends; a daemon
that was already running is left alone.

Across hosts (-H or --hostfile): ranks are placed node-major, filling each
host's slots in the order given (host 0 gets ranks 0..SLOTS-1, and so on);
hosts left without a rank are not used. Every host gets a daemon of its own
for the job (hvdd serve --nodes H --node-rank I), with a per-job socket under
/tmp and a fresh random secret handed over on its standard input; host 0
coordinates and serves the rendezvous (in elastic jobs, below, hvdd run
serves it). Hosts that are this machine
(localhost, 127.0.0.0/8, or one of its addresses or names) are started
directly; the others through ssh -o BatchMode=yes -o
StrictHostKeyChecking=accept-new (or --agent), which must log in without a
password, find hvdd at the same path as here (or --hvdd-path), and find
COMMAND in the same working directory. Like horovodrun's ssh, it takes a
host it has never seen (accept-new records its key; a changed key is still
refused). Remote ranks
get the rank variables and -x exports (not the rest of this environment).
When the job ends, or a rank fails, remote processes are stopped by closing
their agent's standard input: a wrapper on the remote side then sends them
SIGTERM, and SIGKILL after the kill grace. Signals sent to hvdd run reach
remote ranks as SIGTERM. If the ranks all fit on this machine, the job runs
as on one node.

Each rank gets its place in the job through the environment:
  HVDD_RANK, HVDD_SIZE, HVDD_LOCAL_RANK, HVDD_LOCAL_SIZE, HVDD_SOCKET
  HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE,
  HOROVOD_CROSS_RANK (0), HOROVOD_CROSS_SIZE (1)
Across hosts also HVDD_CROSS_RANK and HVDD_CROSS_SIZE, and the cross rank
and size are Horovod's: among the hosts that have that local rank.
And torch.distributed's, as torchrun sets them, so that a program that calls
init_process_group("hvdd") (or "gloo") needs no import of hvdd first:
  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the host's
  index), MASTER_ADDR and MASTER_PORT (where rank 0's store listens:
  127.0.0.1 and a free port on one machine; across hosts host 0 and a free
  port there, or the rendezvous port + 1 when host 0 is another machine)
Each is left alone when set in this environment or with -x. Elastic ranks
get their values at start (and no MASTER_ADDR or MASTER_PORT when hosts are
given or discovered): after a reset, use hvd's (hvd.rank(), hvd.size(), ...).

Every line a rank writes is tagged with its (global) rank, as mpirun
--tag-output does:
  [1]<stdout>:epoch 3 loss 0.25
  [0]<stderr>:warning: ...

If a rank exits with a non-zero status or dies from a signal, the other ranks
get SIGTERM, then SIGKILL after the kill grace, and hvdd run exits with the
failed rank's status (128+N for death by signal N). SIGINT, SIGTERM and SIGHUP
sent to hvdd run are forwarded to every rank; a second Ctrl-C kills them at
once.

Flags (they stop at "--" or at the first argument that is not a flag):
  -np N, --num-proc N
        number of processes to start (required, at least 1); for the
        elastic driver (below), the slots needed before the job starts
  --socket PATH
        daemon socket (default: $HVDD_SOCKET, else /run/hvdd/hvdd.sock for
        root, else $XDG_RUNTIME_DIR/hvdd.sock, else $TMPDIR/hvdd-UID/hvdd.sock)
  --wire-compression none|fp16|bf16
        the daemons it starts send the float32 sums (gradients) between hosts
        in 16 bits, accumulating in float32: half the bytes on a slow link,
        results within a stated error bound (hvdd serve --help); a daemon
        already running keeps its setting
  --job NAME
        the job's name (default: the command's name and random digits, e.g.
        python-3f2a): a daemon runs several jobs at once, each its own ranks,
        and names them in hvdd status and its metrics; the ranks get it as
        HVDD_JOB. A job belongs to the user who started it
  --no-tag-output
        do not prefix output lines with the rank; ranks write straight to
        hvdd run's stdout and stderr
  --start-timeout SECONDS
        how long to wait for the daemons hvdd run starts to accept
        connections: whole seconds, as horovodrun takes it (30), or a
        duration (90s, 2m) (default $HOROVOD_START_TIMEOUT, else 30)
  --kill-grace DURATION
        time between SIGTERM and SIGKILL when stopping ranks (default 5s)
  --min-np MIN, --min-num-proc MIN
        elastic (fault-tolerant) job: ranks run with HOROVOD_ELASTIC=1, and
        when a rank fails the others go on as long as at least MIN run; the
        survivors re-initialise into the job's next epoch through
        hvd.elastic.run. With -H, hvdd run's elastic driver runs the job
        (see "Elastic jobs on hosts" below)
  --reset-limit K
        elastic job: stop it at the reset that would be its K+1-th (a
        failure, or hosts added or removed; default: no limit)
  --elastic-timeout SECONDS
        elastic job: how long its next epoch waits for the surviving ranks
        to re-initialise (passed to the daemons hvdd run starts), how long
        a rank that joins the running job waits in init (the ranks'
        HOROVOD_ELASTIC_TIMEOUT), how long the elastic driver waits for
        enough slots, and how long the ranks of a removed host have to
        leave the job before it stops them (default 600)
  -x NAME[=VALUE]
        export NAME to every rank, with VALUE or with its value in hvdd run's
        environment (ignored if unset there); may be repeated
  --output-filename DIR
        also write every rank's output to DIR/rank.N/stdout and
        DIR/rank.N/stderr, as horovodrun does: N is the rank's tag, padded
        with zeros to the width of -np minus 1 (rank.03 for -np 11), and the
        files hold the lines as they reach the terminal (tagged, unless
        --no-tag-output); they are truncated at the start
  --prefix-output-with-timestamp, -prefix-timestamp
        put the local time before every tagged output line, as horovodrun:
        Mon Jan  2 15:04:05 2006[0]<stdout>:...
  --verbose
        say what hvdd run starts: the daemons' and the ranks' command lines
  --check-build, -cb
        print what this hvdd has, in horovodrun's layout: the frameworks
        whose hvdd module imports in the python3 (else python) of $PATH,
        the controllers and the tensor operations; needs no -np
  --version, -v
        print hvdd's version
  -h, --help
        show this help

Horovod's parameters (horovodrun's flags): each sets the ranks' HOROVOD_*
variable as horovodrun does, and, where hvdd's daemon has the setting, the
flag of every daemon hvdd run starts. A daemon that was already running on
--socket keeps the settings it was started with; hvdd run warns then.
  --fusion-threshold-mb MB
        the daemons' fusion threshold (hvdd serve --fusion-threshold, in
        bytes; 0 disables fusion); HOROVOD_FUSION_THRESHOLD
  --cycle-time-ms MS
        the daemons' cycle time, the least time between dispatched plans,
        to batch more into one (hvdd serve --cycle-time; hvdd's default is
        0, event driven); HOROVOD_CYCLE_TIME
  --no-stall-check, --stall-check-warning-time-seconds S,
  --stall-check-shutdown-time-seconds S
        the daemons' stall check (hvdd serve --stall-check, --stall-shutdown);
        HOROVOD_STALL_CHECK_DISABLE, HOROVOD_STALL_CHECK_TIME_SECONDS,
        HOROVOD_STALL_SHUTDOWN_TIME_SECONDS
  --log-level TRACE|DEBUG|INFO|WARNING|ERROR|FATAL
        the daemons' log level (hvdd serve --log-level; default
        $HOROVOD_LOG_LEVEL, else WARNING); HOROVOD_LOG_LEVEL
  --log-with-timestamp, --log-without-timestamp
        HOROVOD_LOG_HIDE_TIME only: the daemons' log lines always carry time=
  --cache-capacity N
        HOROVOD_CACHE_CAPACITY only: hvdd has no response cache (its daemon
        negotiates every tensor as it comes, through shared memory)
  --hierarchical-allreduce, --hierarchical-allgather (and --no-...)
        HOROVOD_HIERARCHICAL_ALLREDUCE and _ALLGATHER only: hvdd is
        hierarchical by construction (a host's ranks meet in its daemon, and
        the daemons exchange one message per host)
  --autotune, --autotune-log-file FILE, --autotune-warmup-samples N,
  --autotune-steps-per-sample N, --autotune-bayes-opt-max-samples N,
  --autotune-gaussian-process-noise X
        tune the job's fusion threshold, cycle time and the daemons' spin
        window, and across hosts the tcp engine's streams, segment and
        small-message threshold, while it runs (Bayesian optimisation of
        the bytes moved per second, as Horovod's); parameters given stay
        fixed; node 0's daemon writes the log (a CSV of each configuration
        and its score, the best last) and applies the best to every host.
        The daemons started get --autotune and its details; the ranks get
        HOROVOD_AUTOTUNE=1 and the others, as from horovodrun
  --timeline-filename FILE
        record Horovod's timeline of the job in FILE (a Chrome trace for
        chrome://tracing or Perfetto), which the daemon of global rank 0
        writes: sets HOROVOD_TIMELINE to FILE's absolute path in the ranks'
        environment
  --timeline-mark-cycles
        mark every cycle of the daemon's loop in the timeline (CYCLE_START):
        sets HOROVOD_TIMELINE_MARK_CYCLES=1
  --disable-cache
        does nothing: horovodrun caches its start-up checks (ssh to every
        host) for 60 minutes unless given it, and hvdd run makes no such
        checks
  --config-file FILE
        horovodrun's YAML file of these parameters (sections params,
        autotune, timeline, stall_check, logging); a flag given on the
        command line wins wherever it stands. Its controller and
        library_options, and keys horovodrun does not know, are ignored
        with a warning

horovodrun's flags that mean nothing here are refused with the reason
(exit status 2, nothing started): --gloo, --mpi, --jsrun, --tcp,
--mpi-args, --binding-args, --num-nccl-streams, --thread-affinity,
--gloo-timeout-seconds, --mpi-threads-disable.

Flags for jobs across hosts:
  -H HOST[:SLOTS],..., --hosts HOST[:SLOTS],...
        the hosts and how many ranks each may run (default 1); IPv6
        addresses in brackets: [fd00::2]:4
  --hostfile FILE
        the hosts, one per line as "HOST slots=N" or "HOST:N" (# comments)
  --backend tcp|mpi
        the daemons' cross-node engine (default tcp). mpi starts the daemons as
        the ranks of one mpirun (one per host, reached through the same agent
        or ssh command, its plm_rsh_agent) and needs hvdd built with -tags mpi
        on every host
  --rendezvous-port PORT
        host 0's rendezvous port (default: a free port when host 0 is this
        machine, else 29500); for the elastic driver, the port of this
        machine where hvdd run serves the rendezvous (default: a free port)
  -p PORT, --ssh-port PORT
        ssh's port on the remote hosts
  -i FILE, --ssh-identity-file FILE
        ssh's identity file
  --agent COMMAND
        run COMMAND HOST 'SHELL COMMAND' instead of ssh to reach a remote
        host, as mpirun's plm_rsh_agent (COMMAND is split on spaces)
  --hvdd-path PATH
        hvdd on the remote hosts (default: this hvdd's absolute path)
  --network-interface NAME, --network-interfaces NAME,NAME...
        the network interfaces between the hosts: every daemon advertises
        and binds the address of the first of them that its host has, for
        its control links and data (hvdd serve --network-interface); the
        rendezvous stays on host 0's name
  (--socket is not used across hosts: every host gets a socket for the job.)

Elastic jobs on hosts (horovodrun's elastic mode):
  --host-discovery-script SCRIPT
        an elastic job on the hosts SCRIPT finds (instead of -H): a shell
        command line that prints the hosts available now, one per line, as
        HOST:SLOTS or HOST (then --slots-per-host gives its slots). hvdd run
        runs it every second; the job fails at once if its first run fails,
        later failures are retried for up to --elastic-timeout. --min-np
        defaults to -np
  --max-np MAX, --max-num-proc MAX
        at most MAX ranks (default: a rank on every available slot)
  --slots-per-host S, --slots S
        the slots of a host that SCRIPT prints without any
  --blacklist-cooldown-range MIN MAX
        a blacklisted host comes back after a cooldown between MIN
        and MAX seconds: MIN·2^n plus a random fraction of MIN for its n-th
        failure, as Horovod (1 <= MIN <= MAX <= 3600; default: never)

With --host-discovery-script, or -H (or --hostfile) and --min-np, hvdd run
drives the job as horovodrun's elastic driver does. Every host, even a
single one that is this machine, gets a daemon of its own for the job
(hvdd serve ... --elastic --rendezvous-external). hvdd run serves the job's
rendezvous itself, for as long as the job runs, so that the job does not
depend on any one host: the daemons coordinate the job from host 0, the
first to get ranks, and move the coordination to another host when host 0
is lost. The rendezvous listens on 127.0.0.1 when every host of -H is this
machine, else on every interface of this machine, on --rendezvous-port or
a free port (open it in a firewall between the hosts); each daemon is told
the address its host reaches: 127.0.0.1 on this machine, else this
machine's address on its route to the host. hvdd run waits up to
--elastic-timeout for -np slots, then
starts a rank on every available slot, up to --max-np. Every second it
looks at the hosts again: a new host gets a daemon and ranks, a host with
more slots gets more ranks (the older hosts are filled first; running ranks
keep their place), a host with fewer slots has ranks stopped; the running
ranks take the change in at their next commit. A host that is gone is
removed as horovodrun removes one: its daemon is told, every rank resets
at the same commit (hvd.elastic's HostsUpdatedInterrupt), and the host's
ranks are refused in their re-initialisation ("HOST[LOCAL_RANK] has been
removed from elastic job") and exit, while the others go on without
restoring a commit; hvdd run stops the host's ranks that have not left
within --elastic-timeout, then its daemon. New ranks' output tags carry on
the numbering ([4], [5], ...).

Failures: when a rank fails (it exits with a non-zero status, by an
exception or a signal, or cannot start) or a host's daemon (or its agent)
dies, the host is blacklisted, as Horovod blacklists the host of a failed
worker: its other ranks are stopped, the ranks on the other hosts restore
their last commit and go on, and the host comes back after the cooldown of
--blacklist-cooldown-range (with a new daemon and ranks), or never without
one; so is a host added later whose daemon does not start (it exits, or is
not ready within --start-timeout). Host 0 is no exception: when a rank of
it fails, its daemon dies or it is gone, the job goes on on the other
hosts. The job
stops when fewer than --min-np ranks run and none can be added within
--elastic-timeout, when none of the running ranks would be left (new ranks
would have no state to start from), when every host is blacklisted, or at
the reset beyond --reset-limit. Once a rank finishes with status 0
(Horovod: a worker's success), nothing is added any more, and the job ends
with status 0 when the other ranks have ended.

Examples:
  hvdd run -np 4 python train.py --epochs 10
  hvdd run -np 2 --socket /tmp/hvdd.sock -- python -u train.py
  hvdd run -np 8 -x NCCL_DEBUG=INFO -x CUDA_VISIBLE_DEVICES -- ./train
  hvdd run -np 2 --no-tag-output --kill-grace 30s -- python train.py
  hvdd run -np 8 -H node1:4,node2:4 -- python train.py
  hvdd run -np 6 --hostfile hosts.txt -x NCCL_DEBUG=INFO -- python train.py
  hvdd run -np 4 -H 10.0.0.1:2,10.0.0.2:2 -p 2222 -i ~/.ssh/job_key -- ./train
  hvdd run -np 4 -H a:2,b:2 --agent "ssh -o StrictHostKeyChecking=no" -- ./train
  hvdd run -np 4 -H a:2,b:2 --hvdd-path /opt/hvdd/bin/hvdd --rendezvous-port 29600 -- ./train
  hvdd run -np 4 --min-np 2 -H a:2,b:2 --blacklist-cooldown-range 10 100 -- python train.py
  hvdd run -np 4 --min-np 2 --max-np 8 --host-discovery-script ./discover_hosts.sh -- python train.py
  hvdd run -np 4 --fusion-threshold-mb 32 --cycle-time-ms 2 --output-filename logs -- python train.py
  hvdd run -np 8 -H a:4,b:4 --network-interface eth1 --config-file horovod.yaml -- python train.py
`

// envList is the flag.Value behind -x.
type envList struct {
	env *[]string
}

func (e envList) String() string {
	if e.env == nil {
		return ""
	}
	return strings.Join(*e.env, ",")
}

func (e envList) Set(s string) error {
	name, value, hasValue := strings.Cut(s, "=")
	if name == "" || strings.ContainsAny(name, " \t\n") {
		return fmt.Errorf("%q is not NAME or NAME=VALUE", s)
	}
	if !hasValue {
		v, ok := os.LookupEnv(name)
		if !ok {
			return nil // mpirun -x semantics: nothing to export
		}
		value = v
	}
	*e.env = append(*e.env, name+"="+value)
	return nil
}

// ParseArgs parses the arguments of `hvdd run` (without "run" itself) into a
// Config. Flags end at "--" or at the first argument that is not a flag; the
// rest is the command. Both -flag and --flag spellings are accepted. Socket
// is resolved with ipc.SocketPath, so the returned Config names the socket Run
// will use (cmd/hvdd needs it to build DaemonCommand). Durations not given
// are left zero, meaning Run's defaults.
//
// For -h or --help, ParseArgs returns an error wrapping flag.ErrHelp; the
// caller should print Usage and exit 0.
func ParseArgs(args []string) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("hvdd run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.IntVar(&c.NP, "np", 0, "")
	fs.IntVar(&c.NP, "num-proc", 0, "")
	fs.StringVar(&c.Socket, "socket", "", "")
	fs.StringVar(&c.JobName, "job", "", "")
	fs.StringVar(&c.WireCompression, "wire-compression", "", "")
	fs.BoolVar(&c.NoTagOutput, "no-tag-output", false, "")
	fs.Func("start-timeout", "", func(s string) error {
		d, err := parseSeconds(s)
		c.StartTimeout = d
		return err
	})
	fs.DurationVar(&c.KillGrace, "kill-grace", 0, "")
	fs.IntVar(&c.MinNP, "min-np", 0, "")
	fs.IntVar(&c.MinNP, "min-num-proc", 0, "")
	fs.IntVar(&c.ResetLimit, "reset-limit", 0, "")
	var elasticTimeout int
	fs.IntVar(&elasticTimeout, "elastic-timeout", 0, "")
	fs.IntVar(&c.MaxNP, "max-np", 0, "")
	fs.IntVar(&c.MaxNP, "max-num-proc", 0, "")
	fs.StringVar(&c.HostDiscoveryScript, "host-discovery-script", "", "")
	fs.IntVar(&c.SlotsPerHost, "slots-per-host", 0, "")
	fs.IntVar(&c.SlotsPerHost, "slots", 0, "")
	var cooldown cooldownFlag
	fs.Var(&cooldown, "blacklist-cooldown-range", "")
	fs.Var(envList{&c.Env}, "x", "")
	knobFlags(fs, &c.Knobs)
	var refused refusal
	refuseFlags(fs, &refused)
	var configFile string
	fs.StringVar(&configFile, "config-file", "", "")
	fs.StringVar(&c.OutputFilename, "output-filename", "", "")
	fs.BoolVar(&c.PrefixTimestamp, "prefix-output-with-timestamp", false, "")
	fs.BoolVar(&c.PrefixTimestamp, "prefix-timestamp", false, "")
	fs.BoolVar(&c.Verbose, "verbose", false, "")
	fs.Func("network-interface", "", c.addInterface)
	fs.Func("network-interfaces", "", c.addInterface)
	var disableCache bool
	fs.BoolVar(&disableCache, "disable-cache", false, "")
	fs.BoolVar(&c.CheckBuild, "check-build", false, "")
	fs.BoolVar(&c.CheckBuild, "cb", false, "")
	fs.BoolVar(&c.PrintVersion, "version", false, "")
	fs.BoolVar(&c.PrintVersion, "v", false, "")
	var hosts, hostfile string
	fs.StringVar(&hosts, "H", "", "")
	fs.StringVar(&hosts, "hosts", "", "")
	fs.StringVar(&hostfile, "hostfile", "", "")
	fs.StringVar(&c.Backend, "backend", "", "")
	fs.IntVar(&c.RendezvousPort, "rendezvous-port", 0, "")
	fs.IntVar(&c.SSHPort, "p", 0, "")
	fs.IntVar(&c.SSHPort, "ssh-port", 0, "")
	fs.StringVar(&c.SSHIdentityFile, "i", "", "")
	fs.StringVar(&c.SSHIdentityFile, "ssh-identity-file", "", "")
	fs.StringVar(&c.Agent, "agent", "", "")
	fs.StringVar(&c.RemoteHvddPath, "hvdd-path", "", "")

	// --blacklist-cooldown-range takes two values: the flag package stops
	// at the second, which is taken here before parsing goes on.
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return Config{}, fmt.Errorf("hvdd run: %w", err)
			}
			return Config{}, fmt.Errorf("%v; see 'hvdd run --help'", err)
		}
		rest = fs.Args()
		if !cooldown.wantMax {
			break
		}
		if err := cooldown.setMax(rest); err != nil {
			return Config{}, err
		}
		rest = rest[1:]
	}
	c.Command = fs.Args()
	if refused.err != nil {
		return Config{}, refused.err
	}
	if c.CheckBuild || c.PrintVersion {
		return c, nil // horovodrun: no -np needed, nothing run
	}
	if configFile != "" {
		w, err := applyConfigFile(configFile, &c.Knobs)
		if err != nil {
			return Config{}, err
		}
		c.Warnings = append(c.Warnings, w...)
	}
	if err := c.Knobs.validate(); err != nil {
		return Config{}, err
	}
	if tl := c.Knobs.TimelineFilename; tl != nil && *tl != "" {
		// The ranks' daemon writes it, from another working directory.
		abs, err := filepath.Abs(*tl)
		if err != nil {
			return Config{}, fmt.Errorf("--timeline-filename %q: %w", *tl, err)
		}
		c.Knobs.TimelineFilename = &abs
	}
	if al := c.Knobs.AutotuneLogFile; al != nil && *al != "" {
		// Node 0's daemon writes it, from another working directory.
		abs, err := filepath.Abs(*al)
		if err != nil {
			return Config{}, fmt.Errorf("--autotune-log-file %q: %w", *al, err)
		}
		c.Knobs.AutotuneLogFile = &abs
	}
	c.Warnings = append(c.Warnings, c.Knobs.warnings()...)
	if c.OutputFilename != "" {
		abs, err := filepath.Abs(c.OutputFilename)
		if err != nil {
			return Config{}, fmt.Errorf("--output-filename %q: %w", c.OutputFilename, err)
		}
		c.OutputFilename = abs
	}
	if !flagSet(fs, "start-timeout") {
		if v := os.Getenv("HOROVOD_START_TIMEOUT"); v != "" {
			d, err := parseSeconds(v)
			if err != nil {
				return Config{}, fmt.Errorf("HOROVOD_START_TIMEOUT=%s: %v", v, err)
			}
			c.StartTimeout = d
		}
	}
	c.ElasticTimeout = time.Duration(elasticTimeout) * time.Second
	if flagSet(fs, "blacklist-cooldown-range") {
		if err := cooldown.check(); err != nil {
			return Config{}, err
		}
		c.BlacklistCooldown = CooldownRange{time.Duration(cooldown.min) * time.Second, time.Duration(cooldown.max) * time.Second}
	}
	if flagSet(fs, "reset-limit") && c.ResetLimit < 1 {
		return Config{}, errors.New("--reset-limit must be at least 1 (leave it out for no limit)")
	}
	if flagSet(fs, "elastic-timeout") && elasticTimeout < 1 {
		return Config{}, errors.New("--elastic-timeout must be a positive number of seconds, e.g. 600")
	}
	switch {
	case !flagSet(fs, "np") && !flagSet(fs, "num-proc"):
		return Config{}, errors.New("-np is required: pass the number of processes, e.g. hvdd run -np 4 -- python train.py")
	case c.StartTimeout < 0 || c.KillGrace < 0:
		return Config{}, errors.New("--start-timeout and --kill-grace must not be negative; pass e.g. 30 (seconds) or 30s")
	}
	if c.StartTimeout == 0 && (flagSet(fs, "start-timeout") || os.Getenv("HOROVOD_START_TIMEOUT") != "") {
		return Config{}, errors.New("--start-timeout must be positive; pass seconds (e.g. 30) or a duration (e.g. 30s)")
	}
	if c.KillGrace == 0 && flagSet(fs, "kill-grace") {
		return Config{}, errors.New("--kill-grace must be positive; pass e.g. 5s (SIGKILL at once is not supported)")
	}
	switch {
	case hosts != "" && hostfile != "":
		return Config{}, errors.New("-H and --hostfile both name the hosts; pass one of them")
	case hosts != "":
		h, err := ParseHosts(hosts)
		if err != nil {
			return Config{}, err
		}
		c.Hosts = h
	case hostfile != "":
		h, err := ReadHostfile(hostfile)
		if err != nil {
			return Config{}, err
		}
		c.Hosts = h
	case flagSet(fs, "H") || flagSet(fs, "hosts"):
		return Config{}, errors.New("-H is empty; pass the hosts as host1:slots,host2:slots")
	}
	c.Socket = ipc.SocketPath(c.Socket)
	if c.JobName == "" {
		c.JobName = defaultJobName(c.Command)
	}
	if err := c.validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// defaultJobName is a job's name when --job is not given: the command's base
// name and four random hex digits ("python-3f2a").
func defaultJobName(command []string) string {
	base := "job"
	if len(command) > 0 {
		base = filepath.Base(command[0])
	}
	var b [2]byte
	rand.Read(b[:])
	return fmt.Sprintf("%s-%s", base, hex.EncodeToString(b[:]))
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// cooldownFlag is the flag.Value behind --blacklist-cooldown-range MIN MAX
// (whole seconds): Set takes MIN, and ParseArgs hands MAX, the argument
// after it, to setMax.
type cooldownFlag struct {
	min, max int
	wantMax  bool
}

const cooldownUsage = "--blacklist-cooldown-range takes two whole numbers of seconds, MIN MAX, e.g. --blacklist-cooldown-range 10 100"

func (f *cooldownFlag) String() string {
	if f == nil {
		return ""
	}
	return fmt.Sprintf("%d %d", f.min, f.max)
}

func (f *cooldownFlag) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return errors.New(cooldownUsage)
	}
	f.min, f.wantMax = n, true
	return nil
}

// setMax takes MAX from rest, the arguments after MIN.
func (f *cooldownFlag) setMax(rest []string) error {
	f.wantMax = false
	if len(rest) == 0 {
		return errors.New(cooldownUsage)
	}
	n, err := strconv.Atoi(rest[0])
	if err != nil {
		return fmt.Errorf("%s, not %q", cooldownUsage, rest[0])
	}
	f.max = n
	return nil
}

// check applies Horovod's bounds (HostState._validate_cooldown_range), with
// its messages.
func (f *cooldownFlag) check() error {
	lo, hi := int(CooldownLowerLimit/time.Second), int(CooldownUpperLimit/time.Second)
	switch {
	case f.min < lo:
		return fmt.Errorf("Provided cooldown lower limit: %d cannot be lower than default cooldown lower limit: %d; pass --blacklist-cooldown-range MIN MAX with MIN >= %d", f.min, lo, lo)
	case f.max > hi:
		return fmt.Errorf("Provided cooldown upper limit: %d cannot be higher than default cooldown upper limit: %d; pass --blacklist-cooldown-range MIN MAX with MAX <= %d", f.max, hi, hi)
	case f.max < f.min:
		return fmt.Errorf("--blacklist-cooldown-range %d %d: MIN is above MAX; pass MIN first", f.min, f.max)
	}
	return nil
}

// parseSeconds parses --start-timeout: a whole number of seconds, as
// horovodrun takes it (and $HOROVOD_START_TIMEOUT), or a Go duration such
// as 90s or 2m.
func parseSeconds(s string) (time.Duration, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n > int64(24*time.Hour/time.Second) {
			return 0, fmt.Errorf("%d seconds is more than a day", n)
		}
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, errors.New("want seconds (e.g. 30) or a duration (e.g. 30s, 2m)")
	}
	return d, nil
}
