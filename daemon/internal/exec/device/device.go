package device

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/daemon/internal/exec/host"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/timeline"
	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

// Path runs responses with GPU tensors: natively in device memory,
// or staged through host memory onto the host path.
type Path struct {
	log  *slog.Logger
	gpu  *GPUs // nil on a CPU-only node
	host *host.Path
	// gpuPaths are the GPU paths used so far (gpuPath).
	gpuPaths map[string]bool
}

// nativeOK reports whether w can run on a native path: every op of this
// node is a non-empty device tensor, and every row has ops at the same
// positions (rows of other nodes' ranks, and of joined ranks, are nil in
// all of them), at least one.
func nativeOK(w *job.Work) bool {
	var first []int
	for i, row := range w.Ops {
		var pos []int
		for at, o := range row {
			if o == nil {
				continue
			}
			if o.Dev == nil || devOf(o).n == 0 {
				return false
			}
			pos = append(pos, at)
		}
		if i == 0 {
			first = pos
		} else if !slices.Equal(pos, first) {
			return false
		}
	}
	return len(first) > 0
}

// ncclDType reports whether NCCL reduces dt.
func ncclDType(dt tensor.DType) bool {
	switch dt {
	case tensor.Int16, tensor.Uint16, tensor.Bool:
		return false
	}
	return true
}

// New returns the device path over gpus (nil on a CPU-only
// node), staging onto host.
func New(log *slog.Logger, gpus *GPUs, host *host.Path) *Path {
	return &Path{log: log, gpu: gpus, host: host}
}

// Execute runs a response with GPU tensors in it.
func (x *Path) Execute(w job.Work) {
	g := x.gpu
	r := &w.Resp
	if g != nil && !g.hostOnly && nativeOK(&w) {
		devs := usedDevs(&w)
		multiGPU := len(devs) > 1
		nccl := !multiGPU || g.nccl != nil
		switch {
		case r.Op == tensor.Allreduce && r.ReduceOp != tensor.Adasum && nccl && (!multiGPU || ncclDType(r.DType)):
			if w.Engine != nil {
				x.gpuPath("hierarchical allreduce")
			} else {
				x.gpuPath("device allreduce")
			}
			x.runNative(w, devs, x.allreduceDevice)
			return
		case r.Op == tensor.Broadcast && crossNodes(&w):
			// Through the engine and host memory, each GPU fed from there:
			// no NCCL needed.
			x.gpuPath("hierarchical broadcast")
			x.runNative(w, devs, x.broadcastDevice)
			return
		case r.Op == tensor.Broadcast && nccl:
			x.gpuPath("device broadcast")
			x.runNative(w, devs, x.broadcastDevice)
			return
		case (r.Op == tensor.Allgather || r.Op == tensor.Alltoall || r.Op == tensor.Reducescatter) && w.Engine == nil && !multiGPU && noJoined(&w):
			x.gpuPath("device " + strings.ToLower(r.Op.String()))
			x.runOutputs(w, devs)
			return
		case r.Op == tensor.Allgather && crossNodes(&w) && len(r.JoinedRanks) == 0:
			x.gpuPath("hierarchical allgather")
			x.runOutputs(w, devs)
			return
		case r.Op == tensor.Alltoall && crossNodes(&w) && len(r.JoinedRanks) == 0:
			x.gpuPath("hierarchical alltoall")
			x.runOutputs(w, devs)
			return
		case r.Op == tensor.Reducescatter && crossNodes(&w) && len(r.JoinedRanks) == 0 && nccl && (!multiGPU || ncclDType(r.DType)):
			x.gpuPath("hierarchical reducescatter")
			x.runOutputs(w, devs)
			return
		case r.Op == tensor.Allgather && w.Engine == nil && multiGPU && g.nccl != nil && noJoined(&w):
			x.gpuPath("device allgather over GPUs")
			x.runOutputs(w, devs)
			return
		case r.Op == tensor.Alltoall && w.Engine == nil && multiGPU && g.nccl != nil && noJoined(&w):
			x.gpuPath("device alltoall over GPUs")
			x.runOutputs(w, devs)
			return
		case r.Op == tensor.Reducescatter && w.Engine == nil && multiGPU && g.nccl != nil && noJoined(&w) && ncclDType(r.DType):
			x.gpuPath("device reducescatter over GPUs")
			x.runOutputs(w, devs)
			return
		}
	}
	x.gpuPath("staged " + strings.ToLower(r.Op.String()))
	if err := x.stageIn(&w); err != nil {
		x.deviceFailed(w, err)
		return
	}
	x.host.Execute(w)
}

// gpuPath logs the first use of each way of running GPU tensors (tests
// check that the path they mean to exercise ran).
func (x *Path) gpuPath(p string) {
	if x.gpuPaths[p] {
		return
	}
	if x.gpuPaths == nil {
		x.gpuPaths = make(map[string]bool)
	}
	x.gpuPaths[p] = true
	x.log.Debug("GPU path taken", "path", p)
}

// noJoined reports whether every rank of w has its op (no nil row entry).
func noJoined(w *job.Work) bool {
	for _, row := range w.Ops {
		if slices.Contains(row, nil) {
			return false
		}
	}
	return true
}

// usedDevs lists the GPUs w's ops are on, in the daemon's order.
func usedDevs(w *job.Work) []*gpuDev {
	seen := make(map[*gpuDev]bool)
	var out []*gpuDev
	for _, row := range w.Ops {
		for _, o := range row {
			if o != nil && o.Dev != nil && !seen[devOf(o).d] {
				seen[devOf(o).d] = true
				out = append(out, devOf(o).d)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].idx < out[j].idx })
	return out
}

// runNative runs a native path and answers the ops.
func (x *Path) runNative(w job.Work, devs []*gpuDev, f func(ctx context.Context, w job.Work, devs []*gpuDev) error) {
	if w.Trace != nil {
		// The response's top-level phase ends once every rank is answered
		// (on one node, its Begin came from tracer.responded too).
		defer host.TraceAll(w.Trace, &w.Resp, timeline.End, "")
		host.TraceAll(w.Trace, &w.Resp, timeline.Begin, "GPU_"+host.Activity(&w.Resp))
		defer host.TraceAll(w.Trace, &w.Resp, timeline.End, "")
	}
	if err := f(context.Background(), w, devs); err != nil {
		x.deviceFailed(w, err)
		return
	}
	x.host.FinishBatched(w.Ops)
}

// deviceFailed answers w's ops after a failure: on one node with
// CODE_INTERNAL; across nodes through the loop, which fails the job (the
// other nodes wait in the engine for this one).
func (x *Path) deviceFailed(w job.Work, err error) {
	r := &w.Resp
	var ge *gpu.Error
	if errors.As(err, &ge) {
		// A CUDA or NCCL error may leave streams and communicators
		// unusable: start the next job with new ones.
		for _, d := range usedDevs(&w) {
			d.recover()
		}
		if strings.HasPrefix(ge.Call, "nccl") {
			x.gpu.abortComms()
		}
	}
	msg := fmt.Sprintf("%v of %d GPU tensor(s) failed: %v", r.Op, len(r.Tensors), err)
	if n, ok := backends.LostRank(err); ok {
		msg = fmt.Sprintf("node %d%s was lost during %v: %v", n, w.Job.Members.RankRange(n), r.Op, err)
	}
	x.log.Error("GPU collective failed", "op", r.Op, "tensors", len(r.Tensors), "err", err)
	if w.Engine != nil && len(w.View.Nodes) > 1 {
		x.host.P.Post(job.MsgExecErr{Job: w.Job, Err: errors.New(msg), Ops: w.Ops, Closed: errors.Is(err, backends.ErrClosed)})
		return
	}
	for _, row := range w.Ops {
		for _, o := range row {
			if o != nil && o.Dev != nil {
				devOf(o).staged = nil // nothing to copy back
			}
		}
	}
	job.FinishRows(w.Ops, &ipcpb.Done{Code: ipcpb.Code_CODE_INTERNAL, Error: msg})
}

// waitEvents makes each GPU's stream wait for the client events of the ops
// on it (each event once).
func waitEvents(w *job.Work) error {
	seen := make(map[*devEvent]bool)
	for _, row := range w.Ops {
		for _, o := range row {
			if o == nil || o.Dev == nil || devOf(o).ev == nil || seen[devOf(o).ev] {
				continue
			}
			seen[devOf(o).ev] = true
			if err := devOf(o).d.stream.WaitEvent(devOf(o).ev.ev); err != nil {
				return fmt.Errorf("GPU %s: wait for the client's event: %w", devOf(o).d.info.UUID, err)
			}
		}
	}
	return nil
}

