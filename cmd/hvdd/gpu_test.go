package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/daemon/daemontest"
	"github.com/hvdd/hvdd/gpu/fake"
	"github.com/hvdd/hvdd/tensor"
)

func TestDefaultGPUAllreduce(t *testing.T) {
	for _, tc := range []struct{ gpu, hier, want string }{
		{"", "", daemon.GPUAllreduceHierarchical},
		{"NCCL", "", daemon.GPUAllreduceNCCL},
		{"nccl", "0", daemon.GPUAllreduceNCCL},
		{"NCCL", "1", daemon.GPUAllreduceHierarchical},
		{"MPI", "", daemon.GPUAllreduceHost},
		{"GLOO", "", daemon.GPUAllreduceHost},
		{"DDL", "", ""},
	} {
		env := map[string]string{"HOROVOD_GPU_ALLREDUCE": tc.gpu, "HOROVOD_HIERARCHICAL_ALLREDUCE": tc.hier}
		got, err := defaultGPUAllreduce(func(k string) string { return env[k] })
		if got != tc.want || (err != nil) != (tc.want == "") {
			t.Errorf("HOROVOD_GPU_ALLREDUCE=%q HOROVOD_HIERARCHICAL_ALLREDUCE=%q: %q, %v; want %q", tc.gpu, tc.hier, got, err, tc.want)
		}
	}
}

// TestServeGPU runs the real binary with each --gpu: fake (two fake GPUs in
// Welcome, a device allreduce from this process through CUDA IPC, which
// opens GPU 1's context and no other), off and
// auto (on a machine without CUDA: CPU-only, said once), and refuses an
// unknown driver or mode.
func TestServeGPU(t *testing.T) {
	for _, tc := range []struct {
		driver string
		gpus   int
	}{{"fake", 2}, {"off", 0}, {"auto", -1}} {
		t.Run(tc.driver, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			sock := filepath.Join(t.TempDir(), "hvdd.sock")
			d := exec.CommandContext(ctx, hvddBin, "serve", "--slots", "1", "--socket", sock, "--gpu", tc.driver, "--exit-after-job", "--log-level", "info")
			d.Env = append(os.Environ(), "HVDD_FAKE_GPUS=2")
			var logs bytes.Buffer
			d.Stderr = &logs
			if err := d.Start(); err != nil {
				t.Fatal(err)
			}
			c := daemontest.InitClients(t, ctx, sock, 1)[0]
			gpus := c.GPUs()
			switch {
			case tc.gpus == 2 && !slices.Equal(gpus, []string{fake.UUID(0), fake.UUID(1)}):
				t.Errorf("Welcome lists GPUs %v, want the two fake ones", gpus)
			case tc.gpus == 0 && len(gpus) != 0:
				t.Errorf("--gpu off: Welcome lists GPUs %v", gpus)
			}
			if tc.driver == "fake" {
				deviceAllreduce(t, ctx, c)
			}
			c.Close()
			if err := d.Wait(); err != nil {
				t.Fatalf("hvdd serve: %v\n%s", err, logs.String())
			}
			out := logs.String()
			if n := strings.Count(out, "GPU found"); n != len(gpus) {
				t.Errorf("%d GPUs listed to the client, %d logged as found:\n%s", len(gpus), n, out)
			}
			// Contexts open on first use: --gpu fake's one device tensor
			// is on GPU 1, so GPU 0 stays unopened.
			wantOpened := 0
			if tc.driver == "fake" {
				wantOpened = 1
				if !strings.Contains(out, `msg="GPU context opened" index=1 uuid=`+fake.UUID(1)) {
					t.Errorf("no \"GPU context opened\" for GPU 1 (%s):\n%s", fake.UUID(1), out)
				}
			}
			if n := strings.Count(out, "GPU context opened"); n != wantOpened {
				t.Errorf("%d GPU contexts opened, want %d:\n%s", n, wantOpened, out)
			}
			if n := strings.Count(out, "no CUDA driver: CPU-only"); (n == 1) != (len(gpus) == 0) || n > 1 {
				t.Errorf("%q logged %d times with %d GPUs:\n%s", "no CUDA driver: CPU-only", n, len(gpus), out)
			}
		})
	}
	for _, args := range [][]string{{"--gpu", "tpu"}, {"--gpu-allreduce", "ring"}, {"--gpu-completion", "later"}} {
		out, err := exec.Command(hvddBin, append([]string{"serve", "--slots", "1", "--socket", filepath.Join(t.TempDir(), "s")}, args...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), args[1]) {
			t.Errorf("hvdd serve %v: %v, want an error naming %q:\n%s", args, err, args[1], out)
		}
	}
}

// deviceAllreduce sends one fake-GPU tensor (one rank: Sum with postscale 2
// doubles it) and checks it.
func deviceAllreduce(t *testing.T, ctx context.Context, c *hvdd.Client) {
	t.Helper()
	drv := fake.New(fake.Options{Devices: 2})
	dev, err := drv.Open(1)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	s, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	in := []float32{1, 2, 3, 4.5}
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&in[0])), 16)
	p, err := dev.Alloc(len(raw))
	if err != nil {
		t.Fatal(err)
	}
	h, err := dev.IpcMemHandle(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.CopyHtoD(s, p, raw); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
	dt := hvdd.DeviceTensor{UUID: fake.UUID(1), Handle: h[:], AllocSize: uint64(len(raw)), Length: uint64(len(raw)), DType: tensor.Float32}
	if err := c.AllreduceDevice(ctx, dt, hvdd.WithOp(hvdd.Sum), hvdd.WithPostscale(2)); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, len(in))
	if err := dev.CopyDtoH(s, unsafe.Slice((*byte)(unsafe.Pointer(&out[0])), 16), p); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range in {
		if out[i] != 2*in[i] {
			t.Fatalf("device allreduce: %v, want twice %v", out, in)
		}
	}
}
