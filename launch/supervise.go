package launch

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// interruptibly runs start with a context that is cancelled when a signal
// arrives on sigs, and returns that signal (nil if none came) with start's
// error.
func interruptibly(ctx context.Context, sigs <-chan os.Signal, start func(context.Context) error) (os.Signal, error) {
	startCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var sig os.Signal
	stopWatch, watchDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watchDone)
		select {
		case sig = <-sigs:
			cancel()
		case <-stopWatch:
		}
	}()
	err := start(startCtx)
	close(stopWatch)
	<-watchDone
	return sig, err
}

// The states of a job that runs: supervise's, and the elastic driver's.
const (
	jobRunning = iota
	jobFailed
	jobInterrupted
	jobCancelled
)

// supervise waits for every rank to exit, stopping the job on the first
// failure, signal or ctx cancellation. See Run for the result.
func (j *job) supervise(ctx context.Context, sigs <-chan os.Signal) (int, error) {
	var (
		state   = jobRunning
		code    int
		resets  int              // elastic: failures the job went on from
		killC   <-chan time.Time // fires KillGrace after the job began stopping
		ctxDone = ctx.Done()
		daemonC = make(chan *daemonProc, len(j.daemons))
		quit    = make(chan struct{})
	)
	defer close(quit)
	for _, d := range j.daemons {
		go func() {
			select {
			case <-d.done:
				daemonC <- d
			case <-quit:
			}
		}()
	}
	stop := func(sig os.Signal) {
		j.signalAll(sig)
		killC = time.After(j.cfg.KillGrace)
	}
	for j.running > 0 {
		select {
		case e := <-j.exits:
			j.running--
			j.exited[e.rank] = true
			c, how := describeExit(e.state)
			if c == 0 || state != jobRunning {
				continue
			}
			msg := j.describeRank(e.rank, how)
			if min := j.cfg.MinNP; min > 0 {
				limit := j.cfg.ResetLimit
				switch {
				case j.running < min:
					msg += fmt.Sprintf("; %s left, fewer than --min-np %d", ranks(j.running), min)
				case limit > 0 && resets >= limit:
					msg += "; " + fmt.Sprintf(resetLimitMessage, limit)
				default:
					// Elastic: the others re-form the job without it.
					resets++
					j.o.logf("%s; the elastic job goes on with %s (--min-np %d; reset %d)", msg, ranks(j.running), min, resets)
					continue
				}
			}
			state, code = jobFailed, c
			if j.running > 0 {
				msg += fmt.Sprintf("; stopping the other %s", ranks(j.running))
			}
			j.o.logf("%s", msg)
			stop(syscall.SIGTERM)

		case sig := <-sigs:
			first := state == jobRunning
			if first {
				state, code = jobInterrupted, 128+signum(sig)
			}
			j.forwardSignal(sig, first, stop)

		case <-ctxDone:
			ctxDone = nil
			if state == jobRunning {
				state, code = jobCancelled, 128+int(syscall.SIGTERM)
				j.o.logf("%v; stopping %s", context.Cause(ctx), ranks(j.running))
				stop(syscall.SIGTERM)
			}

		case <-killC:
			killC = nil
			j.killAfterGrace()

		case d := <-daemonC:
			_, how := describeExit(d.cmd.ProcessState)
			j.o.logf("%s %s while the job was running; its last output:\n%s",
				d.describe(), how, d.tail.lines(10))
			if n := j.nodeOf(d); n != nil && j.cfg.MinNP > 0 && state == jobRunning {
				// Its host is lost to the elastic job: its ranks cannot
				// re-initialise without their daemon, so they stop (and
				// count as failed ranks); the other hosts go on.
				j.o.logf("stopping the ranks on %s, which lost their daemon", n.Host)
				j.signalRanks(n.Offset, n.Offset+n.Slots, syscall.SIGTERM)
			}
		}
	}
	j.closeStdins()
	j.drain()
	if state == jobCancelled {
		return code, fmt.Errorf("job stopped: %w", context.Cause(ctx))
	}
	return code, nil
}

// describeRank names rank in messages, with how it exited.
func (j *job) describeRank(rank int, how string) string {
	if h, ok := j.hosts[rank]; ok {
		return fmt.Sprintf("rank %d on %s (agent pid %d) %s", rank, h, j.workers[rank].Process.Pid, how)
	}
	return fmt.Sprintf("rank %d (pid %d) %s", rank, j.workers[rank].Process.Pid, how)
}

// forwardSignal forwards sig, received while the job runs: the first one
// (first: the job was running until now) goes to the ranks through stop,
// which also arms the kill grace; a SIGINT after it kills them; any other
// signal is passed on.
func (j *job) forwardSignal(sig os.Signal, first bool, stop func(os.Signal)) {
	switch {
	case first:
		hint := ""
		if sig == syscall.SIGINT {
			hint = " (Ctrl-C again to kill them now)"
		}
		j.o.logf("received %s; forwarding it to %s%s", signame(sig), ranks(j.running), hint)
		stop(sig)
	case sig == syscall.SIGINT:
		j.o.logf("received SIGINT again; killing %s", ranks(j.running))
		j.signalAll(syscall.SIGKILL)
	default:
		j.signalAll(sig)
	}
}

// killAfterGrace SIGKILLs the ranks still running once the kill grace
// after a stop is over.
func (j *job) killAfterGrace() {
	j.o.logf("%s still running %v after being asked to stop; sending SIGKILL", ranks(j.running), j.cfg.KillGrace)
	j.signalAll(syscall.SIGKILL)
}

// abort kills the ranks started so far and waits for them.
func (j *job) abort() {
	j.signalAll(syscall.SIGKILL)
	j.closeStdins()
	for ; j.running > 0; j.running-- {
		<-j.exits
	}
	j.drain()
}

// signalAll sends sig to every rank that has not been seen to exit. A rank
// that exited meanwhile is not an error: os.Process refuses to signal a
// reaped process, so a recycled pid is never hit.
//
// A rank on a remote host cannot be signalled: any signal but SIGKILL closes
// its agent's standard input, on which the remote wrapper sends the rank
// SIGTERM (and SIGKILL after the kill grace); SIGKILL kills the agent.
func (j *job) signalAll(sig os.Signal) { j.signalRanks(0, len(j.workers), sig) }

// signalRanks is signalAll for ranks [lo, hi).
func (j *job) signalRanks(lo, hi int, sig os.Signal) {
	for i := lo; i < hi && i < len(j.workers); i++ {
		cmd := j.workers[i]
		if j.exited[i] {
			continue
		}
		if i < len(j.stdins) && j.stdins[i] != nil && sig != syscall.SIGKILL {
			j.stdins[i].Close()
			continue
		}
		cmd.Process.Signal(sig)
	}
}

// nodeOf returns the node whose own daemon d is; nil for the shared daemon
// and the mpirun of --backend mpi.
func (j *job) nodeOf(d *daemonProc) *node {
	if j.shared() || j.cfg.Backend == "mpi" {
		return nil
	}
	for i, x := range j.daemons {
		if x == d && i < len(j.nodes) {
			return &j.nodes[i]
		}
	}
	return nil
}

// closeStdins closes what is left of the remote ranks' standard inputs.
func (j *job) closeStdins() {
	for _, f := range j.stdins {
		if f != nil {
			f.Close() // a second Close just fails
		}
	}
}

func ranks(n int) string {
	if n == 1 {
		return "1 rank"
	}
	return strconv.Itoa(n) + " ranks"
}