// syncAll synchronises the streams of devs, all of them even after an
// error (no work may be left running on clients' memory).
func syncAll(ctx context.Context, devs []*gpuDev) error {
	var errs []error
	for _, d := range devs {
		if err := d.sync(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// stageIn copies every device tensor of w to host memory (after its event)
// and points the op's buf at the copy, for the CPU path.
func (x *Path) stageIn(w *job.Work) error {
	devs := usedDevs(w)
	if err := waitEvents(w); err != nil {
		return err
	}
	var err error
	for _, row := range w.Ops {
		for _, o := range row {
			if o == nil || o.Dev == nil || devOf(o).n == 0 {
				continue
			}
			host := make([]byte, devOf(o).n)
			if err = devOf(o).d.dev.CopyDtoH(devOf(o).d.stream, host, devOf(o).ptr); err != nil {
				break
			}
			o.Buf, devOf(o).staged = host, host
		}
		if err != nil {
			break
		}
	}
	if serr := syncAll(context.Background(), devs); err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("staging GPU tensors through host memory: %w", err)
	}
	return nil
}

// unstage finishes a staged op before its Done goes out: the in-place
// result goes back to the client's device memory; an output the CPU path
// put in a granted host region goes to a daemon device allocation that the
// Done exports (device_output). Runs on the executor goroutine.
func unstage(o *job.Op, d *ipcpb.Done) *ipcpb.Done {
	dv := devOf(o)
	staged := dv.staged
	dv.staged = nil
	if d.GetCode() != ipcpb.Code_CODE_OK {
		return d
	}
	fail := func(err error) *ipcpb.Done {
		dv.d.recover()
		dv.cg.Log.Error("GPU copy-back failed", "tensor", o.Name, "gpu", dv.d.info.UUID, "err", err)
		return &ipcpb.Done{Code: ipcpb.Code_CODE_INTERNAL, Error: fmt.Sprintf("tensor %q: GPU %s: copy the result back: %v", o.Name, dv.d.info.UUID, err)}
	}
	switch {
	case d.Output != nil:
		out, err := o.Conn.OutputBytes(d.Output)
		if err != nil {
			return fail(err)
		}
		db, err := deviceOutput(dv.cg, dv.d, out)
		o.Conn.ReleaseOutput(d.Output)
		if err != nil {
			return fail(err)
		}
		nd := proto.Clone(d).(*ipcpb.Done)
		nd.Output, nd.DeviceOutput = nil, db
		return nd
	case o.Type == tensor.Allreduce || o.Type == tensor.Broadcast:
		if dv.n == 0 {
			return d
		}
		if err := dv.d.dev.CopyHtoD(dv.d.stream, dv.ptr, staged); err != nil {
			dv.d.sync(context.Background())
			return fail(err)
		}
		if err := dv.d.sync(context.Background()); err != nil {
			return fail(err)
		}
	}
	return d
}

// deviceOutput copies out into a new allocation on d, exported to the
// client until it sends Release with its handle.
func deviceOutput(cg *ConnGPU, d *gpuDev, out []byte) (*ipcpb.DeviceBuffer, error) {
	db := &ipcpb.DeviceBuffer{DeviceUuid: d.info.UUID, Length: uint64(len(out))}
	if len(out) == 0 {
		return db, nil
	}
	p, err := d.dev.Alloc(len(out))
	if err != nil {
		return nil, fmt.Errorf("device output of %d bytes: %w", len(out), err)
	}
	if err := d.dev.CopyHtoD(d.stream, p, out); err != nil {
		d.sync(context.Background())
		d.dev.Free(p)
		return nil, err
	}
	if err := d.sync(context.Background()); err != nil {
		d.dev.Free(p)
		return nil, err
	}
	h, err := d.dev.IpcMemHandle(p)
	if err != nil {
		d.dev.Free(p)
		return nil, err
	}
	if !cg.addOutput(h, &devOutput{d: d, ptr: p}) {
		return nil, errors.New("client gone")
	}
	db.MemHandle, db.AllocSize = h[:], uint64(len(out))
	return db, nil
}

// commKey names a set of GPUs.
func commKey(devs []*gpuDev) string {
	var b strings.Builder
	for _, d := range devs {
		fmt.Fprintf(&b, "%d,", d.idx)
	}
	return b.String()
}

// commsFor returns the NCCL communicators over devs (rank i on devs[i]),
// made on first use.
func (g *GPUs) commsFor(devs []*gpuDev) ([]gpu.Comm, error) {
	k := commKey(devs)
	if cs := g.comms[k]; cs != nil {
		for _, c := range cs {
			if err := c.AsyncError(); err != nil {
				g.abortComms()
				return nil, fmt.Errorf("NCCL communicator over GPUs %s failed: %w", k, err)
			}
		}
		return cs, nil
	}
	ds := make([]gpu.Device, len(devs))
	for i, d := range devs {
		ds[i] = d.dev
	}
	cs, err := g.nccl.CommInitAll(ds)
	if err != nil {
		return nil, fmt.Errorf("NCCL communicator over %d GPUs: %w", len(devs), err)
	}
	g.comms[k] = cs
	g.log.Info("NCCL communicator created", "gpus", len(devs))
	return cs, nil
}

// abortComms aborts every communicator (ncclCommAbort) after an error; the
// next use makes new ones.
func (g *GPUs) abortComms() {
	for k, cs := range g.comms {
		for _, c := range cs {
			c.Abort()
		}
		delete(g.comms, k)
	}
	if g.cross != nil {
		g.cross.Abort()
		g.cross, g.crossOf = nil, nil
	}
}

// group runs f for every communicator inside one NCCL group.
func (g *GPUs) group(cs []gpu.Comm, f func(i int, c gpu.Comm) error) error {
	if err := g.nccl.GroupStart(); err != nil {
		return err
	}
	var errs []error
	for i, c := range cs {
		if err := f(i, c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := g.nccl.GroupEnd(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		g.abortComms()
		return err
	}
	return nil
}

// allreduceDevice is the native allreduce (see the top of this file), on
// one node (w.b nil) or hierarchically across nodes.
func (x *Path) allreduceDevice(ctx context.Context, w job.Work, devs []*gpuDev) (err error) {
	r := &w.Resp
	g := x.gpu
	es := r.DType.Size()
	op, pre, post := host.Scales(r, w.Size)
	offs := make([]int, len(r.Tensors)+1)
	for i, t := range r.Tensors {
		offs[i+1] = offs[i] + int(t.Shape.NumElements())*es
	}
	total := offs[len(r.Tensors)]
	var used []gpu.Comm // NCCL communicators the op ran on
	defer func() {
		if serr := g.syncWatch(ctx, devs, used); err == nil {
			err = serr
		}
	}()
	for _, d := range devs {
		if err := d.ensure(total, pre != 1); err != nil {
			return err
		}
	}
	if err := waitEvents(&w); err != nil {
		return err
	}
	cs, err := x.reduceLocal(&w, devs, offs, op, pre)
	used = append(used, cs...)
	if err != nil {
		return err
	}
	// The nodes together: on NCCL, or through host memory.
	if w.Resp.NCCL {
		cs, err := x.ncclCross(ctx, w, devs, total/es, r.DType, op)
		used = append(used, cs...)
		if err != nil {
			return err
		}
	} else if w.Engine != nil && len(w.View.Nodes) > 1 {
		b, err := x.host.EngineFor(w)
		if err != nil {
			return err
		}
		f := x.host.Fusion(total)
		d0 := devs[0]
		if err := d0.dev.CopyDtoH(d0.stream, f, d0.fuse); err != nil {
			return fmt.Errorf("GPU %s: %w", d0.info.UUID, err)
		}
		if err := d0.sync(ctx); err != nil {
			return err
		}
		// The host path's calls (host.AllreduceCalls): one, on its lone
		// local buffer, where it would have one.
		whole := len(r.Tensors) == 1 && pre == 1 && len(localBufsN(w.Ops[0])) == 1
		if err := host.AllreduceCalls(ctx, b, f, r.DType, op, whole, nil, nil); err != nil {
			return err
		}
		for _, d := range devs {
			if err := d.dev.CopyHtoD(d.stream, d.fuse, f); err != nil {
				return fmt.Errorf("GPU %s: %w", d.info.UUID, err)
			}
		}
	}
	for _, d := range devs {
		if post != 1 {
			if err := d.scale(d.fuse, total/es, r.DType, post); err != nil {
				return fmt.Errorf("GPU %s: postscale: %w", d.info.UUID, err)
			}
		}
	}
	// Write back: one D2D copy per rank and tensor.
	for i, row := range w.Ops {
		for _, o := range row {
			if o == nil {
				continue
			}
			d := devOf(o).d
			if err := d.dev.CopyDtoD(d.stream, devOf(o).ptr, d.fuse.Add(offs[i]), offs[i+1]-offs[i]); err != nil {
				return fmt.Errorf("GPU %s: %w", d.info.UUID, err)
			}
		}
	}
	return nil
}

// reduceLocal reduces the node's ranks' tensors (offs: each tensor's place
// in the concatenation) into every GPU's fusion buffer, which ensure made
// large enough (with the scratch buffer when pre != 1): each GPU's first
// local rank's tensor copied D2D, each further one reduced into it with
// the reduce kernel (with a prescale, every input scaled first through the
// scratch buffer, as the CPU path scales each input); then, over several
// GPUs, one NCCL allreduce of the fusion buffers in a group call. It
// returns the communicators it used.
func (x *Path) reduceLocal(w *job.Work, devs []*gpuDev, offs []int, op tensor.ReduceOp, pre float64) ([]gpu.Comm, error) {
	r := &w.Resp
	es := r.DType.Size()
	for _, d := range devs {
		for i, row := range w.Ops {
			dst, n := d.fuse.Add(offs[i]), offs[i+1]-offs[i]
			first := true
			for _, o := range row {
				if o == nil || devOf(o).d != d {
					continue
				}
				src := devOf(o).ptr
				if first || pre != 1 {
					to := dst
					if !first {
						to = d.scratch.Add(offs[i])
					}
					if err := d.dev.CopyDtoD(d.stream, to, src, n); err != nil {
						return nil, fmt.Errorf("GPU %s: %w", d.info.UUID, err)
					}
					if pre != 1 {
						if err := d.scale(to, n/es, r.DType, pre); err != nil {
							return nil, fmt.Errorf("GPU %s: prescale: %w", d.info.UUID, err)
						}
					}
					src = to
				}
				if !first {
					if err := d.reduce(dst, src, n/es, r.DType, op); err != nil {
						return nil, fmt.Errorf("GPU %s: reduce: %w", d.info.UUID, err)
					}
				}
				first = false
			}
		}
	}
	if len(devs) == 1 {
		return nil, nil
	}
	g := x.gpu
	cs, err := g.commsFor(devs)
	if err != nil {
		return nil, err
	}
	total := offs[len(offs)-1]
	if err := g.group(cs, func(i int, c gpu.Comm) error {
		return c.Allreduce(devs[i].stream, devs[i].fuse, devs[i].fuse, total/es, r.DType, op)
	}); err != nil {
		return cs, fmt.Errorf("NCCL allreduce over %d GPUs: %w", len(devs), err)
	}
	return cs, nil
}

// reduceWhole reduces every tensor of a reducescatter whole into the
// node's GPUs' fusion buffers (reduceLocal, with the prescale), and returns
// where each tensor lies there, the op, the postscale still to apply and
// the communicators used.
func (x *Path) reduceWhole(w *job.Work, devs []*gpuDev) (offs []int, op tensor.ReduceOp, post float64, cs []gpu.Comm, err error) {
	r := &w.Resp
	op, pre, post := host.Scales(r, w.Size)
	offs = make([]int, len(r.Tensors)+1)
	for i, t := range r.Tensors {
		offs[i+1] = offs[i] + int(t.Shape.NumElements())*r.DType.Size()
	}
	for _, d := range devs {
		if err := d.ensure(offs[len(r.Tensors)], pre != 1); err != nil {
			return nil, op, post, nil, err
		}
	}
	cs, err = x.reduceLocal(w, devs, offs, op, pre)
	return offs, op, post, cs, err
}

// commsIndexed is commsFor(devs) with each GPU's index in devs (its rank
// in the communicators).
func (g *GPUs) commsIndexed(devs []*gpuDev) ([]gpu.Comm, map[*gpuDev]int, error) {
	cs, err := g.commsFor(devs)
	if err != nil {
		return nil, nil, err
	}
	idx := make(map[*gpuDev]int, len(devs))
	for j, d := range devs {
		idx[d] = j
	}
	return cs, idx, nil
}

// localBufsN returns the ops of row with bytes: what localBufs counts on
// the CPU path.
func localBufsN(row []*job.Op) []*job.Op {
	var out []*job.Op
	for _, o := range row {
		if o != nil && (len(o.Buf) > 0 || o.Dev != nil && devOf(o).n > 0) {
			out = append(out, o)
		}
	}
	return out
}

// crossNodes reports whether w's collective spans several nodes (its
// process set's), which the engine joins.
func crossNodes(w *job.Work) bool { return w.Engine != nil && len(w.View.Nodes) > 1 }

// broadcastDevice is the native broadcast. On one node the root's GPU
// feeds the node's other GPUs over NCCL. Across nodes (the hierarchical
// broadcast), the root's node copies the root's tensor to host memory, the
// engine broadcasts it (the one call per tensor the CPU path makes, so that
// nodes on either path agree), and every GPU of every node without the
// root's tensor copies it from there. Then each GPU's copy fans out to its
// other local ranks' tensors.
func (x *Path) broadcastDevice(ctx context.Context, w job.Work, devs []*gpuDev) (err error) {
	r := &w.Resp
	var used []gpu.Comm
	defer func() {
		if serr := x.gpu.syncWatch(ctx, devs, used); err == nil {
			err = serr
		}
	}()
	if err := waitEvents(&w); err != nil {
		return err
	}
	var b backends.Backend
	rootNode := -1
	if crossNodes(&w) {
		if b, err = x.host.EngineFor(w); err != nil {
			return err
		}
		rootNode = w.View.Rows.NodeOf(r.Root)
	}
	if b != nil && !w.Resp.NCCL {
		// Across nodes through host memory: the host path's calls, one
		// per tensor (host.BroadcastCalls).
		var src broadcastSources
		in := func(i int) ([]byte, error) {
			if src, err = sourcesOf(&w, i); err != nil {
				return nil, err
			}
			return x.broadcastIn(ctx, src)
		}
		out := func(i int, buf []byte) error {
			if err := x.broadcastOut(ctx, src, buf); err != nil {
				return err
			}
			return fanOut(w.Ops[i], src)
		}
		return host.BroadcastCalls(ctx, b, &w, in, out)
	}
	for i := range r.Tensors {
		src, err := sourcesOf(&w, i)
		if err != nil {
			return err
		}
		switch {
		case w.Resp.NCCL:
			cs, err := x.broadcastNCCL(ctx, w, devs, rootNode, src.root, src.first, src.n)
			used = append(used, cs...)
			if err != nil {
				return err
			}
		case src.root == nil:
			return fmt.Errorf("broadcast root %d has no buffer", r.Root)
		case len(devs) > 1:
			cs, err := x.localBroadcast(devs, src.first, src.n, slices.Index(devs, src.root.d))
			used = append(used, cs...)
			if err != nil {
				return err
			}
		}
		if err := fanOut(w.Ops[i], src); err != nil {
			return err
		}
	}
	return nil
}

// broadcastSources are where a broadcast's tensor is on this node: first[d]
// is the tensor on GPU d that holds the data once it is there (the root's
// on its GPU, else the first local rank's), root the root's (nil on
// another node), n its bytes.
type broadcastSources struct {
	first map[*gpuDev]*devOp
	root  *devOp
	n     int
}

// sourcesOf finds the sources of w's tensor i.
func sourcesOf(w *job.Work, i int) (broadcastSources, error) {
	r, ops := &w.Resp, w.Ops[i]
	if r.Root < 0 || r.Root >= len(ops) {
		return broadcastSources{}, fmt.Errorf("broadcast root %d is out of range", r.Root)
	}
	src := broadcastSources{first: map[*gpuDev]*devOp{}, n: -1}
	if o := ops[r.Root]; o != nil {
		src.root = devOf(o)
		src.first[src.root.d] = src.root
	}
	for _, o := range ops {
		if o == nil {
			continue
		}
		if src.first[devOf(o).d] == nil {
			src.first[devOf(o).d] = devOf(o)
		}
		src.n = devOf(o).n
	}
	if src.n < 0 {
		return src, fmt.Errorf("broadcast of tensor %d: no local buffer", i)
	}
	return src, nil
}

// fanOut copies each GPU's source to the GPU's other local ranks' tensors.
func fanOut(ops []*job.Op, src broadcastSources) error {
	for _, o := range ops {
		if o == nil {
			continue
		}
		from := src.first[devOf(o).d]
		if o.Dev == from {
			continue
		}
		d := devOf(o).d
		if err := d.dev.CopyDtoD(d.stream, devOf(o).ptr, from.ptr, src.n); err != nil {
			return fmt.Errorf("GPU %s: %w", d.info.UUID, err)
		}
	}
	return nil
}

// localBroadcast copies n bytes from first's tensor on devs[from] into
// first's tensor on each other GPU of devs, with one NCCL broadcast in a
// group call. It returns the communicators it used.
func (x *Path) localBroadcast(devs []*gpuDev, first map[*gpuDev]*devOp, n, from int) ([]gpu.Comm, error) {
	g := x.gpu
	cs, err := g.commsFor(devs)
	if err != nil {
		return nil, err
	}
	if err := g.group(cs, func(k int, c gpu.Comm) error {
		p := first[devs[k]].ptr
		return c.Broadcast(devs[k].stream, p, p, n, tensor.Uint8, from)
	}); err != nil {
		return cs, fmt.Errorf("NCCL broadcast over %d GPUs: %w", len(devs), err)
	}
	return cs, nil
}

// broadcastNCCL is the broadcast the nodes agreed to run on NCCL
// (ncclVote): the root's node first spreads the root's tensor to its other
// GPUs, then devs[0] of every node (the GPU of the communicator across
// nodes) joins one NCCL broadcast from the root's node, and the other nodes
// spread it from devs[0] to their other GPUs.
func (x *Path) broadcastNCCL(ctx context.Context, w job.Work, devs []*gpuDev, rootNode int, root *devOp, first map[*gpuDev]*devOp, n int) ([]gpu.Comm, error) {
	g := x.gpu
	var used []gpu.Comm
	if root != nil && len(devs) > 1 {
		cs, err := x.localBroadcast(devs, first, n, slices.Index(devs, root.d))
		used = append(used, cs...)
		if err != nil {
			return used, err
		}
	}
	c, err := g.crossComm(ctx, w.Engine, w.NCCLID)
	if err != nil {
		return used, err
	}
	used = append(used, c)
	d0 := devs[0]
	p := first[d0].ptr
	if err := c.Broadcast(d0.stream, p, p, n, tensor.Uint8, rootNode); err != nil {
		g.abortComms()
		return used, fmt.Errorf("NCCL broadcast across %d nodes: %w", w.Engine.Size(), err)
	}
	if root == nil && len(devs) > 1 {
		cs, err := x.localBroadcast(devs, first, n, 0)
		used = append(used, cs...)
		if err != nil {
			return used, err
		}
	}
	return used, nil
}

// broadcastIn is this node's buffer for a broadcast across nodes through
// host memory (the hierarchical broadcast): on the root's node the root's
// tensor copied there from its GPU.
func (x *Path) broadcastIn(ctx context.Context, src broadcastSources) ([]byte, error) {
	buf := x.host.Fusion(src.n)
	if root := src.root; root != nil {
		d := root.d
		if err := d.dev.CopyDtoH(d.stream, buf, root.ptr); err != nil {
			return nil, fmt.Errorf("GPU %s: %w", d.info.UUID, err)
		}
		if err := d.sync(ctx); err != nil {
			return nil, err
		}
	}
	return buf, nil
}

// broadcastOut feeds what the engine brought to the first tensor on every
// GPU of this node that does not hold the root's.
func (x *Path) broadcastOut(ctx context.Context, src broadcastSources, buf []byte) error {
	var fed []*gpuDev
	for d, t := range src.first {
		if t == src.root {
			continue
		}
		if err := d.dev.CopyHtoD(d.stream, t.ptr, buf); err != nil {
			return fmt.Errorf("GPU %s: %w", d.info.UUID, err)
		}
		fed = append(fed, d)
	}
	// buf is the executor's fusion buffer: the copies finish before it
	// serves again.
	return syncAll(ctx, fed)
}

// NCCL across nodes (GPUAllreduceNCCL). Whether a response takes it is the
// coordinator's decision, once, in the plan (plan.NCCLAcross, Resp.NCCL):
// every node forwarded its ranks' requests saying whether it can (it runs
// with NCCL, not host-only, and its ranks' tensors are non-empty, on its
// GPUs, the first among them), so every node runs what the plan says. An
// allreduce runs: each node's ranks reduced on its GPUs as in
// allreduceDevice, one NCCL allreduce of the fusion buffer of devs[0] over
// a communicator of one GPU per node, an NCCL broadcast from there to the
// node's other GPUs, postscale, write-back; a broadcast runs broadcastNCCL,
// a reducescatter reducescatterGPUs (the nodes' sums allreduced as above,
// each rank's block copied out), an allgather allgatherGPUs, an alltoall
// alltoallNCCL.
//
// The communicator is made on the job's first such response: the
// coordinator drew the NCCL unique id and sent it in that plan, over the
// control links (Work.NCCLID); every node joins with CommInitRank on its
// devs[0].

// CanNCCLAcross reports whether this node can join NCCL communicators
// across nodes: it has GPUs, NCCL, and does not stage every device tensor.
func (g *GPUs) CanNCCLAcross() bool { return g != nil && !g.hostOnly && g.nccl != nil }

// NCCLUniqueID draws an NCCL unique id for a communicator across nodes
// (the coordinator's, sent in its plan).
func (g *GPUs) NCCLUniqueID() ([]byte, error) {
	if !g.CanNCCLAcross() {
		return nil, errors.New("this node runs without NCCL")
	}
	id, err := g.nccl.GetUniqueID()
	if err != nil {
		return nil, fmt.Errorf("NCCL unique id: %w", err)
	}
	return id[:], nil
}

// ExecuteNCCL runs w on NCCL across nodes, as the plan says.
func (x *Path) ExecuteNCCL(w job.Work) {
	if err := x.ncclAcrossOK(&w); err != nil {
		x.deviceFailed(w, fmt.Errorf("the plan runs %v on NCCL across nodes, but %w", w.Resp.Op, err))
		return
	}
	x.gpuPath("nccl " + strings.ToLower(w.Resp.Op.String()))
	switch w.Resp.Op {
	case tensor.Reducescatter, tensor.Allgather, tensor.Alltoall:
		x.runOutputs(w, usedDevs(&w))
	case tensor.Broadcast:
		x.runNative(w, usedDevs(&w), x.broadcastDevice)
	default:
		x.runNative(w, usedDevs(&w), x.allreduceDevice)
	}
}

// ncclAcrossOK reports whether this node can run w as the plan says, on
// NCCL across nodes: what it told the coordinator when it forwarded the
// requests.
func (x *Path) ncclAcrossOK(w *job.Work) error {
	g := x.gpu
	switch {
	case w.Engine == nil:
		return errors.New("no engine across nodes")
	case !g.CanNCCLAcross():
		return errors.New("this node runs without NCCL")
	case !nativeOK(w) || usedDevs(w)[0] != g.devs[0]:
		return fmt.Errorf("this node's tensors are not all non-empty GPU tensors, one on GPU %s", g.devs[0].info.UUID)
	case len(w.NCCLID) != gpu.UniqueIDSize:
		return fmt.Errorf("no NCCL unique id from the coordinator (%d bytes)", len(w.NCCLID))
	}
	return nil
}

// crossComm returns the communicator across the nodes of engine b, made
// with the coordinator's unique id ncclID when there is none yet.
func (g *GPUs) crossComm(ctx context.Context, b backends.Backend, ncclID []byte) (gpu.Comm, error) {
	if g.cross != nil && g.crossOf == b {
		if err := g.cross.AsyncError(); err != nil {
			g.abortComms()
			return nil, fmt.Errorf("NCCL communicator across nodes failed: %w", err)
		}
		return g.cross, nil
	}
	if g.cross != nil {
		g.cross.Destroy() // the previous job's
		g.cross, g.crossOf = nil, nil
	}
	var id gpu.UniqueID
	copy(id[:], ncclID)
	// Open already: this node's ops are on devs[0] (ncclAcrossOK).
	if err := g.devs[0].open("NCCL communicator across nodes"); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, ncclInitTimeout)
	defer cancel()
	c, err := g.nccl.CommInitRank(cctx, g.devs[0].dev, b.Size(), id, b.Rank())
	if err != nil {
		return nil, fmt.Errorf("NCCL communicator across %d nodes: %w", b.Size(), err)
	}
	g.cross, g.crossOf = c, b
	g.log.Info("NCCL communicator across nodes created", "nodes", b.Size(), "rank", b.Rank(), "gpu", g.devs[0].info.UUID)
	return c, nil
}

// ncclInitTimeout bounds joining the communicator across nodes.
const ncclInitTimeout = 60 * time.Second

// ncclCross joins the nodes' fusion buffers (devs[0]'s holds the node's
// result) on NCCL and hands the total to the node's other GPUs.
func (x *Path) ncclCross(ctx context.Context, w job.Work, devs []*gpuDev, count int, dt tensor.DType, op tensor.ReduceOp) ([]gpu.Comm, error) {
	g := x.gpu
	c, err := g.crossComm(ctx, w.Engine, w.NCCLID)
	if err != nil {
		return nil, err
	}
	d0 := devs[0]
	if err := c.Allreduce(d0.stream, d0.fuse, d0.fuse, count, dt, op); err != nil {
		g.abortComms()
		return nil, fmt.Errorf("NCCL allreduce across %d nodes: %w", w.Engine.Size(), err)
	}
	if len(devs) == 1 {
		return []gpu.Comm{c}, nil
	}
	cs, err := g.commsFor(devs)
	if err != nil {
		return []gpu.Comm{c}, err
	}
	n := count * dt.Size()
	if err := g.group(cs, func(i int, c gpu.Comm) error {
		return c.Broadcast(devs[i].stream, devs[i].fuse, devs[i].fuse, n, tensor.Uint8, 0)
	}); err != nil {
		return []gpu.Comm{c}, fmt.Errorf("NCCL broadcast over %d GPUs: %w", len(devs), err)
	}
	return append(cs, c), nil
}

// syncWatch synchronises devs' streams while watching the communicators
// their work ran on: NCCL reports a failed peer through
// ncclCommGetAsyncError, not the stream, and a kernel that waits for a dead
// peer ends only once the communicator is aborted. So the wait goes in
// slices, each followed by a look at the communicators; an error aborts
// them all (the next use makes new ones) and is returned once the streams
// have drained.
func (g *GPUs) syncWatch(ctx context.Context, devs []*gpuDev, comms []gpu.Comm) error {
	if len(comms) == 0 {
		return syncAll(ctx, devs)
	}
	for {
		wctx, cancel := context.WithTimeout(ctx, ncclWatch)
		err := syncAll(wctx, devs)
		cancel()
		for _, c := range comms {
			if cerr := c.AsyncError(); cerr != nil {
				err := fmt.Errorf("NCCL communicator (rank %d of %d) failed: %w", c.Rank(), c.Size(), cerr)
				g.abortComms()
				syncAll(ctx, devs)
				return err
			}
		}
		if err == nil || !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			return err
		}
	}
}

// ncclWatch is how often syncWatch looks at the communicators.
const ncclWatch = 20 * time.Millisecond

// runOutputs runs an allgather, alltoall or reducescatter of one node whose
// ops are all on devs (one GPU; several for an allgather, over NCCL) and
// answers each op with its device output.
func (x *Path) runOutputs(w job.Work, devs []*gpuDev) {
	r := &w.Resp
	if w.Trace != nil {
		defer host.TraceAll(w.Trace, r, timeline.End, "")
		host.TraceAll(w.Trace, r, timeline.Begin, "GPU_"+host.Activity(r))
		defer host.TraceAll(w.Trace, r, timeline.End, "")
	}
	ctx := context.Background()
	dones, used, err := x.buildOutputs(&w, devs)
	if serr := x.gpu.syncWatch(ctx, devs, used); err == nil {
		err = serr
	}
	if err == nil {
		err = exportOutputs(&w, dones)
	}
	if err != nil {
		for _, row := range dones {
			for _, res := range row {
				if res.n > 0 && res.p != 0 && !res.exported {
					res.d.dev.Free(res.p)
				}
			}
		}
		x.deviceFailed(w, err)
		return
	}
	for i, row := range w.Ops {
		for k, o := range row {
			if o != nil {
				o.Finish(dones[i][k].done)
			}
		}
	}
}

// devResult is one op's device output while it is built.
type devResult struct {
	done     *ipcpb.Done
	d        *gpuDev // where p is: the rank's GPU
	p        gpu.DevicePtr
	n        int
	exported bool // the client holds it (addDeviceOutput): its to free
}

// buildOutputs enqueues every op's result on its GPU's stream, and returns
// the NCCL communicators it used. On an error the results allocated so far
// are in what it returns.
func (x *Path) buildOutputs(w *job.Work, devs []*gpuDev) ([][]devResult, []gpu.Comm, error) {
	r := &w.Resp
	es := r.DType.Size()
	dones := make([][]devResult, len(w.Ops))
	if err := waitEvents(w); err != nil {
		return dones, nil, err
	}
	// Over NCCL (several GPUs, or across nodes when voted), through the
	// engine (across nodes), or on one GPU (below).
	var f func(*job.Work, []*gpuDev, [][]devResult) ([]gpu.Comm, error)
	switch {
	case w.Resp.NCCL || !crossNodes(w) && len(devs) > 1:
		f = x.allgatherGPUs
		switch r.Op {
		case tensor.Reducescatter:
			f = x.reducescatterGPUs
		case tensor.Alltoall:
			f = x.alltoallGPUs
			if w.Resp.NCCL {
				f = x.alltoallNCCL
			}
		}
	case crossNodes(w):
		f = x.outputsAcross
	}
	if f != nil {
		cs, err := f(w, devs, dones)
		return dones, cs, err
	}
	d := devs[0]
	for i, ops := range w.Ops {
		t := &r.Tensors[i]
		rowBytes := int(t.Shape.RowElements()) * es
		dones[i] = make([]devResult, len(ops))
		// out allocates rank k's result of n bytes and fills it with fill.
		out := func(k, n int, shape tensor.Shape, fill func(p gpu.DevicePtr) error) error {
			p, err := newResult(&dones[i][k], d, n, &ipcpb.Done{OutputShape: shape})
			if err != nil || p == 0 {
				return err
			}
			return fill(p)
		}
		copyIn := func(dst, src gpu.DevicePtr, n int) error {
			if n == 0 {
				return nil
			}
			if err := d.dev.CopyDtoD(d.stream, dst, src, n); err != nil {
				return fmt.Errorf("GPU %s: %w", d.info.UUID, err)
			}
			return nil
		}
		switch r.Op {
		case tensor.Allgather:
			shape := host.AllgatherShape(t)
			for k := range ops {
				if err := out(k, int(shape[0])*rowBytes, shape, func(p gpu.DevicePtr) error {
					off := 0
					for _, so := range ops {
						if err := copyIn(p.Add(off), devOf(so).ptr, devOf(so).n); err != nil {
							return err
						}
						off += devOf(so).n
					}
					return nil
				}); err != nil {
					return dones, nil, err
				}
			}
		case tensor.Alltoall:
			n := len(ops)
			starts := make([][]int, n) // starts[s][dst]: the row where s's piece for dst begins
			for s := range n {
				starts[s] = make([]int, n+1)
				for dst := range n {
					starts[s][dst+1] = starts[s][dst] + int(t.Splits[s][dst])
				}
			}
			for k := range ops {
				var rows int64
				recv := make([]int32, n)
				for s := range n {
					rows += int64(t.Splits[s][k])
					recv[s] = t.Splits[s][k]
				}
				if err := out(k, int(rows)*rowBytes, append(tensor.Shape{rows}, t.Shape[1:]...), func(p gpu.DevicePtr) error {
					off := 0
					for s, so := range ops {
						m := (starts[s][k+1] - starts[s][k]) * rowBytes
						if err := copyIn(p.Add(off), devOf(so).ptr.Add(starts[s][k]*rowBytes), m); err != nil {
							return err
						}
						off += m
					}
					return nil
				}); err != nil {
					return dones, nil, err
				}
				dones[i][k].done.ReceivedSplits = recv
			}
		case tensor.Reducescatter:
			op, pre, post := host.Scales(r, w.Size)
			for k := range ops {
				start, rows := host.ScatterBlock(t, len(ops), k)
				bytes := int(rows) * rowBytes
				if err := out(k, bytes, append(tensor.Shape{rows}, t.Shape[1:]...), func(p gpu.DevicePtr) error {
					if pre != 1 {
						if err := d.ensure(bytes, true); err != nil {
							return err
						}
					}
					for s, so := range ops {
						src := devOf(so).ptr.Add(int(start) * rowBytes)
						if s == 0 || pre != 1 {
							to := p
							if s > 0 {
								to = d.scratch
							}
							if err := copyIn(to, src, bytes); err != nil {
								return err
							}
							if pre != 1 {
								if err := d.scale(to, bytes/es, r.DType, pre); err != nil {
									return err
								}
							}
							src = to
						}
						if s > 0 {
							if err := d.reduce(p, src, bytes/es, r.DType, op); err != nil {
								return err
							}
						}
					}
					if post != 1 {
						return d.scale(p, bytes/es, r.DType, post)
					}
					return nil
				}); err != nil {
					return dones, nil, err
				}
			}
		}
	}
	return dones, nil, nil
}

// allgatherGPUs builds an allgather's outputs over several GPUs of the
// node, or across nodes on NCCL (w.nccl). On each GPU the first local
// rank's output receives the pieces of the ranks on that GPU by D2D copies
// and every other local rank's piece by an NCCL broadcast from that rank's
// GPU (one group call, each piece in place at its offset). Across nodes,
// GPU 0's output then joins one NCCL broadcast per node of that node's
// pieces (contiguous: ranks are ordered by node) over the communicator
// across nodes, and is spread to the node's other GPUs. The GPU's other
// ranks copy its first output.
func (x *Path) allgatherGPUs(w *job.Work, devs []*gpuDev, dones [][]devResult) ([]gpu.Comm, error) {
	g := x.gpu
	r := &w.Resp
	idx := map[*gpuDev]int{devs[0]: 0}
	var local, used []gpu.Comm
	var err error
	if len(devs) > 1 {
		if local, idx, err = g.commsIndexed(devs); err != nil {
			return nil, err
		}
		used = local
	}
	var cross gpu.Comm
	if w.Resp.NCCL {
		if cross, err = g.crossComm(context.Background(), w.Engine, w.NCCLID); err != nil {
			return used, err
		}
		used = append(used, cross)
	}
	for i, ops := range w.Ops {
		t := &r.Tensors[i]
		shape := host.AllgatherShape(t)
		offs := make([]int, len(ops)+1)
		for k := range ops {
			offs[k+1] = offs[k] + host.AllgatherRankBytes(t, r.DType, k)
		}
		total := offs[len(ops)]
		dones[i] = make([]devResult, len(ops))
		lead := make([]gpu.DevicePtr, len(devs)) // each GPU's first output
		alloc := func(k int) (gpu.DevicePtr, error) {
			return newResult(&dones[i][k], devOf(ops[k]).d, total, &ipcpb.Done{OutputShape: shape})
		}
		for k, o := range ops {
			if o == nil || total == 0 || lead[idx[devOf(o).d]] != 0 {
				continue
			}
			if lead[idx[devOf(o).d]], err = alloc(k); err != nil {
				return used, err
			}
		}
		if total == 0 {
			for k, o := range ops {
				if o != nil {
					alloc(k)
				}
			}
			continue
		}
		for k, o := range ops {
			if o == nil || devOf(o).n == 0 {
				continue
			}
			d := devOf(o).d
			if err := d.dev.CopyDtoD(d.stream, lead[idx[d]].Add(offs[k]), devOf(o).ptr, devOf(o).n); err != nil {
				return used, fmt.Errorf("GPU %s: %w", d.info.UUID, err)
			}
		}
		if len(devs) > 1 {
			if err := g.group(local, func(j int, c gpu.Comm) error {
				for k, o := range ops {
					if o == nil || devOf(o).n == 0 {
						continue
					}
					p := lead[j].Add(offs[k])
					if err := c.Broadcast(devs[j].stream, p, p, devOf(o).n, tensor.Uint8, idx[devOf(o).d]); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				return used, fmt.Errorf("NCCL broadcasts over %d GPUs: %w", len(devs), err)
			}
		}
		if cross != nil {
			counts, _ := host.AllgatherCounts(w.View.Rows, t, r.DType)
			if err := g.group([]gpu.Comm{cross}, func(_ int, c gpu.Comm) error {
				off := 0
				for m, n := range counts {
					if n > 0 {
						if err := c.Broadcast(devs[0].stream, lead[0].Add(off), lead[0].Add(off), n, tensor.Uint8, m); err != nil {
							return err
						}
					}
					off += n
				}
				return nil
			}); err != nil {
				return used, fmt.Errorf("NCCL broadcasts across %d nodes: %w", len(counts), err)
			}
			if len(devs) > 1 {
				if err := g.group(local, func(j int, c gpu.Comm) error {
					return c.Broadcast(devs[j].stream, lead[j], lead[j], total, tensor.Uint8, 0)
				}); err != nil {
					return used, fmt.Errorf("NCCL broadcast over %d GPUs: %w", len(devs), err)
				}
			}
		}
		for k, o := range ops {
			if o == nil || dones[i][k].done != nil {
				continue // another node's rank, or a lead
			}
			d := devOf(o).d
			p, err := alloc(k)
			if err != nil {
				return used, err
			}
			if err := d.dev.CopyDtoD(d.stream, p, lead[idx[d]], total); err != nil {
				return used, fmt.Errorf("GPU %s: %w", d.info.UUID, err)
			}
		}
	}
	return used, nil
}

// outputsAcross builds an allgather's, alltoall's or reducescatter's
// outputs across nodes through the job's engine (the hierarchical paths).
func (x *Path) outputsAcross(w *job.Work, devs []*gpuDev, dones [][]devResult) ([]gpu.Comm, error) {
	b, err := x.host.EngineFor(*w)
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	switch w.Resp.Op {
	case tensor.Reducescatter:
		return x.reducescatterAcross(ctx, w, devs, b, dones)
	case tensor.Alltoall:
		return nil, x.alltoallAcross(ctx, w, devs, b, dones)
	}
	return nil, x.allgatherAcross(ctx, w, devs, b, dones)
}

// allgatherAcross builds an allgather's outputs across nodes (the
// hierarchical allgather): the node's ranks' pieces copied to host memory in
// rank order, the engine's Allgatherv of the nodes' pieces (the one call per
// tensor allgatherMulti makes, so that nodes on either path agree), the
// result copied to one output on each GPU, which the GPU's other ranks copy.
func (x *Path) allgatherAcross(ctx context.Context, w *job.Work, devs []*gpuDev, b backends.Backend, dones [][]devResult) error {
	r := &w.Resp
	in := func(i int, into []byte) error {
		off := 0
		for _, o := range w.Ops[i] {
			if o == nil {
				continue
			}
			if off+devOf(o).n > len(into) {
				return fmt.Errorf("allgather: the node's pieces exceed the %d bytes the plan gives it", len(into))
			}
			d := devOf(o).d
			if err := d.dev.CopyDtoH(d.stream, into[off:off+devOf(o).n], devOf(o).ptr); err != nil {
				return fmt.Errorf("GPU %s: %w", d.info.UUID, err)
			}
			off += devOf(o).n
		}
		return syncAll(ctx, devs)
	}
	out := func(i int, all []byte) error {
		row := w.Ops[i]
		shape := host.AllgatherShape(&r.Tensors[i])
		dones[i] = make([]devResult, len(row))
		lead := map[*gpuDev]gpu.DevicePtr{}
		for k, o := range row {
			if o == nil {
				continue
			}
			d := devOf(o).d
			p, err := newResult(&dones[i][k], d, len(all), &ipcpb.Done{OutputShape: shape})
			if err != nil {
				return err
			}
			if p == 0 {
				continue
			}
			if src, ok := lead[d]; ok {
				err = d.dev.CopyDtoD(d.stream, p, src, len(all))
			} else {
				lead[d] = p
				err = d.dev.CopyHtoD(d.stream, p, all)
			}
			if err != nil {
				return fmt.Errorf("GPU %s: %w", d.info.UUID, err)
			}
		}
		// all is the executor's fusion buffer: the copies finish before
		// it serves again.
		return syncAll(ctx, devs)
	}
	return host.AllgatherCalls(ctx, b, w, x.host.Fusion, in, out)
}

// alltoallAcross builds an alltoall's outputs across nodes (the
// hierarchical alltoall): the pieces the node sends copied to host memory
// in a2aPlan's order, the engine's Alltoallv (alltoallMulti's one call per
// tensor), each local rank's output copied to its GPU run by run from what
// was received.
func (x *Path) alltoallAcross(ctx context.Context, w *job.Work, devs []*gpuDev, b backends.Backend, dones [][]devResult) error {
	in := func(i int, a *host.A2APlan, into []byte) error {
		row := w.Ops[i]
		off := 0
		var err error
		a.Sends(func(s, d int) {
			o, n := row[s], a.Piece(s, d)
			if err != nil || o == nil || n == 0 {
				return
			}
			g := devOf(o).d
			if e := g.dev.CopyDtoH(g.stream, into[off:off+n], devOf(o).ptr.Add(a.Start(s, d))); e != nil {
				err = fmt.Errorf("GPU %s: %w", g.info.UUID, e)
			}
			off += n
		})
		if serr := syncAll(ctx, devs); err == nil {
			err = serr
		}
		return err
	}
	out := func(i int, a *host.A2APlan, got []byte) error {
		row := w.Ops[i]
		t := &w.Resp.Tensors[i]
		dones[i] = make([]devResult, len(row))
		for d, o := range row {
			if o == nil {
				continue
			}
			g, n := devOf(o).d, a.Rows(d)*a.RowBytes
			p, err := newResult(&dones[i][d], g, n, &ipcpb.Done{OutputShape: a.Shape(d, t.Shape), ReceivedSplits: a.Received(d)})
			if err != nil {
				return err
			}
			if p == 0 {
				continue
			}
			// Straight from got, one copy per run: no assembly on the host.
			at := 0
			for _, sg := range a.Segments(d) {
				if sg[1] == 0 {
					continue
				}
				if err := g.dev.CopyHtoD(g.stream, p.Add(at), got[sg[0]:sg[0]+sg[1]]); err != nil {
					return fmt.Errorf("GPU %s: %w", g.info.UUID, err)
				}
				at += sg[1]
			}
		}
		return syncAll(ctx, devs)
	}
	return host.AlltoallCalls(ctx, b, w, x.host.Fusion, in, out)
}

// alltoallNCCL builds an alltoall's outputs across nodes on NCCL
// (w.nccl), in a2aPlan's layout (the hierarchical alltoall's, on device
// memory): the pieces this node sends gathered into a send buffer on GPU 0
// (D2D from GPU 0's ranks, NCCL sends from the other GPUs' in one group
// call), one NCCL send and receive per other node over the communicator
// across nodes into a receive buffer on GPU 0 (the node's own block by a
// D2D copy), then each local rank's output assembled from its runs there
// (D2D on GPU 0, NCCL from GPU 0 to the others). Both buffers are GPU 0's
// fusion buffer. Between two GPUs, or two nodes, NCCL matches sends and
// receives in issue order, which the same loops give on both sides.
func (x *Path) alltoallNCCL(w *job.Work, devs []*gpuDev, dones [][]devResult) ([]gpu.Comm, error) {
	g := x.gpu
	cross, err := g.crossComm(context.Background(), w.Engine, w.NCCLID)
	if err != nil {
		return nil, err
	}
	used := []gpu.Comm{cross}
	var local []gpu.Comm
	idx := map[*gpuDev]int{devs[0]: 0}
	if len(devs) > 1 {
		if local, idx, err = g.commsIndexed(devs); err != nil {
			return used, err
		}
		used = append(used, local...)
	}
	d0 := devs[0]
	me := w.View.Rows.Node
	// move is n bytes from one GPU's src to another's dst.
	type move struct {
		from, to *gpuDev
		src, dst gpu.DevicePtr
		n        int
	}
	// moves runs the moves between GPU 0 and the others: one NCCL group.
	moves := func(ms []move) error {
		if len(ms) == 0 {
			return nil
		}
		return g.group(local, func(j int, c gpu.Comm) error {
			for _, m := range ms {
				switch devs[j] {
				case m.from:
					if err := c.Send(m.from.stream, m.src, m.n, tensor.Uint8, idx[m.to]); err != nil {
						return err
					}
				case m.to:
					if err := c.Recv(m.to.stream, m.dst, m.n, tensor.Uint8, idx[m.from]); err != nil {
						return err
					}
				}
			}
			return nil
		})
	}
	d2d := func(d *gpuDev, dst, src gpu.DevicePtr, n int) error {
		if err := d.dev.CopyDtoD(d.stream, dst, src, n); err != nil {
			return fmt.Errorf("GPU %s: %w", d.info.UUID, err)
		}
		return nil
	}
	for i, row := range w.Ops {
		a := host.NewA2APlan(w, i)
		nn := len(a.SendCounts)
		sendOff := make([]int, nn+1)
		for m, c := range a.SendCounts {
			sendOff[m+1] = sendOff[m] + c
		}
		if err := d0.ensure(sendOff[nn]+a.Total, false); err != nil {
			return used, err
		}
		sendBuf, recvBuf := d0.fuse, d0.fuse.Add(sendOff[nn])
		var in []move
		pos := 0
		a.Sends(func(s, d int) {
			o, n := row[s], a.Piece(s, d)
			if err != nil || o == nil || n == 0 {
				return
			}
			src := devOf(o).ptr.Add(a.Start(s, d))
			if devOf(o).d == d0 {
				err = d2d(d0, sendBuf.Add(pos), src, n)
			} else {
				in = append(in, move{from: devOf(o).d, to: d0, src: src, dst: sendBuf.Add(pos), n: n})
			}
			pos += n
		})
		if err != nil {
			return used, err
		}
		if err := moves(in); err != nil {
			return used, fmt.Errorf("NCCL sends to GPU 0: %w", err)
		}
		if n := a.SendCounts[me]; n > 0 {
			if err := d2d(d0, recvBuf.Add(a.BlockStart[me]), sendBuf.Add(sendOff[me]), n); err != nil {
				return used, err
			}
		}
		if err := g.group([]gpu.Comm{cross}, func(_ int, c gpu.Comm) error {
			for m := range nn {
				if m == me {
					continue
				}
				if n := a.SendCounts[m]; n > 0 {
					if err := c.Send(d0.stream, sendBuf.Add(sendOff[m]), n, tensor.Uint8, m); err != nil {
						return err
					}
				}
				if n := a.RecvCounts[m]; n > 0 {
					if err := c.Recv(d0.stream, recvBuf.Add(a.BlockStart[m]), n, tensor.Uint8, m); err != nil {
						return err
					}
				}
			}
			return nil
		}); err != nil {
			return used, fmt.Errorf("NCCL sends and receives across %d nodes: %w", nn, err)
		}
		t := &w.Resp.Tensors[i]
		dones[i] = make([]devResult, len(row))
		var out []move
		for d, o := range row {
			if o == nil {
				continue
			}
			gd, n := devOf(o).d, a.Rows(d)*a.RowBytes
			p, err := newResult(&dones[i][d], gd, n, &ipcpb.Done{OutputShape: a.Shape(d, t.Shape), ReceivedSplits: a.Received(d)})
			if err != nil {
				return used, err
			}
			if p == 0 {
				continue
			}
			at := 0
			for _, sg := range a.Segments(d) {
				if sg[1] == 0 {
					continue
				}
				if gd == d0 {
					if err := d2d(d0, p.Add(at), recvBuf.Add(sg[0]), sg[1]); err != nil {
						return used, err
					}
				} else {
					out = append(out, move{from: d0, to: gd, src: recvBuf.Add(sg[0]), dst: p.Add(at), n: sg[1]})
				}
				at += sg[1]
			}
		}
		if err := moves(out); err != nil {
			return used, fmt.Errorf("NCCL sends from GPU 0: %w", err)
		}
	}
	return used, nil
}

// reducescatterAcross builds a reducescatter's outputs across nodes (the
// hierarchical reducescatter): the node's ranks' tensors reduced on its GPUs
// (reduceLocal, with the prescale), then per tensor GPU 0's sum copied to
// host memory, the engine's ReduceScatter of it into this node's block (the
// one call per tensor reducescatterMulti makes, with its counts), and each
// local rank's rows of the block copied to its output on its GPU and
// postscaled there. It returns the communicators it used.
func (x *Path) reducescatterAcross(ctx context.Context, w *job.Work, devs []*gpuDev, b backends.Backend, dones [][]devResult) ([]gpu.Comm, error) {
	r := &w.Resp
	mb := w.View.Rows
	es := r.DType.Size()
	offs, _, post, cs, err := x.reduceWhole(w, devs)
	if err != nil {
		return cs, err
	}
	d0 := devs[0]
	full := func(i int) ([]byte, error) {
		f := x.host.Fusion(offs[i+1] - offs[i])
		if err := d0.dev.CopyDtoH(d0.stream, f, d0.fuse.Add(offs[i])); err != nil {
			return nil, fmt.Errorf("GPU %s: %w", d0.info.UUID, err)
		}
		return f, d0.sync(ctx)
	}
	out := func(i int, block []byte, at []int) error {
		t := &r.Tensors[i]
		rowBytes := int(t.Shape.RowElements()) * es
		row := w.Ops[i]
		dones[i] = make([]devResult, len(row))
		for lr := range at {
			rank := mb.Offset + lr
			o := row[rank]
			if o == nil {
				continue
			}
			_, k := host.ScatterBlock(t, w.Size, rank)
			rows, n := int(k), int(k)*rowBytes
			d := devOf(o).d
			p, err := newResult(&dones[i][rank], d, n, &ipcpb.Done{OutputShape: append(tensor.Shape{int64(rows)}, t.Shape[1:]...)})
			if err != nil {
				return err
			}
			if p == 0 {
				continue
			}
			if err := d.dev.CopyHtoD(d.stream, p, block[at[lr]:at[lr]+n]); err != nil {
				return fmt.Errorf("GPU %s: %w", d.info.UUID, err)
			}
			if post != 1 {
				if err := d.scale(p, n/es, r.DType, post); err != nil {
					return fmt.Errorf("GPU %s: postscale: %w", d.info.UUID, err)
				}
			}
		}
		// block is this tensor's; the fusion buffer was read by the engine
		// already. The copies from block finish before it goes.
		return syncAll(ctx, devs)
	}
	return cs, host.ReducescatterCalls(ctx, b, w, full, out)
}

// alltoallGPUs builds an alltoall's outputs over several GPUs of the node:
// each rank's output on its GPU receives the pieces of the ranks on the
// same GPU by D2D copies and the others' by NCCL sends and receives, one
// group call for all of them (between two GPUs NCCL matches them in the
// order issued, which the same loop gives on both sides).
func (x *Path) alltoallGPUs(w *job.Work, devs []*gpuDev, dones [][]devResult) ([]gpu.Comm, error) {
	r := &w.Resp
	g := x.gpu
	cs, idx, err := g.commsIndexed(devs)
	if err != nil {
		return nil, err
	}
	for i, ops := range w.Ops {
		t := &r.Tensors[i]
		rowBytes := int(t.Shape.RowElements()) * r.DType.Size()
		n := len(ops)
		// piece(s, k): the bytes of rank s's tensor for rank k, and where
		// they go in k's output.
		sendOff := make([][]int, n) // sendOff[s][k]: in s's tensor
		recvOff := make([][]int, n) // recvOff[k][s]: in k's output
		for s := range n {
			sendOff[s] = make([]int, n+1)
			for k := range n {
				sendOff[s][k+1] = sendOff[s][k] + int(t.Splits[s][k])*rowBytes
			}
		}
		dones[i] = make([]devResult, n)
		for k, o := range ops {
			recvOff[k] = make([]int, n+1)
			recv := make([]int32, n)
			var rows int64
			for s := range n {
				recvOff[k][s+1] = recvOff[k][s] + int(t.Splits[s][k])*rowBytes
				recv[s] = t.Splits[s][k]
				rows += int64(t.Splits[s][k])
			}
			d := devOf(o).d
			bytes := recvOff[k][n]
			p, err := newResult(&dones[i][k], d, bytes, &ipcpb.Done{OutputShape: append(tensor.Shape{rows}, t.Shape[1:]...), ReceivedSplits: recv})
			if err != nil {
				return cs, err
			}
			if p == 0 {
				continue
			}
		}
		size := func(s, k int) int { return sendOff[s][k+1] - sendOff[s][k] }
		for s, so := range ops {
			for k, ko := range ops {
				if m := size(s, k); m > 0 && devOf(so).d == devOf(ko).d {
					d := devOf(so).d
					if err := d.dev.CopyDtoD(d.stream, dones[i][k].p.Add(recvOff[k][s]), devOf(so).ptr.Add(sendOff[s][k]), m); err != nil {
						return cs, fmt.Errorf("GPU %s: %w", d.info.UUID, err)
					}
				}
			}
		}
		if err := g.group(cs, func(j int, c gpu.Comm) error {
			d := devs[j]
			for s, so := range ops {
				for k, ko := range ops {
					m := size(s, k)
					if m == 0 || devOf(so).d == devOf(ko).d {
						continue
					}
					switch d {
					case devOf(so).d:
						if err := c.Send(d.stream, devOf(so).ptr.Add(sendOff[s][k]), m, tensor.Uint8, idx[devOf(ko).d]); err != nil {
							return err
						}
					case devOf(ko).d:
						if err := c.Recv(d.stream, dones[i][k].p.Add(recvOff[k][s]), m, tensor.Uint8, idx[devOf(so).d]); err != nil {
							return err
						}
					}
				}
			}
			return nil
		}); err != nil {
			return cs, fmt.Errorf("NCCL sends and receives over %d GPUs: %w", len(devs), err)
		}
	}
	return cs, nil
}

// reducescatterGPUs builds a reducescatter's outputs over several GPUs of
// the node, or across nodes on NCCL (w.nccl): the ranks' whole tensors
// reduced into every GPU's fusion buffer as an allreduce's are (reduceLocal:
// local kernels, one NCCL allreduce; across nodes then ncclCross), then each
// local rank's block copied out into its output on its GPU and postscaled
// there.
func (x *Path) reducescatterGPUs(w *job.Work, devs []*gpuDev, dones [][]devResult) ([]gpu.Comm, error) {
	r := &w.Resp
	es := r.DType.Size()
	offs, op, post, cs, err := x.reduceWhole(w, devs)
	if err != nil {
		return cs, err
	}
	if w.Resp.NCCL {
		// Across nodes on NCCL: the nodes' sums added up on GPU 0 and
		// spread to the node's other GPUs.
		cross, err := x.ncclCross(context.Background(), *w, devs, offs[len(offs)-1]/es, r.DType, op)
		cs = append(cs, cross...)
		if err != nil {
			return cs, err
		}
	}
	for i, ops := range w.Ops {
		t := &r.Tensors[i]
		rowBytes := int(t.Shape.RowElements()) * es
		dones[i] = make([]devResult, len(ops))
		for k, o := range ops {
			if o == nil {
				continue // another node's rank
			}
			start, rows := host.ScatterBlock(t, w.Size, k)
			bytes := int(rows) * rowBytes
			d := devOf(o).d
			p, err := newResult(&dones[i][k], d, bytes, &ipcpb.Done{OutputShape: append(tensor.Shape{rows}, t.Shape[1:]...)})
			if err != nil {
				return cs, err
			}
			if p == 0 {
				continue
			}
			if err := d.dev.CopyDtoD(d.stream, p, d.fuse.Add(offs[i]+int(start)*rowBytes), bytes); err != nil {
				return cs, fmt.Errorf("GPU %s: %w", d.info.UUID, err)
			}
			if post != 1 {
				if err := d.scale(p, bytes/es, r.DType, post); err != nil {
					return cs, fmt.Errorf("GPU %s: postscale: %w", d.info.UUID, err)
				}
			}
		}
	}
	return cs, nil
}

// newResult makes *res an op's result of n bytes on GPU d, answered with
// done, and allocates its memory there: the address, 0 for n == 0.
func newResult(res *devResult, d *gpuDev, n int, done *ipcpb.Done) (gpu.DevicePtr, error) {
	*res = devResult{done: done, d: d, n: n}
	if n == 0 {
		return 0, nil
	}
	p, err := d.dev.Alloc(n)
	if err != nil {
		return 0, fmt.Errorf("GPU %s: device output of %d bytes: %w", d.info.UUID, n, err)
	}
	res.p = p
	return p, nil
}

// exportOutputs gives every built output an IPC handle and hands it to its
// client, filling in the Dones.
func exportOutputs(w *job.Work, dones [][]devResult) error {
	for i, row := range w.Ops {
		for k, o := range row {
			if o == nil {
				continue // another node's rank
			}
			res := &dones[i][k]
			d := res.d
			db := &ipcpb.DeviceBuffer{DeviceUuid: d.info.UUID, Length: uint64(res.n)}
			res.done.DeviceOutput = db
			if res.n == 0 {
				continue
			}
			h, err := d.dev.IpcMemHandle(res.p)
			if err != nil {
				return fmt.Errorf("GPU %s: %w", d.info.UUID, err)
			}
			db.MemHandle, db.AllocSize = h[:], uint64(res.n)
			res.exported = true
			if !devOf(o).cg.addOutput(h, &devOutput{d: d, ptr: res.p}) {
				// The client is gone (and the memory freed): it needs no answer.
				res.done = &ipcpb.Done{Code: ipcpb.Code_CODE_ABORTED, Error: "client gone"}
			}
		}
	}
	return nil
}
