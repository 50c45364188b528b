package main

import (
	"os/exec"
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
