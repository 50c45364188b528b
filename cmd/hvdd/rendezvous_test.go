package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hvdd/hvdd/auth"
	"github.com/hvdd/hvdd/rendezvous"
)

// withoutEnv returns os.Environ() less the variables named.
func withoutEnv(names ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		keep := true
		for _, n := range names {
			keep = keep && name != n
		}
		if keep {
			env = append(env, kv)
		}
	}
	return env
}

// TestRendezvousServes starts hvdd rendezvous as a real process: a client
// with the job's secret sets and gets a key, one with another secret is
// refused, and SIGTERM stops it with status 0.
func TestRendezvousServes(t *testing.T) {
	addr := freeTCP(t)
	secret := auth.NewSecret()
	cmd := exec.Command(hvddBin, "rendezvous", "--addr", addr)
	cmd.Env = append(withoutEnv("HVDD_SECRET", "HOROVOD_LOG_LEVEL"), "HVDD_SECRET="+hex.EncodeToString(secret))
	var logs bytes.Buffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	c := rendezvous.NewClient(addr, secret)
	defer c.Close()
	if err := c.Ping(ctx); err != nil { // retries while the server starts
		t.Fatalf("ping: %v", err)
	}
	if err := c.Set(ctx, "coordinator", []byte("10.0.0.2:4000")); err != nil {
		t.Fatalf("set: %v", err)
	}
	if v, err := c.Get(ctx, "coordinator"); err != nil || string(v) != "10.0.0.2:4000" {
		t.Fatalf("get = %q, %v; want 10.0.0.2:4000", v, err)
	}
	other := rendezvous.NewClient(addr, auth.NewSecret())
	defer other.Close()
	if _, err := other.Get(ctx, "coordinator"); err == nil {
		t.Error("a client with another secret read the store")
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("hvdd rendezvous after SIGTERM: %v; its log:\n%s", err, logs.String())
	}
	if !strings.Contains(logs.String(), "rendezvous listening") {
		t.Errorf("its log does not say where it listens:\n%s", logs.String())
	}
}

// TestRendezvousUsage: hvdd rendezvous refuses to start without --addr or
// without a secret, with exit status 2 and a message saying what to pass.
func TestRendezvousUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"no addr", nil, []string{"HVDD_SECRET=" + strings.Repeat("ab", 32)}, "--addr HOST:PORT is required"},
		{"no secret", []string{"--addr", "127.0.0.1:0"}, nil, "no shared secret: use --secret-file or HVDD_SECRET (generate one with"},
		{"both secrets", []string{"--addr", "127.0.0.1:0", "--secret-file", "/dev/null"}, []string{"HVDD_SECRET=" + strings.Repeat("ab", 32)}, "both --secret-file and HVDD_SECRET are set"},
		{"extra argument", []string{"--addr", "127.0.0.1:0", "now"}, nil, `unexpected argument "now"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(hvddBin, append([]string{"rendezvous"}, tt.args...)...)
			cmd.Env = append(withoutEnv("HVDD_SECRET", "HOROVOD_LOG_LEVEL"), tt.env...)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), tt.want) {
				t.Errorf("hvdd rendezvous %v: %v\n%s\nwant exit status 2 and %q", tt.args, err, out, tt.want)
			}
		})
	}
}
