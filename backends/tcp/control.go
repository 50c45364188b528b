package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hvdd/hvdd/backends"
)

// Every pair of ranks shares one control connection (stream 0) beside its
// data connections. It carries fixed 8-byte frames:
//
//	kind u8 | reason u8 | 0 u16 | rank i32 (big-endian)
//
// A heartbeat (kind 1) every Config.Heartbeat says "still here"; its reader
// declares the peer lost after Config.PeerTimeout of silence, which catches
// hung hosts and dead links that never close a socket. A bye (kind 2) is the
// last frame a rank sends: it says why the rank stops (closed, aborted, or
// failed because it lost some rank). A bye that names a lost rank lets every
// survivor blame the rank that really failed, rather than the neighbour whose
// data connection broke first.

const ctrlLen = 8

const (
	ctrlHeartbeat = 1
	ctrlBye       = 2
)

// Reasons carried by a bye.
const (
	byeClosed  = 1 // Close was called
	byeAborted = 2 // a collective was cancelled or called with bad arguments
	byeLost    = 3 // the sender lost the rank named in the frame
	byeDropped = 4 // the rank named in the frame declared the sender lost
)

type ctrlMsg struct {
	kind, reason byte
	rank         int
}

func (m ctrlMsg) marshal() []byte {
	var f [ctrlLen]byte
	f[0], f[1] = m.kind, m.reason
	binary.BigEndian.PutUint32(f[4:], uint32(int32(m.rank)))
	return f[:]
}

// parseCtrl decodes a control frame; it never panics.
func parseCtrl(f []byte) (ctrlMsg, error) {
	if len(f) != ctrlLen {
		return ctrlMsg{}, fmt.Errorf("control frame of %d bytes", len(f))
	}
	m := ctrlMsg{kind: f[0], reason: f[1], rank: int(int32(binary.BigEndian.Uint32(f[4:])))}
	switch {
	case f[2] != 0 || f[3] != 0:
		return ctrlMsg{}, errors.New("control frame padding is not zero")
	case m.kind == ctrlHeartbeat && (m.reason != 0 || m.rank != 0):
		return ctrlMsg{}, errors.New("malformed heartbeat")
	case m.kind == ctrlBye && (m.reason < byeClosed || m.reason > byeDropped):
		return ctrlMsg{}, fmt.Errorf("bye with unknown reason %d", m.reason)
	case m.kind != ctrlHeartbeat && m.kind != ctrlBye:
		return ctrlMsg{}, fmt.Errorf("unknown control frame kind %d", m.kind)
	}
	return m, nil
}

// errDropped marks the failure of a rank that a peer declared lost.
var errDropped = errors.New("a peer declared this rank lost")

// byeFor is the bye this rank sends to p when it fails with err.
func (b *engine) byeFor(err error, p *peer) ctrlMsg {
	var pe *backends.PeerError
	switch {
	case errors.Is(err, errDropped):
		// The group gave up on us (a hung or partitioned rank); we must
		// not pass our view of who failed on as if it were news, only who
		// dropped us, so that a peer that hears of it from us first blames
		// us as the dropper's own bye would ("reported lost by").
		if errors.As(err, &pe) {
			return ctrlMsg{kind: ctrlBye, reason: byeDropped, rank: pe.Rank}
		}
		return ctrlMsg{kind: ctrlBye, reason: byeAborted}
	case errors.As(err, &pe):
		// A rank we lost, or one whose loss made us close (CloseLost).
		return ctrlMsg{kind: ctrlBye, reason: byeLost, rank: pe.Rank}
	case errors.Is(err, backends.ErrClosed):
		// The count of collectives finished with p rides in the rank field.
		return ctrlMsg{kind: ctrlBye, reason: byeClosed, rank: int(int32(p.completed.Load()))}
	}
	return ctrlMsg{kind: ctrlBye, reason: byeAborted}
}

// byeError turns a bye from rank from into this rank's failure.
func (b *engine) byeError(from int, m ctrlMsg) error {
	switch {
	case m.reason == byeLost && m.rank != b.rank && m.rank >= 0 && m.rank < b.size && m.rank != from:
		return &backends.PeerError{Rank: m.rank, Err: fmt.Errorf("reported lost by rank %d", from)}
	case m.reason == byeLost:
		return &backends.PeerError{Rank: from, Err: fmt.Errorf("%w (rank %d lost rank %d)", errDropped, from, m.rank)}
	case m.reason == byeClosed:
		return &backends.PeerError{Rank: from, Err: errPeerClosed}
	case m.reason == byeDropped && m.rank >= 0 && m.rank < b.size && m.rank != from:
		return &backends.PeerError{Rank: from, Err: fmt.Errorf("reported lost by rank %d", m.rank)}
	}
	return &backends.PeerError{Rank: from, Err: errors.New("peer aborted a collective")}
}

// readControl reads p's control connection until it breaks, turning
// silence, errors and byes into the backend's failure.
func (b *engine) readControl(p *peer, c net.Conn) {
	defer b.wg.Done()
	var f [ctrlLen]byte
	for {
		c.SetReadDeadline(time.Now().Add(b.cfg.PeerTimeout))
		_, err := io.ReadFull(c, f[:])
		if b.failure() != nil {
			return // we stopped first; whatever the peer does no longer matters
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				err = fmt.Errorf("no heartbeat for %v", b.cfg.PeerTimeout)
			} else {
				err = fmt.Errorf("control connection: %w", err)
			}
			b.fail(&backends.PeerError{Rank: p.rank, Err: err})
			return
		}
		m, err := parseCtrl(f[:])
		if err != nil {
			b.fail(&backends.PeerError{Rank: p.rank, Err: fmt.Errorf("control connection: %w", err)})
			return
		}
		if m.kind == ctrlBye {
			if m.reason == byeClosed {
				// An orderly close, typically right after the last
				// collective of a job. If the peer finished the
				// collective we are in, what it sent is still on the
				// data connections: let that one complete. A later
				// collective fails at its start (do). Only a collective
				// in progress that the peer never took part in fails
				// now, before it waits for bytes that will not come.
				// Between collectives nothing fails: this rank may be
				// done too, and a failure would tell the other peers,
				// still finishing their last collective, that this one
				// was lost.
				done := int64(uint32(int32(m.rank)))
				p.doneAt.Store(done)
				if a := p.active.Load(); a > done {
					b.fail(b.byeError(p.rank, m))
				} else {
					b.log.Debug("peer closed its backend", "peer", p.rank, "after", done, "our_current", a)
				}
				return
			}
			b.fail(b.byeError(p.rank, m))
			return
		}
	}
}

// heartbeat sends a heartbeat to every connected peer each Config.Heartbeat
// until the backend fails. Write errors are left to the control readers,
// which see the same broken connection.
func (b *engine) heartbeat() {
	defer b.wg.Done()
	t := time.NewTicker(b.cfg.Heartbeat)
	defer t.Stop()
	beat := ctrlMsg{kind: ctrlHeartbeat}.marshal()
	for {
		select {
		case <-b.failed:
			return
		case <-b.noBeat: // tests: simulate a hung host
			return
		case <-t.C:
		}
		for _, p := range b.peers {
			if p != nil {
				p.sendCtrl(beat, b.cfg.PeerTimeout)
			}
		}
	}
}

// errPeerClosed is a peer's orderly close (its job ended); the survivors fail
// their later calls with it, but it is no fault worth a warning.
var errPeerClosed = errors.New("peer closed its backend")
