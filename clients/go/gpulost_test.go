package hvdd_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"testing"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/daemon/daemontest"
	"github.com/hvdd/hvdd/gpu/fake"
	"github.com/hvdd/hvdd/tensor"
)

func init() {
	scenarios["gpulost"] = gpuLost
}

// TestGPULost: a daemon with two fake GPUs, sampled by a fake sampler
// (daemontest.GPUSampler) every few milliseconds, runs two jobs at once:
// "gpu1" with both ranks on GPU 1, "gpu0" with both on GPU 0. Each maps
// its tensors and runs device and host allreduces; gpu1's rank 0 then
// submits a device allreduce its rank 1 has not (queued in the plan).
// The sampler reports GPU 1 fallen off the bus (XID 79): the daemon logs
// the loss once; in gpu1 a new device tensor is refused, and the queued
// allreduce (completed by rank 1's host tensor) fails on both ranks
// instead of running, all with CODE_INTERNAL naming GPU 1's index, UUID
// and PCI bus id; its host allreduces go on; job gpu0 goes on with both.
func TestGPULost(t *testing.T) {
	smp := daemontest.NewGPUSampler(2)
	cfg := gpuConfig(daemon.Config{Slots: 4}, 2)
	cfg.OpenGPUSampler = smp.Open
	cfg.GPUSampleInterval = 5 * time.Millisecond
	s := daemontest.Start(t, cfg)
	jobs := map[string][]*daemontest.Worker{}
	for _, gpu := range []string{"0", "1"} {
		jobs[gpu] = daemontest.Spawn(t, s.Socket, "gpulost", 2, "HVDD_FAKE_GPUS=2", "HVDD_JOB=gpu"+gpu, "HVDD_LOCAL_SIZE=2", "HVDD_TEST_GPU="+gpu)
	}
	for _, ws := range jobs {
		for _, w := range ws {
			w.WaitOutput(t, "READY", 60*time.Second)
		}
	}
	// READY follows the queued allreduce's send, not the daemon's reading
	// of it: lost before then, the GPU refuses the tensor as new (rank 1's
	// host half then waits for a rank 0 that has gone on). The test waits
	// until the daemon lists it as pending.
	waitPending(t, s.Socket, "queued")
	smp.Lose(1)
	s.WaitLog(t, "GPU lost", 30*time.Second)
	for _, ws := range jobs {
		for _, w := range ws {
			if err := w.Cmd.Process.Signal(os.Interrupt); err != nil {
				t.Fatal(err)
			}
		}
	}
	for gpu, ws := range jobs {
		for _, w := range ws {
			if err := w.Wait(60 * time.Second); err != nil {
				t.Errorf("job on GPU %s, rank %d: %v; output:\n%s", gpu, w.Rank, err, w.Output())
			} else if testing.Verbose() {
				t.Logf("job on GPU %s, rank %d:\n%s", gpu, w.Rank, w.Output())
			}
		}
	}
	logs := s.Logs()
	if n := strings.Count(logs, "level=ERROR msg=\"GPU lost"); n != 1 {
		t.Errorf("the loss logged at error level %d times, want once", n)
	}
	for _, want := range []string{"index=1", "uuid=" + fake.UUID(1), "pci=0000:02:00.0"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the daemon's log lacks %s", want)
		}
	}
}

// gpuLost is a rank of TestGPULost on GPU $HVDD_TEST_GPU: a device and a
// host allreduce; on GPU 1, rank 0 queues a device allreduce; READY; then,
// after SIGINT (the test saw the loss), the checks the test describes.
func gpuLost(ctx context.Context, c *hvdd.Client) error {
	e, err := openDev(c)
	if err != nil {
		return err
	}
	const n = 1000
	b, err := e.upload(rawOf(input[float32](c.Rank(), n)))
	if err != nil {
		return err
	}
	device := func(name string) error {
		if err := b.write(rawOf(input[float32](c.Rank(), n))); err != nil {
			return err
		}
		if err := c.AllreduceDevice(ctx, b.tensor(tensor.Float32), hvdd.WithName(name), hvdd.WithOp(hvdd.Sum)); err != nil {
			return err
		}
		raw, err := b.read(ctx)
		if err != nil {
			return err
		}
		for i, v := range typedOf[float32](raw) {
			if want := expectAllreduce[float32](tensor.Sum, c.Size(), i, 1, 1); !close2(v, want) {
				return fmt.Errorf("device allreduce %s: element %d = %v, want %v", name, i, v, want)
			}
		}
		return nil
	}
	host := func(name string) error {
		x := input[float32](c.Rank(), n)
		if err := hvdd.Allreduce(ctx, c, x, hvdd.WithName(name), hvdd.WithOp(hvdd.Sum)); err != nil {
			return fmt.Errorf("host allreduce %s: %w", name, err)
		}
		for i, v := range x {
			if want := expectAllreduce[float32](tensor.Sum, c.Size(), i, 1, 1); !close2(v, want) {
				return fmt.Errorf("host allreduce %s: element %d = %v, want %v", name, i, v, want)
			}
		}
		return nil
	}
	if err := device("before"); err != nil {
		return err
	}
	if err := host("host.before"); err != nil {
		return err
	}
	lost := os.Getenv("HVDD_TEST_GPU") == "1"
	var queued *hvdd.Handle
	if lost && c.Rank() == 0 {
		// Negotiated once rank 1 submits, after the loss.
		if queued, err = c.AllreduceDeviceAsync(b.tensor(tensor.Float32), hvdd.WithName("queued"), hvdd.WithOp(hvdd.Sum)); err != nil {
			return err
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt)
	fmt.Println("READY")
	select {
	case <-sig:
	case <-ctx.Done():
		return ctx.Err()
	}
	if !lost {
		if err := device("after"); err != nil {
			return err
		}
		return host("host.after")
	}
	// namesGPU1 checks that err is CODE_INTERNAL naming GPU 1.
	namesGPU1 := func(what string, err error) error {
		var he *hvdd.Error
		if !errors.As(err, &he) || he.Code.String() != "CODE_INTERNAL" {
			return fmt.Errorf("%s: %v, want a CODE_INTERNAL error", what, err)
		}
		for _, want := range []string{"GPU 1 (", fake.UUID(1), "0000:02:00.0", "is lost", "XID 79"} {
			if !strings.Contains(err.Error(), want) {
				return fmt.Errorf("%s: %v, does not name %q", what, err, want)
			}
		}
		fmt.Printf("%s: %v\n", what, err)
		return nil
	}
	// A new device tensor on the lost GPU is refused.
	err = c.AllreduceDevice(ctx, b.tensor(tensor.Float32), hvdd.WithName("fresh"), hvdd.WithOp(hvdd.Sum))
	if err := namesGPU1("new device tensor", err); err != nil {
		return err
	}
	// The allreduce queued before the loss fails instead of running:
	// rank 1 completes it with a host tensor.
	if c.Rank() == 0 {
		err = queued.Wait(ctx)
	} else {
		err = hvdd.Allreduce(ctx, c, input[float32](c.Rank(), n), hvdd.WithName("queued"), hvdd.WithOp(hvdd.Sum))
	}
	if err := namesGPU1("queued allreduce", err); err != nil {
		return err
	}
	// Host tensors go on.
	return host("host.after")
}
