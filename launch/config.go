package launch

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/hvdd/hvdd/ipc"
)

// Defaults applied by Run to zero-valued Config fields.
const (
	DefaultStartTimeout = 30 * time.Second
	DefaultKillGrace    = 5 * time.Second
	// DefaultElasticTimeout is Horovod's ELASTIC_TIMEOUT_SECS.
	DefaultElasticTimeout = 600 * time.Second
)

// maxLine is the longest line the output tagger buffers; a longer line is
// written out in pieces of this size, each tagged as a line of its own.
const maxLine = 1 << 20

// Config describes one `hvdd run` job. The zero value of every field except
// NP and Command is usable; Run fills in the documented defaults.
type Config struct {
	// NP is the number of worker processes (ranks) to start. It must be at
	// least 1; the zero value is rejected.
	NP int

	// Command is the worker program followed by its arguments, started NP
	// times. Command[0] is looked up in $PATH when it contains no slash. It
	// must not be empty.
	Command []string

	// Socket is the path of the daemon's Unix socket; a leading '@' names a
	// Linux abstract socket. Empty means ipc.SocketPath(""): $HVDD_SOCKET,
	// else ipc.DefaultSocket(). A job across hosts does not use it: every
	// host's daemon gets a socket of its own for the job.
	Socket string

	// JobName names the job for the daemons (HVDD_JOB in every rank's
	// environment): a daemon runs several jobs at once, and shows their
	// names in its status and metrics. Empty means a name made from the
	// command and random digits (ParseArgs fills it).
	JobName string

	// DaemonCommand starts a daemon when none accepts connections on Socket,
	// e.g. [hvdd, "serve", "--slots", "4", "--socket", Socket]. The command
	// must listen on Socket; Run stops it (SIGTERM, then SIGKILL after
	// KillGrace) once every worker has exited. Nil means never start one: Run
	// fails if no daemon is listening.
	DaemonCommand []string

	// StartTimeout bounds how long Run waits for a daemon it started to
	// accept connections (and for another hvdd run to release the socket's
	// lock). Zero means DefaultStartTimeout (30s).
	StartTimeout time.Duration

	// KillGrace is how long ranks (and a daemon Run started) get between
	// SIGTERM and SIGKILL when the job is being stopped. Zero means
	// DefaultKillGrace (5s).
	KillGrace time.Duration

	// MinNP, when positive, makes the job elastic (fault tolerant, as
	// horovodrun --min-np without a discovery script): ranks get
	// HOROVOD_ELASTIC=1, and a rank that fails does not stop the others
	// while at least MinNP ranks run; the daemons re-form the job from them
	// (the survivors re-initialise through hvd.elastic.run), on one host or
	// across hosts, where a host that is lost (its daemon dies, its link is
	// cut) loses its ranks and the other hosts go on.
	MinNP int

	// ResetLimit, when positive, stops an elastic job at the reset that
	// would be its ResetLimit+1-th (horovodrun --reset-limit): a failure it
	// goes on from, or, with the elastic driver, hosts added or removed.
	// Zero means no limit.
	ResetLimit int

	// ElasticTimeout is how long the next epoch of an elastic job waits for
	// its surviving ranks, passed to a daemon Run starts (hvdd serve
	// --elastic-timeout; horovodrun --elastic-timeout). The elastic driver
	// also waits this long for enough slots: -np before the job starts,
	// MinNP once it runs, and for the ranks of a host it removed to leave
	// the job before it stops them. Zero means DefaultElasticTimeout
	// (600 s).
	ElasticTimeout time.Duration

	// MaxNP, when positive, bounds the ranks of a job the elastic driver
	// runs (horovodrun --max-np); zero means no bound: a rank on every
	// available slot. It must not be below NP.
	MaxNP int

	// HostDiscoveryScript, when not empty, makes the job elastic and gives
	// its hosts (horovodrun --host-discovery-script): a shell command line
	// (run with sh -c in Dir) that prints the hosts available now, one per
	// line as HOST:SLOTS, or HOST with SlotsPerHost slots. The elastic
	// driver runs it every second and adds or removes hosts as its output
	// changes. MinNP defaults to NP. It excludes Hosts.
	HostDiscoveryScript string

	// SlotsPerHost is the slots of a host that the discovery script prints
	// without any (horovodrun --slots-per-host). Zero means such a line is
	// an error.
	SlotsPerHost int

	// BlacklistCooldown is how long a blacklisted host or slot of a job the
	// elastic driver runs stays out (horovodrun --blacklist-cooldown-range).
	// The zero value means for good.
	BlacklistCooldown CooldownRange

	// Env holds extra NAME=VALUE entries for every worker, on top of our own
	// environment. Run's rank variables (HVDD_RANK, HOROVOD_RANK, ...) are
	// set last and cannot be overridden. Nil means no extra variables.
	Env []string

	// Dir is the workers' working directory. Empty means ours.
	Dir string

	// NoTagOutput turns off line tagging: workers then write straight to
	// Stdout and Stderr (sharing the file descriptors when those are
	// *os.File). The zero value tags every line as "[rank]<stdout>:line".
	NoTagOutput bool

	// Stdin is connected to rank 0's standard input, as mpirun does; the
	// other ranks read the null device. Nil means rank 0 reads the null
	// device too.
	Stdin io.Reader

	// Stdout receives the workers' standard output. Nil means os.Stdout.
	Stdout io.Writer

	// Stderr receives the workers' standard error, the daemon's output
	// (prefixed "[hvdd] ") and Run's own messages (prefixed "hvdd run: ").
	// Nil means os.Stderr.
	Stderr io.Writer

	// Signals delivers the signals to forward to the workers. Nil means Run
	// subscribes to SIGINT, SIGTERM and SIGHUP with signal.Notify for as long
	// as it runs. Tests (and embedders that route signals themselves) pass
	// their own channel.
	Signals <-chan os.Signal

	// The fields below are for jobs across hosts. They are ignored when
	// Hosts is nil, or when the ranks all land on one host that is this
	// machine: that job's one node uses Socket and DaemonCommand above.

	// Hosts lists the job's hosts in node order (-H, --hostfile). Ranks are
	// placed node-major, filling each host's slots in turn; NP must not
	// exceed their total. Nil means this node only.
	Hosts []Host

	// Backend is the daemons' cross-node engine: "tcp" (the zero value) or
	// "mpi" (the daemons run as the ranks of one mpirun).
	Backend string

	// RendezvousPort is the TCP port node 0's daemon serves the rendezvous
	// on. Zero means a free port when node 0 is this machine, else 29500.
	// In a job the elastic driver runs, hvdd run serves the rendezvous
	// itself, on this port of this machine; zero there means a free port.
	RendezvousPort int

	// SSHPort and SSHIdentityFile are ssh's -p and -i for remote hosts. Zero
	// and empty leave ssh's defaults.
	SSHPort         int
	SSHIdentityFile string

	// Agent replaces ssh for remote hosts: its words (split on white space)
	// are run followed by the host and one shell command line, as mpirun's
	// plm_rsh_agent. Empty means "ssh -o BatchMode=yes -o
	// StrictHostKeyChecking=accept-new [-p SSHPort] [-i SSHIdentityFile]".
	Agent string

	// HvddPath is the hvdd binary that starts the daemons of this machine's
	// hosts. Required when the job spans hosts.
	HvddPath string

	// RemoteHvddPath is the hvdd binary on the remote hosts (--hvdd-path).
	// Empty means HvddPath.
	RemoteHvddPath string

	// Knobs are horovodrun's tuneable parameters (--fusion-threshold-mb,
	// --cycle-time-ms, ..., --config-file): Run adds their HOROVOD_*
	// variables to every rank's environment, after Env, and the daemons it
	// starts get their `hvdd serve` flags (ServeFlags). The zero value
	// sets nothing.
	Knobs Knobs

	// Warnings are printed by Run ("hvdd run: warning: ...") before it
	// starts anything: ParseArgs fills it for what it accepted but cannot
	// do (--autotune, config-file keys without meaning here). Nil means
	// none.
	Warnings []string

	// OutputFilename, when not empty, is a directory where every rank's
	// output is also written, as horovodrun --output-filename writes it:
	// OutputFilename/rank.N/stdout and .../stderr, N the rank's output tag
	// zero-padded to the width of NP-1, each file holding the lines as they
	// reach Stdout and Stderr (tagged, unless NoTagOutput). Run creates the
	// directories and truncates the files.
	OutputFilename string

	// PrefixTimestamp puts the local time (as Python's time.asctime: "Mon
	// Jan  2 15:04:05 2006") before every tagged output line, as
	// horovodrun --prefix-output-with-timestamp does. It does nothing with
	// NoTagOutput.
	PrefixTimestamp bool

	// Verbose makes Run say what it starts (daemon and rank command
	// lines) on Stderr, as horovodrun --verbose does.
	Verbose bool

	// NetworkInterfaces, when not empty, are the network interfaces the
	// daemons of a job across hosts use between them (horovodrun
	// --network-interface): each daemon advertises and binds the address of
	// the first of them that its host has (hvdd serve --network-interface).
	// Unused on one node. Nil means the address each host is named by.
	NetworkInterfaces []string

	// WireCompression is --wire-compression (none, fp16, bf16): every
	// daemon Run starts gets hvdd serve --wire-compression, so that the
	// float32 sums between hosts travel in 16 bits. Empty leaves the
	// daemons' default ($HVDD_WIRE_COMPRESSION, else none).
	WireCompression string

	// CheckBuild and PrintVersion are horovodrun --check-build and
	// --version: the caller prints what was asked instead of running a
	// job (ParseArgs then requires no -np and no command). Run ignores
	// them.
	CheckBuild, PrintVersion bool

	// localHost, if non-nil, replaces isLocalHost (tests).
	localHost func(host string) bool

	// discoverEvery, if positive, replaces DefaultDiscoverEvery (tests).
	discoverEvery time.Duration
	// reportWait, if positive, replaces DefaultReportWait (tests).
	reportWait time.Duration
	// formWait, if positive, replaces DefaultFormWait (tests).
	formWait time.Duration
	// exitWait, if positive, replaces DefaultExitWait (tests).
	exitWait time.Duration
}

