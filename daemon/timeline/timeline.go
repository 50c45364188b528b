// Package timeline writes Horovod's timeline: a Chrome trace-event file
// (chrome://tracing, Perfetto) of what a job's collectives did, tensor by
// tensor.
//
// A Writer takes events from any goroutine without blocking on the disk:
// they are appended to a list of pending events under a mutex, and one
// writer goroutine, which owns the file, swaps the list out and writes it.
// When Options.Buffer events are pending, more are dropped and counted
// (Dropped), so that the daemon's loop never waits for the disk. The writer
// goroutine is not woken per event (a futex call and a thread wake-up per
// event of a quiet burst): it wakes every FlushEvery, writes what has queued
// as one batch, and sleeps again, so an event costs its sender a clock read
// and an append in a critical section that the writer holds only to swap
// the list (cheaper, for sender and writer alike, than the buffered channel
// this was first: BenchmarkResNetStep). Timestamps are microseconds since
// the Writer was created, on the monotonic clock; the file's first record
// carries that start as start_time_since_epoch_in_micros, as Horovod's does.
//
// The file has Horovod's layout: each tensor is a "process" (pid), named by
// a process_name metadata event when it first appears, so that every tensor
// gets its own row; phases are B/E pairs, a rank's readiness an X event of
// no duration named by the rank, and markers (CYCLE_START) global instant
// events. The file is a JSON array that is complete after every batch the
// writer goroutine writes, not only after Close: the writer ends each batch
// with "]" and overwrites it with the next. Each record sits on a line of
// its own, so a file cut short by a crash parses once its last partial line
// is dropped and "]" is appended (both viewers also accept the array left
// open).
//
// The package knows nothing of negotiation: the caller decides which events
// to write (Horovod's NegotiateStart, ActivityStart, ... live in the daemon).
package timeline

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Phase is a trace event's phase ("ph").
type Phase byte

// The phases the timeline writes.
const (
	Begin    Phase = 'B' // a phase starts on the tensor's row
	End      Phase = 'E' // the innermost open phase of the row ends
	Complete Phase = 'X' // an instant tick of no duration (a rank's readiness)
)

// DefaultBuffer is the events a Writer holds for its goroutine when
// Options.Buffer is zero: at most about 2 MiB.
const DefaultBuffer = 1 << 15

// FlushEvery is how often the writer goroutine writes what has queued. At
// the rate of a busy job (about 100,000 events a second: ResNet-50's 161
// tensors take 8 events each per step of a few ms) a period holds about
// 1,000 events, well under DefaultBuffer.
const FlushEvery = 10 * time.Millisecond

// Options tunes a Writer.
type Options struct {
	// Buffer is how many events may wait for the writer goroutine before
	// more are dropped. Zero means DefaultBuffer.
	Buffer int
}

type kind uint8

const (
	kindEvent kind = iota
	kindMarker
	kindSync
)

// record is one event on its way to the writer goroutine.
type record struct {
	kind   kind
	ph     Phase
	rank   int32 // Complete events without a name: the rank they name
	tid    int32 // the row's track: 0, or another node's (EventAt)
	ts     int64
	tensor string
	name   string
	ack    chan struct{} // kindSync
}

// A Writer writes one timeline file. Event, Mark, Now and Dropped are safe
// for concurrent use; Close and CloseAsync may be called once.
type Writer struct {
	path    string
	start   time.Time
	limit   int           // Options.Buffer: pending events beyond it are dropped
	kick    chan struct{} // Sync: write now rather than at the next tick
	stop    chan struct{}
	done    chan struct{} // closed once the file is closed
	err     error         // the writer goroutine's first error; read after done
	dropped atomic.Uint64

	// mu guards pending: the records sent and not yet taken by the writer
	// goroutine, in order.
	mu      sync.Mutex
	pending []record

	// The fields below belong to the writer goroutine.
	spare   []record // the last batch's array, reused as the next pending list
	f       *os.File
	bw      *bufio.Writer
	tensors map[string]int  // pid by tensor name, from 1
	tracks  map[[2]int]bool // (pid, tid) pairs named so far (tid > 0)
	open    bool            // the file ends with the terminator, to be overwritten
	scratch []byte          // the record being formatted
}

// terminator ends the array after each batch; the next batch overwrites it.
const terminator = "\n]\n"

// Create truncates or creates the file at path and starts its writer
// goroutine.
func Create(path string, opts Options) (*Writer, error) {
	w, err := create(path, opts)
	if err != nil {
		return nil, err
	}
	go w.run()
	return w, nil
}

