package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hvdd/hvdd/backends/nccl"
	"github.com/hvdd/hvdd/daemon/internal/exec"
	"github.com/hvdd/hvdd/daemon/internal/exec/device"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/internal/loop"
	"github.com/hvdd/hvdd/daemon/internal/nodes"
	"github.com/hvdd/hvdd/daemon/internal/poll"
)

// Version is the daemon's version string.
const Version = loop.DaemonVersion

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("daemon: server closed")

// Server is one node's daemon. Create it with New and run it with Serve.
type Server struct {
	cfg     Config
	log     *slog.Logger
	uid     uint32
	quit    chan struct{} // closed by Close
	started chan struct{} // closed when Serve has started the loop (p is set)
	done    chan struct{} // closed when the loop has exited

	closeOnce sync.Once
	gpu       *device.GPUs // the GPUs opened; nil when CPU-only
	sampling  *gpuSampling // the GPU sampler's goroutine (gpusample.go); nil when none

	// mu guards the fields that follow.
	mu       sync.Mutex
	p        *poll.Poller
	l        *loop.Loop // set once Serve made it
	closed   bool
	ln       *net.UnixListener
	conns    int         // client connections open
	draining bool        // Shutdown was called (before Serve: Serve starts the drain)
	cause    error       // why the server stops, told to the clients
	idleExit *time.Timer // Config.IdleExit: armed while no client is connected
}

// New checks cfg and returns a Server that is not yet serving.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("daemon: invalid config: %w", err)
	}
	c := cfg.withDefaults()
	s := &Server{
		cfg:     c,
		log:     c.Logger,
		uid:     uint32(os.Getuid()),
		quit:    make(chan struct{}),
		started: make(chan struct{}),
		done:    make(chan struct{}),
		gpu:     device.OpenGPUs(c.GPU, nccl.NewEngines(c.NCCL), c.Logger, c.GPUAllreduce == GPUAllreduceHost),
	}
	s.gpu.OrderOnGPU(c.GPUCompletion == GPUCompletionStream)
	s.sampling = s.newGPUSampling()
	return s, nil
}

// Listen creates the daemon's socket at path: it makes the directory (0755 if
// missing), refuses to replace a socket some daemon still answers on, removes a
// stale one, and leaves the new socket at mode 0660.
func Listen(path string) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("daemon: socket directory: %w", err)
	}
	if _, err := os.Lstat(path); err == nil {
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("daemon: another daemon is already listening on %s (stop it, or pass a different --socket)", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("daemon: remove stale socket %s: %w", path, err)
		}
	}
	old := syscall.Umask(0o117)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("daemon: listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return nil, fmt.Errorf("daemon: chmod %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(true)
	return ln, nil
}

