package cluster

import (
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/hvdd/hvdd/cluster/clusterpb"
)

// rawPair returns a Link over one end of a loopback TCP connection and the
// other end as a plain connection, so that a test can write any bytes.
func rawPair(t *testing.T, cfg Config) (*Link, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	raw := <-acc
	if raw == nil {
		t.Fatal("accept failed")
	}
	l, err := newLink(c, cfg.WithDefaults(), "peer")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(); raw.Close() })
	return l, raw
}

// waitReadable blocks until the link's descriptor is readable, as an event
// loop's epoll would.
func waitReadable(t *testing.T, l *Link) {
	t.Helper()
	pfd := []unix.PollFd{{Fd: int32(l.FD()), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(pfd, 10_000)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			t.Fatalf("descriptor never became readable: %v", err)
		}
		return
	}
}

func frame(t *testing.T, m *clusterpb.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)
}

// TestTryRecvFraming feeds frames byte by byte, several at once, with
// heartbeats between them and one larger than a read's chunk: TryRecv never
// blocks, returns nothing for an incomplete frame, and every message once,
// in order.
func TestTryRecvFraming(t *testing.T) {
	l, raw := rawPair(t, Config{Secret: secret, Heartbeat: time.Hour})
	if m, err := l.TryRecv(); m != nil || err != nil {
		t.Fatalf("empty link: %v %v", m, err)
	}
	hb := frame(t, &clusterpb.Message{Msg: &clusterpb.Message_Heartbeat{Heartbeat: &clusterpb.Heartbeat{}}})
	big := strings.Repeat("x", 3*tryReadChunk+17)
	want := []*clusterpb.Message{
		{Msg: &clusterpb.Message_Plan{Plan: &clusterpb.Plan{Seq: 1}}},
		{Msg: &clusterpb.Message_Abort{Abort: &clusterpb.Abort{Code: 7, Msg: big}}},
		{Msg: &clusterpb.Message_Plan{Plan: &clusterpb.Plan{Seq: 2}}},
		{Msg: &clusterpb.Message_Bye{Bye: &clusterpb.Bye{}}},
	}
	// The first message a byte at a time.
	f := frame(t, want[0])
	for i, b := range f {
		if _, err := raw.Write([]byte{b}); err != nil {
			t.Fatal(err)
		}
		waitReadable(t, l)
		m, err := l.TryRecv()
		if err != nil {
			t.Fatal(err)
		}
		if i < len(f)-1 && m != nil {
			t.Fatalf("a message after %d of %d bytes", i+1, len(f))
		}
		if i == len(f)-1 && !proto.Equal(m, want[0]) {
			t.Fatalf("got %v, want %v", m, want[0])
		}
	}
	// The rest in one write, heartbeats between.
	var all []byte
	for _, m := range want[1:] {
		all = append(append(all, hb...), frame(t, m)...)
	}
	go raw.Write(all)
	for _, w := range want[1:] {
		// As an event loop does: TryRecv until it has nothing, then wait.
		m, err := l.TryRecv()
		for m == nil && err == nil {
			waitReadable(t, l)
			m, err = l.TryRecv()
		}
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(m, w) {
			t.Fatalf("got a %T, want %T", m.Msg, w.Msg)
		}
	}
	if m, err := l.TryRecv(); m != nil || err != nil {
		t.Fatalf("after the last message: %v %v", m, err)
	}
}

func TestTryRecvErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bytes []byte
		want  string
	}{
		{"oversized", binary.BigEndian.AppendUint32(nil, MaxMessage+1), "limit"},
		{"garbage", []byte{0, 0, 0, 3, 0xff, 0xff, 0xff}, "undecodable"},
		{"empty message", []byte{0, 0, 0, 0}, "undecodable"},
		{"closed", nil, "closed the connection"},
		{"closed inside a frame", []byte{0, 0, 0, 9, 1}, "closed the connection"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, raw := rawPair(t, Config{Secret: secret, Heartbeat: time.Hour})
			raw.Write(tc.bytes)
			if tc.want == "closed the connection" {
				raw.Close()
			}
			for {
				waitReadable(t, l)
				m, err := l.TryRecv()
				if m != nil {
					t.Fatalf("decoded %v", m)
				}
				if err != nil {
					if !strings.Contains(err.Error(), tc.want) {
						t.Fatalf("error %q, want it to mention %q", err, tc.want)
					}
					return
				}
			}
		})
	}
}

func TestSilentAndClose(t *testing.T) {
	l, _ := rawPair(t, Config{Secret: secret, Heartbeat: time.Hour, PeerTimeout: time.Minute})
	now := time.Now()
	if err := l.Silent(now); err != nil {
		t.Fatalf("fresh link reported silent: %v", err)
	}
	if err := l.Silent(now.Add(2 * time.Minute)); err == nil || !strings.Contains(err.Error(), "silent") {
		t.Fatalf("after the peer timeout: %v", err)
	}
	// Close wakes a Recv that waits on a quiet peer (here for up to a minute).
	errc := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		close(started)
		_, err := l.Recv()
		errc <- err
	}()
	<-started
	l.Close()
	if err := <-errc; err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("Recv after Close: %v", err)
	}
	if err := l.Send(&clusterpb.Message{Msg: &clusterpb.Message_Bye{Bye: &clusterpb.Bye{}}}); err == nil {
		t.Fatal("Send after Close succeeded")
	}
}

