package device

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/hvdd/hvdd/gpu/fake"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// TestMarkLost: a GPU is found by UUID, else by PCI bus id in NVML's form;
// it is marked and logged once; LostErr and Resolve then name it by index,
// UUID and PCI bus id, and the other GPU is untouched.
func TestMarkLost(t *testing.T) {
	var logs bytes.Buffer
	g := OpenGPUs(fake.New(fake.Options{Devices: 3}), nil, slog.New(slog.NewTextHandler(&logs, nil)), false)
	if g == nil {
		t.Fatal("no fake GPU")
	}
	defer g.Close()
	cause := errors.New("XID 79 (fallen off the bus)")
	tests := []struct {
		name      string
		uuid, bus string
		idx       int // the GPU marked; -1 none
		marked    bool
	}{
		{"by UUID", fake.UUID(1), "", 1, true},
		{"again", fake.UUID(1), "0000:02:00.0", 1, false},
		{"by NVML's bus id", "GPU-unknown", "00000000:03:00.0", 2, true},
		{"not the daemon's", "GPU-unknown", "0000:3b:00.0", -1, false},
		{"nothing", "", "", -1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, marked := g.MarkLost(tc.uuid, tc.bus, cause)
			if marked != tc.marked || (e == nil) != (tc.idx < 0) {
				t.Fatalf("MarkLost(%q, %q) = %v, %v; want GPU %d, marked %v", tc.uuid, tc.bus, e, marked, tc.idx, tc.marked)
			}
			if e != nil && (e.Index != tc.idx || e.UUID != fake.UUID(tc.idx)) {
				t.Errorf("MarkLost(%q, %q) = GPU %d %s, want %d", tc.uuid, tc.bus, e.Index, e.UUID, tc.idx)
			}
		})
	}
	if n := strings.Count(logs.String(), "GPU lost"); n != 2 {
		t.Errorf("%d \"GPU lost\" log lines, want 2 (one per GPU):\n%s", n, logs.String())
	}
	if err := g.LostErr(0); err != nil {
		t.Errorf("LostErr(0) = %v, want nil", err)
	}
	err := g.LostErr(1)
	want := "GPU 1 (" + fake.UUID(1) + ", PCI 0000:02:00.0) is lost: XID 79 (fallen off the bus)"
	if err == nil || err.Error() != want || !errors.Is(err, ErrGPULost) || !errors.Is(err, cause) {
		t.Errorf("LostErr(1) = %v, want %q matching ErrGPULost and its cause", err, want)
	}
	var cg ConnGPU
	_, err = g.Resolve(&cg, "w", &ipcpb.DeviceBuffer{DeviceUuid: fake.UUID(1), Length: 4}, 4)
	if !errors.Is(err, ErrGPULost) || !strings.Contains(err.Error(), `tensor "w"`) || !strings.Contains(err.Error(), want) {
		t.Errorf("Resolve on the lost GPU: %v, want ErrGPULost naming the tensor and %q", err, want)
	}
	if g.devs[1].opened() {
		t.Error("Resolve opened the lost GPU's context")
	}
	// The GPU that is not lost still resolves (an empty tensor: no handle).
	if dv, err := g.Resolve(&cg, "w", &ipcpb.DeviceBuffer{DeviceUuid: fake.UUID(0)}, 0); err != nil {
		t.Errorf("Resolve on GPU 0: %v", err)
	} else {
		dv.Release()
	}
}

// TestSameBus: NVML's and CUDA's forms of one PCI bus id match.
func TestSameBus(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"0000:3b:00.0", "00000000:3B:00.0", true},
		{"0000:3b:00.0", "0000:3b:00.0", true},
		{"0000:3b:00.0", "0000:3c:00.0", false},
		{"0001:3b:00.0", "00000000:3b:00.0", false},
		{"", "", false},
	} {
		if got := sameBus(tc.a, tc.b); got != tc.same {
			t.Errorf("sameBus(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
}
