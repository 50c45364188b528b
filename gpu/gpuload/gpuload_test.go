package gpuload

import (
	"errors"
	"testing"

	"github.com/hvdd/hvdd/gpu"
)

func TestLoad(t *testing.T) {
	d, n, err := Load("fake")
	if err != nil || d == nil || n == nil || d.Name() != "fake" {
		t.Fatalf(`Load("fake") = %v, %v, %v`, d, n, err)
	}
	if d, n, err := Load("off"); d != nil || n != nil || !errors.Is(err, gpu.ErrNoDriver) || !NoDriver(err) {
		t.Errorf(`Load("off") = %v, %v, %v`, d, n, err)
	}
	if _, _, err := Load("vulkan"); err == nil || NoDriver(err) {
		t.Errorf(`Load("vulkan") = %v; want an error that is not "no driver"`, err)
	}
	// auto: the real driver where there is one, else "no driver".
	d, n, err = Load("auto")
	switch {
	case err == nil:
		if d.Name() != "cuda" || n == nil {
			t.Errorf(`Load("auto") = %v, %v`, d, n)
		}
	case errors.Is(err, gpu.ErrNoNCCL):
		if d == nil || d.Name() != "cuda" || n != nil {
			t.Errorf(`Load("auto") without NCCL = %v, %v, %v`, d, n, err)
		}
	case NoDriver(err):
		if d != nil || n != nil {
			t.Errorf(`Load("auto") without a driver returned %v, %v`, d, n)
		}
		t.Logf("no CUDA driver here: %v", err)
	default:
		t.Errorf(`Load("auto"): %v`, err)
	}
}

func TestDefault(t *testing.T) {
	t.Setenv(Env, "fake")
	if d, _, err := Default(); err != nil || d.Name() != "fake" {
		t.Errorf("Default with %s=fake: %v, %v", Env, d, err)
	}
	t.Setenv(Env, "off")
	if _, _, err := Default(); !NoDriver(err) {
		t.Errorf("Default with %s=off: %v", Env, err)
	}
}