// Serve accepts clients on ln until ctx is done or Shutdown/Close is called. It
// always returns a non-nil error: ErrServerClosed after Shutdown or Close, the
// context's error after cancellation.
func (s *Server) Serve(ctx context.Context, ln *net.UnixListener) error {
	s.mu.Lock()
	if s.ln != nil {
		s.mu.Unlock()
		return errors.New("daemon: Serve called twice")
	}
	s.ln = ln
	if s.closed {
		// Close came first: it could not close ln.
		s.mu.Unlock()
		ln.Close()
		close(s.done)
		return ErrServerClosed
	}
	s.mu.Unlock()

	l, err := s.start()
	if err != nil {
		return err
	}
	unregister, err := l.RegisterMetrics()
	if err != nil {
		s.p.Close()
		return err
	}
	defer unregister()
	go func() {
		defer close(s.done)
		l.Run()
	}()
	close(s.started)
	if g := s.sampling; g != nil {
		go g.run(s.quit)
		defer g.wait(s.log)
	}
	go func() {
		select {
		case <-ctx.Done():
			s.mu.Lock()
			if s.cause == nil {
				s.cause = context.Cause(ctx)
			}
			s.mu.Unlock()
			s.Close()
		case <-s.quit:
		}
	}()
	if s.cfg.IdleExit > 0 {
		s.mu.Lock()
		s.idleExit = time.AfterFunc(s.cfg.IdleExit, s.idleTimeout)
		s.mu.Unlock()
	}
	s.log.Info("hvdd daemon listening", "socket", ln.Addr().String(), "slots", s.cfg.Slots,
		"fusion_threshold", s.cfg.FusionThreshold, "version", Version)

	err = s.accept(ln, l)
	s.Close()
	<-s.done
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// start makes the poller and the loop, telling the loop of a Close or a
// Shutdown that came before Serve.
func (s *Server) start() (*loop.Loop, error) {
	p, err := poll.NewPoller()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.p = p
	closed, draining := s.closed, s.draining
	s.mu.Unlock()
	if closed {
		p.Post(loop.MsgQuit{})
	}
	if draining {
		p.Post(loop.MsgDrain{})
	}
	l, err := s.newLoop(p)
	if err != nil {
		p.Close()
		return nil, err
	}
	s.mu.Lock()
	s.l = l
	s.mu.Unlock()
	return l, nil
}

// accept hands ln's connections to the loop until ln fails or the Server
// closes (ErrServerClosed).
func (s *Server) accept(ln *net.UnixListener, l *loop.Loop) error {
	for {
		uc, err := ln.AcceptUnix()
		if err != nil {
			select {
			case <-s.quit:
				return ErrServerClosed
			default:
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					continue
				}
				return fmt.Errorf("daemon: accept: %w", err)
			}
		}
		l.Accept(uc, s.admit)
	}
}

// Shutdown drains the server: it refuses new jobs (their ranks are told
// that the daemon is stopping), lets the running job run to its end (the
// last of its connections closing), then closes the server and returns nil.
// A forming job's remaining ranks are still taken, and so are the ranks of
// an elastic job that re-initialise into its next epoch. If ctx ends first,
// Shutdown closes the server now, its job's ranks are told context.Cause(ctx)
// as the reason (unless Serve's context gave one), and it returns ctx's
// error. Serve returns ErrServerClosed either way. Called before Serve,
// Shutdown makes Serve drain from the start; it returns at once.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.draining = true
	p := s.p
	s.mu.Unlock()
	if p == nil {
		return nil
	}
	p.Post(loop.MsgDrain{})
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	if s.cause == nil {
		s.cause = context.Cause(ctx)
	}
	s.mu.Unlock()
	s.Close()
	<-s.done
	return ctx.Err()
}

// Close stops the server now: the listener and every connection are closed, so
// clients see their pending operations fail.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		close(s.quit)
		s.mu.Lock()
		s.closed = true
		if s.ln != nil {
			s.ln.Close()
		}
		p := s.p
		s.mu.Unlock()
		if p != nil {
			// The loop closes every connection on its way out.
			p.Post(loop.MsgQuit{})
		}
	})
	return nil
}

// ShutdownNote is what clients are told when the server stops: its
// context's cause (cmd/hvdd names the signal), if it gave one.
func (s *Server) ShutdownNote() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cause == nil || errors.Is(s.cause, context.Canceled) || errors.Is(s.cause, context.DeadlineExceeded) {
		return "the hvdd daemon is shutting down"
	}
	return "the hvdd daemon is shutting down: " + s.cause.Error()
}

// admit counts a new client connection unless the Server is closing, and
// stops the idle exit's timer.
func (s *Server) admit() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns++
	if s.idleExit != nil {
		s.idleExit.Stop()
	}
	return true
}

// ConnClosed counts a client connection closed, and arms the idle exit's
// timer when it was the last.
func (s *Server) ConnClosed() {
	s.mu.Lock()
	s.conns--
	if s.conns == 0 && s.idleExit != nil && !s.closed {
		s.idleExit.Reset(s.cfg.IdleExit)
	}
	s.mu.Unlock()
}

