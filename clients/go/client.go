// Package hvdd is the Go client of the hvdd daemon: Horovod's collectives
// (allreduce, allgather, broadcast, alltoall, reducescatter, barrier, join) on
// typed Go slices, run by the node's daemon over shared memory.
//
// A process connects with Init, learns its place in the job from Rank, Size and
// friends, and calls the collectives. Every collective exists in a blocking form
// and an asynchronous one returning a handle to Wait on or Poll. Slices made by
// Alloc live in shared memory and are handed to the daemon without a copy;
// other slices are staged through the client's shared-memory arena.
//
// The client holds no collective logic: names, dtypes and shapes go to the
// daemon, which matches them across ranks and reports disagreements as errors.
package hvdd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hvdd/hvdd/ipc"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/shm"
)

// Client is a connection to the local hvdd daemon. The zero value is ready for
// Init; set fields before calling it. A Client is safe for concurrent use once
// initialised.
type Client struct {
	// Socket is the daemon's socket path. Empty means $HVDD_SOCKET, else the
	// default path (/run/hvdd/hvdd.sock for root, $XDG_RUNTIME_DIR/hvdd.sock).
	Socket string

	// RequestedLocalRank asks for a local rank. Nil means $HVDD_LOCAL_RANK,
	// $OMPI_COMM_WORLD_LOCAL_RANK or $SLURM_LOCALID, else any free rank.
	RequestedLocalRank *int

	// Job names the job this process belongs to: the daemon runs several
	// jobs at once, and processes of one uid that give the same name form
	// one. Empty means $HVDD_JOB (hvdd run --job), else the launcher's job
	// id (Open MPI's, SLURM's job.step), else the unnamed job.
	Job string

	// JobLocalSize is the job's number of processes on this node, which
	// its hello tells the daemon (LocalSize reports it once the job has
	// formed). Zero means $HVDD_LOCAL_SIZE, else $OMPI_COMM_WORLD_LOCAL_SIZE
	// or $MPI_LOCALNRANKS, else the daemon's --slots.
	JobLocalSize int

	// ArenaSize is the size of each shared-memory staging region. Zero means
	// 256 MiB (memfd pages cost nothing until touched); larger requests get a
	// region of their own size.
	ArenaSize int64

	// Spin is how long a waiting goroutine polls for the daemon's answers
	// before sleeping in the kernel. Zero means $HVDD_SPIN_US microseconds,
	// else 50 µs; negative never spins.
	Spin time.Duration

	// NoChannel keeps every message on the socket instead of the
	// shared-memory channel (ipc.Channel), which saves the system calls of
	// a busy job. $HVDD_CHANNEL=0 does the same.
	NoChannel bool

	// RingSize is the size of each of the channel's two rings, a power of
	// two from 4 KiB to 16 MiB. Zero means $HVDD_RING_BYTES, else 128 KiB.
	RingSize int

	// StartTimeout bounds Init when ctx has no deadline: connecting while the
	// daemon starts and waiting for every rank to arrive. Zero means
	// $HVDD_START_TIMEOUT seconds, else 120 s; in an elastic job (whose
	// workers may wait to join a running job until its next commit)
	// $HOROVOD_ELASTIC_TIMEOUT seconds, else 600 s (Horovod's default).
	StartTimeout time.Duration

	// Elastic joins an elastic job: when a rank is lost, the survivors
	// Close and Init a new Client, and the daemon forms the job's next
	// epoch from them (their ranks in the old order). Also set by
	// $HOROVOD_ELASTIC=1, as hvdd run --min-np sets it. Every rank of a job
	// must agree.
	Elastic bool

	ic      *ipc.Conn
	welcome *ipcpb.Welcome

	// mu guards the fields that follow.
	mu       sync.Mutex
	pending  map[uint32]*Handle
	names    map[string]bool // names in flight
	nextID   uint32
	regions  []*arenaRegion
	granted  map[uint32]*shm.Region
	updates  []HostsUpdate // host-update notifications not yet taken (HostsUpdates)
	nextReg  uint32
	failed   error // set when the connection is gone
	closed   bool
	autoName map[string]int // per collective, for unnamed ops

	readMu     sync.Mutex    // held by the goroutine reading the socket
	readerFree chan struct{} // a token: the reader role is free
	spin       time.Duration
	groupSeq   atomic.Uint64
	sockIn     uint64        // counted socket frames read since the channel (readMu)
	curSpin    time.Duration // the adaptive spin window (readMu)

	// txMu serialises sending: the channel's ring and the socket writes it
	// counts.
	txMu  sync.Mutex
	ch    *ipc.Channel // nil without a channel
	chMem *shm.Region
}

