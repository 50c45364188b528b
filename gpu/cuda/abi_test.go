package cuda

import (
	"errors"
	"testing"

	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/gputest"
	"github.com/hvdd/hvdd/tensor"
)

// stubLib builds testdata/stub.c into a shared library and binds it as
// both libraries, or skips without a C compiler.
func stubLib(t *testing.T) (*cudaLib, *ncclLib) {
	t.Helper()
	h, _, err := dlopen([]string{gputest.SharedLib(t, "testdata/stub.c", "libstub.so")})
	if err != nil {
		t.Fatal(err)
	}
	cl, nl := &cudaLib{}, &ncclLib{}
	if err := bind(h, cl); err != nil {
		t.Fatalf("bind the driver API: %v", err)
	}
	if err := bind(h, nl); err != nil {
		t.Fatalf("bind NCCL: %v", err)
	}
	return cl, nl
}

// TestABI calls the stub through the bindings: structs passed by value,
// cuLaunchKernel's eleven arguments and its parameter array, NCCL's enums.
func TestABI(t *testing.T) {
	cl, nl := stubLib(t)
	d := &Driver{lib: cl}
	in, err := d.info(0)
	if err != nil {
		t.Fatal(err)
	}
	want := gpu.Info{Index: 0, UUID: "GPU-00112233-4455-6677-8899-aabbccddeeff", Name: "Stub GPU", PCIBusID: "0000:3b:00.0", MemoryBytes: 80 << 30, ComputeCapability: 90}
	if in != want {
		t.Errorf("info = %+v, want %+v", in, want)
	}
	dev, err := d.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	// A 64-byte handle by value: the stub sums its bytes weighted by
	// position.
	var h gpu.IpcMemHandle
	var sum uint64
	for i := range h {
		h[i] = byte(i*5 + 1)
		sum += uint64(h[i]) * uint64(i+1)
	}
	p, err := dev.OpenMemHandle(h, 0)
	if err != nil || uint64(p) != sum {
		t.Errorf("OpenMemHandle = %#x, %v; want %#x (the handle's bytes reached C intact, flags 1)", uint64(p), err, sum)
	}
	var eh gpu.IpcEventHandle
	copy(eh[:], h[:])
	e, err := dev.OpenEventHandle(eh)
	if err != nil || e.(*event).h != uintptr(sum) {
		t.Errorf("OpenEventHandle = %v, %v", e, err)
	}
	s := &stream{d: dev.(*device), h: 0x1234}
	if err := dev.Memset8(s, 0x1000, 0xab, 77); err != nil {
		t.Errorf("Memset8: %v", err)
	}
	// Query maps CUDA_ERROR_NOT_READY to "not done".
	if done, err := (&event{d: dev.(*device)}).Query(); done || err != nil {
		t.Errorf("Query of a not-ready event = %v, %v", done, err)
	}
	fn := &function{d: dev.(*device), name: "kernel"}
	if err := fn.Launch(s, 7, 32, gpu.DevicePtr(0xdeadbeef0001), uint64(16), 2.5, int32(-3), float32(0.25)); err != nil {
		t.Errorf("Launch: %v", err)
	}
	var ge *gpu.Error
	if err := fn.Launch(s, 7, 32, gpu.DevicePtr(1), uint64(16), 2.5, int32(-3), float32(0.25)); !errors.As(err, &ge) || ge.Code != 13 || ge.Call != "cuLaunchKernel" {
		t.Errorf("Launch with a wrong first argument: %v", err)
	}

	n := &NCCL{lib: nl, version: 21903}
	id, err := n.GetUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	var idSum uint64
	for i := range id {
		idSum += uint64(byte(3*i)) * uint64(i+1)
	}
	c, err := n.CommInitRank(t.Context(), dev, 4, id, 3)
	if err != nil || c.(*comm).h != uintptr(idSum*1000+43) {
		t.Errorf("CommInitRank = %v, %v; the 128-byte id by value, then nranks and rank", c, err)
	}
	cc := &comm{n: n, d: dev.(*device), h: 0xcc, rank: 0, size: 2}
	if err := cc.Allreduce(s, 0x10, 0x20, 1000, tensor.Float32, tensor.Average); err != nil {
		t.Errorf("Allreduce: %v", err)
	}
	if err := cc.Reduce(s, 0x10, 0x20, 5, tensor.BFloat16, tensor.Min, 1); err != nil {
		t.Errorf("Reduce: %v", err)
	}
	if err := cc.Allreduce(s, 0x10, 0x20, 1000, tensor.Float32, tensor.Sum); !errors.As(err, &ge) || ge.Name != "ncclInvalidArgument" {
		t.Errorf("Allreduce with a wrong op: %v (the stub refuses it)", err)
	}
	if err := cc.Allreduce(s, 0x10, 0x20, 1000, tensor.Int16, tensor.Sum); !errors.As(err, &ge) || ge.Code != ncclInvalidArgument {
		t.Errorf("Allreduce of int16: %v", err)
	}
	if err := cc.AsyncError(); !errors.As(err, &ge) || ge.Name != "ncclRemoteError" || ge.Desc == "" {
		t.Errorf("AsyncError = %v", err)
	}
	if err := dev.Close(); err != nil {
		t.Error(err)
	}
	if _, err := dev.Alloc(1); err == nil {
		t.Error("Alloc on a closed device succeeded")
	}
}
