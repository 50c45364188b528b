package daemon_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/daemon/daemontest"
	"github.com/hvdd/hvdd/ipc"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/shm"
)

// rawClient speaks the protocol by hand, so tests can break it.
type rawClient struct {
	t  *testing.T
	ic *ipc.Conn
}

func dialRaw(t *testing.T, socket string) *rawClient {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ic, err := ipc.NewConn(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ic.Close() })
	return &rawClient{t: t, ic: ic}
}

func (r *rawClient) send(id uint32, m *ipcpb.ClientMessage, fd int) {
	r.t.Helper()
	if err := r.ic.WriteClient(id, m, fd); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rawClient) hello(localRank int32) {
	r.send(0, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Hello{Hello: &ipcpb.Hello{Version: ipc.Version, Pid: int32(os.Getpid()), LocalRank: localRank}}}, -1)
}

// next reads the next server message, failing the test after 10 s.
func (r *rawClient) next() (uint32, *ipcpb.ServerMessage, error) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return r.ic.ReadServer(ctx)
}

// expectFatal reads until a Fatal arrives and checks its code and text, then
// that the daemon closed the connection.
func (r *rawClient) expectFatal(code ipcpb.Code, substr string) {
	r.t.Helper()
	for {
		_, m, err := r.next()
		if err != nil {
			r.t.Fatalf("want Fatal %v (%q), got error %v", code, substr, err)
		}
		f := m.GetFatal()
		if f == nil {
			continue
		}
		if f.GetCode() != code || !strings.Contains(f.GetError(), substr) {
			r.t.Fatalf("got Fatal %v %q, want %v containing %q", f.GetCode(), f.GetError(), code, substr)
		}
		break
	}
	if _, _, err := r.next(); !errors.Is(err, ipc.ErrClosed) {
		r.t.Fatalf("connection still open after Fatal: %v", err)
	}
}

func frame(kind, flags byte, id uint32, body []byte) []byte {
	b := []byte{'H', 'V', kind, flags, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.LittleEndian.PutUint32(b[4:], id)
	binary.LittleEndian.PutUint32(b[8:], uint32(len(body)))
	return append(b, body...)
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// healthyJob runs a 2-rank job of Go clients in this process while bad
// clients misbehave, and checks it still computes.
func healthyJob(t *testing.T, socket string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errc := make(chan error, 2)
	for i := 0; i < 2; i++ {
		lr := i
		go func() {
			c := &hvdd.Client{Socket: socket, RequestedLocalRank: &lr}
			if err := c.Init(ctx); err != nil {
				errc <- err
				return
			}
			defer c.Close()
			x := []float32{1, 2, 3}
			if err := hvdd.Allreduce(ctx, c, x, hvdd.WithOp(hvdd.Sum), hvdd.WithName("h")); err != nil {
				errc <- err
				return
			}
			if x[2] != 6 {
				errc <- errors.New("wrong sum")
				return
			}
			errc <- nil
		}()
	}
	for i := 0; i < 2; i++ {
		if err := <-errc; err != nil {
			t.Fatalf("healthy job: %v", err)
		}
	}
}

func TestBadFrames(t *testing.T) {
	s := daemontest.Start(t, daemon.Config{Slots: 2})
	hello := mustMarshal(t, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Hello{Hello: &ipcpb.Hello{Version: ipc.Version}}})
	tests := []struct {
		name  string
		bytes []byte
		want  string
	}{
		{"bad magic", append([]byte("GET / HTTP/1.1\r\n"), make([]byte, 8)...), "bad magic"},
		{"unknown kind", frame(9, 0, 0, hello), "unknown frame kind"},
		{"server kind", frame(ipc.KindServer, 0, 0, hello), "where a client message"},
		{"flags", frame(ipc.KindClient, 7, 0, hello), "reserved flags"},
		{"oversized", frame(ipc.KindClient, 0, 0, nil)[:8], ""},
		{"garbage body", frame(ipc.KindClient, 0, 0, []byte{0xff, 0xff, 0xff, 0xff, 0x0f}), "undecodable"},
		{"empty body", frame(ipc.KindClient, 0, 0, nil), "no known content"},
		{"unknown field only", frame(ipc.KindClient, 0, 0, []byte{0xfa, 0x3f, 0x00}), "no known content"},
		{"truncated", frame(ipc.KindClient, 0, 0, hello)[:15], "closed inside"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := dialRaw(t, s.Socket)
			b := tc.bytes
			if tc.name == "oversized" {
				b = append(b, 0xff, 0xff, 0xff, 0x7f) // length 2 GiB
				tc.want = "exceeds"
			}
			if err := r.ic.WriteRaw(b, -1); err != nil {
				t.Fatal(err)
			}
			if tc.name == "truncated" {
				r.ic.CloseWrite()
			}
			r.expectFatal(ipcpb.Code_CODE_PROTOCOL, tc.want)
		})
	}
	healthyJob(t, s.Socket)
}

