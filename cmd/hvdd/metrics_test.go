package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
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

// TestServeMetrics runs hvdd serve --metrics-addr with a bare port (0: any
// free one), which binds loopback; a job's allreduces show on /metrics, and
// the endpoint goes with the daemon.
func TestServeMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sock := filepath.Join(t.TempDir(), "hvdd.sock")
	d := exec.CommandContext(ctx, hvddBin, "serve", "--slots", "2", "--socket", sock, "--metrics-addr", "0", "--log-level", "info")
	stderr, err := d.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	defer d.Process.Kill()
	urls := make(chan string, 1)
	var log strings.Builder
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		re := regexp.MustCompile(`msg="serving metrics" url=(\S+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				urls <- m[1]
			}
		}
	}()
	var url string
	select {
	case url = <-urls:
	case <-ctx.Done():
		t.Fatal("hvdd serve never said where it serves its metrics")
	}
	if !strings.HasPrefix(url, "http://127.0.0.1:") || !strings.HasSuffix(url, "/metrics") {
		t.Fatalf("--metrics-addr 0 serves at %s, want loopback", url)
	}
	clients := daemontest.InitClients(t, ctx, sock, 2)
	daemontest.RunAll(t, clients, func(c *hvdd.Client) error {
		for range 3 {
			if err := hvdd.Allreduce(ctx, c, make([]float32, 16), hvdd.WithName("x")); err != nil {
				return err
			}
		}
		return nil
	})
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`hvdd_ops_total{code="ok",collective="allreduce",job_name=""} 6`,
		`hvdd_op_bytes_total{collective="allreduce",job_name=""} 384`,
		`hvdd_clients{state="running"} 2`,
		"process_resident_memory_bytes ",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
	for _, c := range clients {
		c.Close()
	}
	d.Process.Signal(syscall.SIGTERM)
	<-logDone
	if err := d.Wait(); err != nil {
		t.Fatalf("hvdd serve after SIGTERM: %v\n%s", err, log.String())
	}
	if c, err := net.Dial("tcp", strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/metrics")); err == nil {
		c.Close()
		t.Error("the metrics endpoint outlived the daemon")
	}
}

// TestServeMetricsBadAddr: a --metrics-addr that is no address is refused
// with what to give instead.
func TestServeMetricsBadAddr(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "hvdd.sock")
	out, err := exec.Command(hvddBin, "serve", "--slots", "1", "--socket", sock, "--metrics-addr", "nowhere").CombinedOutput()
	if code := exitCode(err); code != 1 || !strings.Contains(string(out), "want HOST:PORT, :PORT or PORT") {
		t.Fatalf("exit %d, output %q: want 1 and a message saying what to give", code, out)
	}
}

// exitCode is err's exit status: 0 for nil, -1 if it is no exit.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}
