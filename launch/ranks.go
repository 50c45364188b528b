package launch

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// How long output may lag behind the process that wrote it. A rank's
// stdout and stderr normally reach EOF as it exits, but a child it left
// behind can hold them open.
const (
	// exitOutputWait bounds how long a rank's exit report waits for the
	// rank's output to end, so that a failure message follows the rank's
	// last lines (its traceback) without being held up by an orphan.
	exitOutputWait = 250 * time.Millisecond
	// drainWait bounds how long Run waits, once every rank has exited, for
	// output still coming from their orphans before it closes the pipes.
	drainWait = time.Second
)

type exitEvent struct {
	rank  int
	state *os.ProcessState // nil if Wait failed before the process was reaped
}

// startRanks starts every rank, node by node, with path as the command of
// the ranks on this machine. If one cannot be started, it kills those
// already started and returns the run's exit code and error.
func (j *job) startRanks(path string) (int, error) {
	j.exits = make(chan exitEvent, j.cfg.NP)
	for i, n := range j.nodes {
		for lr := range n.Slots {
			if err := j.startRank(path, i, lr); err != nil {
				j.abort()
				where := ""
				if !n.Shared {
					where = " on " + n.Host
				}
				return rankStartFailed(err), fmt.Errorf("start rank %d%s: %w; check that the command exists and is executable", n.Offset+lr, where, err)
			}
		}
	}
	return 0, nil
}

// startRank starts local rank lr of node i: directly on this machine, else
// through the agent.
func (j *job) startRank(path string, i, lr int) error {
	return j.startRankAs(path, i, j.nodes[i].Offset+lr, j.rankEnv(i, lr))
}

// startRankAs starts a rank on node i whose output is tagged with rank
// (the next tag: len(j.workers)), with the rank variables rankEnv.
func (j *job) startRankAs(path string, i, rank int, rankEnv []string) error {
	n, cfg := j.nodes[i], j.cfg
	if cfg.driven() {
		// The daemons name the workers of each forming epoch by it to
		// the elastic driver (its tag: unique in the job).
		rankEnv = append(rankEnv, workerEnv+"="+strconv.Itoa(rank))
	}
	if !n.Local {
		return j.startRemoteRank(i, rank, rankEnv)
	}
	cmd := exec.Command(path, cfg.Command[1:]...)
	cmd.Args[0] = cfg.Command[0]
	cmd.Dir = cfg.Dir
	// Our environment, then cfg.Env, then the rank variables (os/exec keeps
	// the last of duplicate names). A job with daemons of its own hands its
	// secret to them alone.
	env := os.Environ()
	if !n.Shared {
		env = environ()
	}
	cmd.Env = append(append(env, cfg.Env...), rankEnv...)
	if rank == 0 {
		cmd.Stdin = cfg.Stdin
	}
	// Ranks stay in our process group, so a terminal's Ctrl-C reaches them
	// directly; they also get SIGTERM if hvdd run itself is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	return j.startCmd(cmd, rank, nil)
}

