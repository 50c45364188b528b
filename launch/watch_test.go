package launch

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// groupAlive returns the live (not zombie) processes of process group pgid.
func groupAlive(t *testing.T, pgid int) []string {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var alive []string
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) < 3 || fields[0] == "Z" {
			continue
		}
		if g, _ := strconv.Atoi(fields[2]); g == pgid {
			cl, _ := os.ReadFile(filepath.Join(filepath.Dir(f), "cmdline"))
			alive = append(alive, s[:i+1]+" "+strings.ReplaceAll(string(cl), "\x00", " "))
		}
	}
	return alive
}

// runWatched runs job.watch's wrapper around cmd in a process group of its
// own, closes the wrapper's stdin after closeAfter (never when negative),
// and returns the wrapper's exit status once no process of its group is
// left. It fails the test if one is left 3 s after the wrapper exited:
// longer than any wrapper needs to exit, shorter than a leaked grace sleep
// (the grace here is 5 s).
func runWatched(t *testing.T, cmd string, closeAfter time.Duration) int {
	t.Helper()
	j := &job{grace: 5}
	c := exec.Command("sh", "-c", j.watch("", cmd, "", ""))
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, err := c.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := c.Process.Pid
	if closeAfter >= 0 {
		time.AfterFunc(closeAfter, func() { in.Close() })
	}
	err = c.Wait()
	in.Close()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		left := groupAlive(t, pgid)
		if len(left) == 0 {
			return code
		}
		if time.Now().After(deadline) {
			syscall.Kill(-pgid, syscall.SIGKILL)
			t.Fatalf("wrapper of %q (stdin closed after %v) exited %d and left %v", cmd, closeAfter, code, left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWatchWrapper checks the remote wrapper of ranks and daemons: it exits
// with the command's status, a closed stdin stops the command (SIGTERM,
// then SIGKILL after the grace), and it leaves no process behind, its
// watcher's grace sleep included, in whatever order the command's exit and
// the end of stdin come (the fault campaign found a grace sleep left behind
// when they came together).
func TestWatchWrapper(t *testing.T) {
	if got := runWatched(t, "exit 3", -1); got != 3 {
		t.Errorf("command exiting 3: wrapper exited %d", got)
	}
	if got := runWatched(t, "exec sleep 60", 50*time.Millisecond); got != 128+int(syscall.SIGTERM) {
		t.Errorf("stdin closed under a running command: wrapper exited %d, want %d (SIGTERM)", got, 128+int(syscall.SIGTERM))
	}
	// The command's exit and the end of stdin close together: each order,
	// and every interleaving in between that 60 tries reach.
	for i := range 60 {
		d := time.Duration(i%6) * 4 * time.Millisecond
		got := runWatched(t, fmt.Sprintf("exec sleep 0.0%d", 1+i%3), d)
		if got != 0 && got != 128+int(syscall.SIGTERM) {
			t.Fatalf("try %d: wrapper exited %d, want 0 or %d", i, got, 128+int(syscall.SIGTERM))
		}
	}
}

// TestWatchWrapperKillsAfterGrace checks that a command ignoring SIGTERM
// gets SIGKILL after the grace.
func TestWatchWrapperKillsAfterGrace(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the 5 s grace")
	}
	got := runWatched(t, "exec sh -c 'trap \"\" TERM; exec sleep 60'", 50*time.Millisecond)
	if got != 128+int(syscall.SIGKILL) {
		t.Errorf("wrapper exited %d, want %d (SIGKILL after the grace)", got, 128+int(syscall.SIGKILL))
	}
}
