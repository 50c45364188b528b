package launch

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hvdd/hvdd/auth"
)

// A job across hosts (Config.Hosts naming more than this machine):
//
//   - Every host gets one daemon, `hvdd serve --slots S --nodes H --node-rank
//     I --rendezvous HOST0:PORT --advertise HOST --socket /tmp/hvdd-run-JOB-I/
//     hvdd.sock --secret-file /dev/stdin`, and a fresh random secret for the
//     job on its standard input (never on a command line). Node 0
//     coordinates and serves the rendezvous.
//   - Hosts that are this machine (isLocalHost) get their daemon and ranks
//     as child processes; the others through the agent (ssh), one agent
//     process per daemon and per rank, each running one sh command line.
//   - The remote command line runs the daemon or rank in the background and
//     watches its own standard input: when that closes (hvdd run closed it,
//     exited, or the agent died), the watcher sends the process SIGTERM,
//     then SIGKILL after the kill grace. So hvdd run stops a remote process
//     by closing the agent's stdin, needing no tty (ssh -tt) and no remote
//     pid; a signal forwarded to the job reaches remote ranks as SIGTERM.
//   - A remote daemon is ready when its wrapper sees the socket appear and
//     prints a marker line, which hvdd run takes out of the daemon's output;
//     a local one when its socket accepts a connection.

// DefaultRendezvousPort is node 0's rendezvous port when node 0 is another
// machine and --rendezvous-port is not given.
const DefaultRendezvousPort = 29500

// secretEnv is the daemon's environment variable for the secret; it must not
// reach a daemon given --secret-file (hvdd serve refuses both).
const secretEnv = "HVDD_SECRET"

func (c *Config) validateHosts() error {
	if _, err := layout(c.Hosts, c.NP); err != nil {
		return err
	}
	switch c.Backend {
	case "", "tcp", "mpi":
	default:
		return fmt.Errorf("unknown --backend %q; pass tcp or mpi", c.Backend)
	}
	if c.RendezvousPort < 0 || c.RendezvousPort > 65535 {
		return fmt.Errorf("--rendezvous-port %d is not a TCP port (1-65535; 0 picks one)", c.RendezvousPort)
	}
	if c.SSHPort < 0 || c.SSHPort > 65535 {
		return fmt.Errorf("--ssh-port %d is not a TCP port (1-65535)", c.SSHPort)
	}
	if c.Agent != "" && len(strings.Fields(c.Agent)) == 0 {
		return errors.New("--agent is blank; pass a command such as 'ssh -o BatchMode=yes'")
	}
	return nil
}

// multiJob is what the ranks and daemons of one job across hosts share.
type multiJob struct {
	cfg        *Config
	nodes      []node
	id         string // random, names the sockets' directories
	secret     string // hex, handed to every daemon on its stdin
	rendezvous string // node 0's HOST:PORT
	grace      int    // the remote wrappers' kill grace, in whole seconds
	remoteHvdd string
	cwd        string
}

func (m *multiJob) socket(i int) string {
	return fmt.Sprintf("/tmp/hvdd-run-%s-%d/hvdd.sock", m.id, i)
}

