package fake_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/fake"
	"github.com/hvdd/hvdd/tensor"
)

func gpuErr(t *testing.T, err error) *gpu.Error {
	t.Helper()
	var ge *gpu.Error
	if !errors.As(err, &ge) {
		t.Fatalf("error %v (%T) is not a *gpu.Error", err, err)
	}
	return ge
}

func openDev(t *testing.T, d gpu.Driver, i int) (gpu.Device, gpu.Stream) {
	t.Helper()
	dev, err := d.Open(i)
	if err != nil {
		t.Fatal(err)
	}
	s, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Destroy(); dev.Close() })
	return dev, s
}

func TestFailNext(t *testing.T) {
	defer fake.Reset()
	dev, _ := openDev(t, fake.New(fake.Options{}), 0)
	fake.FailNext("cuMemAlloc", 2, 2)
	for i := 0; i < 2; i++ {
		_, err := dev.Alloc(64)
		if ge := gpuErr(t, err); ge.Call != "cuMemAlloc" || ge.Code != 2 || ge.Name != "CUDA_ERROR_OUT_OF_MEMORY" {
			t.Errorf("injected failure %d: %+v", i, ge)
		}
	}
	p, err := dev.Alloc(64)
	if err != nil {
		t.Fatalf("the third Alloc: %v", err)
	}
	dev.Free(p)
	fake.FailNext("ncclAllReduce", 1, 0)
	if ge := gpuErr(t, fakeAllreduceErr(t)); ge.Code != 2 || ge.Name != "ncclSystemError" {
		t.Errorf("injected NCCL failure: %+v", ge)
	}
}

// fakeAllreduceErr makes a one-rank communicator and returns its first
// Allreduce's error.
func fakeAllreduceErr(t *testing.T) error {
	d := fake.New(fake.Options{})
	dev, s := openDev(t, d, 0)
	comms, err := fake.NewNCCL().CommInitAll([]gpu.Device{dev})
	if err != nil {
		t.Fatal(err)
	}
	defer comms[0].Destroy()
	p, _ := dev.Alloc(64)
	defer dev.Free(p)
	err = comms[0].Allreduce(s, p, p, 16, tensor.Float32, tensor.Sum)
	s.Synchronize(context.Background())
	return err
}

func TestLoseDevice(t *testing.T) {
	defer fake.Reset()
	dev, s := openDev(t, fake.New(fake.Options{}), 0)
	p, err := dev.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	fake.LoseDevice()
	if err := dev.Memset8(s, p, 1, 64); gpuErr(t, err).Desc != "fake: device lost" {
		t.Errorf("Memset8 on a lost device: %v", err)
	}
	if _, err := dev.Alloc(1); err == nil {
		t.Error("Alloc on a lost device succeeded")
	}
	if _, err := fake.NewNCCL().GetUniqueID(); gpuErr(t, err).Name != "ncclUnhandledCudaError" {
		t.Errorf("GetUniqueID on a lost device: %v", err)
	}
	fake.Reset()
	if err := dev.Free(p); err != nil {
		t.Errorf("Free after Reset: %v", err)
	}
}

