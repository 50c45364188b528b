package hvdd

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/hvdd/hvdd/ipc"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// StatusConn is a connection to a daemon that asks for its status (what
// `hvdd status` shows): its jobs, their ranks, the tensors they wait on,
// recent errors and its links. It joins no job. Not safe for concurrent use.
type StatusConn struct {
	ic *ipc.Conn
	id uint32
}

// DialStatus connects to the daemon at socket (empty: $HVDD_SOCKET, else the
// default path) for status requests.
func DialStatus(ctx context.Context, socket string) (*StatusConn, error) {
	path := ipc.SocketPath(socket)
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("hvdd: no daemon answers on %s: %w (start one with hvdd serve, or pass --socket)", path, err)
	}
	ic, err := ipc.NewConn(c.(*net.UnixConn))
	if err != nil {
		c.Close()
		return nil, err
	}
	return &StatusConn{ic: ic}, nil
}

// Status asks for the daemon's status, listing at most maxPending pending
// tensors per job (0: the daemon's default).
func (s *StatusConn) Status(ctx context.Context, maxPending int) (*ipcpb.Status, error) {
	s.id++
	req := &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Status{Status: &ipcpb.StatusRequest{MaxPending: int32(maxPending)}}}
	if err := s.ic.WriteClient(s.id, req, -1); err != nil {
		return nil, fmt.Errorf("hvdd: status request: %w", err)
	}
	for {
		id, m, err := s.ic.ReadServer(ctx)
		if err != nil {
			return nil, fmt.Errorf("hvdd: status: %w", err)
		}
		if f := m.GetFatal(); f != nil {
			return nil, &Error{Code: f.GetCode(), Msg: f.GetError()}
		}
		if st := m.GetStatus(); st != nil && id == s.id {
			return st, nil
		}
		if m.GetStatus() == nil {
			return nil, errors.New("hvdd: the daemon answered a status request with something else (an older daemon?)")
		}
	}
}

// Close closes the connection.
func (s *StatusConn) Close() error { return s.ic.Close() }
