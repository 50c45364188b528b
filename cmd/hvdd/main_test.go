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
