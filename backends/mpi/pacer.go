package mpi

import "time"

// pacer keeps the state that decides how often the bridge's receiver probes
// MPI, which offers no descriptor to wait on (Bridge.nap does the waiting).
//
// A conversation, a message arriving within window of the one before it,
// makes the receiver hot: until window after the latest message it probes
// every bridgeMinWait. Otherwise it is idle: each empty probe doubles the
// wait (hv_next_wait), up to a cap. A message received or sent restarts the
// doubling. A lone message, such as the heartbeat that every link sends once
// a second, starts no hot window.
type pacer struct {
	window time.Duration

	last     time.Time     // when the latest message arrived
	hotUntil time.Time     // hot until then
	wait     time.Duration // the latest idle wait; 0 restarts the doubling
}

// message records a message that arrived at now.
func (p *pacer) message(now time.Time) {
	if !p.last.IsZero() && now.Sub(p.last) < p.window {
		p.hotUntil = now.Add(p.window)
	}
	p.last, p.wait = now, 0
}

// sent records that this side sent a message, which usually asks for a
// reply: the idle doubling restarts, so the reply waits at most about as
// long again as it took to come.
func (p *pacer) sent() { p.wait = 0 }

// hot reports whether the receiver is in a hot window at now.
func (p *pacer) hot(now time.Time) bool { return now.Before(p.hotUntil) }
