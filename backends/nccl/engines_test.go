package nccl

import (
	"context"
	"sync"
	"testing"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/gpu/fake"
)

// TestEngines checks the factory the daemon wires: none without a library;
// otherwise NCCL's engines, node-local and joined across nodes, each a
// DeviceGrouper and a DevicePeer too, healthy until closed.
func TestEngines(t *testing.T) {
	if f := NewEngines(nil); f != nil {
		t.Fatalf("NewEngines(nil) = %v, want nil", f)
	}
	drv, lib := fake.New(fake.Options{Devices: 2}), fake.NewNCCL()
	f := NewEngines(lib)
	if f.Name() != "nccl" {
		t.Errorf("Name = %q", f.Name())
	}
	if v, err := f.Version(); err != nil {
		t.Errorf("Version: %v", err)
	} else if want, _ := lib.Version(); v != want {
		t.Errorf("Version = %d, want %d", v, want)
	}
	check := func(what string, es []backends.DeviceEngine) {
		t.Helper()
		for i, e := range es {
			if _, ok := e.(backends.DeviceGrouper); !ok {
				t.Errorf("%s engine %d is no DeviceGrouper", what, i)
			}
			if _, ok := e.(backends.DevicePeer); !ok {
				t.Errorf("%s engine %d is no DevicePeer", what, i)
			}
			if e.Rank() != i || e.Size() != len(es) {
				t.Errorf("%s engine %d: rank %d of %d", what, i, e.Rank(), e.Size())
			}
			if err := e.Err(); err != nil {
				t.Errorf("%s engine %d: Err = %v on a new engine", what, i, err)
			}
		}
		for i, e := range es {
			if err := e.Close(); err != nil {
				t.Errorf("%s engine %d: Close: %v", what, i, err)
			}
			if e.Err() == nil {
				t.Errorf("%s engine %d: Err = nil once closed", what, i)
			}
		}
	}
	devs := openDevs(t, drv, 2)
	local, err := f.NewLocal(devs)
	if err != nil {
		t.Fatal(err)
	}
	check("local", local)

	id, err := f.NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	joined := make([]backends.DeviceEngine, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() { joined[r], errs[r] = f.Join(context.Background(), devs[r], id, r, 2) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("Join rank %d: %v", r, err)
		}
	}
	check("joined", joined)
	if _, err := f.Join(context.Background(), devs[0], id[:3], 0, 2); err == nil {
		t.Error("Join with a short id: no error")
	}
}
