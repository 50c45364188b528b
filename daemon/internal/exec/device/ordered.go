package device

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

// GPU-ordered completion (issue 33 item 4; ../shared/GPU-PATH.md D1/D2).
//
// Host-synchronised completion, the default, waits for the GPU before each
// Done (waitStreams): the op's GPU latency, the host's wake-up and the
// client's round trip run one after another. Ordered on the GPU
// (OrderOnGPU, hvdd serve --gpu-completion stream), the executor records
// the GPU's interprocess completion event on its stream once the
// response's work is enqueued and sends the Done at once, with the event's
// handle (Done.device_event); the client's stream waits on that event
// before the result is used (as ProcessGroupNCCL's work.wait()), so no host
// synchronisation runs on the success path. Only what cannot fail for a
// remote reason completes so (orderedOK): one GPU, kernels and copies, no
// engine; and only for clients that said they wait
// (DeviceBuffer.client_waits). Failures the GPU reports later (a sticky
// CUDA error) reach the job through the watchdog, which polls the
// completion event while ordered work is outstanding and fails the job:
// the ranks' next ops get the error. Mappings of client memory close only
// after the ordered work before them has run (devMapping.Unref).

// orderedOK reports whether a response on route rt may complete ordered on
// the GPU: the mode is on, the route is one GPU's (a combine kernel or
// copies on its stream, nothing across nodes or through an engine, whose
// failures only a host wait sees), and every op's client waits on the
// event itself.
func orderedOK(on bool, rt route, clientsWait bool) bool {
	if !on || !clientsWait || rt.way != oneGPU {
		return false
	}
	return rt.op == tensor.Allreduce || rt.op == tensor.Broadcast
}

// clientsWait reports whether every local op of w said that its client
// orders its use of the result after Done.device_event.
func clientsWait(w *job.Work) bool {
	some := false
	for _, row := range w.Ops {
		for _, o := range row {
			if o == nil {
				continue
			}
			if o.Dev == nil || !devOf(o).waits {
				return false
			}
			some = true
		}
	}
	return some
}

// OrderOnGPU turns GPU-ordered completion on or off (hvdd serve
// --gpu-completion); call it before the first op. Nil-safe.
func (g *GPUs) OrderOnGPU(on bool) {
	if g != nil {
		g.ordered = on
		mode, input := "host", "stream"
		if on {
			mode = "stream"
		}
		if g.inputHostWait {
			input = "host"
		}
		g.log.Info("GPU op completion", "mode", mode, "input_wait", input)
	}
}

// doneEvent returns d's interprocess completion event, made and exported
// on first use (executor goroutine).
func (d *gpuDev) doneEvent() (*doneEv, error) {
	if de := d.done.Load(); de != nil {
		return de, nil
	}
	ev, err := d.dev.NewEvent(true)
	if err != nil {
		return nil, fmt.Errorf("GPU %s: completion event: %w", d.info.UUID, err)
	}
	h, err := ev.IpcHandle()
	if err != nil {
		ev.Destroy()
		return nil, fmt.Errorf("GPU %s: export the completion event: %w", d.info.UUID, err)
	}
	d.g.counts.exports.Add(1)
	de := &doneEv{ev: ev, h: h[:]}
	d.done.Store(de)
	return de, nil
}

// doneEv is a GPU's completion event and its IPC handle, published once
// made (gpuDev.done) for the watchdog and the housekeeping goroutine.
type doneEv struct {
	ev gpu.Event
	h  []byte
}