// runMulti is Run for a job on several hosts (or on one remote host).
func runMulti(ctx context.Context, cfg *Config, nodes []node) (int, error) {
	if cfg.HvddPath == "" {
		return exitUsage, errors.New("no hvdd binary to start the daemons with (Config.HvddPath is empty)")
	}
	m := &multiJob{cfg: cfg, nodes: nodes, remoteHvdd: cfg.RemoteHvddPath, cwd: cfg.Dir}
	if m.remoteHvdd == "" {
		m.remoteHvdd = cfg.HvddPath
	}
	if m.cwd == "" {
		wd, err := os.Getwd()
		if err != nil {
			return exitLaunchFailed, fmt.Errorf("find the working directory for remote ranks: %w", err)
		}
		m.cwd = wd
	}
	m.grace = int((cfg.KillGrace + time.Second - 1) / time.Second)
	var path string
	remote := false
	for _, n := range nodes {
		remote = remote || !n.Local
	}
	for _, n := range nodes {
		if n.Local && path == "" {
			p, code, err := lookCommand(cfg)
			if err != nil {
				return code, err
			}
			path = p
		}
	}
	o := &output{stdout: cfg.Stdout, stderr: cfg.Stderr}
	for _, n := range nodes {
		if ip := net.ParseIP(n.Host); remote && (strings.EqualFold(n.Host, "localhost") || ip != nil && ip.IsLoopback()) {
			o.logf("warning: host %s is a loopback address, which the other hosts cannot reach; name it by an address they can", n.Host)
		}
	}

	m.secret = hex.EncodeToString(auth.NewSecret())
	var id [6]byte
	rand.Read(id[:]) // the job id is not secret: it only names the sockets
	m.id = hex.EncodeToString(id[:])
	port := cfg.RendezvousPort
	if port == 0 {
		port = DefaultRendezvousPort
		if nodes[0].Local {
			p, err := freePort(nodes[0].Host)
			if err != nil {
				return exitLaunchFailed, fmt.Errorf("find a free rendezvous port on %s: %w; pass --rendezvous-port", nodes[0].Host, err)
			}
			port = p
		}
	}
	m.rendezvous = net.JoinHostPort(nodes[0].Host, strconv.Itoa(port))

	sigs := cfg.Signals
	if sigs == nil {
		ch := make(chan os.Signal, 8)
		signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
		defer signal.Stop(ch)
		sigs = ch
	}

	ds, sig, err := m.startDaemonsInterruptibly(ctx, o, sigs)
	defer m.stopDaemons(ds)
	if code, err := startFailed(ctx, sig, err, "the hvdd daemons"); err != nil {
		return code, err
	}

	j := &job{cfg: cfg, o: o, exits: make(chan exitEvent, cfg.NP), daemons: ds}
	for i, n := range nodes {
		for lr := range n.Slots {
			rank := n.Offset + lr
			if err := m.startRank(j, path, i, lr); err != nil {
				j.abort()
				code := exitLaunchFailed
				switch {
				case errors.Is(err, fs.ErrNotExist):
					code = exitNotFound
				case errors.Is(err, fs.ErrPermission):
					code = exitNotRunnable
				}
				return code, fmt.Errorf("start rank %d on %s: %w; check that the command exists and is executable", rank, n.Host, err)
			}
		}
	}
	return j.supervise(ctx, sigs)
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

// environ is our environment without the job secret's variable.
func environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, secretEnv+"=") {
			env = append(env, kv)
		}
	}
	return env
}

// rankEnv is the rank variables of local rank lr on node i.
func (m *multiJob) rankEnv(i, lr int) []string {
	n := m.nodes[i]
	cr, cs := crossRank(m.nodes, i, lr)
	r, size := strconv.Itoa(n.Offset+lr), strconv.Itoa(m.cfg.NP)
	l, ls := strconv.Itoa(lr), strconv.Itoa(n.Slots)
	c, csz := strconv.Itoa(cr), strconv.Itoa(cs)
	return []string{
		"HVDD_SOCKET=" + m.socket(i),
		"HVDD_RANK=" + r, "HVDD_SIZE=" + size,
		"HVDD_LOCAL_RANK=" + l, "HVDD_LOCAL_SIZE=" + ls,
		"HVDD_CROSS_RANK=" + c, "HVDD_CROSS_SIZE=" + csz,
		"HOROVOD_RANK=" + r, "HOROVOD_SIZE=" + size,
		"HOROVOD_LOCAL_RANK=" + l, "HOROVOD_LOCAL_SIZE=" + ls,
		"HOROVOD_CROSS_RANK=" + c, "HOROVOD_CROSS_SIZE=" + csz,
	}
}

