package loop

import (
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// TestProcessAlive: a running process is alive; one that exited is not,
// whether its parent has reaped it yet (a zombie) or not.
func TestProcessAlive(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := int32(cmd.Process.Pid)
	if !processAlive(pid) {
		t.Fatal("a running process is not alive")
	}
	cmd.Process.Kill()
	// Wait for the exit without reaping: the process stays a zombie.
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, int(pid), &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatalf("waitid: %v", err)
	}
	if processAlive(pid) {
		t.Error("a zombie counts as alive")
	}
	cmd.Wait()
	if processAlive(pid) {
		t.Error("a reaped process counts as alive")
	}
}
