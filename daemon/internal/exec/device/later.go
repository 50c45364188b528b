package device

import (
	"sync"
)

// Driver calls that may block for long (issue 26: an IPC open can take
// hundreds of milliseconds, a free waits for the device's work) never run
// on the loop goroutine, where they would stall every job's negotiation.
// The loop hands them to the GPUs' housekeeping queue (later), whose
// goroutine runs them one at a time, in the order given: a mapping's close
// queued before the same handle's next open runs first. The goroutine
// exists only while there is work, so an idle daemon has none.

// housekeeping is the queue of blocking driver calls and its goroutine.
type housekeeping struct {
	mu      sync.Mutex
	q       []func()
	running bool
	pending sync.WaitGroup // queued and not yet run
}

// later queues f to run on the housekeeping goroutine, after everything
// queued before it.
func (g *GPUs) later(f func()) {
	h := &g.hk
	h.pending.Add(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.q = append(h.q, f)
	if !h.running {
		h.running = true
		go h.run()
	}
}

// run runs the queue until it is empty.
func (h *housekeeping) run() {
	for {
		h.mu.Lock()
		if len(h.q) == 0 {
			h.running = false
			h.mu.Unlock()
			return
		}
		f := h.q[0]
		h.q[0] = nil
		h.q = h.q[1:]
		h.mu.Unlock()
		f()
		h.pending.Done()
	}
}

// Settle waits until everything queued for the housekeeping goroutine so
// far has run: the IPC handles released have been closed, the memory
// freed. The daemon calls it before it closes the GPUs; tests, to read
// counts that are final. A no-op on a CPU-only node.
func (g *GPUs) Settle() {
	if g == nil {
		return
	}
	g.hk.pending.Wait()
}

// opening is a driver handle being opened on the housekeeping goroutine: an
// IPC memory handle, an IPC event, a GPU's context. ready is closed once
// the open has ended, err (set before) says whether it failed.
type opening struct {
	ready chan struct{}
	err   error
}

func newOpening() opening { return opening{ready: make(chan struct{})} }

// done reports whether the open has ended; true for none (nil).
func (o *opening) done() bool {
	if o == nil {
		return true
	}
	select {
	case <-o.ready:
		return true
	default:
		return false
	}
}

// wait blocks until the open has ended; at once for none (nil).
func (o *opening) wait() {
	if o != nil {
		<-o.ready
	}
}

// end records the open's outcome and wakes its waiters.
func (o *opening) end(err error) {
	o.err = err
	close(o.ready)
}
