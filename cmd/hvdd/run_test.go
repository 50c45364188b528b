package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRunAcrossHosts runs hvdd run on two loopback addresses of this
// machine: the binary starts one daemon per "host" from its own path.
func TestRunAcrossHosts(t *testing.T) {
	cmd := exec.Command(hvddBin, "run", "-np", "3", "-H", "127.0.0.2:2,127.0.0.3:2", "--",
		"sh", "-c", `echo "$HVDD_RANK/$HVDD_SIZE local $HVDD_LOCAL_RANK/$HVDD_LOCAL_SIZE"`)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hvdd run: %v\n%s", err, out)
	}
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	slices.Sort(got)
	want := []string{"[0]<stdout>:0/3 local 0/2", "[1]<stdout>:1/3 local 1/2", "[2]<stdout>:2/3 local 0/1"}
	if !slices.Equal(got, want) {
		t.Errorf("output %q, want %q", got, want)
	}
	out, err = exec.Command(hvddBin, "run", "-np", "5", "-H", "127.0.0.2:2,127.0.0.3:2", "true").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "-np 5 is more than the 4 slots") {
		t.Errorf("hvdd run -np 5 on 4 slots: %v\n%s", err, out)
	}
}

// TestRunRefusedFlag: a horovodrun flag without meaning here fails with
// its reason and exit status 2, before anything is started.
func TestRunRefusedFlag(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "sock", "hvdd.sock")
	for _, flag := range []string{"--gloo", "--mpi", "--tcp", "--mpi-args=--bind-to core", "--num-nccl-streams=2"} {
		name, _, _ := strings.Cut(flag, "=")
		cmd := exec.Command(hvddBin, "run", "-np", "2", "--socket", socket, flag, "--", "touch", filepath.Join(dir, "ran"))
		out, err := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.HasPrefix(string(out), "hvdd run: "+name+" is not supported: ") {
			t.Errorf("hvdd run %s: %v, exit status %d, output %q; want status 2 and the reason", flag, err, code, out)
		}
	}
	for _, p := range []string{filepath.Dir(socket), filepath.Join(dir, "ran")} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s exists: a refused command line started something", p)
		}
	}
}

// TestRunCheckBuild: horovodrun --check-build's layout, without -np, with
// the frameworks checked by the python on PATH (here none: PATH is empty).
func TestRunCheckBuild(t *testing.T) {
	cmd := exec.Command(hvddBin, "run", "--check-build")
	cmd.Env = append(os.Environ(), "PATH=")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hvdd run --check-build: %v\n%s", err, out)
	}
	for _, want := range []string{"hvdd " + version() + " ", "\nAvailable Frameworks:\n    [?] TensorFlow\n    [?] PyTorch\n    [ ] MXNet\n    [?] Keras\n    (not checked: no python3 or python in $PATH)\n",
		"\nAvailable Controllers:\n", "    [ ] Gloo\n", "\nAvailable Tensor Operations:\n    [ ] NCCL\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out, err = exec.Command(hvddBin, "run", "--version").Output()
	if err != nil || string(out) != "hvdd "+version()+"\n" {
		t.Errorf("hvdd run --version: %q, %v", out, err)
	}
}
