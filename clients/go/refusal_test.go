package hvdd

import (
	"context"
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hvdd/hvdd/ipc"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// TestRefusalBeforeHello: the daemon refused this process (a Fatal, then the
// connection closed) before the client's handshake wrote anything. The
// write fails, and Init must report the daemon's reason, not the closed
// connection; the two raced in CI (TestMultiNodeWrongSecret).
func TestRefusalBeforeHello(t *testing.T) {
	c, fd := clientPair(t)
	daemon, err := ipc.NewConnFD(fd)
	if err != nil {
		t.Fatal(err)
	}
	const why = "node 1 could not join the job: authentication failed"
	if err := daemon.WriteServer(0, &ipcpb.ServerMessage{Msg: &ipcpb.ServerMessage_Fatal{Fatal: &ipcpb.Fatal{
		Code: ipcpb.Code_CODE_ABORTED, Error: why}}}, -1); err != nil {
		t.Fatal(err)
	}
	daemon.Close()
	err = c.handshake(context.Background(), 0)
	var herr *Error
	if !errors.As(err, &herr) || herr.Code != ipcpb.Code_CODE_ABORTED || !strings.Contains(herr.Msg, why) {
		t.Fatalf("handshake returned %v; want the daemon's refusal %q", err, why)
	}
}

// TestClosedBeforeHello: a daemon that closed the connection without a
// Fatal leaves the client with the closed connection as its error.
func TestClosedBeforeHello(t *testing.T) {
	c, fd := clientPair(t)
	unix.Close(fd)
	if err := c.handshake(context.Background(), 0); !errors.Is(err, ipc.ErrClosed) {
		t.Fatalf("handshake returned %v; want the closed connection", err)
	}
}

// clientPair returns a client not yet handshaken, connected to the other
// end of a socket pair, which the test plays as the daemon.
func clientPair(t *testing.T) (*Client, int) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := &Client{ArenaSize: 1 << 20}
	if c.ic, err = ipc.NewConnFD(fds[0]); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.ic.Close() })
	return c, fds[1]
}
