package cuda

import (
	"errors"
	"os"
	"testing"

	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/gputest"
)

// factory opens the real driver and, where it loads, NCCL.
func factory() (gpu.Driver, gpu.NCCL, error) {
	d, err := Open()
	if err != nil {
		return nil, nil, err
	}
	n, err := OpenNCCL()
	if err != nil {
		return d, nil, nil
	}
	return d, n, nil
}

func TestMain(m *testing.M) { os.Exit(gputest.Main(m, factory)) }

// TestConformance runs the suite where a GPU and its driver are present.
func TestConformance(t *testing.T) {
	d, err := Open()
	if err != nil {
		if !errors.Is(err, gpu.ErrNoDriver) {
			t.Fatalf("Open's error does not wrap gpu.ErrNoDriver: %v", err)
		}
		t.Skipf("no CUDA driver here (%v): the suite runs on a GPU machine (scripts/gpu-check.sh)", err)
	}
	if infos, err := d.Devices(); err != nil || len(infos) == 0 {
		t.Skipf("the CUDA driver loads but lists no GPU (%v)", err)
	}
	var n gpu.NCCL
	if nc, err := OpenNCCL(); err == nil {
		n = nc
	} else {
		if !errors.Is(err, gpu.ErrNoNCCL) {
			t.Errorf("OpenNCCL's error does not wrap gpu.ErrNoNCCL: %v", err)
		}
		t.Logf("no NCCL (%v): its tests skip", err)
	}
	gputest.Run(t, d, n)
}

// TestLoadErrors: a library that is not there gives the seam's sentinels.
func TestLoadErrors(t *testing.T) {
	if _, _, err := dlopen([]string{"/nonexistent/libcuda.so.1"}); err == nil {
		t.Fatal("dlopen of a missing file succeeded")
	}
	if _, err := OpenNCCL(); err != nil && !errors.Is(err, gpu.ErrNoNCCL) {
		t.Errorf("OpenNCCL: %v does not wrap gpu.ErrNoNCCL", err)
	}
	if _, err := Open(); err != nil && !errors.Is(err, gpu.ErrNoDriver) {
		t.Errorf("Open: %v does not wrap gpu.ErrNoDriver", err)
	}
}

func TestFormatUUID(t *testing.T) {
	u := [16]byte{0x8a, 0x1f, 0x2b, 0x3c, 0x4d, 0x5e, 0x6f, 0x70, 0x81, 0x92, 0xa3, 0xb4, 0xc5, 0xd6, 0xe7, 0xf8}
	if got, want := formatUUID(u), "GPU-8a1f2b3c-4d5e-6f70-8192-a3b4c5d6e7f8"; got != want {
		t.Errorf("formatUUID = %q, want %q", got, want)
	}
}

// TestDTypes pins the ncclDataType_t values (nccl.h) and the dtypes NCCL
// lacks.
func TestDTypes(t *testing.T) {
	n := &NCCL{version: 21903}
	want := map[string]int32{"int8": 0, "uint8": 1, "int32": 2, "int64": 4, "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
	for _, dt := range gpu.DTypes {
		v, ok := n.DType(dt)
		w, has := want[dt.String()]
		if ok != has || v != w {
			t.Errorf("DType(%v) = %d, %v; want %d, %v", dt, v, ok, w, has)
		}
	}
	if _, ok := (&NCCL{version: 20906}).DType(gpu.DTypes[7]); ok {
		t.Error("bfloat16 offered by NCCL 2.9")
	}
}
