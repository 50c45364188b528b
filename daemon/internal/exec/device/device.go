package device

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	"google.golang.org/protobuf/proto"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/daemon/internal/exec/host"
	"github.com/hvdd/hvdd/daemon/internal/exec/sched"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/internal/poll"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/daemon/timeline"
	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/kernels"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

// Path runs responses with GPU tensors: natively in device memory,
// or staged through host memory onto the host path.
type Path struct {
	log     *slog.Logger
	gpu     *GPUs // nil on a CPU-only node
	host    *host.Path
	engines *sched.Engines // shared with the host path
	p       *poll.Poller
	// gpuPaths are the GPU paths used so far (gpuPath).
	gpuPaths map[string]bool
	// watchCh feeds the watchdog of GPU-ordered completion (ordered.go),
	// made on first use.
	watchCh   chan watchItem
	watchDone chan struct{} // closed as the watchdog returns (Stop)
	stopping  atomic.Bool   // set by Stop
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

// New returns the device path over gpus (nil on a CPU-only node),
// staging onto host; it takes the engine of a response across nodes from
// engines (the host path's) and posts a failed collective across nodes
// (job.MsgExecErr) to the loop through p.
func New(log *slog.Logger, gpus *GPUs, host *host.Path, engines *sched.Engines, p *poll.Poller) *Path {
	return &Path{log: log, gpu: gpus, host: host, engines: engines, p: p}
}

// Execute runs a response with GPU tensors in it, or one the plan runs on
// NCCL across nodes, on its route: decided once (decide), logged once per
// route (gpuPath), its phase on the timeline named after it (traceGPU).
func (x *Path) Execute(w job.Work) {
	t, devs := x.topologyOf(&w)
	rt := decide(&w.Resp, t)
	if rt.way == ncclAcross {
		if err := x.ncclAcrossOK(&w); err != nil {
			x.deviceFailed(w, fmt.Errorf("the plan runs %v on NCCL across nodes, but %w", w.Resp.Op, err))
			return
		}
		devs = usedDevs(&w)
	}
	x.gpuPath(rt.label())
	switch rt {
	case route{oneGPU, tensor.Allreduce}:
		x.runNative(w, devs, rt, x.allreduceOneGPU)
	case route{inPlace, tensor.Allreduce}:
		x.runNative(w, devs, rt, x.allreduceInPlace)
	case route{overGPUs, tensor.Allreduce}:
		x.runNative(w, devs, rt, x.allreduceFused(nil))
	case route{hierarchical, tensor.Allreduce}:
		x.runNative(w, devs, rt, x.allreduceFused(x.allreduceHierarchical))
	case route{ncclAcross, tensor.Allreduce}:
		x.runNative(w, devs, rt, x.allreduceFused(x.allreduceNCCL))

	case route{oneGPU, tensor.Broadcast}, route{overGPUs, tensor.Broadcast}:
		x.runNative(w, devs, rt, x.broadcastOnNode)
	case route{hierarchical, tensor.Broadcast}:
		x.runNative(w, devs, rt, x.broadcastHierarchical)
	case route{ncclAcross, tensor.Broadcast}:
		x.runNative(w, devs, rt, x.broadcastNCCL)

	case route{oneGPU, tensor.Allgather}, route{overGPUs, tensor.Allgather}:
		x.runResults(w, devs, rt, x.onNode(x.allgatherOverGPUs))
	case route{hierarchical, tensor.Allgather}:
		x.runResults(w, devs, rt, x.viaEngine(x.allgatherHierarchical))
	case route{ncclAcross, tensor.Allgather}:
		x.runResults(w, devs, rt, x.viaNCCL(x.allgatherOverGPUs))

	case route{oneGPU, tensor.Alltoall}, route{overGPUs, tensor.Alltoall}:
		x.runResults(w, devs, rt, x.alltoallOverGPUs)
	case route{hierarchical, tensor.Alltoall}:
		x.runResults(w, devs, rt, x.viaEngine(x.alltoallHierarchical))
	case route{ncclAcross, tensor.Alltoall}:
		x.runResults(w, devs, rt, x.viaNCCL(x.alltoallNCCLAcross))

	case route{oneGPU, tensor.Reducescatter}:
		x.runResults(w, devs, rt, reducescatterOneGPU)
	case route{overGPUs, tensor.Reducescatter}:
		x.runResults(w, devs, rt, x.onNode(x.reducescatterOverGPUs))
	case route{hierarchical, tensor.Reducescatter}:
		x.runResults(w, devs, rt, x.viaEngine(x.reducescatterHierarchical))
	case route{ncclAcross, tensor.Reducescatter}:
		x.runResults(w, devs, rt, x.viaNCCL(x.reducescatterOverGPUs))

	default: // staged (decide gives no other route)
		if err := x.stageIn(&w); err != nil {
			x.deviceFailed(w, err)
			return
		}
		x.host.Execute(w)
	}
}

// topologyOf is what decide needs of this node and of w's ops, and the
// GPUs they are on (when native).
func (x *Path) topologyOf(w *job.Work) (topology, []*gpuDev) {
	t := topology{crossNodes: crossNodes(w)}
	g := x.gpu
	if g == nil || g.hostOnly || !nativeOK(w) {
		return t, nil
	}
	devs := usedDevs(w)
	t.native, t.gpus, t.nccl = true, len(devs), g.engines != nil
	t.noJoined = noJoined(w)
	t.oneRankPerGPU = len(localBufsN(w.Ops[0])) == len(devs)
	return t, devs
}

// nativeFn runs a native route that works in the ops' own tensors (an
// allreduce or a broadcast): it enqueues the work on devs' streams.
type nativeFn func(ctx context.Context, w *job.Work, devs []*gpuDev) error

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

// runNative runs a native route that works in the ops' own tensors (an
// allreduce or a broadcast): after the clients' events, f; then it waits
// for the GPUs and answers the ops, or, where the work may complete
// ordered on the GPU (orderedOK), answers them at once (finishOrdered).
func (x *Path) runNative(w job.Work, devs []*gpuDev, rt route, f nativeFn) {
	defer traceGPU(&w, rt)()
	ctx := context.Background()
	var err error
	for _, d := range devs {
		if err = d.asyncFailed(); err != nil {
			break
		}
	}
	if err == nil {
		err = waitEvents(&w)
	}
	if err == nil {
		err = f(ctx, &w, devs)
	}
	if err == nil && orderedOK(x.gpu.ordered, rt, clientsWait(&w)) {
		if err = x.finishOrdered(&w, devs); err != nil {
			x.deviceFailed(w, err)
		}
		return
	}
	if werr := x.gpu.waitStreams(ctx, devs); err == nil {
		err = werr
	}
	if err != nil {
		x.deviceFailed(w, err)
		return
	}
	x.host.FinishBatched(w.Ops)
}

// traceGPU begins w's GPU phase on the timeline, named after its route
// (route.phase), if it is traced, and returns what ends it and the
// response's top-level phase (on one node, its Begin came from
// tracer.responded too), to run once every rank is answered.
func traceGPU(w *job.Work, rt route) (end func()) {
	if w.Trace == nil {
		return func() {}
	}
	job.TraceAll(w.Trace, &w.Resp, timeline.Begin, rt.phase())
	return func() {
		job.TraceAll(w.Trace, &w.Resp, timeline.End, "")
		job.TraceAll(w.Trace, &w.Resp, timeline.End, "")
	}
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
			x.gpu.abortEngines()
		}
	}
	msg := fmt.Sprintf("%v of %d GPU tensor(s) failed: %v", r.Op, len(r.Tensors), err)
	lost := 0
	if n, ok := backends.LostRank(err); ok {
		msg = fmt.Sprintf("node %d%s was lost during %v: %v", n, w.Job.Members.RankRange(n), r.Op, err)
		lost = n + 1
	}
	x.log.Error("GPU collective failed", "op", r.Op, "tensors", len(r.Tensors), "err", err)
	x.fail(w, msg, errors.Is(err, backends.ErrClosed), lost)
}

