package cuda

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/tensor"
)

// ncclResult_t values.
const (
	ncclSuccess         = 0
	ncclInvalidArgument = 4
	ncclInvalidUsage    = 5
	ncclInProgress      = 7
)

var ncclResultNames = []string{"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
	"ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress"}

// NCCL is the NCCL library. Its methods are safe for concurrent use.
type NCCL struct {
	lib     *ncclLib
	version int
}

var _ gpu.NCCL = (*NCCL)(nil)

var ncclLoad struct {
	once sync.Once
	n    *NCCL
	err  error
}

// OpenNCCL loads libnccl.so.2 (once per process; see ncclPaths for where it
// is looked for). Its errors wrap gpu.ErrNoNCCL.
func OpenNCCL() (*NCCL, error) {
	ncclLoad.once.Do(func() {
		h, path, err := dlopen(ncclPaths())
		if err != nil {
			ncclLoad.err = fmt.Errorf("%w: load libnccl.so.2 (set HVDD_NCCL_LIBRARY, LD_LIBRARY_PATH, or pip install nvidia-nccl-cu12): %v", gpu.ErrNoNCCL, err)
			return
		}
		lib := &ncclLib{}
		if err := bind(h, lib); err != nil {
			ncclLoad.err = fmt.Errorf("%w: %s: %v", gpu.ErrNoNCCL, path, err)
			return
		}
		var v int32
		if r := lib.ncclGetVersion(&v); r != ncclSuccess {
			ncclLoad.err = fmt.Errorf("%w: %s: ncclGetVersion: %d", gpu.ErrNoNCCL, path, r)
			return
		}
		ncclLoad.n = &NCCL{lib: lib, version: int(v)}
	})
	return ncclLoad.n, ncclLoad.err
}

func (n *NCCL) err(call string, r int32) error {
	if r == ncclSuccess {
		return nil
	}
	name := fmt.Sprintf("ncclResult %d", r)
	if int(r) < len(ncclResultNames) {
		name = ncclResultNames[r]
	}
	return &gpu.Error{Call: call, Code: int(r), Name: name, Desc: n.lib.ncclGetErrorString(r)}
}

func invalid(call, format string, args ...any) error {
	return &gpu.Error{Call: call, Code: ncclInvalidArgument, Name: "ncclInvalidArgument", Desc: "hvdd: " + fmt.Sprintf(format, args...)}
}

// Version returns ncclGetVersion's (21903 for 2.19.3).
func (n *NCCL) Version() (int, error) { return n.version, nil }

// DType returns NCCL's ncclDataType_t for dt. NCCL has no uint16, int16 or
// bool (the daemon reduces those with its own kernels and moves them as
// uint8), and bfloat16 only from 2.10.
func (n *NCCL) DType(dt tensor.DType) (int32, bool) {
	switch dt {
	case tensor.Int8:
		return 0, true // ncclInt8
	case tensor.Uint8:
		return 1, true // ncclUint8
	case tensor.Int32:
		return 2, true // ncclInt32
	case tensor.Int64:
		return 4, true // ncclInt64
	case tensor.Float16:
		return 6, true // ncclFloat16
	case tensor.Float32:
		return 7, true // ncclFloat32
	case tensor.Float64:
		return 8, true // ncclFloat64
	case tensor.BFloat16:
		return 9, n.version >= 21000 // ncclBfloat16
	}
	return 0, false
}

// redOp returns NCCL's ncclRedOp_t for op.
func (n *NCCL) redOp(op tensor.ReduceOp) (int32, bool) {
	switch op {
	case tensor.Sum:
		return 0, true // ncclSum
	case tensor.Product:
		return 1, true // ncclProd
	case tensor.Max:
		return 2, true // ncclMax
	case tensor.Min:
		return 3, true // ncclMin
	case tensor.Average:
		return 4, n.version >= 21000 // ncclAvg
	}
	return 0, false
}

// GetUniqueID runs ncclGetUniqueId (which starts NCCL's bootstrap root in
// this process).
func (n *NCCL) GetUniqueID() (gpu.UniqueID, error) {
	var id gpu.UniqueID
	return id, n.err("ncclGetUniqueId", n.lib.ncclGetUniqueID(&id))
}

func deviceOf(call string, dev gpu.Device) (*device, error) {
	d, ok := dev.(*device)
	if !ok || d == nil {
		return nil, invalid(call, "device %T is not a CUDA device", dev)
	}
	return d, nil
}