// ServeFlags is the `hvdd serve` flags that pass the job's settings to
// every daemon Run starts: --log-level (Knobs.LogLevel, else
// $HOROVOD_LOG_LEVEL, else warning: a job's own daemons speak up only when
// something is wrong; info with --autotune, whose progress and choice are
// info lines), then the knobs the daemon has a setting for
// (--fusion-threshold, --cycle-time, --stall-check, --stall-shutdown,
// --autotune and its details). Whoever builds DaemonCommand should append
// them.
func (c *Config) ServeFlags() []string {
	level := os.Getenv("HOROVOD_LOG_LEVEL")
	if c.Knobs.LogLevel != nil {
		level = *c.Knobs.LogLevel
	}
	if level == "" {
		level = "warning"
		if c.Knobs.autotune() {
			level = "info"
		}
	}
	args := append([]string{"--log-level", strings.ToLower(level)}, c.Knobs.daemonFlags()...)
	if c.WireCompression != "" {
		args = append(args, "--wire-compression", c.WireCompression)
	}
	return args
}

// addInterface takes --network-interface NAME (repeatable) and
// --network-interfaces NAME,NAME.
func (c *Config) addInterface(list string) error {
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" || strings.ContainsAny(name, " /\t") {
			return fmt.Errorf("%q is not a network interface name (e.g. eth0)", list)
		}
		if !slices.Contains(c.NetworkInterfaces, name) {
			c.NetworkInterfaces = append(c.NetworkInterfaces, name)
		}
	}
	return nil
}

