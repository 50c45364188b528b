package fake

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hvdd/hvdd/gpu"
)

// work is one item of a stream's queue. run does it (quit closes when the
// context is torn down, for work that blocks); done releases what the item
// held, run or not.
type work struct {
	call string
	run  func(quit <-chan struct{}) error
	done func()
}

// stream is a fake CUDA stream: a queue that a goroutine of its own runs in
// order.
type stream struct {
	ctx    *devCtx
	exited chan struct{} // closed when the goroutine has ended

	// mu guards the fields that follow.
	mu        sync.Mutex
	q         []work
	enq, done uint64        // items enqueued and run so far
	changed   chan struct{} // closed (and replaced) when done grows or the stream ends
	wake      chan struct{} // the goroutine's doorbell (capacity 1)
	destroyed bool
}

var _ gpu.Stream = (*stream)(nil)

func (d *device) NewStream() (gpu.Stream, error) {
	c, err := d.enter("cuStreamCreate")
	if err != nil {
		return nil, err
	}
	s := &stream{ctx: c, exited: make(chan struct{}), changed: make(chan struct{}), wake: make(chan struct{}, 1)}
	c.mu.Lock()
	c.streams[s] = struct{}{}
	c.mu.Unlock()
	go s.loop()
	return s, nil
}

// asStream returns s as the fake's stream of c.
func asStream(call string, c *devCtx, s gpu.Stream) (*stream, error) {
	fs, ok := s.(*stream)
	if !ok || fs == nil {
		return nil, newErr(call, errInvalidHandle, "stream %T is not a fake stream", s)
	}
	if c != nil && fs.ctx != c {
		return nil, newErr(call, errInvalidHandle, "stream of device %d used on device %d", fs.ctx.index, c.index)
	}
	return fs, nil
}

// enqueue adds w to s; w.done runs when w has run or been dropped. On error
// w.done runs at once.
func (s *stream) enqueue(w work) error {
	if err := s.ctx.err(w.call); err != nil {
		w.done()
		return err
	}
	s.mu.Lock()
	if s.destroyed {
		s.mu.Unlock()
		w.done()
		return newErr(w.call, errInvalidHandle, "stream destroyed")
	}
	s.q = append(s.q, w)
	s.enq++
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return nil
}

// loop runs the queue until the stream is destroyed and drained, or the
// context is torn down (then the rest is dropped).
func (s *stream) loop() {
	defer close(s.exited)
	delay := s.ctx.drv.opts.MaxDelay
	for {
		s.mu.Lock()
		if len(s.q) == 0 {
			if s.destroyed {
				s.mu.Unlock()
				return
			}
			s.mu.Unlock()
			select {
			case <-s.wake:
				continue
			case <-s.ctx.quit:
				s.drop()
				return
			}
		}
		w := s.q[0]
		s.q[0] = work{}
		s.q = s.q[1:]
		s.mu.Unlock()

		select {
		case <-s.ctx.quit:
			w.done()
			s.drop()
			return
		default:
		}
		if delay > 0 {
			time.Sleep(rand.N(delay))
		}
		if lost.Load() {
			s.ctx.sticky.CompareAndSwap(nil, lostErr(w.call))
		}
		if s.ctx.sticky.Load() == nil {
			if err := w.run(s.ctx.quit); err != nil {
				e, ok := err.(*gpu.Error)
				if !ok {
					e = newErr(w.call, 719, "%v", err) // CUDA_ERROR_LAUNCH_FAILED
				}
				s.ctx.sticky.CompareAndSwap(nil, e)
			}
		}
		w.done()
		s.mu.Lock()
		s.done++
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
	}
}

// drop releases the queued work without running it (context teardown).
func (s *stream) drop() {
	s.mu.Lock()
	q := s.q
	s.q = nil
	s.destroyed = true
	s.done = s.enq
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	for _, w := range q {
		w.done()
	}
}

func (s *stream) WaitEvent(e gpu.Event) error {
	const call = "cuStreamWaitEvent"
	if err := check(call); err != nil {
		return err
	}
	ev, ok := e.(*event)
	if !ok || ev == nil {
		return newErr(call, errInvalidHandle, "event %T is not a fake event", e)
	}
	if !ev.hold() {
		return newErr(call, errInvalidHandle, "event destroyed")
	}
	r := atomic.LoadUint64(&ev.words[0])
	return s.enqueue(work{call: call, done: ev.release, run: func(quit <-chan struct{}) error {
		ev.wait(r, quit, nil)
		return nil
	}})
}

func (s *stream) Synchronize(ctx context.Context) error {
	const call = "cuStreamSynchronize"
	if err := check(call); err != nil {
		return err
	}
	s.mu.Lock()
	target := s.enq
	s.mu.Unlock()
	for {
		s.mu.Lock()
		done, ch := s.done, s.changed
		s.mu.Unlock()
		if done >= target {
			return s.ctx.err(call)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", call, ctx.Err())
		}
	}
}