// idleTimeout closes the server when Config.IdleExit has passed with no
// client connected (a client that came meanwhile stopped the timer, but may
// have raced its firing).
func (s *Server) idleTimeout() {
	s.mu.Lock()
	idle := s.conns == 0 && !s.closed
	s.mu.Unlock()
	if idle {
		s.log.Info("no client for the idle exit time; exiting", "idle_exit", s.cfg.IdleExit)
		s.Close()
	}
}

// newLoop wires the loop: its config, the executor, and the formation (on
// this node alone, or across nodes).
func (s *Server) newLoop(p *poll.Poller) (*loop.Loop, error) {
	c := s.cfg
	x := exec.New(exec.Config{Log: s.log, GPU: s.gpu, Workers: c.Workers}, p)
	formation := loop.OneNodeFormation(c.FusionThreshold)
	if c.multiNode() {
		formation = func(h job.LoopHooks) (job.Formation, error) {
			return nodes.New(h, p, nodes.Config{
				Nodes: c.Nodes, NodeRank: c.NodeRank, Advertise: c.Advertise, Rendezvous: c.Rendezvous,
				ExternalRendezvous: c.ExternalRendezvous, ElasticDriver: c.ElasticDriver, Secret: c.Secret, Control: c.Control, NewBackend: c.NewBackend,
				Elastic: c.Elastic, StartTimeout: c.StartTimeout, Heartbeat: c.Heartbeat, PeerTimeout: c.PeerTimeout,
				FusionThreshold: c.FusionThreshold,
				NCCLAcross:      c.GPUAllreduce == GPUAllreduceNCCL && s.gpu.CanNCCLAcross(),
				NCCLUniqueID:    s.gpu.NCCLUniqueID,
			}, s.log)
		}
	}
	return loop.New(loop.Config{
		Slots: c.Slots, FusionThreshold: c.FusionThreshold, CycleTime: c.CycleTime, Spin: c.Spin,
		StallCheck: c.StallCheck, StallShutdown: c.StallShutdown, OutputRegion: c.OutputRegion,
		Nodes: c.Nodes, NodeRank: c.NodeRank, MultiNode: c.multiNode(), ElasticTimeout: c.reformTimeout(),
		ExitAfterJob: c.ExitAfterJob, Autotune: c.Autotune, OnStatus: c.OnStatus, Metrics: c.Metrics,
		AllowGIDs: c.AllowGIDs, Log: s.log, UID: s.uid, GPUs: s.gpu,
	}, s, p, x, formation)
}

// Probe asks the event loop what the daemon is doing and returns its
// answer. The question travels the way every event reaches the loop (a
// message posted through its eventfd, the path of new connections, the
// executor's completions and timers), and the loop answers it between two
// passes over its events, so an answer proves that the loop still turns: a
// loop stuck in a system call, a lock or an endless pass answers nothing,
// and Probe returns ctx's error. It returns ErrServerClosed once the loop
// has exited; called before Serve, it waits for Serve to start the loop.
// Safe from any goroutine.
func (s *Server) Probe(ctx context.Context) (loop.Status, error) {
	select {
	case <-s.started:
	case <-s.done:
		return loop.Status{}, ErrServerClosed
	case <-ctx.Done():
		return loop.Status{}, fmt.Errorf("daemon: not serving yet: %w", context.Cause(ctx))
	}
	s.mu.Lock()
	l := s.l
	s.mu.Unlock()
	st, err := l.Probe(ctx)
	if errors.Is(err, loop.ErrLoopDone) {
		return loop.Status{}, ErrServerClosed
	}
	return st, err
}

// SettleGPUs waits until the driver calls the device path has queued off
// the loop so far (closing IPC handles released, freeing device memory)
// have run, so that the counts in the metrics are final. A no-op on a
// CPU-only node.
func (s *Server) SettleGPUs() { s.gpu.Settle() }
