package daemon_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/daemon/daemontest"
)

// TestAllowGIDSupplementary connects as uid 65534 whose primary group is
// 65534: a daemon with AllowGIDs 4242 takes it when 4242 is one of its
// supplementary groups (how usermod -aG adds a user to the hvdd group),
// and refuses it otherwise.
func TestAllowGIDSupplementary(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to connect as another uid")
	}
	// The test binary may sit in a private directory: run a copy.
	dir, err := os.MkdirTemp("", "hvdd-groups-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	exe := filepath.Join(dir, "worker")
	src, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, src, 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		groups []uint32
		want   string // what the worker prints first: the Fatal's code, CODE_OK for a Welcome
	}{
		{"supplementary 4242", []uint32{100, 4242}, "CODE_OK"},
		{"no 4242", []uint32{100}, "CODE_PERMISSION_DENIED"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := daemontest.Start(t, daemon.Config{Slots: 1, AllowGIDs: []uint32{4242}})
			os.Chmod(s.Socket, 0o666)
			os.Chmod(filepath.Dir(s.Socket), 0o755)
			cmd := exec.Command(exe, "-test.run=^$")
			cmd.Env = append(os.Environ(), daemontest.WorkerEnv+"=other-uid", "HVDD_SOCKET="+s.Socket)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: tt.groups}}
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.HasPrefix(string(out), tt.want+" ") {
				t.Fatalf("uid 65534 with groups %v: %v, want %s:\n%s", tt.groups, err, tt.want, out)
			}
		})
	}
}