func (s *stream) Destroy() error {
	const call = "cuStreamDestroy"
	if err := check(call); err != nil {
		return err
	}
	s.mu.Lock()
	if s.destroyed {
		s.mu.Unlock()
		return newErr(call, errInvalidHandle, "stream destroyed twice")
	}
	s.destroyed = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	c := s.ctx
	c.mu.Lock()
	delete(c.streams, s)
	c.mu.Unlock()
	return nil
}

// event is a fake CUDA event: words[0] counts Records, words[1] is the
// highest Record whose captured work has run. The words are in Go memory,
// or for an interprocess event in a memfd shared with other processes.
type event struct {
	ctx   *devCtx
	words *[2]uint64
	mem   []byte // the memfd's mapping (interprocess), or nil
	fd    int    // the memfd (exported interprocess event), or -1

	// mu guards the fields that follow.
	mu        sync.Mutex
	refs      int // queued waits using the words
	destroyed bool
}

var _ gpu.Event = (*event)(nil)

var eventSeq atomic.Uint64

func (d *device) NewEvent(interprocess bool) (gpu.Event, error) {
	const call = "cuEventCreate"
	c, err := d.enter(call)
	if err != nil {
		return nil, err
	}
	e := &event{ctx: c, fd: -1, words: new([2]uint64)}
	if interprocess {
		name := fmt.Sprintf("hvdd-fake-event-%d-%d", os.Getpid(), eventSeq.Add(1))
		fd, mem, err := newMemfd(name, 16)
		if err != nil {
			return nil, newErr(call, errOutOfMemory, "%v", err)
		}
		e.fd, e.mem = fd, mem
		e.words = (*[2]uint64)(unsafe.Pointer(&mem[0]))
	}
	c.mu.Lock()
	c.events[e] = struct{}{}
	c.mu.Unlock()
	return e, nil
}

func (d *device) OpenEventHandle(h gpu.IpcEventHandle) (gpu.Event, error) {
	const call = "cuIpcOpenEventHandle"
	c, err := d.enter(call)
	if err != nil {
		return nil, err
	}
	if string(h[0:8]) != evtMagic {
		return nil, newErr(call, errInvalidValue, "not a fake event handle (magic %q)", h[0:8])
	}
	for _, b := range h[16:] {
		if b != 0 {
			return nil, newErr(call, errInvalidValue, "event handle has non-zero bytes past offset 16")
		}
	}
	pid := int(binary.LittleEndian.Uint32(h[8:]))
	pfd := int(int32(binary.LittleEndian.Uint32(h[12:])))
	fd, name, size, err := openPeerFd(pid, pfd)
	if err != nil {
		return nil, newErr(call, errInvalidValue, "event handle of pid %d fd %d: %v", pid, pfd, err)
	}
	defer closeFd(fd)
	if size != 16 {
		return nil, newErr(call, errInvalidValue, "memfd %q has %d bytes, an event 16", name, size)
	}
	mem, err := mmapShared(fd, 16)
	if err != nil {
		return nil, newErr(call, errMapFailed, "%v", err)
	}
	e := &event{ctx: c, fd: -1, mem: mem, words: (*[2]uint64)(unsafe.Pointer(&mem[0]))}
	c.mu.Lock()
	c.events[e] = struct{}{}
	c.mu.Unlock()
	return e, nil
}

// hold keeps the words mapped for a queued wait; false if destroyed.
func (e *event) hold() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.destroyed {
		return false
	}
	e.refs++
	return true
}

func (e *event) release() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.refs--
	if e.destroyed && e.refs == 0 {
		e.unmap()
	}
}

func (e *event) unmap() {
	if e.mem != nil {
		unmapBytes(e.mem)
		e.mem = nil
	}
	if e.fd >= 0 {
		closeFd(e.fd)
		e.fd = -1
	}
}

// wait blocks until the work of record r has run (completed >= r), quit is
// closed or ctx ends (then it returns false).
func (e *event) wait(r uint64, quit <-chan struct{}, ctx context.Context) bool {
	var ctxDone <-chan struct{}
	if ctx != nil {
		ctxDone = ctx.Done()
	}
	for {
		c := atomic.LoadUint64(&e.words[1])
		if c >= r {
			return true
		}
		select {
		case <-quit:
			return false
		case <-ctxDone:
			return false
		default:
		}
		futexWait(&e.words[1], uint32(c), int64(20*time.Millisecond))
	}
}

// complete raises completed to k and wakes the waiters.
func (e *event) complete(k uint64) {
	for {
		c := atomic.LoadUint64(&e.words[1])
		if c >= k || atomic.CompareAndSwapUint64(&e.words[1], c, k) {
			break
		}
	}
	futexWake(&e.words[1])
}

func (e *event) Record(s gpu.Stream) error {
	const call = "cuEventRecord"
	if err := check(call); err != nil {
		return err
	}
	fs, err := asStream(call, nil, s)
	if err != nil {
		return err
	}
	if !e.hold() {
		return newErr(call, errInvalidHandle, "event destroyed")
	}
	k := atomic.AddUint64(&e.words[0], 1)
	return fs.enqueue(work{call: call, done: e.release, run: func(<-chan struct{}) error {
		e.complete(k)
		return nil
	}})
}