// elastic reports whether the job is elastic: its ranks get
// HOROVOD_ELASTIC=1 and a failed rank need not stop the others.
func (c *Config) elastic() bool { return c.MinNP > 0 || c.HostDiscoveryScript != "" }

// driven reports whether the elastic driver runs the job (elastic.go): an
// elastic job whose hosts are discovered, or given with -H.
func (c *Config) driven() bool {
	return c.HostDiscoveryScript != "" || c.MinNP > 0 && len(c.Hosts) > 0
}

// withDefaults returns a copy of c with the zero-valued fields filled in.
func (c Config) withDefaults() Config {
	c.Socket = ipc.SocketPath(c.Socket)
	if c.StartTimeout == 0 {
		c.StartTimeout = DefaultStartTimeout
	}
	if c.KillGrace == 0 {
		c.KillGrace = DefaultKillGrace
	}
	if c.Stdout == nil {
		c.Stdout = os.Stdout
	}
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	if c.HostDiscoveryScript != "" && c.MinNP == 0 {
		c.MinNP = c.NP // horovodrun: min_np = args.min_np or args.np
	}
	// The knobs' variables come after Env (a new slice: the caller's Env
	// is not written to).
	c.Env = slices.Concat(c.Env, c.Knobs.env())
	return c
}

// validate reports the first thing wrong with c, saying how to fix it.
func (c *Config) validate() error {
	switch {
	case c.WireCompression != "" && c.WireCompression != "none" && c.WireCompression != "fp16" && c.WireCompression != "bf16":
		return fmt.Errorf("--wire-compression %q: choose none, fp16 or bf16", c.WireCompression)
	case c.NP < 1:
		return fmt.Errorf("the number of processes is %d; it must be at least 1 (pass -np N)", c.NP)
	case len(c.Command) == 0:
		return errors.New("no command to run; put it after the flags, e.g. hvdd run -np 2 -- python train.py")
	case c.Command[0] == "":
		return errors.New("the command name is empty; put the program to run after the flags")
	case c.StartTimeout < 0:
		return fmt.Errorf("start timeout %v is negative; pass a positive duration such as --start-timeout 30s", c.StartTimeout)
	case c.KillGrace < 0:
		return fmt.Errorf("kill grace %v is negative; pass a positive duration such as --kill-grace 5s", c.KillGrace)
	case c.MinNP < 0 || c.MinNP > c.NP:
		return fmt.Errorf("--min-np %d must be between 1 and -np %d", c.MinNP, c.NP)
	case c.ResetLimit < 0 || c.ElasticTimeout < 0:
		return errors.New("--reset-limit and --elastic-timeout must not be negative")
	case (c.ResetLimit > 0 || c.ElasticTimeout > 0) && !c.elastic():
		return errors.New("--reset-limit and --elastic-timeout apply to elastic jobs: pass --min-np too (or --host-discovery-script)")
	case c.elastic() && c.Backend == "mpi":
		return errors.New("--min-np (an elastic job) needs the tcp engine across hosts: the MPI engine's world cannot shrink; drop --backend mpi")
	case len(c.DaemonCommand) > 0 && c.DaemonCommand[0] == "":
		return errors.New("the daemon command's program name is empty")
	case c.RendezvousPort < 0 || c.RendezvousPort > 65535:
		return fmt.Errorf("--rendezvous-port %d is not a TCP port (1-65535; 0 picks one)", c.RendezvousPort)
	}
	if err := c.validateElastic(); err != nil {
		return err
	}
	if strings.ContainsRune(c.Socket, 0) {
		return fmt.Errorf("socket path %q contains a NUL byte", c.Socket)
	}
	// sun_path holds 108 bytes including the terminating NUL.
	if len(c.Socket) > 107 {
		return fmt.Errorf("socket path %q is %d bytes, longer than a Unix socket allows (107); pass a shorter --socket", c.Socket, len(c.Socket))
	}
	if len(c.Hosts) > 0 {
		if err := c.validateHosts(); err != nil {
			return err
		}
	}
	for _, kv := range c.Env {
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" {
			return fmt.Errorf("environment entry %q is not NAME=VALUE", kv)
		}
	}
	return nil
}