func TestBadRegions(t *testing.T) {
	s := daemontest.Start(t, daemon.Config{Slots: 2})
	reg := func(id uint32, size uint64) *ipcpb.ClientMessage {
		return &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_RegisterRegion{RegisterRegion: &ipcpb.RegisterRegion{Region: id, Size: size}}}
	}
	memfd := func(size int64, seal bool) int {
		fd, err := unix.MemfdCreate("t", unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		unix.Ftruncate(fd, size)
		if seal {
			unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	var p [2]int
	if err := unix.Pipe(p[:]); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	tests := []struct {
		name string
		msg  *ipcpb.ClientMessage
		fd   int
		want string
	}{
		{"no fd", reg(1, 4096), -1, "needs a file descriptor"},
		{"pipe fd", reg(1, 4096), p[0], "not a memfd"},
		{"unsealed", reg(1, 4096), memfd(4096, false), "F_SEAL_SHRINK"},
		{"too small", reg(1, 1<<20), memfd(4096, true), "fewer than"},
		{"absurd size", reg(1, 1<<62), memfd(4096, true), "absurd"},
		{"daemon id range", reg(0x80000001, 4096), memfd(4096, true), "daemon's range"},
		{"unregister unknown", &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_UnregisterRegion{UnregisterRegion: &ipcpb.UnregisterRegion{Region: 5}}}, -1, "unknown region"},
		{"release unknown", &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Release{Release: &ipcpb.Release{Buffer: &ipcpb.Buffer{Region: 0x80000000, Length: 8}}}}, -1, "unknown region"},
		{"wrong version", &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Hello{Hello: &ipcpb.Hello{Version: 99}}}, -1, "protocol version 99"},
		{"enqueue before hello", &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Enqueue{Enqueue: &ipcpb.Enqueue{Name: "x"}}}, -1, "before Hello"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := dialRaw(t, s.Socket)
			r.send(0, tc.msg, tc.fd)
			r.expectFatal(ipcpb.Code_CODE_PROTOCOL, tc.want)
		})
	}
	// A duplicate registration.
	r := dialRaw(t, s.Socket)
	r.send(0, reg(1, 4096), memfd(4096, true))
	r.send(0, reg(1, 4096), memfd(4096, true))
	r.expectFatal(ipcpb.Code_CODE_PROTOCOL, "registered twice")
	healthyJob(t, s.Socket)
}