// agentArgv is the command that reaches a remote host, before the host and
// its command line: --agent's words, else ssh with --ssh-port and
// --ssh-identity-file.
func (m *multiJob) agentArgv() []string {
	if m.cfg.Agent != "" {
		return strings.Fields(m.cfg.Agent)
	}
	argv := append([]string(nil), sshCommand...)
	if m.cfg.SSHPort != 0 {
		argv = append(argv, "-p", strconv.Itoa(m.cfg.SSHPort))
	}
	if m.cfg.SSHIdentityFile != "" {
		argv = append(argv, "-i", m.cfg.SSHIdentityFile)
	}
	return argv
}

// agent returns the command that runs script on host.
func (m *multiJob) agent(host, script string) *exec.Cmd {
	// The remote login shell may not be sh; it gets one quoted word for sh.
	argv := append(m.agentArgv(), host, "sh -c "+shellQuote(script))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = environ()
	return cmd
}

// agentString is agentArgv as one line, for messages and mpirun's
// plm_rsh_agent.
func (m *multiJob) agentString() string { return strings.Join(m.agentArgv(), " ") }

// sshCommand reaches remote hosts when no agent is given: never a password
// prompt (BatchMode), and, as horovodrun's ssh does, a host not yet in
// known_hosts is taken (accept-new records its key; unlike horovodrun's
// StrictHostKeyChecking=no, a changed key is still refused).
var sshCommand = []string{"ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new"}

// watch wraps the sh command line cmd (which must not read its stdin): it
// runs in the background, and when our stdin ends it gets SIGTERM, then
// SIGKILL after the grace. The wrapper exits with cmd's status. pre runs
// first, with stdin still ours; post runs after cmd, before the exit.
func (m *multiJob) watch(pre, cmd, whileRunning, post string) string {
	g := strconv.Itoa(max(m.grace, 1))
	s := pre + "exec 3<&0; " +
		cmd + " 3<&- & p=$!; " +
		"( cat <&3 >/dev/null 2>&1; exec 3<&-; kill -TERM $p; sleep " + g + "; kill -KILL $p ) >/dev/null 2>&1 & w=$!; " +
		"exec 3<&-; " + whileRunning +
		"wait $p; r=$?; kill $w 2>/dev/null; " + post + "exit $r"
	return s
}

// workerScript is the remote command line of local rank lr on node i.
func (m *multiJob) workerScript(i, lr int) string {
	env := append(append([]string{}, m.cfg.Env...), m.rankEnv(i, lr)...)
	cmd := "( cd " + shellQuote(m.cwd) + " && exec env " + shellJoin(env) + " " + shellJoin(m.cfg.Command) + " )"
	return m.watch("", cmd, "", "")
}