// fail answers w's ops with msg (CODE_INTERNAL), copying nothing back;
// across nodes it fails the job instead, through the loop, whose other
// nodes wait in the engine (closed: the engine failed only because the
// loop closed it; lost: the node the engine lost, +1, or 0).
func (x *Path) fail(w job.Work, msg string, closed bool, lost int) {
	if w.Engine != nil && len(w.View.Nodes) > 1 {
		x.p.Post(job.MsgExecErr{Job: w.Job, Err: errors.New(msg), Ops: w.Ops, Closed: closed, Lost: lost})
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
			if devOf(o).d.g.inputHostWait {
				// An experiment (HVDD_GPU_INPUT_WAIT=host): the host waits
				// for the client's event, so that no GPU-side wait across
				// contexts sits on the daemon's stream.
				devOf(o).d.g.counts.syncs.Add(1)
				if err := devOf(o).ev.ev.Synchronize(context.Background()); err != nil {
					return fmt.Errorf("GPU %s: wait for the client's event: %w", devOf(o).d.info.UUID, err)
				}
				continue
			}
			if err := devOf(o).d.stream.WaitEvent(devOf(o).ev.ev); err != nil {
				return fmt.Errorf("GPU %s: wait for the client's event: %w", devOf(o).d.info.UUID, err)
			}
		}
	}
	return nil
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
			devOf(o).d.g.counts.stagings.Add(1)
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

// deviceOutput copies out into a buffer of the connection's pool on d,
// lent to the client until it sends Release with its handle.
func deviceOutput(cg *ConnGPU, d *gpuDev, out []byte) (*ipcpb.DeviceBuffer, error) {
	db := &ipcpb.DeviceBuffer{DeviceUuid: d.info.UUID, Length: uint64(len(out))}
	if len(out) == 0 {
		return db, nil
	}
	o, err := cg.take(d, len(out))
	if err != nil {
		return nil, err
	}
	if err := d.dev.CopyHtoD(d.stream, o.ptr, out); err != nil {
		d.sync(context.Background())
		cg.giveBack(o)
		return nil, err
	}
	if err := d.sync(context.Background()); err != nil {
		cg.giveBack(o)
		return nil, err
	}
	h, err := o.handle()
	if err != nil {
		cg.giveBack(o)
		return nil, err
	}
	if !cg.lend(o) {
		return nil, errors.New("client gone")
	}
	db.MemHandle, db.AllocSize = h[:], uint64(o.size)
	return db, nil
}

// The native allreduce. The ranks of one node on one GPU meet in one
// combine kernel straight from their tensors into their tensors
// (allreduceOneGPU); one rank on each of several GPUs, in NCCL in place
// (allreduceInPlace). Otherwise (allreduceFused) every GPU's fusion buffer
// gets the node's result (reduceLocal: a combine kernel on each GPU, NCCL
// over the node's GPUs); across nodes the nodes' results are added up on
// NCCL across nodes where the plan says (allreduceNCCL), else through the
// job's engine and host memory (allreduceHierarchical); then every GPU's
// fusion buffer goes out to its ranks' tensors, postscaled, by one more
// combine kernel (a fan-out).

// allreduceFused returns the allreduce through the GPUs' fusion buffers,
// with between adding up the nodes' results (total bytes in every GPU's
// fusion buffer) across nodes; nil on one node.
func (x *Path) allreduceFused(between func(ctx context.Context, w *job.Work, devs []*gpuDev, total int, op tensor.ReduceOp) error) nativeFn {
	return func(ctx context.Context, w *job.Work, devs []*gpuDev) error {
		r := &w.Resp
		op, pre, post := sched.Scales(r, w.Size)
		offs := sched.FusedOffsets(r)
		total := offs[len(r.Tensors)]
		for _, d := range devs {
			if err := d.ensure(total); err != nil {
				return err
			}
		}
		if err := x.reduceLocal(w, devs, offs, op, pre); err != nil {
			return err
		}
		if between != nil {
			if err := between(ctx, w, devs, total, op); err != nil {
				return err
			}
		}
		return fanOutFused(w, devs, offs, op, post)
	}
}