// TestBadEnqueue sends requests with bad buffers on a member of a formed job:
// each gets an error Done, the connection stays usable, and the job computes.
func TestBadEnqueue(t *testing.T) {
	s := daemontest.Start(t, daemon.Config{Slots: 1})
	r := dialRaw(t, s.Socket)
	r.hello(0)
	m, err := shm.Create("t", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r.send(0, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_RegisterRegion{RegisterRegion: &ipcpb.RegisterRegion{Region: 3, Size: 4096}}}, m.FD())
	if _, w, err := r.next(); err != nil || w.GetWelcome() == nil {
		t.Fatalf("want Welcome, got %v %v", w, err)
	}
	f32 := ipcpb.DType_DTYPE_FLOAT32
	ar := ipcpb.OpType_OP_ALLREDUCE
	tests := []struct {
		name string
		e    *ipcpb.Enqueue
		want string
	}{
		{"offset past end", &ipcpb.Enqueue{Name: "a", Op: ar, Dtype: f32, Shape: []int64{4}, Buffer: &ipcpb.Buffer{Region: 3, Offset: 4090, Length: 16}}, "outside region"},
		{"offset overflow", &ipcpb.Enqueue{Name: "b", Op: ar, Dtype: f32, Shape: []int64{4}, Buffer: &ipcpb.Buffer{Region: 3, Offset: 1<<64 - 8, Length: 16}}, "outside region"},
		{"unknown region", &ipcpb.Enqueue{Name: "c", Op: ar, Dtype: f32, Shape: []int64{4}, Buffer: &ipcpb.Buffer{Region: 9, Length: 16}}, "unknown region"},
		{"length mismatch", &ipcpb.Enqueue{Name: "d", Op: ar, Dtype: f32, Shape: []int64{5}, Buffer: &ipcpb.Buffer{Region: 3, Length: 16}}, "buffer of 16 bytes"},
		{"absurd shape", &ipcpb.Enqueue{Name: "e", Op: ar, Dtype: f32, Shape: []int64{1 << 40, 1 << 40}, Buffer: &ipcpb.Buffer{Region: 3, Length: 16}}, "absurd"},
		{"negative dim", &ipcpb.Enqueue{Name: "f", Op: ar, Dtype: f32, Shape: []int64{-4}, Buffer: &ipcpb.Buffer{Region: 3, Length: 16}}, "negative"},
		{"bad dtype", &ipcpb.Enqueue{Name: "g", Op: ar, Dtype: 77, Shape: []int64{4}, Buffer: &ipcpb.Buffer{Region: 3, Length: 16}}, "unsupported dtype"},
		{"bad op", &ipcpb.Enqueue{Name: "h", Op: 42, Dtype: f32}, "unknown collective"},
		{"no name", &ipcpb.Enqueue{Op: ar, Dtype: f32, Shape: []int64{4}, Buffer: &ipcpb.Buffer{Region: 3, Length: 16}}, "without a name"},
		{"nan scale", &ipcpb.Enqueue{Name: "i", Op: ar, Dtype: f32, Shape: []int64{4}, Prescale: nan(), Buffer: &ipcpb.Buffer{Region: 3, Length: 16}}, "finite"},
		{"process set", &ipcpb.Enqueue{Name: "j", Op: ar, Dtype: f32, Shape: []int64{4}, ProcessSet: 3, Buffer: &ipcpb.Buffer{Region: 3, Length: 16}}, "does not exist"},
		{"host and device", &ipcpb.Enqueue{Name: "k", Op: ar, Dtype: f32, Shape: []int64{4}, Buffer: &ipcpb.Buffer{Region: 3, Length: 16}, DeviceBuffer: &ipcpb.DeviceBuffer{Length: 16}}, "both a host buffer and a device buffer"},
		{"device on CPU-only", &ipcpb.Enqueue{Name: "l", Op: ar, Dtype: f32, Shape: []int64{4}, DeviceBuffer: &ipcpb.DeviceBuffer{DeviceUuid: "GPU-0", MemHandle: make([]byte, 64), AllocSize: 16, Length: 16}}, "CPU-only"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := uint32(100 + i)
			r.send(id, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Enqueue{Enqueue: tc.e}}, -1)
			gid, msg, err := r.next()
			if err != nil {
				t.Fatal(err)
			}
			d := msg.GetDone()
			if gid != id || d == nil || d.GetCode() == ipcpb.Code_CODE_OK || !strings.Contains(d.GetError(), tc.want) {
				t.Fatalf("got id %d %v, want an error Done for %d containing %q", gid, msg, id, tc.want)
			}
		})
	}
	// The connection still works: a good allreduce of 4 floats (1 rank: Sum is identity).
	b := m.Bytes()
	binary.LittleEndian.PutUint32(b[0:], 0x40400000) // 3.0
	r.send(7, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Enqueue{Enqueue: &ipcpb.Enqueue{Name: "ok", Op: ar, Dtype: f32, Shape: []int64{4}, ReduceOp: ipcpb.ReduceOp_REDUCE_SUM, Postscale: 2, Buffer: &ipcpb.Buffer{Region: 3, Length: 16}}}}, -1)
	if id, msg, err := r.next(); err != nil || id != 7 || msg.GetDone().GetCode() != ipcpb.Code_CODE_OK {
		t.Fatalf("good enqueue: %d %v %v", id, msg, err)
	}
	if got := binary.LittleEndian.Uint32(b[0:]); got != 0x40c00000 { // 6.0
		t.Fatalf("result %#x, want 6.0 (%#x)", got, 0x40c00000)
	}
}