// create is Create without the writer goroutine.
func create(path string, opts Options) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("timeline: %w", err)
	}
	n := opts.Buffer
	if n <= 0 {
		n = DefaultBuffer
	}
	w := &Writer{
		path:    path,
		start:   time.Now(),
		limit:   n,
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		f:       f,
		bw:      bufio.NewWriterSize(f, 64<<10),
		tensors: make(map[string]int),
		tracks:  make(map[[2]int]bool),
	}
	w.bw.WriteString("[\n")
	fmt.Fprintf(w.bw, `{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "hvdd", "start_time_since_epoch_in_micros": %d}}`, w.start.UnixMicro())
	w.bw.WriteString(",\n")
	w.bw.WriteString(`{"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}}`)
	w.terminate()
	return w, nil
}

// Path is the file the Writer writes.
func (w *Writer) Path() string { return w.path }

// Now is the timeline's clock: microseconds since the Writer was created.
func (w *Writer) Now() int64 { return time.Since(w.start).Microseconds() }

// Event writes a phase event on tensor's row, stamped now. name is the
// phase (NEGOTIATE_ALLREDUCE, ALLREDUCE, MEMCPY_IN_FUSION_BUFFER, ...);
// End events need none. It never blocks: with the buffer full the event is
// dropped.
func (w *Writer) Event(tensor string, ph Phase, name string) {
	w.send(record{kind: kindEvent, ph: ph, tensor: tensor, name: name, ts: w.Now()})
}

// EventAt writes a phase event on track tid (> 0) of tensor's row, stamped
// ts on this Writer's clock (Now): the phases another node ran, which it
// timed itself. A track is named "node <tid>" where it first appears, so
// that viewers show each node's phases under the row's own (track 0), which
// keeps its Begin/End nesting.
func (w *Writer) EventAt(tensor string, ph Phase, name string, ts int64, tid int) {
	w.send(record{kind: kindEvent, ph: ph, tensor: tensor, name: name, ts: ts, tid: int32(tid)})
}

// RankReady writes Horovod's tick for rank's readiness on tensor's row: a
// Complete event named by the rank.
func (w *Writer) RankReady(tensor string, rank int) {
	w.send(record{kind: kindEvent, ph: Complete, tensor: tensor, rank: int32(rank), ts: w.Now()})
}

// Mark writes a global instant event (CYCLE_START), stamped now.
func (w *Writer) Mark(name string) {
	w.send(record{kind: kindMarker, name: name, ts: w.Now()})
}

func (w *Writer) send(r record) {
	w.mu.Lock()
	if len(w.pending) >= w.limit {
		w.mu.Unlock()
		w.dropped.Add(1)
		return
	}
	w.pending = append(w.pending, r)
	w.mu.Unlock()
}

// Dropped is the number of events dropped so far because the buffer was
// full.
func (w *Writer) Dropped() uint64 { return w.dropped.Load() }

// Sync blocks until every event sent before it is in the file, which is then
// a complete JSON array. It returns the writer's error, if any; after Close
// it returns at once.
func (w *Writer) Sync() error {
	select {
	case <-w.done:
		return w.err
	default:
	}
	// Never dropped: it holds no event, and its sender waits for it.
	ack := make(chan struct{})
	w.mu.Lock()
	w.pending = append(w.pending, record{kind: kindSync, ack: ack})
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default: // a kick is already pending
	}
	select {
	case <-ack:
		return nil
	case <-w.done:
		return w.err
	}
}

// CloseAsync stops the Writer: the events already sent are written, the file
// is closed, and then done (if not nil) is called on the writer goroutine
// with the first error writing the file. Events sent after CloseAsync may be
// lost.
func (w *Writer) CloseAsync(done func(error)) {
	go func() {
		<-w.done
		if done != nil {
			done(w.err)
		}
	}()
	close(w.stop)
}

// Close stops the Writer as CloseAsync does and waits until the file is
// closed.
func (w *Writer) Close() error {
	close(w.stop)
	<-w.done
	return w.err
}

// run is the writer goroutine: every FlushEvery (or at once for Sync) it
// writes what has queued.
func (w *Writer) run() {
	defer close(w.done)
	tick := time.NewTicker(FlushEvery)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-w.kick:
		case <-w.stop:
			// Write what is already queued, then close.
			w.drain()
			if err := w.f.Close(); err != nil && w.err == nil {
				w.err = fmt.Errorf("timeline: close %s: %w", w.path, err)
			}
			return
		}
		w.drain()
	}
}

