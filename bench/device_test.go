package bench

import (
	"fmt"
	"strings"
	"testing"

	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/daemon/daemontest"
	"github.com/hvdd/hvdd/gpu/fake"
)

// TestDeviceCheck runs `hvdd bench --device fake --check` on every
// collective for 2 ranks on two fake GPUs through an in-process daemon that
// opened them, and asserts that every result was right and that the rows
// say where the tensors were.
func TestDeviceCheck(t *testing.T) {
	for _, op := range []string{"allreduce", "allgather", "broadcast", "alltoall", "reducescatter"} {
		t.Run(op, func(t *testing.T) {
			s := daemontest.Start(t, daemon.Config{Slots: 2, GPU: fake.New(fake.Options{Devices: 2}), NCCL: fake.NewNCCL()})
			args := fmt.Sprintf("--device fake --op %s --op-reduce average --check --json --min-bytes 4 --max-bytes 64K --step-factor 64 --iters 5 --warmup 1 --small-iters 5 --small-time 0", op)
			ws := daemontest.Spawn(t, s.Socket, "bench", 2, argsEnv+"="+args, "HVDD_FAKE_GPUS=2")
			outs := make([]string, len(ws))
			for i, w := range ws {
				if err := w.Wait(rankWait); err != nil {
					t.Fatalf("rank %d: %v; output:\n%s", i, err, w.Output())
				}
				outs[i] = w.Output()
			}
			rows := jsonRows(t, outs[0])
			if len(rows) != 3 {
				t.Fatalf("rank 0 printed %d rows, want 3:\n%s", len(rows), outs[0])
			}
			for _, r := range rows {
				if r.Op != op || r.Check != "ok" || r.Device != "fake" || r.Iters != 5 || r.MedianUS <= 0 {
					t.Errorf("bad row %+v", r)
				}
			}
			if !strings.Contains(s.Logs(), "GPU path taken") {
				t.Errorf("the daemon ran no GPU path; log:\n%s", s.Logs())
			}
		})
	}
}

func TestDeviceFlag(t *testing.T) {
	var help strings.Builder
	if _, err := ParseArgs([]string{"--device", "tpu"}, &help); err == nil || !strings.Contains(err.Error(), "tpu") {
		t.Errorf("--device tpu: %v", err)
	}
	if _, err := ParseArgs([]string{"--device", "fake", "--profile", "resnet50"}, &help); err == nil {
		t.Error("--device with a profile accepted")
	}
	cfg, err := ParseArgs([]string{"--device", "host"}, &help)
	if err != nil || cfg.Device != "" {
		t.Errorf("--device host: %q, %v", cfg.Device, err)
	}
}
