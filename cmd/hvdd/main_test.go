package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon/daemontest"
)

var hvddBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hvdd-bin-")
	if err != nil {
		panic(err)
	}
	hvddBin = filepath.Join(dir, "hvdd")
	if out, err := exec.Command("go", "build", "-o", hvddBin, ".").CombinedOutput(); err != nil {
		os.Stderr.Write(out)
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"serve", "--help"}, {"run", "--help"}, {"bench", "--help"}, {"status", "--help"}, {"rendezvous", "--help"}, {"version"}} {
		out, err := exec.Command(hvddBin, args...).CombinedOutput()
		if err != nil || len(out) == 0 {
			t.Errorf("hvdd %v: %v\n%s", args, err, out)
		}
		// A flag that names its own default shows no sentinel such as
		// "(default -1ns)" besides it.
		if m := regexp.MustCompile(`\(default \$[^)]*\) \(default [^)]*\)`).Find(out); m != nil {
			t.Errorf("hvdd %v shows two defaults: %s", args, m)
		}
	}
	out, err := exec.Command(hvddBin, "serve").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "slots") {
		t.Errorf("hvdd serve without --slots: %v\n%s", err, out)
	}
	out, err = exec.Command(hvddBin, "frobnicate").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "unknown command") {
		t.Errorf("unknown command: %v\n%s", err, out)
	}
}

// TestSystemdActivation starts hvdd serve the way systemd does: the listening
// socket at fd 3 with LISTEN_PID/LISTEN_FDS, and NOTIFY_SOCKET for Type=notify.
func TestSystemdActivation(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "hvdd.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	lf, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(dir, "notify"), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	cmd := exec.Command("sh", "-c", `LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" serve --slots 1 --socket /nonexistent/never.sock`, hvddBin)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+filepath.Join(dir, "notify"))
	cmd.ExtraFiles = []*os.File{lf}
	var logs bytes.Buffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lf.Close()
	ln.Close()
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	}()
	notify.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 64)
	n, err := notify.Read(buf)
	if err != nil || string(buf[:n]) != "READY=1" {
		t.Fatalf("no READY=1 from the daemon (%v %q); log:\n%s", err, buf[:n], logs.String())
	}
	c := &hvdd.Client{Socket: sock}
	if err := c.Init(t.Context()); err != nil {
		t.Fatalf("client through the activated socket: %v; log:\n%s", err, logs.String())
	}
	x := []float32{2}
	if err := hvdd.Allreduce(t.Context(), c, x); err != nil || x[0] != 2 {
		t.Fatalf("allreduce: %v %v", x, err)
	}
	c.Close()
}

// freeTCP returns a free 127.0.0.1 port as host:port.
func freeTCP(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestSignalTellsClients: a daemon stopped by SIGTERM fails its clients'
// pending operations with an error that names the signal.
func TestSignalTellsClients(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "hvdd.sock")
	d := exec.Command(hvddBin, "serve", "--slots", "2", "--socket", sock, "--log-level", "error")
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	defer d.Process.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clients := daemontest.InitClients(t, ctx, sock, 2)
	// Rank 1 never submits "lonely": rank 0's op waits until the daemon goes.
	h, err := hvdd.AllreduceAsync(clients[0], []float32{1}, hvdd.WithName("lonely"))
	if err != nil {
		t.Fatal(err)
	}
	d.Process.Signal(syscall.SIGTERM)
	err = h.Wait(ctx)
	if err == nil || !strings.Contains(err.Error(), "received SIGTERM") {
		t.Errorf("pending op after SIGTERM: %v, want an error naming SIGTERM", err)
	}
	if err := d.Wait(); err != nil {
		t.Errorf("hvdd serve after SIGTERM: %v", err)
	}
}

// TestExitAfterJob: a daemon started with --exit-after-job (as a job's own
// processes start one under mpirun or srun) serves one job and exits with
// status 0 once its ranks have closed; a second daemon with --idle-exit and
// no client ever exits too.
func TestExitAfterJob(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sock := filepath.Join(t.TempDir(), "hvdd.sock")
	d := exec.CommandContext(ctx, hvddBin, "serve", "--slots", "2", "--socket", sock, "--exit-after-job", "--log-level", "info")
	var logs bytes.Buffer
	d.Stderr = &logs
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- d.Wait() }()
	clients := daemontest.InitClients(t, ctx, sock, 2)
	done := make(chan []float32, 2)
	for _, c := range clients {
		go func() {
			out := []float32{float32(c.Rank() + 1)}
			if err := hvdd.Allreduce(ctx, c, out, hvdd.WithName("x")); err != nil {
				t.Error(err)
			}
			done <- out
		}()
	}
	for range clients {
		if out := <-done; len(out) != 1 || out[0] != 1.5 {
			t.Errorf("allreduce: %v, want [1.5]", out)
		}
	}
	select {
	case err := <-exited:
		t.Fatalf("the daemon exited while its job ran: %v\n%s", err, logs.String())
	default:
	}
	for _, c := range clients {
		c.Close()
	}
	if err := <-exited; err != nil {
		t.Fatalf("hvdd serve --exit-after-job: %v\n%s", err, logs.String())
	}
	if !strings.Contains(logs.String(), "job over; exiting") {
		t.Errorf("log does not say why it exited:\n%s", logs.String())
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}

	idle := exec.CommandContext(ctx, hvddBin, "serve", "--slots", "1", "--socket", sock, "--idle-exit", "50ms", "--log-level", "error")
	if out, err := idle.CombinedOutput(); err != nil || ctx.Err() != nil {
		t.Fatalf("hvdd serve --idle-exit 50ms with no client: %v\n%s", err, out)
	}
}