// finishOrdered ends a response whose work is enqueued on devs[0]'s stream
// (orderedOK): the completion event recorded after it, the watchdog told,
// each op answered with the event's handle. A response that outgrew its
// combine tables waits on the host, as host-synchronised completion does
// (the outgrown areas are freed at its end); one whose event cannot be
// made or recorded (a CUDA error) drains the GPU and fails.
func (x *Path) finishOrdered(w *job.Work, devs []*gpuDev) error {
	d := devs[0]
	de, err := d.doneEvent()
	if err == nil {
		err = de.ev.Record(d.stream)
	}
	if err != nil || len(d.tab.retired) > 0 {
		if werr := x.gpu.waitStreams(context.Background(), devs); err == nil {
			err = werr
		}
		if err != nil {
			return err
		}
		x.host.FinishBatched(w.Ops)
		return nil
	}
	if d.tab.copied {
		// A queued copy may still read the host bytes of this response's
		// new tables: the next response writes fresh ones (steady state:
		// the tables are cached on the GPU and nothing is copied).
		d.tab.host = nil
	}
	d.endResponse()
	seq := d.orderedSeq.Add(1)
	x.watch(watchItem{d: d, job: w.Job, seq: seq})
	dn := &ipcpb.Done{DeviceEvent: de.h}
	for _, row := range w.Ops {
		for _, o := range row {
			if o != nil {
				o.Finish(dn)
			}
		}
	}
	return nil
}

// watchItem is a response completed ordered on d's GPU, seq its number
// there, for the watchdog.
type watchItem struct {
	d   *gpuDev
	job *job.Job
	seq int64
}

// watchQueue bounds the responses waiting for the watchdog; past it the
// executor waits.
const watchQueue = 4096

// watch hands it to the watchdog, started on first use.
func (x *Path) watch(it watchItem) {
	if x.watchCh == nil {
		x.watchCh = make(chan watchItem, watchQueue)
		x.watchDone = make(chan struct{})
		go func() {
			defer close(x.watchDone)
			x.watchdog(x.watchCh)
		}()
	}
	x.watchCh <- it
}

// Stop ends the watchdog; the executor calls it as it stops, before the
// GPUs close (which ends whatever still runs on them).
func (x *Path) Stop() {
	if x.watchCh != nil {
		x.stopping.Store(true) // a GPU that never finishes must not hold the daemon's stop
		close(x.watchCh)
		<-x.watchDone
		x.watchCh = nil
	}
}

// The watchdog's polling: from watchFirst, doubling up to watchMax, while
// the GPU has not run the work it watches.
const (
	watchFirst = 20 * time.Microsecond
	watchMax   = time.Millisecond
)

// watchdog polls each GPU's completion event (Query, never a blocking
// wait) until the ordered work it was told about has run; a CUDA error
// fails that work's job through the loop (job.MsgExecErr), so that its
// ranks' next ops get it. It sleeps while nothing is outstanding.
func (x *Path) watchdog(ch <-chan watchItem) {
	for it := range ch {
		d := it.d
		pause := watchFirst
		for d.doneSeen.Load() < it.seq && !x.stopping.Load() {
			upTo := d.orderedSeq.Load()
			ok, err := d.done.Load().ev.Query()
			if err != nil {
				x.log.Error("GPU work completed on the GPU failed", "gpu", d.info.UUID, "err", err)
				d.asyncErr.Store(&err)
				x.p.Post(job.MsgExecErr{Job: it.job, Err: fmt.Errorf("GPU %s: work of an op completed on the GPU failed: %w", d.info.UUID, err)})
				d.doneSeen.Store(upTo)
				break
			}
			if ok {
				if upTo > d.doneSeen.Load() {
					d.doneSeen.Store(upTo)
				}
				break
			}
			time.Sleep(pause)
			pause = min(2*pause, watchMax)
		}
	}
}

// asyncFailed returns, once, the error the watchdog saw on d since the
// last response (the executor then recovers d's stream).
func (d *gpuDev) asyncFailed() error {
	if p := d.asyncErr.Swap(nil); p != nil {
		return errors.Join(errors.New("an earlier op completed on the GPU failed"), *p)
	}
	return nil
}

// waitOrdered waits, on the housekeeping goroutine, for the ordered work
// queued on d so far, before client memory it may use is unmapped.
func (d *gpuDev) waitOrdered() {
	de := d.done.Load()
	if de == nil || d.doneSeen.Load() >= d.orderedSeq.Load() {
		return
	}
	if ok, err := de.ev.Query(); ok || err != nil {
		return // run already (an error is the watchdog's to report)
	}
	d.g.counts.syncs.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	de.ev.Synchronize(ctx)
}