func (e *event) Query() (bool, error) {
	const call = "cuEventQuery"
	if err := check(call); err != nil {
		return false, err
	}
	if !e.hold() {
		return false, newErr(call, errInvalidHandle, "event destroyed")
	}
	defer e.release()
	return atomic.LoadUint64(&e.words[1]) >= atomic.LoadUint64(&e.words[0]), e.ctx.err(call)
}

func (e *event) Synchronize(ctx context.Context) error {
	const call = "cuEventSynchronize"
	if err := check(call); err != nil {
		return err
	}
	if !e.hold() {
		return newErr(call, errInvalidHandle, "event destroyed")
	}
	defer e.release()
	r := atomic.LoadUint64(&e.words[0])
	if !e.wait(r, e.ctx.quit, ctx) {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", call, ctx.Err())
		}
		return newErr(call, errInvalidContext, "device closed")
	}
	return e.ctx.err(call)
}

func (e *event) IpcHandle() (gpu.IpcEventHandle, error) {
	const call = "cuIpcGetEventHandle"
	var h gpu.IpcEventHandle
	if err := check(call); err != nil {
		return h, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.destroyed {
		return h, newErr(call, errInvalidHandle, "event destroyed")
	}
	if e.fd < 0 {
		return h, newErr(call, errInvalidValue, "event was not created interprocess (or was opened from a handle)")
	}
	copy(h[0:8], evtMagic)
	binary.LittleEndian.PutUint32(h[8:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint32(h[12:], uint32(int32(e.fd)))
	return h, nil
}

func (e *event) Destroy() error {
	const call = "cuEventDestroy"
	if err := check(call); err != nil {
		return err
	}
	if !e.destroy() {
		return newErr(call, errInvalidHandle, "event destroyed twice")
	}
	return nil
}

// destroy forgets e; its words stay mapped while queued waits use them.
func (e *event) destroy() bool {
	e.mu.Lock()
	if e.destroyed {
		e.mu.Unlock()
		return false
	}
	e.destroyed = true
	if e.refs == 0 {
		e.unmap()
	}
	e.mu.Unlock()
	e.ctx.mu.Lock()
	delete(e.ctx.events, e)
	e.ctx.mu.Unlock()
	return true
}

// Copies and memset.

func (d *device) CopyHtoD(s gpu.Stream, dst gpu.DevicePtr, src []byte) error {
	const call = "cuMemcpyHtoDAsync"
	return d.enqueueOn(call, s, func() ([]span, func(<-chan struct{}) error, error) {
		sp, err := hold(call, dst, len(src))
		return []span{sp}, func(<-chan struct{}) error { copy(sp.bytes, src); return nil }, err
	})
}

func (d *device) CopyDtoH(s gpu.Stream, dst []byte, src gpu.DevicePtr) error {
	const call = "cuMemcpyDtoHAsync"
	return d.enqueueOn(call, s, func() ([]span, func(<-chan struct{}) error, error) {
		sp, err := hold(call, src, len(dst))
		return []span{sp}, func(<-chan struct{}) error { copy(dst, sp.bytes); return nil }, err
	})
}

func (d *device) CopyDtoD(s gpu.Stream, dst, src gpu.DevicePtr, n int) error {
	const call = "cuMemcpyDtoDAsync"
	return d.enqueueOn(call, s, func() ([]span, func(<-chan struct{}) error, error) {
		a, err := hold(call, dst, n)
		if err != nil {
			return nil, nil, err
		}
		b, err := hold(call, src, n)
		if err != nil {
			return []span{a}, nil, err
		}
		return []span{a, b}, func(<-chan struct{}) error { copy(a.bytes, b.bytes); return nil }, nil
	})
}

func (d *device) Memset8(s gpu.Stream, p gpu.DevicePtr, v byte, n int) error {
	const call = "cuMemsetD8Async"
	return d.enqueueOn(call, s, func() ([]span, func(<-chan struct{}) error, error) {
		sp, err := hold(call, p, n)
		return []span{sp}, func(<-chan struct{}) error {
			for i := range sp.bytes {
				sp.bytes[i] = v
			}
			return nil
		}, err
	})
}

// enqueueOn runs the common part of a call that queues work on s: prep
// resolves the device memory (holding it) and returns the work.
func (d *device) enqueueOn(call string, s gpu.Stream, prep func() ([]span, func(<-chan struct{}) error, error)) error {
	c, err := d.enter(call)
	if err != nil {
		return err
	}
	fs, err := asStream(call, c, s)
	if err != nil {
		return err
	}
	spans, run, err := prep()
	done := func() {
		for _, sp := range spans {
			sp.release()
		}
	}
	if err != nil {
		done()
		return err
	}
	return fs.enqueue(work{call: call, run: run, done: done})
}