// allreduceInPlace is the allreduce of a node's ranks, one on each GPU of
// devs: NCCL in place on the ranks' own tensors over the node-local
// engines (one group call, an allreduce per tensor and GPU), then the
// postscale in place (a combine kernel per GPU): no fusion buffer and no
// copies.
func (x *Path) allreduceInPlace(_ context.Context, w *job.Work, devs []*gpuDev) error {
	r := &w.Resp
	op, _, post := sched.Scales(r, w.Size)
	local, err := x.gpu.localEngines(devs)
	if err != nil {
		return err
	}
	mine := make([][]gpu.DevicePtr, len(devs)) // mine[j][i]: tensor i on devs[j]
	for j, d := range devs {
		for _, row := range w.Ops {
			mine[j] = append(mine[j], gpu.DevicePtr(rankPtrs(row, d, 0)[0]))
		}
	}
	if err := groupEach(local, func(j int, e engine) error {
		for i, p := range mine[j] {
			if err := e.Allreduce(devs[j].stream, p, p, int(r.Tensors[i].Shape.NumElements()), r.DType, op); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("NCCL allreduce over %d GPUs: %w", len(devs), err)
	}
	if post == 1 {
		return nil
	}
	for j, d := range devs {
		segs := make([]kernels.Segment, len(mine[j]))
		for i, p := range mine[j] {
			segs[i] = kernels.Segment{Count: uint64(r.Tensors[i].Shape.NumElements()), In: []uint64{uint64(p)}, Out: []uint64{uint64(p)}}
		}
		if err := d.combine(segs, 1, 1, r.DType, op, 1, post); err != nil {
			return fmt.Errorf("GPU %s: postscale: %w", d.info.UUID, err)
		}
	}
	return nil
}

// allreduceOneGPU is the allreduce of a node's ranks on one GPU, devs[0]:
// one combine kernel, a segment per tensor, that reads every rank's tensor
// and writes the result into every rank's tensor.
func (x *Path) allreduceOneGPU(_ context.Context, w *job.Work, devs []*gpuDev) error {
	r := &w.Resp
	d := devs[0]
	op, pre, post := sched.Scales(r, w.Size)
	segs := make([]kernels.Segment, len(w.Ops))
	nin := 0
	for i, row := range w.Ops {
		ps := rankPtrs(row, d, 0)
		nin = len(ps)
		segs[i] = kernels.Segment{Count: uint64(r.Tensors[i].Shape.NumElements()), In: ps, Out: ps}
	}
	if err := d.combine(segs, nin, nin, r.DType, op, pre, post); err != nil {
		return fmt.Errorf("GPU %s: allreduce: %w", d.info.UUID, err)
	}
	return nil
}

// fanOutFused writes every GPU's fusion buffer (offs: each tensor's place)
// into its ranks' tensors, postscaled: one combine kernel per GPU, a
// segment per tensor, one input and an output per local rank.
func fanOutFused(w *job.Work, devs []*gpuDev, offs []int, op tensor.ReduceOp, post float64) error {
	es := w.Resp.DType.Size()
	for _, d := range devs {
		segs := make([]kernels.Segment, len(w.Ops))
		nout := 0
		for i, row := range w.Ops {
			outs := rankPtrs(row, d, 0)
			nout = len(outs)
			segs[i] = kernels.Segment{Count: uint64((offs[i+1] - offs[i]) / es), In: []uint64{uint64(d.fuse.Add(offs[i]))}, Out: outs}
		}
		if err := d.combine(segs, 1, nout, w.Resp.DType, op, 1, post); err != nil {
			return fmt.Errorf("GPU %s: write back: %w", d.info.UUID, err)
		}
	}
	return nil
}

// allreduceHierarchical adds up the nodes' results across nodes through
// the job's engine and host memory: GPU 0's fusion buffer (which holds the
// node's result, as every GPU's does) copied to the executor's host fusion
// buffer, the calls of the one schedule on it (sched.AllreduceCalls, whole
// where sched.Whole says, as on the host path, so that nodes on either path
// agree), and the total copied into every GPU's fusion buffer.
func (x *Path) allreduceHierarchical(ctx context.Context, w *job.Work, devs []*gpuDev, total int, op tensor.ReduceOp) error {
	b, err := x.engines.For(w)
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
	if err := sched.AllreduceCalls(ctx, b, f, w.Resp.DType, op, sched.Whole(w), nil, nil); err != nil {
		return err
	}
	for _, d := range devs {
		if err := d.dev.CopyHtoD(d.stream, d.fuse, f); err != nil {
			return fmt.Errorf("GPU %s: %w", d.info.UUID, err)
		}
	}
	return nil
}

// reduceLocal reduces the node's ranks' tensors (offs: each tensor's place
// in the concatenation) into every GPU's fusion buffer, which ensure made
// large enough: on each GPU one combine kernel over its local ranks'
// tensors, each scaled by pre; then, over several GPUs, one NCCL allreduce
// of the fusion buffers over the node-local engines, in one group call.
func (x *Path) reduceLocal(w *job.Work, devs []*gpuDev, offs []int, op tensor.ReduceOp, pre float64) error {
	dt := w.Resp.DType
	for _, d := range devs {
		segs := make([]kernels.Segment, len(w.Ops))
		nin := 0
		for i, row := range w.Ops {
			ins := rankPtrs(row, d, 0)
			nin = len(ins)
			segs[i] = kernels.Segment{Count: uint64((offs[i+1] - offs[i]) / dt.Size()), In: ins, Out: []uint64{uint64(d.fuse.Add(offs[i]))}}
		}
		if err := d.combine(segs, nin, 1, dt, op, pre, 1); err != nil {
			return fmt.Errorf("GPU %s: reduce: %w", d.info.UUID, err)
		}
	}
	if len(devs) == 1 {
		return nil
	}
	local, err := x.gpu.localEngines(devs)
	if err != nil {
		return err
	}
	count := offs[len(offs)-1] / dt.Size()
	if err := groupEach(local, func(i int, e engine) error {
		return e.Allreduce(devs[i].stream, devs[i].fuse, devs[i].fuse, count, dt, op)
	}); err != nil {
		return fmt.Errorf("NCCL allreduce over %d GPUs: %w", len(devs), err)
	}
	return nil
}

// reduceWhole reduces every tensor of a reducescatter whole into the
// node's GPUs' fusion buffers (reduceLocal, with the prescale), and returns
// where each tensor lies there, the op and the postscale still to apply.
func (x *Path) reduceWhole(w *job.Work, devs []*gpuDev) (offs []int, op tensor.ReduceOp, post float64, err error) {
	r := &w.Resp
	op, pre, post := sched.Scales(r, w.Size)
	offs = sched.FusedOffsets(r)
	for _, d := range devs {
		if err := d.ensure(offs[len(r.Tensors)]); err != nil {
			return nil, op, post, err
		}
	}
	return offs, op, post, x.reduceLocal(w, devs, offs, op, pre)
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

// The native broadcast. On one node the root's GPU feeds the node's
// other GPUs over NCCL (broadcastOnNode); across nodes the nodes join on
// NCCL where the plan says (broadcastNCCL), else through the job's engine
// and host memory (broadcastHierarchical). Then each GPU's copy fans out
// to its other local ranks' tensors.

// broadcastOnNode is the broadcast on one node: tensor by tensor, the
// root's copied to the node's other GPUs over NCCL, then fanned out.
func (x *Path) broadcastOnNode(_ context.Context, w *job.Work, devs []*gpuDev) error {
	return eachBroadcast(w, func(src broadcastSources) error {
		switch {
		case src.root == nil:
			return fmt.Errorf("broadcast root %d has no buffer", w.Resp.Root)
		case len(devs) > 1:
			return x.broadcastOverGPUs(devs, src.on(devs), src.n, slices.Index(devs, src.root.d))
		}
		return nil
	})
}

// broadcastNCCL is the broadcast on NCCL across nodes, tensor by tensor
// (broadcastNCCLAcross), each then fanned out.
func (x *Path) broadcastNCCL(ctx context.Context, w *job.Work, devs []*gpuDev) error {
	return eachBroadcast(w, func(src broadcastSources) error {
		return x.broadcastNCCLAcross(ctx, w, devs, src)
	})
}

// eachBroadcast runs move for each tensor of w, given its sources, then
// fans each GPU's copy out to its other local ranks' tensors.
func eachBroadcast(w *job.Work, move func(src broadcastSources) error) error {
	for i := range w.Resp.Tensors {
		src, err := sourcesOf(w, i)
		if err != nil {
			return err
		}
		if err := move(src); err != nil {
			return err
		}
		if err := fanOut(w.Ops[i], src); err != nil {
			return err
		}
	}
	return nil
}

// broadcastHierarchical is the broadcast across nodes through the job's
// engine and host memory: the root's node copies the root's tensor to host
// memory (broadcastIn), the engine broadcasts it (the host path's calls,
// one per tensor: sched.BroadcastCalls, so that nodes on either path
// agree), every GPU without the root's tensor copies it from there
// (broadcastOut), and each GPU's copy fans out to its other local ranks'.
func (x *Path) broadcastHierarchical(ctx context.Context, w *job.Work, _ []*gpuDev) error {
	b, err := x.engines.For(w)
	if err != nil {
		return err
	}
	var src broadcastSources
	in := func(i int) ([]byte, error) {
		if src, err = sourcesOf(w, i); err != nil {
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
	return sched.BroadcastCalls(ctx, b, w, in, out)
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

// on returns the tensor on each GPU of devs that holds the data once it is
// there (first).
func (s broadcastSources) on(devs []*gpuDev) []gpu.DevicePtr {
	bufs := make([]gpu.DevicePtr, len(devs))
	for k, d := range devs {
		bufs[k] = s.first[d].ptr
	}
	return bufs
}

// broadcastOverGPUs copies n bytes from bufs[from] on devs[from] into
// bufs[k] on every other GPU devs[k] of the node: one NCCL broadcast over
// the node-local engines, in one group call.
func (x *Path) broadcastOverGPUs(devs []*gpuDev, bufs []gpu.DevicePtr, n, from int) error {
	local, err := x.gpu.localEngines(devs)
	if err != nil {
		return err
	}
	if err := groupEach(local, func(k int, e engine) error {
		return e.Broadcast(devs[k].stream, bufs[k], bufs[k], n, tensor.Uint8, from)
	}); err != nil {
		return fmt.Errorf("NCCL broadcast over %d GPUs: %w", len(devs), err)
	}
	return nil
}

// broadcastNCCLAcross is the broadcast the plan runs on NCCL across nodes:
// the root's node first spreads the root's tensor to its other GPUs, then
// devs[0] of every node (the GPU of the engine across nodes) joins one
// NCCL broadcast from the root's node, and the other nodes spread it from
// devs[0] to their other GPUs.
func (x *Path) broadcastNCCLAcross(ctx context.Context, w *job.Work, devs []*gpuDev, src broadcastSources) error {
	bufs := src.on(devs)
	if src.root != nil && len(devs) > 1 {
		if err := x.broadcastOverGPUs(devs, bufs, src.n, slices.Index(devs, src.root.d)); err != nil {
			return err
		}
	}
	across, err := x.gpu.acrossEngine(ctx, w)
	if err != nil {
		return err
	}
	rootNode := w.View.Rows.NodeOf(w.Resp.Root)
	if err := across.Broadcast(devs[0].stream, bufs[0], bufs[0], src.n, tensor.Uint8, rootNode); err != nil {
		return fmt.Errorf("NCCL broadcast across %d nodes: %w", across.Size(), err)
	}
	if src.root == nil && len(devs) > 1 {
		return x.broadcastOverGPUs(devs, bufs, src.n, 0)
	}
	return nil
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
// GPUs, the first among them), so every node runs what the plan says (the
// route ncclAcross). An allreduce runs allreduceFused: each node's ranks
// reduced on its GPUs, then allreduceNCCL (one NCCL allreduce of the fusion buffer of
// devs[0] over the engine across nodes, one rank per node, and an NCCL
// broadcast from there to the node's other GPUs), postscale, write-back; a
// broadcast runs broadcastNCCL, a reducescatter
// reducescatterOverGPUs (the nodes' results allreduced as above, each
// rank's block copied out), an allgather allgatherOverGPUs, an alltoall
// alltoallNCCLAcross, each with the engine across nodes.
//
// The engine across nodes is made on the job's first such response
// (GPUs.acrossEngine): the coordinator drew the NCCL unique id and sent it
// in that plan, over the control links (Work.NCCLID); every node joins
// (backends.DeviceEngines.Join) on its devs[0].

// CanNCCLAcross reports whether this node can join NCCL communicators
// across nodes: it has GPUs, NCCL, and does not stage every device tensor.
func (g *GPUs) CanNCCLAcross() bool { return g != nil && !g.hostOnly && g.engines != nil }

// NCCLUniqueID draws an NCCL unique id for a communicator across nodes
// (the coordinator's, sent in its plan).
func (g *GPUs) NCCLUniqueID() ([]byte, error) {
	if !g.CanNCCLAcross() {
		return nil, errors.New("this node runs without NCCL")
	}
	return g.engines.NewUniqueID()
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

// allreduceNCCL adds up the nodes' results (total bytes in every GPU's
// fusion buffer) on the engine across nodes (allreduceNCCLAcross).
func (x *Path) allreduceNCCL(ctx context.Context, w *job.Work, devs []*gpuDev, total int, op tensor.ReduceOp) error {
	across, err := x.gpu.acrossEngine(ctx, w)
	if err != nil {
		return err
	}
	return x.allreduceNCCLAcross(devs, across, total/w.Resp.DType.Size(), w.Resp.DType, op)
}

// allreduceNCCLAcross adds up the nodes' results on NCCL across nodes:
// the fusion buffer of devs[0] (which holds the node's result, as every
// GPU's does: count elements of dt) joins one NCCL allreduce over the
// engine across nodes, and the total goes from there to the node's other
// GPUs by an NCCL broadcast (broadcastOverGPUs).
func (x *Path) allreduceNCCLAcross(devs []*gpuDev, across engine, count int, dt tensor.DType, op tensor.ReduceOp) error {
	d0 := devs[0]
	if err := across.Allreduce(d0.stream, d0.fuse, d0.fuse, count, dt, op); err != nil {
		return fmt.Errorf("NCCL allreduce across %d nodes: %w", across.Size(), err)
	}
	if len(devs) == 1 {
		return nil
	}
	bufs := make([]gpu.DevicePtr, len(devs))
	for i, d := range devs {
		bufs[i] = d.fuse
	}
	return x.broadcastOverGPUs(devs, bufs, count*dt.Size(), 0)
}

// Results. An allgather, alltoall or reducescatter leaves each rank a
// result of a new size, which the daemon allocates on the rank's GPU and
// exports to the client (Done.device_output, freed on its Release). Its
// route's builder (a resultsFn) enqueues them:
//
//   - oneGPU: on one GPU, by device copies and the daemon's kernels;
//   - overGPUs: on the node's GPUs, by device copies on each and, over
//     several, NCCL between them (the node-local engines);
//   - hierarchical: across nodes through the job's engine (the calls of
//     the one schedule, sched.*Calls) and host memory (viaEngine);
//   - ncclAcross: across nodes on NCCL (the engine across nodes), where
//     the plan says (Resp.NCCL; viaNCCL).
//
// The allgather and the reducescatter on NCCL across nodes are their
// overGPUs builders given the engine across nodes.

// resultsFn enqueues the results of w's ops, on devs, into res
// (res[i][rank] for tensor i; on an error it holds the results allocated
// so far).
type resultsFn func(ctx context.Context, w *job.Work, devs []*gpuDev, res [][]devResult) error

// onNode is a builder that takes the engine across nodes, on one node.
func (x *Path) onNode(f func(w *job.Work, devs []*gpuDev, res [][]devResult, across engine) error) resultsFn {
	return func(_ context.Context, w *job.Work, devs []*gpuDev, res [][]devResult) error {
		return f(w, devs, res, nil)
	}
}

// viaEngine is a builder across nodes through the job's engine (the
// response's: sched.Engines).
func (x *Path) viaEngine(f func(ctx context.Context, w *job.Work, devs []*gpuDev, b backends.Backend, res [][]devResult) error) resultsFn {
	return func(ctx context.Context, w *job.Work, devs []*gpuDev, res [][]devResult) error {
		b, err := x.engines.For(w)
		if err != nil {
			return err
		}
		return f(ctx, w, devs, b, res)
	}
}

// viaNCCL is a builder across nodes on the engine across nodes.
func (x *Path) viaNCCL(f func(w *job.Work, devs []*gpuDev, res [][]devResult, across engine) error) resultsFn {
	return func(ctx context.Context, w *job.Work, devs []*gpuDev, res [][]devResult) error {
		across, err := x.gpu.acrossEngine(ctx, w)
		if err != nil {
			return err
		}
		return f(w, devs, res, across)
	}
}

// runResults runs an allgather, alltoall or reducescatter whose ops of
// this node are all on devs: after the clients' events, build; then it
// waits for the GPUs and answers each op with its result.
func (x *Path) runResults(w job.Work, devs []*gpuDev, rt route, build resultsFn) {
	defer traceGPU(&w, rt)()
	ctx := context.Background()
	res := make([][]devResult, len(w.Ops))
	err := waitEvents(&w)
	if err == nil {
		err = build(ctx, &w, devs, res)
	}
	if werr := x.gpu.waitStreams(ctx, devs); err == nil {
		err = werr
	}
	if err == nil {
		err = exportResults(&w, res)
	}
	if err != nil {
		for _, row := range res {
			for _, r := range row {
				if r.out != nil && !r.lent {
					r.cg.giveBack(r.out)
				}
			}
		}
		x.deviceFailed(w, err)
		return
	}
	for i, row := range w.Ops {
		for k, o := range row {
			if o != nil {
				o.Finish(res[i][k].done)
			}
		}
	}
}

// devResult is one op's result while it is built.
type devResult struct {
	done *ipcpb.Done
	d    *gpuDev // where p is: the rank's GPU
	cg   *ConnGPU
	out  *devOutput // the pool's buffer p is in; nil for n == 0
	p    gpu.DevicePtr
	n    int
	lent bool // the client holds it (ConnGPU.lend) until it sends Release
}

// newResult makes *res the result of n bytes of o (on its GPU),
// answered with done, in a buffer of o's connection's pool: the address,
// 0 for n == 0.
func newResult(res *devResult, o *job.Op, n int, done *ipcpb.Done) (gpu.DevicePtr, error) {
	dv := devOf(o)
	*res = devResult{done: done, d: dv.d, cg: dv.cg, n: n}
	if n == 0 {
		return 0, nil
	}
	out, err := dv.cg.take(dv.d, n)
	if err != nil {
		return 0, err
	}
	res.out, res.p = out, out.ptr
	return out.ptr, nil
}

// exportResults gives every result built its buffer's IPC handle (exported
// once per buffer) and lends the buffer to its client, filling in the
// Dones.
func exportResults(w *job.Work, res [][]devResult) error {
	for i, row := range w.Ops {
		for k, o := range row {
			if o == nil {
				continue // another node's rank
			}
			r := &res[i][k]
			db := &ipcpb.DeviceBuffer{DeviceUuid: r.d.info.UUID, Length: uint64(r.n)}
			r.done.DeviceOutput = db
			if r.n == 0 {
				continue
			}
			h, err := r.out.handle()
			if err != nil {
				return err
			}
			db.MemHandle, db.AllocSize = h[:], uint64(r.out.size)
			r.lent = true
			if !r.cg.lend(r.out) {
				// The client is gone (and the memory freed): it needs no answer.
				r.done = &ipcpb.Done{Code: ipcpb.Code_CODE_ABORTED, Error: "client gone"}
			}
		}
	}
	return nil
}

// allgatherOverGPUs builds an allgather's results on the node's GPUs and,
// given the engine across nodes (across; nil on one node), across nodes on
// NCCL, tensor by tensor (allgatherTensor).
func (x *Path) allgatherOverGPUs(w *job.Work, devs []*gpuDev, res [][]devResult, across engine) error {
	local, err := x.gpu.enginesBetween(devs)
	if err != nil {
		return err
	}
	for i := range w.Ops {
		if err := x.allgatherTensor(w, i, devs, res, local, across); err != nil {
			return err
		}
	}
	return nil
}

// allgatherTensor builds the results of w's tensor i (allgatherOverGPUs).
// Each GPU's first local rank's result is the GPU's lead: it receives
// every rank's piece at the rank's offset, from this node's ranks
// (gatherOnNode) and, across nodes, from the others (allgatherNCCLAcross,
// which completes GPU 0's lead and spreads it to the node's other GPUs).
// The GPU's other ranks then copy its lead.
func (x *Path) allgatherTensor(w *job.Work, i int, devs []*gpuDev, res [][]devResult, local []engine, across engine) error {
	r := &w.Resp
	ops, t := w.Ops[i], &r.Tensors[i]
	shape := sched.AllgatherShape(t)
	offs := make([]int, len(ops)+1) // rank k's piece at offs[k] of the result
	for k := range ops {
		offs[k+1] = offs[k] + sched.AllgatherRankBytes(t, r.DType, k)
	}
	total := offs[len(ops)]
	res[i] = make([]devResult, len(ops))
	alloc := func(k int) (gpu.DevicePtr, error) {
		return newResult(&res[i][k], ops[k], total, &ipcpb.Done{OutputShape: shape})
	}
	if total == 0 {
		for k, o := range ops {
			if o != nil {
				alloc(k)
			}
		}
		return nil
	}
	lead := make([]gpu.DevicePtr, len(devs)) // lead[j]: GPU devs[j]'s
	for k, o := range ops {
		if o == nil {
			continue // another node's rank
		}
		if j := slices.Index(devs, devOf(o).d); lead[j] == 0 {
			p, err := alloc(k)
			if err != nil {
				return err
			}
			lead[j] = p
		}
	}
	if err := gatherOnNode(ops, devs, lead, offs, local); err != nil {
		return err
	}
	if across != nil {
		if err := x.allgatherNCCLAcross(w, i, devs, lead, total, across); err != nil {
			return err
		}
	}
	for k, o := range ops {
		if o == nil || res[i][k].done != nil {
			continue // another node's rank, or a lead
		}
		d := devOf(o).d
		p, err := alloc(k)
		if err != nil {
			return err
		}
		if err := d.dev.CopyDtoD(d.stream, p, lead[slices.Index(devs, d)], total); err != nil {
			return fmt.Errorf("GPU %s: %w", d.info.UUID, err)
		}
	}
	return nil
}

// gatherOnNode puts every local rank's piece (rank k's at offs[k]) into
// every GPU's lead: a D2D copy into its own GPU's and, over several GPUs
// (local, the node-local engines over devs), NCCL broadcasts from its GPU
// into the others', one group call for all, each piece in place at its
// offset.
func gatherOnNode(ops []*job.Op, devs []*gpuDev, lead []gpu.DevicePtr, offs []int, local []engine) error {
	for k, o := range ops {
		if o == nil || devOf(o).n == 0 {
			continue
		}
		d := devOf(o).d
		if err := d.dev.CopyDtoD(d.stream, lead[slices.Index(devs, d)].Add(offs[k]), devOf(o).ptr, devOf(o).n); err != nil {
			return fmt.Errorf("GPU %s: %w", d.info.UUID, err)
		}
	}
	if local == nil {
		return nil
	}
	if err := groupEach(local, func(j int, e engine) error {
		for k, o := range ops {
			if o == nil || devOf(o).n == 0 {
				continue
			}
			p := lead[j].Add(offs[k])
			if err := e.Broadcast(devs[j].stream, p, p, devOf(o).n, tensor.Uint8, slices.Index(devs, devOf(o).d)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("NCCL broadcasts over %d GPUs: %w", len(devs), err)
	}
	return nil
}

// allgatherNCCLAcross completes GPU 0's lead (total bytes) for w's tensor
// i across nodes on NCCL: one broadcast per node of that node's pieces
// (contiguous: ranks are ordered by node) over the engine across nodes, in
// one group call, then the lead spread to the node's other GPUs' leads.
func (x *Path) allgatherNCCLAcross(w *job.Work, i int, devs []*gpuDev, lead []gpu.DevicePtr, total int, across engine) error {
	counts, _ := sched.AllgatherCounts(w.View.Rows, &w.Resp.Tensors[i], w.Resp.DType)
	if err := across.Group(func() error {
		off := 0
		for m, n := range counts {
			if n > 0 {
				p := lead[0].Add(off)
				if err := across.Broadcast(devs[0].stream, p, p, n, tensor.Uint8, m); err != nil {
					return err
				}
			}
			off += n
		}
		return nil
	}); err != nil {
		return fmt.Errorf("NCCL broadcasts across %d nodes: %w", len(counts), err)
	}
	if len(devs) == 1 {
		return nil
	}
	return x.broadcastOverGPUs(devs, lead, total, 0)
}

// allgatherHierarchical builds an allgather's results across nodes through
// the job's engine: the node's ranks' pieces copied to host memory in rank
// order, the engine's Allgatherv of the nodes' pieces (the host path's one
// call per tensor, sched.AllgatherCalls, so that nodes on either path
// agree), the result copied to one result on each GPU, which the GPU's
// other ranks copy.
func (x *Path) allgatherHierarchical(ctx context.Context, w *job.Work, devs []*gpuDev, b backends.Backend, res [][]devResult) error {
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
		shape := sched.AllgatherShape(&r.Tensors[i])
		res[i] = make([]devResult, len(row))
		lead := map[*gpuDev]gpu.DevicePtr{}
		for k, o := range row {
			if o == nil {
				continue
			}
			d := devOf(o).d
			p, err := newResult(&res[i][k], o, len(all), &ipcpb.Done{OutputShape: shape})
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
	return sched.AllgatherCalls(ctx, b, w, x.host.Fusion, in, out)
}

// gpuMove is n bytes from src on one of the node's GPUs to dst on another,
// or on the same one.
type gpuMove struct {
	from, to *gpuDev
	src, dst gpu.DevicePtr
	n        int
}

// moveAll enqueues the moves ms between GPUs of devs: one within a GPU by
// a D2D copy, one between two GPUs by an NCCL send and receive over local
// (the node-local engines over devs; nil with one GPU), all of those in
// one group call. Between two GPUs NCCL matches sends and receives in the
// order issued, which the one walk over ms gives on both sides.
func moveAll(devs []*gpuDev, local []engine, ms []gpuMove) error {
	between := false
	for _, m := range ms {
		if m.from != m.to {
			between = true
			continue
		}
		if err := m.to.dev.CopyDtoD(m.to.stream, m.dst, m.src, m.n); err != nil {
			return fmt.Errorf("GPU %s: %w", m.to.info.UUID, err)
		}
	}
	if !between {
		return nil
	}
	if err := groupEach(local, func(j int, e engine) error {
		d := devs[j]
		for _, m := range ms {
			var err error
			switch {
			case m.from == m.to:
			case m.from == d:
				err = e.Send(d.stream, m.src, m.n, tensor.Uint8, slices.Index(devs, m.to))
			case m.to == d:
				err = e.Recv(d.stream, m.dst, m.n, tensor.Uint8, slices.Index(devs, m.from))
			}
			if err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("NCCL sends and receives over %d GPUs: %w", len(devs), err)
	}
	return nil
}

// alltoallOverGPUs builds an alltoall's results on the node's GPUs: each
// rank's result on its GPU receives every rank's piece for it, in rank
// order (moveAll: D2D copies from the ranks on the same GPU, NCCL sends
// and receives from the others, one group call per tensor).
func (x *Path) alltoallOverGPUs(_ context.Context, w *job.Work, devs []*gpuDev, res [][]devResult) error {
	local, err := x.gpu.enginesBetween(devs)
	if err != nil {
		return err
	}
	for i, ops := range w.Ops {
		t := &w.Resp.Tensors[i]
		rowBytes := int(t.Shape.RowElements()) * w.Resp.DType.Size()
		n := len(ops)
		// start[s][k]: where rank s's piece for rank k begins in s's tensor.
		start := make([][]int, n)
		for s := range n {
			start[s] = make([]int, n+1)
			for k := range n {
				start[s][k+1] = start[s][k] + int(t.Splits[s][k])*rowBytes
			}
		}
		res[i] = make([]devResult, n)
		var ms []gpuMove
		for k, o := range ops {
			recv := make([]int32, n)
			var rows int64
			for s := range n {
				recv[s] = t.Splits[s][k]
				rows += int64(recv[s])
			}
			p, err := newResult(&res[i][k], o, int(rows)*rowBytes, &ipcpb.Done{OutputShape: append(tensor.Shape{rows}, t.Shape[1:]...), ReceivedSplits: recv})
			if err != nil {
				return err
			}
			at := 0
			for s, so := range ops {
				if m := start[s][k+1] - start[s][k]; m > 0 {
					ms = append(ms, gpuMove{from: devOf(so).d, to: devOf(o).d, src: devOf(so).ptr.Add(start[s][k]), dst: p.Add(at), n: m})
					at += m
				}
			}
		}
		if err := moveAll(devs, local, ms); err != nil {
			return err
		}
	}
	return nil
}

// placeAlltoall makes the results of this node's ranks for w's tensor i
// from what an alltoall across nodes received, in a's layout: each
// result allocated on its rank's GPU, and every run of it (one per node,
// A2APlan.Segments) put there by put, which copies n bytes at offset src
// of what was received to dst on GPU d.
func placeAlltoall(w *job.Work, i int, a *sched.A2APlan, res [][]devResult, put func(d *gpuDev, dst gpu.DevicePtr, src, n int) error) error {
	row, t := w.Ops[i], &w.Resp.Tensors[i]
	res[i] = make([]devResult, len(row))
	for r, o := range row {
		if o == nil {
			continue
		}
		d := devOf(o).d
		p, err := newResult(&res[i][r], o, a.Rows(r)*a.RowBytes, &ipcpb.Done{OutputShape: a.Shape(r, t.Shape), ReceivedSplits: a.Received(r)})
		if err != nil {
			return err
		}
		at := 0
		for _, sg := range a.Segments(r) {
			if sg[1] == 0 {
				continue
			}
			if err := put(d, p.Add(at), sg[0], sg[1]); err != nil {
				return err
			}
			at += sg[1]
		}
	}
	return nil
}

// alltoallHierarchical builds an alltoall's results across nodes through
// the job's engine: the pieces the node sends copied to host memory in
// A2APlan's order, the engine's Alltoallv (the host path's one call per
// tensor, sched.AlltoallCalls), each local rank's result copied to its GPU
// run by run from what was received (placeAlltoall): no assembly on the
// host.
func (x *Path) alltoallHierarchical(ctx context.Context, w *job.Work, devs []*gpuDev, b backends.Backend, res [][]devResult) error {
	in := func(i int, a *sched.A2APlan, into []byte) error {
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
	out := func(i int, a *sched.A2APlan, got []byte) error {
		if err := placeAlltoall(w, i, a, res, func(d *gpuDev, dst gpu.DevicePtr, src, n int) error {
			if err := d.dev.CopyHtoD(d.stream, dst, got[src:src+n]); err != nil {
				return fmt.Errorf("GPU %s: %w", d.info.UUID, err)
			}
			return nil
		}); err != nil {
			return err
		}
		return syncAll(ctx, devs)
	}
	return sched.AlltoallCalls(ctx, b, w, x.host.Fusion, in, out)
}

// alltoallNCCLAcross builds an alltoall's results across nodes on NCCL,
// in A2APlan's layout (the hierarchical alltoall's, in device memory), on
// GPU 0's fusion buffer, tensor by tensor: the pieces this node sends
// gathered into a send buffer there (moveAll: D2D from GPU 0's ranks, NCCL
// from the other GPUs'), exchanged with the other nodes into a receive
// buffer there (alltoallExchange), and each local rank's result assembled
// from its runs in it (placeAlltoall, moveAll from GPU 0).
func (x *Path) alltoallNCCLAcross(w *job.Work, devs []*gpuDev, res [][]devResult, across engine) error {
	local, err := x.gpu.enginesBetween(devs)
	if err != nil {
		return err
	}
	d0 := devs[0]
	for i, row := range w.Ops {
		a := sched.NewA2APlan(w, i)
		nn := len(a.SendCounts)
		sendOff := make([]int, nn+1) // node m's pieces at sendOff[m] of the send buffer
		for m, c := range a.SendCounts {
			sendOff[m+1] = sendOff[m] + c
		}
		if err := d0.ensure(sendOff[nn] + a.Total); err != nil {
			return err
		}
		sendBuf, recvBuf := d0.fuse, d0.fuse.Add(sendOff[nn])
		var in []gpuMove
		pos := 0
		a.Sends(func(s, d int) {
			if o, n := row[s], a.Piece(s, d); o != nil && n > 0 {
				in = append(in, gpuMove{from: devOf(o).d, to: d0, src: devOf(o).ptr.Add(a.Start(s, d)), dst: sendBuf.Add(pos), n: n})
				pos += n
			}
		})
		if err := moveAll(devs, local, in); err != nil {
			return fmt.Errorf("the node's pieces to GPU 0: %w", err)
		}
		if err := alltoallExchange(a, w.View.Rows.Node, d0, sendBuf, sendOff, recvBuf, across); err != nil {
			return err
		}
		var out []gpuMove
		placeAlltoall(w, i, a, res, func(d *gpuDev, dst gpu.DevicePtr, src, n int) error {
			out = append(out, gpuMove{from: d0, to: d, src: recvBuf.Add(src), dst: dst, n: n})
			return nil
		})
		if err := moveAll(devs, local, out); err != nil {
			return fmt.Errorf("the results from GPU 0: %w", err)
		}
	}
	return nil
}

// alltoallExchange sends what this node (me) has for each other node m
// (at sendOff[m] of sendBuf) and receives what m has for it (into recvBuf
// at a.BlockStart[m]): one NCCL send and receive per node over the engine
// across nodes, in one group call; its own block goes by a D2D copy on
// GPU 0 (d0). Between two nodes NCCL matches them in the order issued,
// which the same loop gives on both sides.
func alltoallExchange(a *sched.A2APlan, me int, d0 *gpuDev, sendBuf gpu.DevicePtr, sendOff []int, recvBuf gpu.DevicePtr, across engine) error {
	if n := a.SendCounts[me]; n > 0 {
		if err := d0.dev.CopyDtoD(d0.stream, recvBuf.Add(a.BlockStart[me]), sendBuf.Add(sendOff[me]), n); err != nil {
			return fmt.Errorf("GPU %s: %w", d0.info.UUID, err)
		}
	}
	nn := len(a.SendCounts)
	if err := across.Group(func() error {
		for m := range nn {
			if m == me {
				continue
			}
			if n := a.SendCounts[m]; n > 0 {
				if err := across.Send(d0.stream, sendBuf.Add(sendOff[m]), n, tensor.Uint8, m); err != nil {
					return err
				}
			}
			if n := a.RecvCounts[m]; n > 0 {
				if err := across.Recv(d0.stream, recvBuf.Add(a.BlockStart[m]), n, tensor.Uint8, m); err != nil {
					return err
				}
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("NCCL sends and receives across %d nodes: %w", nn, err)
	}
	return nil
}

// reducescatterOneGPU builds a reducescatter's results on one GPU, d: one
// combine kernel with a segment per tensor and rank, which reads that
// rank's block of every rank's tensor and writes the rank's result, scaled
// as the CPU path scales.
func reducescatterOneGPU(_ context.Context, w *job.Work, devs []*gpuDev, res [][]devResult) error {
	r := &w.Resp
	d := devs[0]
	op, pre, post := sched.Scales(r, w.Size)
	es := r.DType.Size()
	var segs []kernels.Segment
	nin := 0
	for i, ops := range w.Ops {
		t := &r.Tensors[i]
		rowBytes := int(t.Shape.RowElements()) * es
		res[i] = make([]devResult, len(ops))
		for k := range ops {
			start, rows := sched.ScatterBlock(t, len(ops), k)
			n := int(rows) * rowBytes
			p, err := newResult(&res[i][k], ops[k], n, &ipcpb.Done{OutputShape: append(tensor.Shape{rows}, t.Shape[1:]...)})
			if err != nil {
				return err
			}
			if p == 0 {
				continue
			}
			ins := rankPtrs(ops, d, int(start)*rowBytes)
			nin = len(ins)
			segs = append(segs, kernels.Segment{Count: uint64(n / es), In: ins, Out: []uint64{uint64(p)}})
		}
	}
	if err := d.combine(segs, nin, 1, r.DType, op, pre, post); err != nil {
		return fmt.Errorf("GPU %s: reducescatter: %w", d.info.UUID, err)
	}
	return nil
}

// reducescatterOverGPUs builds a reducescatter's results on the node's
// GPUs and, given the engine across nodes (across; nil on one node),
// across nodes on NCCL: the ranks' whole tensors reduced into every GPU's
// fusion buffer as an allreduce's are (reduceWhole: local kernels, NCCL
// over the node's GPUs; across nodes then allreduceNCCLAcross), then each
// local rank's block copied out into its result on its GPU and postscaled
// there.
func (x *Path) reducescatterOverGPUs(w *job.Work, devs []*gpuDev, res [][]devResult, across engine) error {
	r := &w.Resp
	es := r.DType.Size()
	offs, op, post, err := x.reduceWhole(w, devs)
	if err != nil {
		return err
	}
	if across != nil {
		if err := x.allreduceNCCLAcross(devs, across, offs[len(offs)-1]/es, r.DType, op); err != nil {
			return err
		}
	}
	for i, ops := range w.Ops {
		t := &r.Tensors[i]
		rowBytes := int(t.Shape.RowElements()) * es
		res[i] = make([]devResult, len(ops))
		for k, o := range ops {
			if o == nil {
				continue // another node's rank
			}
			start, rows := sched.ScatterBlock(t, w.Size, k)
			d := devOf(o).d
			if err := scatterResult(&res[i][k], o, t, int(rows), post, r.DType, func(p gpu.DevicePtr, n int) error {
				return d.dev.CopyDtoD(d.stream, p, d.fuse.Add(offs[i]+int(start)*rowBytes), n)
			}); err != nil {
				return err
			}
		}
	}
	return nil
}

// scatterResult makes *res a reducescatter's result of rows rows of t for
// o, on its GPU: in a buffer of its connection's pool, filled by fill (n
// bytes at p), and postscaled.
func scatterResult(res *devResult, o *job.Op, t *plan.Tensor, rows int, post float64, dt tensor.DType, fill func(p gpu.DevicePtr, n int) error) error {
	d := devOf(o).d
	n := rows * int(t.Shape.RowElements()) * dt.Size()
	p, err := newResult(res, o, n, &ipcpb.Done{OutputShape: append(tensor.Shape{int64(rows)}, t.Shape[1:]...)})
	if err != nil || p == 0 {
		return err
	}
	if err := fill(p, n); err != nil {
		return fmt.Errorf("GPU %s: %w", d.info.UUID, err)
	}
	if post != 1 {
		if err := d.scale(p, n/dt.Size(), dt, post); err != nil {
			return fmt.Errorf("GPU %s: postscale: %w", d.info.UUID, err)
		}
	}
	return nil
}

// reducescatterHierarchical builds a reducescatter's results across nodes
// through the job's engine: the node's ranks' tensors reduced on its GPUs
// (reduceWhole, with the prescale), then per tensor GPU 0's result copied
// to host memory, the engine's ReduceScatter of it into this node's block
// (the host path's one call per tensor, sched.ReducescatterCalls, with its
// counts), and each local rank's rows of the block copied to its result on
// its GPU and postscaled there.
func (x *Path) reducescatterHierarchical(ctx context.Context, w *job.Work, devs []*gpuDev, b backends.Backend, res [][]devResult) error {
	r := &w.Resp
	mb := w.View.Rows
	offs, _, post, err := x.reduceWhole(w, devs)
	if err != nil {
		return err
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
		row := w.Ops[i]
		res[i] = make([]devResult, len(row))
		for lr := range at {
			rank := mb.Offset + lr
			o := row[rank]
			if o == nil {
				continue
			}
			_, rows := sched.ScatterBlock(t, w.Size, rank)
			d := devOf(o).d
			if err := scatterResult(&res[i][rank], o, t, int(rows), post, r.DType, func(p gpu.DevicePtr, n int) error {
				return d.dev.CopyHtoD(d.stream, p, block[at[lr]:at[lr]+n])
			}); err != nil {
				return err
			}
		}
		// block is this tensor's; the fusion buffer was read by the engine
		// already. The copies from block finish before it goes.
		return syncAll(ctx, devs)
	}
	return sched.ReducescatterCalls(ctx, b, w, full, out)
}