type arenaRegion struct {
	id    uint32
	m     *shm.Region
	arena *shm.Arena
}

// Init connects to the daemon and returns when the whole job has formed.
func Init(ctx context.Context) (*Client, error) {
	c := &Client{}
	if err := c.Init(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Init connects c to the daemon, registers its staging arena and waits until
// every rank of the job has arrived. It fails if c is already initialised.
func (c *Client) Init(ctx context.Context) error {
	if c.ic != nil {
		return errors.New("hvdd: client already initialised")
	}
	c.Socket = ipc.SocketPath(c.Socket)
	if c.ArenaSize == 0 {
		c.ArenaSize = 256 << 20
	}
	timeout := c.StartTimeout
	if timeout == 0 {
		timeout = startTimeout(c.Elastic || os.Getenv("HOROVOD_ELASTIC") == "1")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	uc, err := dial(ctx, c.Socket)
	if err != nil {
		return err
	}
	if c.ic, err = ipc.NewConn(uc); err != nil {
		uc.Close()
		return fmt.Errorf("hvdd: %w", err)
	}
	c.pending = make(map[uint32]*Handle)
	c.names = make(map[string]bool)
	c.granted = make(map[uint32]*shm.Region)
	c.autoName = make(map[string]int)
	c.readerFree = make(chan struct{}, 1)
	c.spin = c.Spin
	if c.spin == 0 {
		c.spin = 50 * time.Microsecond
		if v, err := strconv.ParseFloat(os.Getenv("HVDD_SPIN_US"), 64); err == nil {
			c.spin = time.Duration(v * float64(time.Microsecond))
		}
	}
	lr := -1
	if c.RequestedLocalRank != nil {
		lr = *c.RequestedLocalRank
	} else {
		for _, k := range []string{"HVDD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"} {
			if v, err := strconv.Atoi(os.Getenv(k)); err == nil {
				lr = v
				break
			}
		}
	}
	err = c.handshake(ctx, lr)
	if err == nil && !c.NoChannel && os.Getenv("HVDD_CHANNEL") != "0" {
		err = c.openChannel()
	}
	if err != nil {
		c.ic.Close()
		c.ic = nil
		if ctx.Err() != nil {
			return fmt.Errorf("hvdd: init: the job did not form within the start timeout (%v): are all ranks started, and is the daemon's --slots right? (%w)", timeout, ctx.Err())
		}
		return err
	}
	return nil
}

// startTimeout is StartTimeout's default.
func startTimeout(elastic bool) time.Duration {
	secs := func(name string) (time.Duration, bool) {
		v, err := strconv.ParseFloat(os.Getenv(name), 64)
		return time.Duration(v * float64(time.Second)), err == nil && v > 0
	}
	if d, ok := secs("HVDD_START_TIMEOUT"); ok {
		return d
	}
	if !elastic {
		return 120 * time.Second
	}
	if d, ok := secs("HOROVOD_ELASTIC_TIMEOUT"); ok {
		return d
	}
	return 600 * time.Second
}

// dial connects to the daemon, retrying while it is starting.
func dial(ctx context.Context, path string) (*net.UnixConn, error) {
	var d net.Dialer
	delay := 5 * time.Millisecond
	for {
		conn, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			return conn.(*net.UnixConn), nil
		}
		if errors.Is(err, unix.EACCES) {
			// Waiting will not help: the socket's mode or group keeps us out.
			return nil, fmt.Errorf("hvdd: permission denied on the daemon's socket %s: this user may not use that daemon; ask for the socket's group (a service daemon's is hvdd: usermod -aG hvdd USER, then log in again), or set HVDD_SOCKET to a daemon of your own", path)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("hvdd: cannot reach the daemon at %s: %v (start one with `hvdd serve --slots N`, run under `hvdd run`, or set HVDD_SOCKET)", path, err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}

// openChannel creates the shared-memory channel and registers it. It runs
// after Welcome and before any request, so that the daemon sends nothing on
// the socket between the registration and the first frame it counts.
func (c *Client) openChannel() error {
	ring := c.RingSize
	if ring == 0 {
		ring = ipc.DefaultRingSize
		if v, err := strconv.Atoi(os.Getenv("HVDD_RING_BYTES")); err == nil {
			ring = v
		}
	}
	m, err := shm.Create(fmt.Sprintf("hvdd-chan-%d", os.Getpid()), int64(ipc.ChannelBytes(ring)))
	if err != nil {
		return fmt.Errorf("hvdd: channel: %w", err)
	}
	ch, err := ipc.NewChannel(m.Bytes(), ipc.ClientSide)
	if err != nil {
		err = fmt.Errorf("ring size %d (RingSize, HVDD_RING_BYTES): %w", ring, err)
	}
	if err == nil {
		err = c.ic.WriteClient(0, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_RegisterChannel{
			RegisterChannel: &ipcpb.RegisterChannel{Size: uint64(m.Size())}}}, m.FD())
	}
	if err != nil {
		m.Close()
		return fmt.Errorf("hvdd: channel: %w", err)
	}
	c.ch, c.chMem = ch, m
	return nil
}

// send sends one message: through the channel when there is one and the
// message carries no descriptor (waiting for room if the ring is full), else
// on the socket, after the ring has drained so that the daemon sees the
// messages in the order they were sent.
func (c *Client) send(id uint32, m *ipcpb.ClientMessage, fd int) error {
	c.txMu.Lock()
	defer c.txMu.Unlock()
	if c.ch == nil {
		return c.ic.WriteClient(id, m, fd)
	}
	b, err := c.ch.Encode(ipc.KindClient, id, m)
	if err != nil {
		return err
	}
	if fd < 0 && len(b) <= c.ch.MaxFrame() {
		for {
			ok, err := c.ch.SendFrame(b)
			if err != nil {
				return err
			}
			if ok {
				if c.ch.PeerAsleep() {
					return c.ic.WriteWake()
				}
				return nil
			}
			if err := c.waitRing(func() bool { return c.ch.Room(len(b)) }); err != nil {
				return err
			}
		}
	}
	if err := c.waitRing(c.ch.Empty); err != nil {
		return err
	}
	if err := c.ic.WriteRaw(b, fd); err != nil {
		return err
	}
	c.ch.SocketSent(1)
	return nil
}

// waitRing waits until cond holds of the ring the daemon drains: yielding at
// first, then sleeping a millisecond at a time while watching the socket for
// the daemon's end. The caller holds txMu.
func (c *Client) waitRing(cond func() bool) error {
	for i := 0; !cond(); i++ {
		if i < 1000 {
			unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			continue
		}
		if c.ic.PeerClosed(time.Millisecond) {
			return ipc.ErrClosed
		}
	}
	return nil
}

func (c *Client) handshake(ctx context.Context, localRank int) error {
	if err := c.ic.WriteClient(0, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Hello{Hello: &ipcpb.Hello{
		Version: ipc.Version, Pid: int32(os.Getpid()), LocalRank: int32(localRank), Client: "go",
		Elastic: c.Elastic || os.Getenv("HOROVOD_ELASTIC") == "1", Timeline: envTimeline(),
		AutotuneEnv: envAutotune(), Job: c.jobName(), LocalSize: int32(c.localSize()),
		Worker: os.Getenv("HVDD_WORKER"),
	}}}, -1); err != nil {
		return c.refusal(fmt.Errorf("hvdd: hello: %w", err))
	}
	if _, err := c.addRegion(c.ArenaSize); err != nil {
		return c.refusal(err)
	}
	for {
		_, m, err := c.ic.ReadServer(ctx)
		if err != nil {
			return fmt.Errorf("hvdd: waiting for the job to form: %w", err)
		}
		switch m := m.Msg.(type) {
		case *ipcpb.ServerMessage_Welcome:
			c.welcome = m.Welcome
			return nil
		case *ipcpb.ServerMessage_Fatal:
			return &Error{Code: m.Fatal.GetCode(), Msg: m.Fatal.GetError()}
		default:
			return fmt.Errorf("hvdd: unexpected %T before Welcome", m)
		}
	}
}

// envTimeline is the timeline $HOROVOD_TIMELINE asks for at init (made
// absolute here; the daemon's working directory is not ours), nil for none
// or DYNAMIC (StartTimeline later).
func envTimeline() *ipcpb.Timeline {
	path := os.Getenv("HOROVOD_TIMELINE")
	if path == "" || path == "DYNAMIC" {
		return nil
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	mc := os.Getenv("HOROVOD_TIMELINE_MARK_CYCLES")
	return &ipcpb.Timeline{FilePath: path, MarkCycles: mc != "" && mc != "0"}
}

// jobName is the job name Hello gives (see Client.Job).
func (c *Client) jobName() string {
	if c.Job != "" {
		return c.Job
	}
	if v := os.Getenv("HVDD_JOB"); v != "" {
		return v
	}
	for _, k := range []string{"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"} {
		if v := os.Getenv(k); v != "" && os.Getenv("OMPI_COMM_WORLD_RANK") != "" {
			return "ompi-" + v
		}
	}
	if j, s := os.Getenv("SLURM_JOB_ID"), os.Getenv("SLURM_STEP_ID"); j != "" && os.Getenv("SLURM_PROCID") != "" {
		return "slurm-" + j + "." + s
	}
	return ""
}

// localSize is the local size Hello gives (see Client.JobLocalSize); 0 for the
// daemon's --slots.
func (c *Client) localSize() int {
	if c.JobLocalSize != 0 {
		return c.JobLocalSize
	}
	for _, k := range []string{"HVDD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"} {
		if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
			return v
		}
	}
	return 0
}

// envAutotune is HOROVOD_AUTOTUNE and HOROVOD_AUTOTUNE_* as NAME=VALUE,
// for Hello: global rank 0's turn the daemon's autotuning on for the job
// (the log file's path made absolute, for the daemon's directory).
func envAutotune() []string {
	var out []string
	for _, kv := range os.Environ() {
		name, value, _ := strings.Cut(kv, "=")
		if name != "HOROVOD_AUTOTUNE" && !strings.HasPrefix(name, "HOROVOD_AUTOTUNE_") {
			continue
		}
		if name == "HOROVOD_AUTOTUNE_LOG" && value != "" {
			if abs, err := filepath.Abs(value); err == nil {
				value = abs
			}
		}
		out = append(out, name+"="+value)
	}
	sort.Strings(out)
	return out
}

// refusal returns the daemon's reason for refusing this process, if it sent
// one before closing the connection, in place of err: a write of the
// handshake that fails because the daemon has closed the connection races
// with reading its Fatal, which waits unread in the socket.
func (c *Client) refusal(err error) error {
	if !errors.Is(err, ipc.ErrClosed) {
		return err
	}
	for {
		f, ok, rerr := c.ic.TryReadFrame()
		if rerr != nil || !ok {
			return err
		}
		if _, m, derr := ipc.DecodeServer(f); derr == nil && m.GetFatal() != nil {
			return &Error{Code: m.GetFatal().GetCode(), Msg: m.GetFatal().GetError()}
		}
	}
}

// addRegion creates and registers a staging region of at least size bytes.
// Callers hold c.mu, or run before the reader starts.
func (c *Client) addRegion(size int64) (*arenaRegion, error) {
	m, err := shm.Create(fmt.Sprintf("hvdd-client-%d", os.Getpid()), size)
	if err != nil {
		return nil, fmt.Errorf("hvdd: %w", err)
	}
	r := &arenaRegion{id: c.nextReg, m: m, arena: shm.NewArena(size)}
	c.nextReg++
	if err := c.send(0, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_RegisterRegion{
		RegisterRegion: &ipcpb.RegisterRegion{Region: r.id, Size: uint64(size)}}}, m.FD()); err != nil {
		m.Close()
		return nil, fmt.Errorf("hvdd: register region: %w", err)
	}
	c.regions = append(c.regions, r)
	return r, nil
}

// The client has no reader goroutine: a goroutine that waits for a handle
// reads the channel and the socket itself (holding readMu), completing
// whatever frames arrive, and hands the reader role on when its own handle is
// done. With one waiter (the usual training loop) no goroutine hand-off sits
// on the path. While it waits, the reader first polls without sleeping for
// Spin (the channel's ring is a memory read; without a channel the socket is
// read without blocking), so that a quick answer costs no wake-up, then
// sleeps on the socket, telling the daemon through the channel to ring.

// pump reads and dispatches frames until done() holds. The caller holds
// readMu. With block false it only takes what is already there.
func (c *Client) pump(ctx context.Context, done func() bool, block bool) error {
	if c.curSpin < c.spin {
		c.curSpin = c.spin
	}
	spinEnd := time.Now().Add(c.curSpin)
	woke := false
	for !done() {
		// After a sleep, also drain the socket: doorbells rung while we
		// slept would otherwise wake the next sleep for nothing.
		got, err := c.take(!block || woke)
		woke = false
		if err != nil {
			c.failAll(err)
			return err
		}
		if got {
			continue
		}
		if !block {
			return nil
		}
		if c.spin > 0 && time.Now().Before(spinEnd) {
			unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			continue
		}
		if c.ch != nil {
			// Say we sleep, then look once more: a frame published before
			// the daemon could see the flag rang no doorbell.
			c.ch.SetAsleep(true)
			if c.ch.Pending() {
				c.ch.SetAsleep(false)
				continue
			}
		}
		// Block in the kernel until a frame arrives or ctx is done.
		slept := time.Now()
		f, err := c.ic.ReadFrame(ctx)
		if c.ch != nil {
			c.ch.SetAsleep(false)
		}
		if c.spin > 0 {
			c.curSpin = ipc.AdaptSpin(c.curSpin, c.spin, time.Since(slept))
		}
		if err != nil && ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil {
			err = c.dispatchSocket(f)
		}
		if err != nil {
			c.failAll(err)
			return err
		}
		woke = true
		spinEnd = time.Now().Add(c.curSpin)
	}
	return nil
}

// take dispatches the frames that have arrived, without sleeping: with a
// channel, the socket frames the daemon counted before its ring's head, then
// the ring; with sock (or without a channel) also the socket's own frames.
func (c *Client) take(sock bool) (bool, error) {
	got := false
	if c.ch != nil {
		want := c.ch.Snapshot()
		for c.sockIn < want {
			// Written before the ring frames: already in the socket.
			f, err := c.ic.ReadFrame(context.Background())
			if err != nil {
				return got, err
			}
			if err := c.dispatchSocket(f); err != nil {
				return got, err
			}
			got = true
		}
		for {
			f, ok, err := c.ch.Next()
			if err != nil {
				return got, err
			}
			if !ok {
				break
			}
			if err := c.dispatch(f); err != nil {
				return got, err
			}
			got = true
		}
		if !sock {
			return got, nil
		}
	}
	for {
		f, ok, err := c.ic.TryReadFrame()
		if err != nil || !ok {
			return got, err
		}
		if err := c.dispatchSocket(f); err != nil {
			return got, err
		}
		got = true
	}
}

// dispatchSocket acts on a frame read from the socket, counting it for the
// channel's order.
func (c *Client) dispatchSocket(f ipc.Frame) error {
	if f.Kind == ipc.KindWake {
		return nil
	}
	c.sockIn++
	return c.dispatch(f)
}

// dispatch acts on one frame from the daemon.
func (c *Client) dispatch(f ipc.Frame) error {
	id, m, err := ipc.DecodeServer(f)
	if err != nil {
		return err
	}
	switch m := m.Msg.(type) {
	case *ipcpb.ServerMessage_Done:
		c.mu.Lock()
		h := c.pending[id]
		delete(c.pending, id)
		if h != nil {
			delete(c.names, h.name)
		}
		c.mu.Unlock()
		if h != nil {
			h.complete(m.Done, nil)
		}
	case *ipcpb.ServerMessage_GrantRegion:
		fd, err := c.ic.PopFD()
		if err != nil {
			return err
		}
		r, err := shm.Open(fd, int64(m.GrantRegion.GetSize()))
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.granted[m.GrantRegion.GetRegion()] = r
		c.mu.Unlock()
	case *ipcpb.ServerMessage_Fatal:
		return &Error{Code: m.Fatal.GetCode(), Msg: m.Fatal.GetError()}
	case *ipcpb.ServerMessage_HostsUpdated:
		c.mu.Lock()
		c.updates = append(c.updates, HostsUpdate{Timestamp: m.HostsUpdated.GetTimestamp(), Result: int(m.HostsUpdated.GetResult())})
		c.mu.Unlock()
	}
	return nil
}

// HostsUpdate is a host-update notification of an elastic job (Horovod's):
// workers wait to join it, and its ranks should re-initialise (see
// CloseToReset) at the same step. Only global rank 0 receives them.
type HostsUpdate struct {
	// Timestamp is when the daemons saw the change (Unix milliseconds).
	Timestamp int64
	// Result holds Horovod's HostUpdateResult flags: 1 removed, 2 added.
	Result int
}

// HostsUpdates returns the host-update notifications received since the
// last call. They arrive with the replies to collectives: a rank that runs
// none receives none.
func (c *Client) HostsUpdates() []HostsUpdate {
	c.mu.Lock()
	defer c.mu.Unlock()
	u := c.updates
	c.updates = nil
	return u
}

// failAll records that the connection is gone and fails every pending handle.
func (c *Client) failAll(err error) {
	c.mu.Lock()
	if c.closed {
		err = &Error{Code: ipcpb.Code_CODE_SHUT_DOWN, Msg: "hvdd: client closed"}
	} else if errors.Is(err, ipc.ErrClosed) {
		err = &Error{Code: ipcpb.Code_CODE_SHUT_DOWN, Msg: "hvdd: the daemon closed the connection (did it exit?)"}
	}
	if c.failed == nil {
		c.failed = err
	}
	pend := c.pending
	c.pending = map[uint32]*Handle{}
	c.mu.Unlock()
	for _, h := range pend {
		h.complete(nil, err)
	}
}

// waitFor makes progress on the connection until h is done or ctx ends.
func (c *Client) waitFor(ctx context.Context, h *Handle) error {
	for {
		select {
		case <-h.done:
			return nil
		default:
		}
		if c.readMu.TryLock() {
			err := c.pump(ctx, h.isDone, true)
			c.readMu.Unlock()
			// Hand the reader role to another waiter, if any.
			select {
			case c.readerFree <- struct{}{}:
			default:
			}
			if err != nil && ctx.Err() != nil {
				return err
			}
			if h.isDone() {
				return nil
			}
			continue
		}
		select {
		case <-h.done:
			return nil
		case <-c.readerFree:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// progress takes whatever frames have arrived, without blocking.
func (c *Client) progress() {
	if c.readMu.TryLock() {
		c.pump(context.Background(), func() bool { return false }, false)
		c.readMu.Unlock()
		select {
		case c.readerFree <- struct{}{}:
		default:
		}
	}
}

// Close says goodbye to the daemon (an orderly shutdown, not a lost rank),
// closes the connection and releases the shared memory. Pending operations fail.
func (c *Client) Close() error { return c.close(false, false) }

// CloseToReset is Close for a rank of an elastic job that re-initialises at
// once into the job's next epoch (Horovod's reset after a host update): the
// daemon ends the epoch for every rank, and the next one takes in the
// workers waiting to join.
func (c *Client) CloseToReset() error { return c.close(true, false) }

// CloseAtExit is Close for a process about to exit (Python's atexit
// shutdown): the daemon tells hvdd run's elastic driver, which then waits
// for the process's exit status rather than stopping it as a rank that left
// the job but still runs.
func (c *Client) CloseAtExit() error { return c.close(false, true) }

func (c *Client) close(reset, exiting bool) error {
	if c.ic == nil {
		return nil
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.send(0, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Goodbye{Goodbye: &ipcpb.Goodbye{ElasticReset: reset, Exiting: exiting}}}, -1)
	err := c.ic.Close()
	// A goroutine blocked reading sees the close; then fail what is left.
	c.readMu.Lock()
	c.failAll(ipc.ErrClosed)
	c.readMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.regions {
		r.m.Close()
	}
	for _, r := range c.granted {
		r.Close()
	}
	c.regions, c.granted = nil, nil
	c.txMu.Lock()
	if c.chMem != nil {
		c.ch = nil
		c.chMem.Close()
		c.chMem = nil
	}
	c.txMu.Unlock()
	return err
}

// Rank is this process's global rank.
func (c *Client) Rank() int { return int(c.welcome.GetRank()) }

// JobID identifies the job on its daemon; an elastic job keeps it across
// epochs.
func (c *Client) JobID() uint64 { return c.welcome.GetJobId() }

// Epoch is the membership epoch of an elastic job: 0 when it formed, one
// more each time its survivors re-formed it.
func (c *Client) Epoch() uint64 { return c.welcome.GetEpoch() }

// Size is the number of processes in the job.
func (c *Client) Size() int { return int(c.welcome.GetSize()) }

// LocalRank is this process's rank among those on its node.
func (c *Client) LocalRank() int { return int(c.welcome.GetLocalRank()) }

// LocalSize is the number of processes on this node.
func (c *Client) LocalSize() int { return int(c.welcome.GetLocalSize()) }

// CrossRank is this node's index among the nodes that have a process with this
// local rank.
func (c *Client) CrossRank() int { return int(c.welcome.GetCrossRank()) }

// CrossSize is the number of nodes that have a process with this local rank.
func (c *Client) CrossSize() int { return int(c.welcome.GetCrossSize()) }

// IsHomogeneous reports whether every node runs the same number of processes.
func (c *Client) IsHomogeneous() bool { return c.welcome.GetIsHomogeneous() }

// alloc reserves n bytes of shared memory, growing the arena when needed.
func (c *Client) alloc(n int64) ([]byte, *arenaRegion, int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failed != nil {
		return nil, nil, 0, c.failed
	}
	for _, r := range c.regions {
		if off, ok := r.arena.Alloc(n); ok {
			return r.m.Bytes()[off : off+n : off+n], r, off, nil
		}
	}
	r, err := c.addRegion(max(c.ArenaSize, shm.RoundToPages(n)))
	if err != nil {
		return nil, nil, 0, err
	}
	off, _ := r.arena.Alloc(n)
	return r.m.Bytes()[off : off+n : off+n], r, off, nil
}

// locate finds the arena allocation that holds b, if b lies in shared memory.
func (c *Client) locate(b []byte) (*arenaRegion, int64, bool) {
	if len(b) == 0 {
		return nil, 0, false
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.regions {
		base := uintptr(unsafe.Pointer(&r.m.Bytes()[0]))
		if p >= base && p+uintptr(len(b)) <= base+uintptr(r.m.Size()) {
			return r, int64(p - base), true
		}
	}
	return nil, 0, false
}

// output returns the granted bytes a Done points at.
func (c *Client) output(b *ipcpb.Buffer) ([]byte, error) {
	if b.GetLength() == 0 {
		return nil, nil
	}
	c.mu.Lock()
	r := c.granted[b.GetRegion()]
	c.mu.Unlock()
	if r == nil {
		return nil, fmt.Errorf("hvdd: output in unknown region %#x", b.GetRegion())
	}
	return r.Slice(b.GetOffset(), b.GetLength())
}

// release tells the daemon an output has been read.
func (c *Client) release(b *ipcpb.Buffer) {
	if b.GetLength() == 0 {
		return
	}
	c.send(0, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Release{Release: &ipcpb.Release{Buffer: b}}}, -1)
}
