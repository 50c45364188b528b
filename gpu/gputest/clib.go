package gputest

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// SharedLib compiles the C file src into a shared library called name in a
// temporary directory of tb and returns its path, for tests that load a
// stand-in for a driver library (gpu/cuda's and gpu/nvml's stubs). Without
// a C compiler (cc) it skips tb: CI's set-up installs gcc.
func SharedLib(tb testing.TB, src, name string) string {
	tb.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		tb.Skipf("no C compiler (cc) to build %s from %s", name, src)
	}
	so := filepath.Join(tb.TempDir(), name)
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-o", so, src).CombinedOutput(); err != nil {
		tb.Fatalf("cc %s: %v\n%s", src, err, out)
	}
	return so
}