// CommInitRank runs ncclCommInitRank, which blocks until every rank joined,
// on a goroutine of its own. If ctx ends first, CommInitRank returns ctx's
// error at once and the goroutine aborts the communicator when (if) the
// call returns; a rank whose peers never come keeps that goroutine (and
// its thread) until the process ends, which is NCCL's blocking init.
func (n *NCCL) CommInitRank(ctx context.Context, dev gpu.Device, nranks int, id gpu.UniqueID, rank int) (gpu.Comm, error) {
	const call = "ncclCommInitRank"
	d, err := deviceOf(call, dev)
	if err != nil {
		return nil, err
	}
	type result struct {
		h   uintptr
		err error
	}
	res := make(chan result, 1)
	var gaveUp atomic.Bool
	go func() {
		var h uintptr
		err := d.do(call, func() int32 { return n.lib.ncclCommInitRank(&h, int32(nranks), uniqueID{id}, int32(rank)) })
		if err == nil && gaveUp.Load() {
			d.do("ncclCommAbort", func() int32 { return n.lib.ncclCommAbort(h) })
			return
		}
		res <- result{h, n.wrap(err)}
	}()
	select {
	case r := <-res:
		if r.err != nil {
			return nil, r.err
		}
		return &comm{n: n, d: d, h: r.h, rank: rank, size: nranks}, nil
	case <-ctx.Done():
		gaveUp.Store(true)
		select {
		case r := <-res: // it finished meanwhile
			if r.err == nil {
				d.do("ncclCommAbort", func() int32 { return n.lib.ncclCommAbort(r.h) })
			}
		default:
		}
		return nil, fmt.Errorf("%s: rank %d of %d: %w", call, rank, nranks, ctx.Err())
	}
}

// wrap turns a CUDA-shaped error from device.do around an NCCL call into
// an NCCL one (do names it with the CUDA error table).
func (n *NCCL) wrap(err error) error {
	ge, ok := err.(*gpu.Error)
	if !ok || !strings.HasPrefix(ge.Call, "nccl") || strings.HasPrefix(ge.Desc, "hvdd:") {
		return err
	}
	return n.err(ge.Call, int32(ge.Code))
}

// ncall runs an NCCL call with d's context current and returns its error.
func (n *NCCL) ncall(d *device, call string, f func() int32) error {
	return n.wrap(d.do(call, f))
}

// CommInitAll makes one communicator over devs with ncclCommInitAll.
func (n *NCCL) CommInitAll(devs []gpu.Device) ([]gpu.Comm, error) {
	const call = "ncclCommInitAll"
	if len(devs) == 0 {
		return nil, invalid(call, "no devices")
	}
	ds := make([]*device, len(devs))
	ords := make([]int32, len(devs))
	for i, dev := range devs {
		d, err := deviceOf(call, dev)
		if err != nil {
			return nil, err
		}
		ds[i], ords[i] = d, d.dev
	}
	hs := make([]uintptr, len(devs))
	if err := n.ncall(ds[0], call, func() int32 { return n.lib.ncclCommInitAll(&hs[0], int32(len(devs)), &ords[0]) }); err != nil {
		return nil, err
	}
	out := make([]gpu.Comm, len(devs))
	for i := range out {
		out[i] = &comm{n: n, d: ds[i], h: hs[i], rank: i, size: len(devs)}
	}
	return out, nil
}

// GroupStart locks the calling goroutine to its thread until GroupEnd
// (NCCL's group state is per thread).
func (n *NCCL) GroupStart() error {
	runtime.LockOSThread()
	if err := n.err("ncclGroupStart", n.lib.ncclGroupStart()); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	return nil
}

// GroupEnd ends the group and unlocks the goroutine from its thread.
func (n *NCCL) GroupEnd() error {
	defer runtime.UnlockOSThread()
	return n.err("ncclGroupEnd", n.lib.ncclGroupEnd())
}

// comm is an ncclComm_t.
type comm struct {
	n          *NCCL
	d          *device
	h          uintptr
	rank, size int
}

func (c *comm) Rank() int          { return c.rank }
func (c *comm) Size() int          { return c.size }
func (c *comm) Device() gpu.Device { return c.d }

// args converts a collective's stream, dtype and op (op < 0: none).
func (c *comm) args(call string, s gpu.Stream, dt tensor.DType, op tensor.ReduceOp, withOp bool) (uintptr, int32, int32, error) {
	cs, err := streamOf(call, s)
	if err != nil {
		return 0, 0, 0, invalid(call, "%v", err)
	}
	ndt, ok := c.n.DType(dt)
	if !ok {
		return 0, 0, 0, invalid(call, "NCCL %d has no dtype %v", c.n.version, dt)
	}
	var nop int32
	if withOp {
		if nop, ok = c.n.redOp(op); !ok {
			return 0, 0, 0, invalid(call, "NCCL %d has no reduction %v", c.n.version, op)
		}
	}
	return cs.h, ndt, nop, nil
}