// FuzzFrames feeds arbitrary bytes to the frame decoder: it returns messages,
// asks for more, or fails; it never panics or over-reads.
func FuzzFrames(f *testing.F) {
	f.Add([]byte{0, 0, 0, 2, 0x1a, 0})
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		l := &Link{peer: "fuzz", pb: append([]byte(nil), b...)}
		for i := 0; i <= len(b); i++ {
			m, need, err := l.buffered()
			if err != nil || need > 0 {
				if need > MaxMessage+4 {
					t.Fatalf("asks for %d bytes", need)
				}
				return
			}
			if m == nil {
				t.Fatal("no message, no need, no error")
			}
		}
		t.Fatal("more messages than bytes")
	})
}

// TestBuffered: Buffered tells whether TryRecv can answer from the buffer
// alone (the daemon's loop stops reading a link when it cannot).
func TestBuffered(t *testing.T) {
	l, raw := rawPair(t, Config{Secret: secret, Heartbeat: time.Hour})
	if l.Buffered() {
		t.Fatal("empty link reports a buffered frame")
	}
	two := append(frame(t, &clusterpb.Message{Msg: &clusterpb.Message_Plan{Plan: &clusterpb.Plan{Seq: 1}}}),
		frame(t, &clusterpb.Message{Msg: &clusterpb.Message_Plan{Plan: &clusterpb.Plan{Seq: 2}}})...)
	if _, err := raw.Write(two); err != nil {
		t.Fatal(err)
	}
	var m *clusterpb.Message
	for m == nil {
		waitReadable(t, l)
		var err error
		if m, err = l.TryRecv(); err != nil {
			t.Fatal(err)
		}
	}
	// One small write arrives in one read: the second frame is buffered.
	if !l.Buffered() {
		t.Fatal("second frame not reported buffered")
	}
	if m, err := l.TryRecv(); err != nil || m.GetPlan().GetSeq() != 2 {
		t.Fatalf("second frame: %v %v", m, err)
	}
	if l.Buffered() {
		t.Fatal("drained link reports a buffered frame")
	}
	// A header TryRecv will refuse counts as buffered, so that it is read.
	raw.Write(binary.BigEndian.AppendUint32(nil, MaxMessage+1))
	waitReadable(t, l)
	if _, err := l.TryRecv(); err == nil {
		t.Fatal("oversized frame accepted")
	}
	if !l.Buffered() {
		t.Fatal("an oversized header is not reported")
	}
}

// directConn is a connection whose writes go elsewhere (as the MPI bridge's
// do): it records each DirectWrite.
type directConn struct {
	*net.TCPConn
	frames chan []byte
}

func (c *directConn) DirectWrite(b []byte) error {
	c.frames <- append([]byte(nil), b...)
	return nil
}

// tcpPair returns both ends of a loopback TCP connection; the test closes
// the accepted end when it ends.
func tcpPair(t *testing.T) (*net.TCPConn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() { c, _ := ln.Accept(); acc <- c }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	raw := <-acc
	t.Cleanup(func() { raw.Close() })
	return c.(*net.TCPConn), raw
}

// TestDirectWriter: a Link over a DirectWriter sends each message as one
// whole frame through DirectWrite, never on the descriptor, and still reads
// the descriptor.
func TestDirectWriter(t *testing.T) {
	c, raw := tcpPair(t)
	dc := &directConn{TCPConn: c, frames: make(chan []byte, 4)}
	l, err := newLink(dc, Config{Secret: secret, Heartbeat: time.Hour}.WithDefaults(), "peer")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	m := &clusterpb.Message{Msg: &clusterpb.Message_Heartbeat{Heartbeat: &clusterpb.Heartbeat{}}}
	ready := &clusterpb.Message{Msg: &clusterpb.Message_Abort{Abort: &clusterpb.Abort{Msg: "direct"}}}
	if err := l.Send(ready); err != nil {
		t.Fatal(err)
	}
	if got, want := <-dc.frames, frame(t, ready); string(got) != string(want) {
		t.Errorf("DirectWrite got % x, want the frame % x", got, want)
	}
	raw.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, err := raw.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("the descriptor carried %d bytes (%v)", n, err)
	}
	// Reads still come from the descriptor.
	raw.Write(append(frame(t, m), frame(t, ready)...))
	got, err := l.Recv()
	if err != nil || got.GetAbort().GetMsg() != "direct" {
		t.Errorf("Recv = %v, %v; want the abort", got, err)
	}
	l.Close()
	if err := l.Send(ready); err == nil || len(dc.frames) != 0 {
		t.Errorf("Send on a closed link: %v, %d frames written", err, len(dc.frames))
	}
}

// expectConn records what its link tells it through Expect.
type expectConn struct {
	*net.TCPConn
	told []bool
}

func (c *expectConn) Expect(on bool) { c.told = append(c.told, on) }

// TestExpecter: a link passes changes of Expect to a connection that wants
// them (the MPI bridge), once each, ends with false at Close, and is silent
// after it.
func TestExpecter(t *testing.T) {
	c, _ := tcpPair(t)
	ec := &expectConn{TCPConn: c}
	l, err := newLink(ec, Config{Secret: secret, Heartbeat: time.Hour}.WithDefaults(), "peer")
	if err != nil {
		t.Fatal(err)
	}
	for _, on := range []bool{false, true, true, false, false, true} {
		l.Expect(on)
	}
	if got, want := fmt.Sprint(ec.told), "[true false true]"; got != want {
		t.Fatalf("told %s before Close, want %s", got, want)
	}
	l.Close()
	l.Expect(true)
	if got, want := fmt.Sprint(ec.told), "[true false true false]"; got != want {
		t.Fatalf("told %s after Close, want %s", got, want)
	}
}