func nan() float64 { var z float64; return z / z }

// TestBadChannel: a channel region of the wrong size, a second channel, and a
// ring holding garbage or counters out of range each end that connection with
// a protocol error, while a healthy job (whose clients use channels) runs.
func TestBadChannel(t *testing.T) {
	s := daemontest.Start(t, daemon.Config{Slots: 2})
	regChan := func(size int) (*ipcpb.ClientMessage, *shm.Region) {
		m, err := shm.Create("t", int64(size))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_RegisterChannel{RegisterChannel: &ipcpb.RegisterChannel{Size: uint64(size)}}}, m
	}
	put := func(b []byte, off int, v uint64) { binary.LittleEndian.PutUint64(b[off:], v) }
	good := ipc.ChannelBytes(4096)
	tests := []struct {
		name  string
		size  int
		twice bool
		fill  func(b []byte)
		want  string
	}{
		{"wrong size", 4 * 4096, false, nil, "channel region must be"},
		{"second channel", good, true, nil, "second RegisterChannel"},
		{"garbage frame", good, false, func(b []byte) {
			copy(b[ipc.ChannelHeader:], "garbage-garbage!")
			put(b, 0, 16)
		}, "bad magic"},
		{"head out of range", good, false, func(b []byte) { put(b, 0, 1<<30) }, "head"},
		{"undecodable body", good, false, func(b []byte) {
			copy(b[ipc.ChannelHeader:], "HV\x01\x00\x00\x00\x00\x00\x04\x00\x00\x00\xff\xff\xff\xff")
			put(b, 0, 16)
		}, "undecodable"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := dialRaw(t, s.Socket)
			msg, m := regChan(tc.size)
			r.send(0, msg, m.FD())
			if tc.twice {
				msg2, m2 := regChan(tc.size)
				r.send(0, msg2, m2.FD())
			}
			if tc.fill != nil {
				tc.fill(m.Bytes())
				// The daemon may be asleep: ring the doorbell.
				if err := r.ic.WriteWake(); err != nil {
					t.Fatal(err)
				}
			}
			r.expectFatal(ipcpb.Code_CODE_PROTOCOL, tc.want)
		})
	}
	healthyJob(t, s.Socket)
}

func TestBusyAndRanks(t *testing.T) {
	s := daemontest.Start(t, daemon.Config{Slots: 2})
	a := dialRaw(t, s.Socket)
	a.hello(1)
	b := dialRaw(t, s.Socket)
	b.hello(5)
	b.expectFatal(ipcpb.Code_CODE_BUSY, "out of range")
	c := dialRaw(t, s.Socket)
	c.hello(1)
	c.expectFatal(ipcpb.Code_CODE_BUSY, "already taken")
	d := dialRaw(t, s.Socket)
	d.hello(-1) // gets rank 0: the job forms
	for _, r := range []*rawClient{a, d} {
		if _, m, err := r.next(); err != nil || m.GetWelcome() == nil {
			t.Fatalf("want Welcome, got %v %v", m, err)
		}
	}
	e := dialRaw(t, s.Socket)
	e.hello(-1)
	e.expectFatal(ipcpb.Code_CODE_BUSY, "running job (unnamed, uid 0) of 2 ranks")
}