// drain writes what has queued as one batch, if anything has: the pending
// list as it is now (not what keeps arriving, so that a busy job still gets
// its file completed each period), swapped for the last batch's emptied
// array.
func (w *Writer) drain() {
	w.mu.Lock()
	batch := w.pending
	if len(batch) == 0 {
		w.mu.Unlock()
		return
	}
	w.pending = w.spare[:0]
	w.mu.Unlock()
	w.batch(batch)
	clear(batch) // let the names go
	w.spare = batch[:0]
}

// batch writes rs, then ends the array and acknowledges the Syncs among
// them.
func (w *Writer) batch(rs []record) {
	var acks []chan struct{}
	for _, r := range rs {
		if r.kind == kindSync {
			acks = append(acks, r.ack)
		} else {
			w.write(r)
		}
	}
	w.terminate()
	for _, a := range acks {
		close(a)
	}
}

// write appends one record (after its tensor's metadata, the first time).
func (w *Writer) write(r record) {
	if w.err != nil {
		return
	}
	if w.open {
		// Overwrite the terminator of the last batch.
		if _, err := w.f.Seek(-int64(len(terminator)), io.SeekCurrent); err != nil {
			w.fail(err)
			return
		}
		w.open = false
	}
	b := append(w.scratch[:0], ",\n"...)
	switch r.kind {
	case kindMarker:
		b = append(b, `{"name": `...)
		b = appendString(b, r.name)
		b = append(b, `, "ph": "i", "s": "g", "pid": 0, "ts": `...)
		b = strconv.AppendInt(b, r.ts, 10)
		b = append(b, '}')
	case kindEvent:
		pid, ok := w.tensors[r.tensor]
		if !ok {
			pid = len(w.tensors) + 1
			w.tensors[r.tensor] = pid
			b = append(b, `{"name": "process_name", "ph": "M", "pid": `...)
			b = strconv.AppendInt(b, int64(pid), 10)
			b = append(b, `, "args": {"name": `...)
			b = appendString(b, r.tensor)
			b = append(b, "}},\n"...)
			b = append(b, `{"name": "process_sort_index", "ph": "M", "pid": `...)
			b = strconv.AppendInt(b, int64(pid), 10)
			b = append(b, `, "args": {"sort_index": `...)
			b = strconv.AppendInt(b, int64(pid), 10)
			b = append(b, "}},\n"...)
		}
		if r.tid > 0 && !w.tracks[[2]int{pid, int(r.tid)}] {
			w.tracks[[2]int{pid, int(r.tid)}] = true
			b = append(b, `{"name": "thread_name", "ph": "M", "pid": `...)
			b = strconv.AppendInt(b, int64(pid), 10)
			b = append(b, `, "tid": `...)
			b = strconv.AppendInt(b, int64(r.tid), 10)
			b = append(b, `, "args": {"name": "node `...)
			b = strconv.AppendInt(b, int64(r.tid), 10)
			b = append(b, "\"}},\n"...)
		}
		b = append(b, `{"ph": "`...)
		b = append(b, byte(r.ph))
		b = append(b, '"')
		if r.ph != End {
			b = append(b, `, "name": `...)
			if r.ph == Complete && r.name == "" {
				b = append(b, '"')
				b = strconv.AppendInt(b, int64(r.rank), 10)
				b = append(b, '"')
			} else {
				b = appendString(b, r.name)
			}
		}
		b = append(b, `, "ts": `...)
		b = strconv.AppendInt(b, r.ts, 10)
		b = append(b, `, "pid": `...)
		b = strconv.AppendInt(b, int64(pid), 10)
		if r.tid > 0 {
			b = append(b, `, "tid": `...)
			b = strconv.AppendInt(b, int64(r.tid), 10)
		}
		if r.ph == Complete {
			b = append(b, `, "dur": 0`...)
		}
		b = append(b, '}')
	}
	w.bw.Write(b)
	w.scratch = b
}

// terminate ends the array and writes the batch to the file.
func (w *Writer) terminate() {
	if w.err != nil || w.open {
		return
	}
	w.bw.WriteString(terminator)
	if err := w.bw.Flush(); err != nil {
		w.fail(err)
		return
	}
	w.open = true
}

func (w *Writer) fail(err error) {
	w.err = fmt.Errorf("timeline: write %s: %w", w.path, err)
}

// appendString appends s as a JSON string.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