// startRemoteRank starts a rank on node i, a remote host, through the
// agent; see startRankAs.
func (j *job) startRemoteRank(i, rank int, rankEnv []string) error {
	n := j.nodes[i]
	cmd := j.agent(n.Host, j.workerScript(rankEnv))
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

// rankEnv is the rank variables of local rank lr on node i. HVDD_CROSS_RANK
// and HVDD_CROSS_SIZE are set only on nodes with a daemon of their own (a
// job across hosts); HOROVOD_CROSS_* always.
func (j *job) rankEnv(i, lr int) []string {
	n := j.nodes[i]
	cr, cs := crossRank(j.nodes, i, lr)
	return j.rankVars(i, slotInfo{n.Offset + lr, j.size, lr, n.Slots, cr, cs}, strconv.Itoa(lr))
}

// rankVars is the rank variables of a rank on node i at slot s, torch's
// among them (torchVars); requestLR is its HVDD_LOCAL_RANK, the local rank
// its client asks the daemon for ("-1": any).
func (j *job) rankVars(i int, s slotInfo, requestLR string) []string {
	n := j.nodes[i]
	r, size := strconv.Itoa(s.rank), strconv.Itoa(s.size)
	l, ls := strconv.Itoa(s.local), strconv.Itoa(s.localSize)
	c, csz := strconv.Itoa(s.cross), strconv.Itoa(s.crossSize)
	env := []string{
		"HVDD_SOCKET=" + n.Socket,
		"HVDD_RANK=" + r, "HVDD_SIZE=" + size,
		"HVDD_LOCAL_RANK=" + requestLR, "HVDD_LOCAL_SIZE=" + ls,
	}
	if j.cfg.JobName != "" {
		env = append(env, "HVDD_JOB="+j.cfg.JobName)
	}
	if !n.Shared {
		env = append(env, "HVDD_CROSS_RANK="+c, "HVDD_CROSS_SIZE="+csz)
	}
	if j.cfg.elastic() {
		env = append(env, "HOROVOD_ELASTIC=1")
		if t := j.cfg.ElasticTimeout; t > 0 {
			// How long a rank that joins the running job waits in init.
			env = append(env, "HOROVOD_ELASTIC_TIMEOUT="+strconv.FormatFloat(t.Seconds(), 'f', -1, 64))
		}
	}
	env = append(env,
		"HOROVOD_RANK="+r, "HOROVOD_SIZE="+size,
		"HOROVOD_LOCAL_RANK="+l, "HOROVOD_LOCAL_SIZE="+ls,
		"HOROVOD_CROSS_RANK="+c, "HOROVOD_CROSS_SIZE="+csz,
	)
	return append(env, j.torchVars(i, s)...)
}

// workerEnv names a worker of a job the elastic driver runs (Hello.worker).
const workerEnv = "HVDD_WORKER"

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

// A pump copies one rank's stdout or stderr from a pipe to the job's
// output. Run makes the pipes itself rather than letting os/exec do it, so
// that a rank's exit is seen when the rank exits, not when the last process
// holding its pipe does.
type pump struct {
	r, w  *os.File // w is the child's end; closed in our process once started
	sink  io.Writer
	flush func()   // writes out a final partial line; nil for raw output
	file  *os.File // the --output-filename file, closed at the end; or nil
	done  chan struct{}
}

func (p *pump) run() {
	defer close(p.done)
	io.Copy(p.sink, p.r) // ends at EOF, or when drain closes r
	if p.flush != nil {
		p.flush()
	}
	if p.file != nil {
		p.file.Close()
	}
}

// waitPumps waits up to d for every pump in ps to finish, and reports
// whether they all did.
func waitPumps(ps []*pump, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for _, p := range ps {
		select {
		case <-p.done:
		case <-t.C:
			return false
		}
	}
	return true
}

// startCmd starts cmd as rank, with its output tagged, and a goroutine that
// reports its exit on j.exits. stdin, if non-nil, is the write end of the
// pipe cmd reads (a rank started through the agent); the job closes it to
// stop the rank.
func (j *job) startCmd(cmd *exec.Cmd, rank int, stdin *os.File) error {
	cfg := j.cfg
	var pumps []*pump
	started := false
	defer func() {
		for _, p := range pumps {
			p.w.Close() // the child has its copy
			if !started {
				p.r.Close()
				if p.file != nil {
					p.file.Close()
				}
			}
		}
	}()
	connect := func(dst io.Writer, stream string) (io.Writer, error) {
		var p pump
		if cfg.OutputFilename != "" {
			f, err := openRankOutput(cfg, rank, stream)
			if err != nil {
				return nil, err
			}
			p.file = f
		}
		switch f, ok := dst.(*os.File); {
		case cfg.NoTagOutput && ok && p.file == nil:
			return f, nil // the rank shares our descriptor, and sees a terminal if it is one
		case cfg.NoTagOutput && p.file != nil:
			p.sink = io.MultiWriter(lockedWriter{j.o, dst}, p.file)
		case cfg.NoTagOutput:
			p.sink = lockedWriter{j.o, dst}
		default:
			lw := newLineWriter(j.o, dst, "["+strconv.Itoa(rank)+"]<"+stream+">:", maxLine)
			lw.stamp = cfg.PrefixTimestamp
			if p.file != nil {
				lw.file = p.file
			}
			p.sink, p.flush = lw, func() { lw.Flush() }
		}
		var err error
		if p.r, p.w, err = os.Pipe(); err != nil {
			if p.file != nil {
				p.file.Close()
			}
			return nil, err
		}
		p.done = make(chan struct{})
		pumps = append(pumps, &p)
		return p.w, nil
	}
	var err error
	if cmd.Stdout, err = connect(cfg.Stdout, "stdout"); err != nil {
		return err
	}
	if cmd.Stderr, err = connect(cfg.Stderr, "stderr"); err != nil {
		return err
	}
	// Don't wait forever to copy a Stdin that is not an *os.File.
	cmd.WaitDelay = time.Second
	j.o.verbosef("starting rank %d: %s", rank, strings.Join(cmd.Args, " "))
	if err := cmd.Start(); err != nil {
		return err
	}
	started = true
	for _, p := range pumps {
		go p.run()
	}
	j.pumps = append(j.pumps, pumps...)
	j.workers = append(j.workers, cmd)
	j.exited = append(j.exited, false)
	if stdin != nil {
		for len(j.stdins) < rank {
			j.stdins = append(j.stdins, nil)
		}
		j.stdins = append(j.stdins, stdin)
	}
	j.running++
	go func() {
		cmd.Wait()
		waitPumps(pumps, exitOutputWait)
		j.exits <- exitEvent{rank: rank, state: cmd.ProcessState}
	}()
	return nil
}

// drain waits up to drainWait for the ranks' output to end, then closes the
// pipes (a process still writing to one gets EPIPE) and waits for the pumps
// to flush.
func (j *job) drain() {
	if !waitPumps(j.pumps, drainWait) {
		j.o.logf("output pipes still open %v after the last rank exited (a rank left a child process running?); closing them", drainWait)
	}
	for _, p := range j.pumps {
		p.r.Close()
		<-p.done
	}
}

// openRankOutput creates (or truncates) rank's stream file under
// cfg.OutputFilename, as horovodrun's gloo_run does:
// OutputFilename/rank.N/stdout, N zero-padded to the width of NP-1 so that
// the directories sort in rank order (ranks an elastic job adds beyond NP
// may be wider).
func openRankOutput(cfg *Config, rank int, stream string) (*os.File, error) {
	width := len(strconv.Itoa(max(cfg.NP-1, 0)))
	dir := filepath.Join(cfg.OutputFilename, fmt.Sprintf("rank.%0*d", width, rank))
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("create the output directory of rank %d: %w", rank, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, stream), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create the %s file of rank %d: %w", stream, rank, err)
	}
	return f, nil
}

// makeOutputDir creates cfg.OutputFilename (with its parents), where the
// ranks' output files go.
func makeOutputDir(cfg *Config) error {
	if cfg.OutputFilename == "" {
		return nil
	}
	if err := os.MkdirAll(cfg.OutputFilename, 0o755); err != nil {
		return fmt.Errorf("create the --output-filename directory: %w; pass a directory you can write to", err)
	}
	return nil
}