// startRank starts local rank lr of node i.
func (m *multiJob) startRank(j *job, path string, i, lr int) error {
	n, cfg := m.nodes[i], m.cfg
	rank := n.Offset + lr
	if n.Local {
		cmd := exec.Command(path, cfg.Command[1:]...)
		cmd.Args[0] = cfg.Command[0]
		cmd.Dir = cfg.Dir
		cmd.Env = append(append(environ(), cfg.Env...), m.rankEnv(i, lr)...)
		if rank == 0 {
			cmd.Stdin = cfg.Stdin
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
		return j.startCmd(cmd, rank, nil)
	}
	cmd := m.agent(n.Host, m.workerScript(i, lr))
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.Stdin = r
	// The agent stays in our process group, as local ranks do.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	err = j.startCmd(cmd, rank, w)
	r.Close()
	if err != nil {
		w.Close()
		return err
	}
	if j.hosts == nil {
		j.hosts = map[int]string{}
	}
	j.hosts[rank] = n.Host
	return nil
}

// daemonArgs is node i's `hvdd serve` command line after the program name.
func (m *multiJob) daemonArgs(i int) []string {
	n := m.nodes[i]
	args := []string{"serve", "--slots", strconv.Itoa(n.Slots), "--nodes", strconv.Itoa(len(m.nodes)),
		"--node-rank", strconv.Itoa(i), "--rendezvous", m.rendezvous, "--advertise", n.Host,
		"--socket", m.socket(i), "--log-level", daemonLogLevel(), "--secret-file", "/dev/stdin"}
	if m.cfg.Backend != "" {
		args = append(args, "--backend", m.cfg.Backend)
	}
	return args
}

// daemonLogLevel is $HOROVOD_LOG_LEVEL when set, else warning: the daemons a
// job starts speak up only when something is wrong.
func daemonLogLevel() string {
	if v := os.Getenv("HOROVOD_LOG_LEVEL"); v != "" {
		return v
	}
	return "warning"
}

func (m *multiJob) readyMarker(i int) string {
	return "hvdd-run-daemon-ready " + m.id + " " + strconv.Itoa(i)
}

// daemonScript is node i's remote command line: it reads the secret from
// its stdin, starts the daemon with the secret on the daemon's stdin, and
// prints the ready marker once the daemon's socket exists (the daemon binds
// and listens in one step, in a directory made fresh for the job).
func (m *multiJob) daemonScript(i int) string {
	sock := shellQuote(m.socket(i))
	dir := shellQuote(filepath.Dir(m.socket(i)))
	pre := "IFS= read -r s || exit 1; mkdir -m 700 " + dir + " || exit 1; "
	cmd := `printf '%s\n' "$s" | ` + shellJoin(append([]string{m.remoteHvdd}, m.daemonArgs(i)...))
	wait := "s=; while kill -0 $p 2>/dev/null && ! test -S " + sock + "; do sleep 0.05 2>/dev/null || sleep 1; done; " +
		"test -S " + sock + " && echo " + shellQuote(m.readyMarker(i)) + "; "
	return m.watch(pre, cmd, wait, "rm -rf "+dir+"; ")
}

// startDaemon starts node i's daemon.
func (m *multiJob) startDaemon(o *output, i int) (*daemonProc, error) {
	n := m.nodes[i]
	d := &daemonProc{tail: &tailBuffer{max: 8 << 10}, done: make(chan struct{}), host: n.Host, ready: make(chan struct{})}
	out := newLineWriter(o, o.stderr, "[hvdd "+n.Host+"] ", maxLine)
	out.tail = d.tail
	var stdout *lineWriter
	var stdinR *os.File
	if n.Local {
		dir := filepath.Dir(m.socket(i))
		if err := os.Mkdir(dir, 0o700); err != nil {
			return nil, fmt.Errorf("create the daemon's socket directory: %w", err)
		}
		d.cmd = exec.Command(m.cfg.HvddPath, m.daemonArgs(i)...)
		d.cmd.Env = environ()
		d.cmd.Stdout = out
		// Its own process group, as on the single-node path.
		d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		// 65 bytes fit in any pipe buffer: write and close before the start.
		w.WriteString(m.secret + "\n")
		w.Close()
		stdinR = r
	} else {
		d.cmd = m.agent(n.Host, m.daemonScript(i))
		marker := []byte(m.readyMarker(i))
		var once sync.Once
		stdout = newLineWriter(o, o.stderr, "[hvdd "+n.Host+"] ", maxLine)
		stdout.tail = d.tail
		stdout.drop = func(line []byte) bool {
			if bytes.Equal(bytes.TrimRight(line, "\r\n"), marker) {
				once.Do(func() { close(d.ready) })
				return true
			}
			return false
		}
		d.cmd.Stdout = stdout
		d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		w.WriteString(m.secret + "\n") // the wrapper reads it; then w stays open
		d.stdin, stdinR = w, r
		d.remoteGrace = time.Duration(max(m.grace, 1)) * time.Second
	}
	d.cmd.Stderr = out
	d.cmd.Stdin = stdinR
	d.cmd.WaitDelay = time.Second
	err := d.cmd.Start()
	stdinR.Close()
	if err != nil {
		if d.stdin != nil {
			d.stdin.Close()
		}
		if n.Local {
			os.RemoveAll(filepath.Dir(m.socket(i)))
		}
		if n.Local {
			return nil, fmt.Errorf("start the hvdd daemon for %s (%s): %w; pass the hvdd binary's path", n.Host, m.cfg.HvddPath, err)
		}
		return nil, fmt.Errorf("start the agent for %s (%s): %w; install ssh or pass --agent", n.Host, m.agentString(), err)
	}
	go func() {
		d.cmd.Wait()
		out.Flush()
		if stdout != nil {
			stdout.Flush()
		}
		close(d.done)
	}()
	return d, nil
}

// waitReady waits until node i's daemon is ready, or fails saying why.
func (m *multiJob) waitReady(ctx context.Context, d *daemonProc, i int, deadline time.Time) error {
	n := m.nodes[i]
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	where := "on " + n.Host
	hint := fmt.Sprintf("check that '%s %s true' works without a password and that hvdd is at %s there (--hvdd-path)", m.agentString(), n.Host, m.remoteHvdd)
	if n.Local {
		where = "for " + n.Host + " on this machine"
		hint = "fix what it reports"
	}
	for delay := pollMin; ; delay = min(2*delay, pollMax) {
		if n.Local && probe(m.socket(i)) == nil {
			return nil
		}
		poll := time.After(delay)
		if !n.Local {
			poll = nil
		}
		select {
		case <-d.ready:
			return nil
		case <-d.done:
			_, how := describeExit(d.cmd.ProcessState)
			return fmt.Errorf("the hvdd daemon %s %s before it was ready; its last output:\n%s\n%s",
				where, how, d.tail.lines(10), hint)
		case <-ctx.Done():
			return fmt.Errorf("waiting for the hvdd daemon %s to start: %w", where, context.Cause(ctx))
		case <-timeout.C:
			return fmt.Errorf("the hvdd daemon %s was not ready within %v, so the job was stopped; its last output:\n%s\n%s, or raise --start-timeout",
				where, m.cfg.StartTimeout, d.tail.lines(10), hint)
		case <-poll:
		}
	}
}

// startDaemonsInterruptibly starts every node's daemon and waits until all
// are ready, giving up when a signal arrives (returned) or one fails. The
// daemons it returns are started, ready or not, and must be stopped.
func (m *multiJob) startDaemonsInterruptibly(ctx context.Context, o *output, sigs <-chan os.Signal) ([]*daemonProc, os.Signal, error) {
	var ds []*daemonProc
	sig, err := interruptibly(ctx, sigs, func(ctx context.Context) (err error) {
		if m.cfg.Backend == "mpi" {
			ds, err = m.startMPIDaemons(ctx, o)
		} else {
			ds, err = m.startDaemons(ctx, o)
		}
		return err
	})
	return ds, sig, err
}

func (m *multiJob) startDaemons(ctx context.Context, o *output) ([]*daemonProc, error) {
	deadline := time.Now().Add(m.cfg.StartTimeout)
	var ds []*daemonProc
	for i := range m.nodes {
		d, err := m.startDaemon(o, i)
		if err != nil {
			return ds, err
		}
		ds = append(ds, d)
	}
	// They all start at once; wait for each in turn, the first failure
	// (or the deadline) ends the wait.
	errs := make(chan error, len(ds))
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i, d := range ds {
		go func() { errs <- m.waitReady(waitCtx, d, i, deadline) }()
	}
	var first error
	for range ds {
		if err := <-errs; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	return ds, first
}

// stopDaemons stops the daemons (all at once) and removes the local sockets'
// directories.
func (m *multiJob) stopDaemons(ds []*daemonProc) {
	var wg sync.WaitGroup
	for _, d := range ds {
		wg.Go(func() { d.stop(m.cfg.KillGrace) })
	}
	wg.Wait()
	for i, n := range m.nodes {
		if n.Local && i < len(ds) {
			os.RemoveAll(filepath.Dir(m.socket(i)))
		}
	}
}
