package fake_test

import (
	"os"
	"testing"

	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/fake"
	"github.com/hvdd/hvdd/gpu/gputest"
)

func factory() (gpu.Driver, gpu.NCCL, error) {
	return fake.New(fake.Options{Devices: 2}), fake.NewNCCL(), nil
}

func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		envChildMain()
		return
	}
	// Every piece of stream work waits a little, here and in the children:
	// missing ordering shows as wrong data.
	os.Setenv("HVDD_FAKE_GPU_DELAY", "200us")
	os.Exit(gputest.Main(m, factory))
}

func TestConformance(t *testing.T) {
	d, n, _ := factory()
	gputest.Run(t, d, n)
}