// TestLoseAtInFlight: work queued before the loss fails the stream (a
// sticky error), as on a GPU that fell off the bus.
func TestLoseDeviceInFlight(t *testing.T) {
	defer fake.Reset()
	dev, s := openDev(t, fake.New(fake.Options{MaxDelay: 20 * time.Millisecond}), 0)
	p, _ := dev.Alloc(1 << 20)
	defer dev.Free(p)
	for i := 0; i < 10; i++ {
		if err := dev.Memset8(s, p, byte(i), 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	fake.LoseDevice()
	if err := s.Synchronize(context.Background()); err == nil {
		t.Error("Synchronize after the device was lost with work queued: no error")
	}
}

// TestEnvInjection starts a child with HVDD_FAKE_GPU_FAIL and
// HVDD_FAKE_GPU_LOSE_AT, the way a test tells a daemon it started.
func TestEnvInjection(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"=1",
		"HVDD_FAKE_GPU_FAIL=cuIpcOpenMemHandle:1:1,cuMemAlloc:1",
		"HVDD_FAKE_GPU_LOSE_AT=cuStreamCreate:2")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	want := []string{
		"alloc 1: cuMemAlloc: CUDA_ERROR_UNKNOWN (999): fake: injected failure",
		"alloc 2: <nil>",
		"open: cuIpcOpenMemHandle: CUDA_ERROR_INVALID_VALUE (1): fake: injected failure",
		"stream 1: <nil>",
		"stream 2: cuStreamCreate: CUDA_ERROR_UNKNOWN (999): fake: device lost",
		"alloc 3: cuMemAlloc: CUDA_ERROR_UNKNOWN (999): fake: device lost",
	}
	if got := strings.TrimSpace(string(out)); got != strings.Join(want, "\n") {
		t.Errorf("child printed\n%s\nwant\n%s", got, strings.Join(want, "\n"))
	}
}

const envChild = "HVDD_FAKE_TEST_ENV_CHILD"

// envChildMain is TestEnvInjection's child.
func envChildMain() {
	d := fake.New(fake.Options{})
	dev, err := d.Open(0)
	if err != nil {
		panic(err)
	}
	p, err := dev.Alloc(64)
	println2("alloc 1:", err)
	p, err = dev.Alloc(64)
	println2("alloc 2:", err)
	h, _ := dev.IpcMemHandle(p)
	_, err = dev.OpenMemHandle(h, 64)
	println2("open:", err)
	_, err = dev.NewStream()
	println2("stream 1:", err)
	_, err = dev.NewStream()
	println2("stream 2:", err)
	_, err = dev.Alloc(64)
	println2("alloc 3:", err)
}

func println2(what string, err error) {
	os.Stdout.WriteString(what + " ")
	if err == nil {
		os.Stdout.WriteString("<nil>\n")
	} else {
		os.Stdout.WriteString(err.Error() + "\n")
	}
}

// TestHandleLayout builds a memory handle by hand from a memfd made here,
// as the package doc describes (the Python client's tests do the same), and
// opens it; and checks the layout of the handles the fake makes.
func TestHandleLayout(t *testing.T) {
	dev, s := openDev(t, fake.New(fake.Options{}), 0)
	const n = 8192
	fd, err := unix.MemfdCreate("python-side", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	unix.Ftruncate(fd, n)
	unix.Pwrite(fd, bytes.Repeat([]byte{0x3c}, n), 0)
	var h gpu.IpcMemHandle
	copy(h[:], "HVDDFAKE")
	binary.LittleEndian.PutUint32(h[8:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint32(h[12:], uint32(fd))
	binary.LittleEndian.PutUint64(h[16:], n)
	binary.LittleEndian.PutUint64(h[24:], 12345)
	p, err := dev.OpenMemHandle(h, n)
	if err != nil {
		t.Fatalf("OpenMemHandle of a hand-made handle: %v", err)
	}
	got := make([]byte, n)
	dev.CopyDtoH(s, got, p)
	dev.Memset8(s, p.Add(100), 0x11, 1)
	s.Synchronize(context.Background())
	if !bytes.Equal(got, bytes.Repeat([]byte{0x3c}, n)) {
		t.Error("the mapped memfd does not hold what was written to it")
	}
	var one [1]byte
	unix.Pread(fd, one[:], 100)
	if one[0] != 0x11 {
		t.Errorf("a device write did not reach the memfd: %#x", one[0])
	}
	// Opening again counts a reference: the same address, two closes.
	p2, err := dev.OpenMemHandle(h, n)
	if err != nil || p2 != p {
		t.Errorf("second OpenMemHandle = %#x, %v; want %#x", uint64(p2), err, uint64(p))
	}
	if err := dev.CloseMemHandle(p); err != nil {
		t.Fatal(err)
	}
	if err := dev.CloseMemHandle(p); err != nil {
		t.Fatal(err)
	}
	if err := dev.CloseMemHandle(p); err == nil {
		t.Error("a third CloseMemHandle succeeded")
	}
	// A wrong size is refused.
	if _, err := dev.OpenMemHandle(h, n+1); err == nil {
		t.Error("OpenMemHandle with the wrong size succeeded")
	}

	// The fake's own handles.
	q, _ := dev.Alloc(1000)
	mh, _ := dev.IpcMemHandle(q)
	if string(mh[:8]) != "HVDDFAKE" || binary.LittleEndian.Uint32(mh[8:]) != uint32(os.Getpid()) ||
		binary.LittleEndian.Uint64(mh[16:]) != 1000 || !bytes.Equal(mh[32:], make([]byte, 32)) {
		t.Errorf("memory handle %x", mh)
	}
	link, _ := os.Readlink("/proc/self/fd/" + itoa(int(int32(binary.LittleEndian.Uint32(mh[12:])))))
	if !strings.HasPrefix(link, "/memfd:hvdd-fake-mem-") {
		t.Errorf("the handle's fd is %q", link)
	}
	// A freed allocation's handle no longer opens.
	dev.Free(q)
	if _, err := dev.OpenMemHandle(mh, 1000); err == nil {
		t.Error("OpenMemHandle of a freed allocation succeeded")
	}
	e, _ := dev.NewEvent(true)
	defer e.Destroy()
	eh, _ := e.IpcHandle()
	if string(eh[:8]) != "HVDDFEVT" || binary.LittleEndian.Uint32(eh[8:]) != uint32(os.Getpid()) || !bytes.Equal(eh[16:], make([]byte, 48)) {
		t.Errorf("event handle %x", eh)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestAbortReachesPeer: a rank blocked in a collective fails promptly, with
// AsyncError set, when another rank aborts; so does one whose peer's
// connection breaks.
func TestAbortReachesPeer(t *testing.T) {
	d := fake.New(fake.Options{Devices: 2})
	dev0, s0 := openDev(t, d, 0)
	dev1, _ := openDev(t, d, 1)
	comms, err := fake.NewNCCL().CommInitAll([]gpu.Device{dev0, dev1})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := dev0.Alloc(64)
	defer dev0.Free(p)
	if err := comms[0].Allreduce(s0, p, p, 16, tensor.Float32, tensor.Sum); err != nil {
		t.Fatal(err)
	}
	if err := comms[1].Abort(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s0.Synchronize(ctx); err != nil {
		t.Fatalf("rank 0's stream after rank 1 aborted: %v", err)
	}
	if ge := gpuErr(t, comms[0].AsyncError()); ge.Name != "ncclRemoteError" {
		t.Errorf("rank 0's AsyncError: %v", ge)
	}
	comms[0].Abort()
}

// TestBreakComm: a broken communicator reports the asynchronous error
// given, its blocked work ends, its peer learns only once it is aborted,
// and a communicator already aborted cannot be broken.
func TestBreakComm(t *testing.T) {
	d := fake.New(fake.Options{Devices: 2})
	dev0, s0 := openDev(t, d, 0)
	dev1, s1 := openDev(t, d, 1)
	comms, err := fake.NewNCCL().CommInitAll([]gpu.Device{dev0, dev1})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := dev0.Alloc(64)
	defer dev0.Free(p)
	if err := comms[0].Allreduce(s0, p, p, 16, tensor.Float32, tensor.Sum); err != nil {
		t.Fatal(err)
	}
	if err := fake.BreakComm(comms[0], 0, "link down"); err != nil {
		t.Fatal(err)
	}
	ge := gpuErr(t, comms[0].AsyncError())
	if ge.Call != "ncclCommGetAsyncError" || ge.Name != "ncclSystemError" || !strings.Contains(ge.Desc, "link down") {
		t.Errorf("rank 0's AsyncError: %v", ge)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s0.Synchronize(ctx); err != nil {
		t.Fatalf("rank 0's stream after BreakComm: %v", err)
	}
	if err := comms[1].AsyncError(); err != nil {
		t.Errorf("rank 1 told of rank 0's broken link before any abort: %v", err)
	}
	if err := comms[0].Abort(); err != nil {
		t.Fatal(err)
	}
	// Rank 1 blocked in a collective rank 0 never joins learns of the
	// abort: the collective ends, with its AsyncError set.
	p1, _ := dev1.Alloc(64)
	defer dev1.Free(p1)
	if err := comms[1].Allreduce(s1, p1, p1, 16, tensor.Float32, tensor.Sum); err != nil {
		t.Fatal(err)
	}
	s1.Synchronize(ctx)
	if comms[1].AsyncError() == nil {
		t.Fatal("rank 1 not told of rank 0's abort")
	}
	if err := fake.BreakComm(comms[0], 6, "again"); err == nil {
		t.Error("BreakComm of an aborted communicator succeeded")
	}
	if err := fake.BreakComm(nil, 0, ""); err == nil {
		t.Error("BreakComm(nil) succeeded")
	}
	comms[1].Abort()
}

// TestCommInitRankCtx: a rank whose peers never come gives up at its ctx's
// end, and the id's other ranks then fail rather than wait.
func TestCommInitRankCtx(t *testing.T) {
	d := fake.New(fake.Options{Devices: 2})
	dev0, _ := openDev(t, d, 0)
	dev1, _ := openDev(t, d, 1)
	n := fake.NewNCCL()
	id, err := n.GetUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := n.CommInitRank(ctx, dev0, 3, id, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("CommInitRank without peers: %v", err)
	}
	if _, err := n.CommInitRank(context.Background(), dev1, 3, id, 1); err == nil {
		t.Fatal("joining a communicator whose rank 0 gave up succeeded")
	}
}

// TestFreeWhileQueued: memory freed while queued work uses it stays mapped
// until that work ran; a stale pointer is not reused.
func TestFreeWhileQueued(t *testing.T) {
	dev, s := openDev(t, fake.New(fake.Options{MaxDelay: 5 * time.Millisecond}), 0)
	p, _ := dev.Alloc(1 << 16)
	out := make([]byte, 1<<16)
	dev.Memset8(s, p, 9, 1<<16)
	dev.CopyDtoH(s, out, p)
	if err := dev.Free(p); err != nil {
		t.Fatal(err)
	}
	q, _ := dev.Alloc(1 << 16)
	defer dev.Free(q)
	if q == p {
		t.Error("a freed address was handed out again")
	}
	if err := s.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, bytes.Repeat([]byte{9}, 1<<16)) {
		t.Error("work queued before Free did not see its memory")
	}
	if err := dev.Memset8(s, p, 1, 1); err == nil {
		t.Error("Memset8 of freed memory succeeded")
	}
}

// TestOpenWhileClosingSameHandle: an open of an IPC handle that comes
// while another goroutine's close of its last mapping is under way (the
// daemon's loop opens a client's handle for a new op while its executor
// closes the previous op's mapping of it) gets a mapping that stays usable:
// the fake counts opens of a handle in one context, as CUDA does, and the
// close that reached zero must not remove a mapping the open has just
// counted on. The hook runs the open between the close's count and its
// unmapping, the window CI once hit ("address ... is in no allocation").
func TestOpenWhileClosingSameHandle(t *testing.T) {
	dev, s := openDev(t, fake.New(fake.Options{}), 0)
	const n = 4096
	p, err := dev.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free(p)
	if err := dev.Memset8(s, p, 7, n); err != nil {
		t.Fatal(err)
	}
	h, err := dev.IpcMemHandle(p)
	if err != nil {
		t.Fatal(err)
	}
	first, err := dev.OpenMemHandle(h, n)
	if err != nil {
		t.Fatal(err)
	}
	var second gpu.DevicePtr
	var openErr error
	restore := fake.SetCloseHook(func() {
		second, openErr = dev.OpenMemHandle(h, n)
	})
	err = dev.CloseMemHandle(first)
	restore()
	if err != nil {
		t.Fatal(err)
	}
	if openErr != nil {
		t.Fatalf("open during the close: %v", openErr)
	}
	buf := make([]byte, 64)
	if err := dev.CopyDtoH(s, buf, second.Add(128)); err != nil {
		t.Fatalf("copy from the mapping opened while the last one closed: %v", err)
	}
	if err := s.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, bytes.Repeat([]byte{7}, 64)) {
		t.Errorf("the mapping reads %v, want the allocation's 7s", buf[:8])
	}
	if err := dev.CloseMemHandle(second); err != nil {
		t.Fatal(err)
	}
}