func (c *comm) Allreduce(s gpu.Stream, send, recv gpu.DevicePtr, count int, dt tensor.DType, op tensor.ReduceOp) error {
	const call = "ncclAllReduce"
	sh, ndt, nop, err := c.args(call, s, dt, op, true)
	if err != nil {
		return err
	}
	return c.n.ncall(c.d, call, func() int32 {
		return c.n.lib.ncclAllReduce(uint64(send), uint64(recv), uint64(count), ndt, nop, c.h, sh)
	})
}

func (c *comm) Broadcast(s gpu.Stream, send, recv gpu.DevicePtr, count int, dt tensor.DType, root int) error {
	const call = "ncclBroadcast"
	sh, ndt, _, err := c.args(call, s, dt, 0, false)
	if err != nil {
		return err
	}
	return c.n.ncall(c.d, call, func() int32 {
		return c.n.lib.ncclBroadcast(uint64(send), uint64(recv), uint64(count), ndt, int32(root), c.h, sh)
	})
}

func (c *comm) Reduce(s gpu.Stream, send, recv gpu.DevicePtr, count int, dt tensor.DType, op tensor.ReduceOp, root int) error {
	const call = "ncclReduce"
	sh, ndt, nop, err := c.args(call, s, dt, op, true)
	if err != nil {
		return err
	}
	return c.n.ncall(c.d, call, func() int32 {
		return c.n.lib.ncclReduce(uint64(send), uint64(recv), uint64(count), ndt, nop, int32(root), c.h, sh)
	})
}

func (c *comm) AllGather(s gpu.Stream, send, recv gpu.DevicePtr, sendCount int, dt tensor.DType) error {
	const call = "ncclAllGather"
	sh, ndt, _, err := c.args(call, s, dt, 0, false)
	if err != nil {
		return err
	}
	return c.n.ncall(c.d, call, func() int32 {
		return c.n.lib.ncclAllGather(uint64(send), uint64(recv), uint64(sendCount), ndt, c.h, sh)
	})
}

func (c *comm) ReduceScatter(s gpu.Stream, send, recv gpu.DevicePtr, recvCount int, dt tensor.DType, op tensor.ReduceOp) error {
	const call = "ncclReduceScatter"
	sh, ndt, nop, err := c.args(call, s, dt, op, true)
	if err != nil {
		return err
	}
	return c.n.ncall(c.d, call, func() int32 {
		return c.n.lib.ncclReduceScatter(uint64(send), uint64(recv), uint64(recvCount), ndt, nop, c.h, sh)
	})
}

func (c *comm) Send(s gpu.Stream, buf gpu.DevicePtr, count int, dt tensor.DType, peer int) error {
	const call = "ncclSend"
	sh, ndt, _, err := c.args(call, s, dt, 0, false)
	if err != nil {
		return err
	}
	return c.n.ncall(c.d, call, func() int32 {
		return c.n.lib.ncclSend(uint64(buf), uint64(count), ndt, int32(peer), c.h, sh)
	})
}

func (c *comm) Recv(s gpu.Stream, buf gpu.DevicePtr, count int, dt tensor.DType, peer int) error {
	const call = "ncclRecv"
	sh, ndt, _, err := c.args(call, s, dt, 0, false)
	if err != nil {
		return err
	}
	return c.n.ncall(c.d, call, func() int32 {
		return c.n.lib.ncclRecv(uint64(buf), uint64(count), ndt, int32(peer), c.h, sh)
	})
}

func (c *comm) AsyncError() error {
	const call = "ncclCommGetAsyncError"
	var r int32
	if err := c.n.err(call, c.n.lib.ncclCommGetAsyncError(c.h, &r)); err != nil {
		return err
	}
	if r == ncclInProgress {
		return nil
	}
	return c.n.err(call, r)
}

func (c *comm) Abort() error {
	return c.n.ncall(c.d, "ncclCommAbort", func() int32 { return c.n.lib.ncclCommAbort(c.h) })
}

func (c *comm) Destroy() error {
	return c.n.ncall(c.d, "ncclCommDestroy", func() int32 { return c.n.lib.ncclCommDestroy(c.h) })
}