// TestPeerCredentials connects as another uid: the daemon refuses it.
func TestPeerCredentials(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to connect as another uid")
	}
	s := daemontest.Start(t, daemon.Config{Slots: 1})
	os.Chmod(s.Socket, 0o666)
	os.Chmod(filepath.Dir(s.Socket), 0o755)
	// The test binary may sit in a private directory: run a copy.
	dir, err := os.MkdirTemp("", "hvdd-uid-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	exe := filepath.Join(dir, "worker")
	src, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, src, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), daemontest.WorkerEnv+"=other-uid", "HVDD_SOCKET="+s.Socket)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "CODE_PERMISSION_DENIED") || !strings.Contains(string(out), "may not use this daemon") {
		t.Fatalf("uid 65534 was not refused (%v):\n%s", err, out)
	}
}

func TestMain(m *testing.M) {
	if os.Getenv(daemontest.WorkerEnv) == "other-uid" {
		c, err := net.Dial("unix", os.Getenv("HVDD_SOCKET"))
		if err != nil {
			fmt.Println("dial:", err)
			os.Exit(1)
		}
		ic, err := ipc.NewConn(c.(*net.UnixConn))
		if err != nil {
			fmt.Println("conn:", err)
			os.Exit(1)
		}
		ic.WriteClient(0, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Hello{Hello: &ipcpb.Hello{Version: ipc.Version}}}, -1)
		_, msg, err := ic.ReadServer(context.Background())
		fmt.Println(msg.GetFatal().GetCode(), msg.GetFatal().GetError(), err)
		os.Exit(0)
	}
	os.Exit(daemontest.Main(m))
}