// validateHosts reports the first thing wrong with the fields for jobs
// across hosts.
func (c *Config) validateHosts() error {
	if _, err := layout(c.Hosts, c.NP); err != nil {
		return err
	}
	switch c.Backend {
	case "", "tcp", "mpi":
	default:
		return fmt.Errorf("unknown --backend %q; pass tcp or mpi", c.Backend)
	}
	if c.SSHPort < 0 || c.SSHPort > 65535 {
		return fmt.Errorf("--ssh-port %d is not a TCP port (1-65535)", c.SSHPort)
	}
	if c.Agent != "" && len(strings.Fields(c.Agent)) == 0 {
		return errors.New("--agent is blank; pass a command such as 'ssh -o BatchMode=yes'")
	}
	return nil
}

// validateElastic reports the first thing wrong with the fields of the
// elastic driver.
func (c *Config) validateElastic() error {
	r := c.BlacklistCooldown
	switch {
	case c.MaxNP < 0 || c.SlotsPerHost < 0:
		return errors.New("--max-np and --slots-per-host must not be negative")
	case c.HostDiscoveryScript != "" && len(c.Hosts) > 0:
		return errors.New("--host-discovery-script and -H (or --hostfile) both name the hosts; pass one of them")
	case c.SlotsPerHost > 0 && c.HostDiscoveryScript == "":
		return errors.New("--slots-per-host gives the slots of the hosts that --host-discovery-script prints without any; with -H give every host's slots as HOST:SLOTS")
	case c.MaxNP > 0 && !c.elastic():
		return errors.New("--max-np applies to elastic jobs: pass --min-np and -H, or --host-discovery-script")
	case c.MaxNP > 0 && !c.driven():
		return errors.New("--max-np needs hosts for the job to grow on: pass -H (e.g. -H localhost:8) or --host-discovery-script")
	case c.MaxNP > 0 && c.MaxNP < c.NP:
		return fmt.Errorf("--max-np %d is less than -np %d, the ranks the job starts with; raise --max-np or lower -np", c.MaxNP, c.NP)
	case r != (CooldownRange{}) && (r.Min <= 0 || r.Max < r.Min):
		return fmt.Errorf("blacklist cooldown range %v to %v: want 0 < MIN <= MAX, e.g. --blacklist-cooldown-range 10 100", r.Min, r.Max)
	case r != (CooldownRange{}) && !c.driven():
		return errors.New("--blacklist-cooldown-range applies to elastic jobs on hosts: pass -H with --min-np (e.g. -H localhost:4), or --host-discovery-script")
	}
	return nil
}