func TestStallWarningAndShutdown(t *testing.T) {
	s := daemontest.Start(t, daemon.Config{Slots: 2, StallCheck: 200 * time.Millisecond, StallShutdown: 400 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	clients := daemontest.InitClients(t, ctx, s.Socket, 2)
	defer clients[0].Close()
	defer clients[1].Close()
	// Rank 0 submits a tensor that rank 1 never does.
	err := hvdd.Allreduce(ctx, clients[0], []float32{1}, hvdd.WithName("lonely"))
	if !errors.Is(err, hvdd.ErrAborted) || !strings.Contains(err.Error(), `"allreduce.lonely" waits for ranks [1]`) && !strings.Contains(err.Error(), `"lonely" waits for ranks [1]`) {
		t.Fatalf("want an abort naming the stalled tensor and rank 1, got %v", err)
	}
	logs := s.Logs()
	for _, want := range []string{"One or more tensors were submitted", "Missing ranks:", "1!: [lonely]"} {
		if !strings.Contains(logs, want) {
			t.Errorf("stall log lacks %q:\n%s", want, logs)
		}
	}
}

// helloJob says hello as local rank lr of the named job of size processes.
func (r *rawClient) helloJob(name string, size, lr int32) {
	r.send(0, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Hello{Hello: &ipcpb.Hello{
		Version: ipc.Version, Pid: int32(os.Getpid()), LocalRank: lr, Job: name, LocalSize: size}}}, -1)
}

// welcome reads r's Welcome.
func (r *rawClient) welcome() *ipcpb.Welcome {
	r.t.Helper()
	_, m, err := r.next()
	if err != nil || m.GetWelcome() == nil {
		r.t.Fatalf("want Welcome, got %v %v", m, err)
	}
	return m.GetWelcome()
}

// TestJobLanes: a daemon of 4 slots runs two named jobs of 2 at once, each
// with its own ranks and id; a third job must wait for slots, a job larger
// than the daemon is refused, the name of a running job cannot be reused,
// and when a job ends its slots serve the next.
func TestJobLanes(t *testing.T) {
	s := daemontest.Start(t, daemon.Config{Slots: 4})
	start := func(name string) (*rawClient, *rawClient) {
		a, b := dialRaw(t, s.Socket), dialRaw(t, s.Socket)
		a.helloJob(name, 2, 0)
		b.helloJob(name, 2, 1)
		wa, wb := a.welcome(), b.welcome()
		if wa.GetSize() != 2 || wa.GetRank() != 0 || wb.GetRank() != 1 || wa.GetJobId() != wb.GetJobId() || wa.GetLocalSize() != 2 {
			t.Fatalf("job %s: welcomes %v / %v", name, wa, wb)
		}
		return a, b
	}
	a0, a1 := start("a")
	start("b")
	c := dialRaw(t, s.Socket)
	c.helloJob("c", 1, -1)
	c.expectFatal(ipcpb.Code_CODE_BUSY, `this daemon has --slots 4 and its jobs hold 4 (job "a" (uid 0): 2, job "b" (uid 0): 2); a job of 1 more must wait`)
	big := dialRaw(t, s.Socket)
	big.helloJob("big", 5, -1)
	big.expectFatal(ipcpb.Code_CODE_BUSY, "a job of 5 local processes does not fit this daemon's --slots 4")
	again := dialRaw(t, s.Socket)
	again.helloJob("a", 2, -1)
	again.expectFatal(ipcpb.Code_CODE_BUSY, `running job "a" (uid 0) of 2 ranks`)
	// Job a ends (its ranks close): its two slots take job c.
	a0.ic.Close()
	a1.ic.Close()
	s.WaitLog(t, `msg="job ended" job=1 name=a`, 10*time.Second)
	c0, c1 := dialRaw(t, s.Socket), dialRaw(t, s.Socket)
	c0.helloJob("c", 2, -1)
	c1.helloJob("c", 2, -1)
	if w0, w1 := c0.welcome(), c1.welcome(); w0.GetJobId() != 3 || w1.GetJobId() != 3 || w0.GetRank()+w1.GetRank() != 1 {
		t.Fatalf("job c: welcomes %v / %v, want job 3 with ranks 0 and 1", w0, w1)
	}
	s.WaitLog(t, `msg="job formed" job=3`, 10*time.Second)
}

// TestJobLocalSizeDisagrees: the processes of a job must agree on its local
// size.
func TestJobLocalSizeDisagrees(t *testing.T) {
	s := daemontest.Start(t, daemon.Config{Slots: 4})
	a := dialRaw(t, s.Socket)
	a.helloJob("j", 2, 0)
	s.WaitLog(t, "client joined", 10*time.Second)
	b := dialRaw(t, s.Socket)
	b.helloJob("j", 3, 1)
	b.expectFatal(ipcpb.Code_CODE_BUSY, `job "j" (uid 0) has 2 processes on this node, this process says 3 (HVDD_LOCAL_SIZE): every process of a job must agree`)
}

// TestStatusConnection: a status connection answers every StatusRequest,
// then refuses a Hello on it; a job's connection refuses a StatusRequest.
func TestStatusConnection(t *testing.T) {
	s := daemontest.Start(t, daemon.Config{Slots: 1})
	status := &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Status{Status: &ipcpb.StatusRequest{}}}
	r := dialRaw(t, s.Socket)
	for id := uint32(1); id <= 2; id++ {
		r.send(id, status, -1)
		got, m, err := r.next()
		if err != nil || got != id || m.GetStatus().GetSlots() != 1 || m.GetStatus().GetVersion() != daemon.Version {
			t.Fatalf("status %d: %d %v %v", id, got, m, err)
		}
	}
	r.hello(0)
	r.expectFatal(ipcpb.Code_CODE_PROTOCOL, "Hello on a status connection")
	j := dialRaw(t, s.Socket)
	j.hello(0)
	j.welcome()
	j.send(1, status, -1)
	j.expectFatal(ipcpb.Code_CODE_PROTOCOL, "StatusRequest on a job's connection")
}
