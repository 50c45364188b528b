//go:build cgo

package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hvdd/hvdd/gpu/gputest"
)

// TestStatusGPUsNVMLStub runs hvdd serve with fake GPUs and its default
// sampler, gpu/nvml's, through go-nvml's binding on gpu/nvml's C stub of
// libnvidia-ml.so.1 (two GPUs; STUB_NVML_XID=79 makes the second fall off
// the bus): hvdd status and /metrics show the first's figures and the
// second lost; the daemon, whose fake GPUs are not the stub's, says that
// NVML lost a GPU it does not use, and exits cleanly.
func TestStatusGPUsNVMLStub(t *testing.T) {
	lib := gputest.SharedLib(t, filepath.Join("..", "..", "gpu", "nvml", "testdata", "stub.c"), "libnvidia-ml.so.1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sock := filepath.Join(t.TempDir(), "hvdd.sock")
	d := exec.CommandContext(ctx, hvddBin, "serve", "--slots", "1", "--socket", sock, "--gpu", "fake",
		"--metrics-addr", "0", "--gpu-sample-interval", "1h", "--log-level", "info")
	d.Env = append(os.Environ(), "HVDD_FAKE_GPUS=2", "HVDD_NVML_LIBRARY="+lib, "STUB_NVML_XID=79")
	stderr, err := d.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	defer d.Process.Kill()
	urls, sampled := make(chan string, 1), make(chan struct{})
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
			if strings.Contains(sc.Text(), `msg="GPU sampling started"`) {
				close(sampled)
			}
		}
	}()
	var url string
	for wait := sampled; url == "" || wait != nil; {
		select {
		case url = <-urls:
		case <-wait:
			wait = nil
		case <-ctx.Done():
			t.Fatal("hvdd serve never served its metrics and sampled its GPUs")
		}
	}
	const uuid0, uuid1 = "GPU-00000000-2222-3333-4444-555555555555", "GPU-11111111-2222-3333-4444-555555555555"
	table, err := exec.Command(hvddBin, "status", "--socket", sock).Output()
	if err != nil {
		t.Fatalf("hvdd status: %v\n%s", err, table)
	}
	for _, want := range []string{
		"GPU 0 " + uuid0 + " (PCI 0000:3b:00.0): 40% busy, memory 20% busy, 512.0 MiB of 80.0 GiB used, 55 C, 350.0 W\n",
		"GPU 1 " + uuid1 + " (PCI 0000:5e:00.0): LOST (XID 79 (fallen off the bus)): its GPU tensors fail\n",
	} {
		if !strings.Contains(string(table), want) {
			t.Errorf("hvdd status lacks %q:\n%s", want, table)
		}
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`hvdd_gpu_utilization_ratio{gpu="0",uuid="` + uuid0 + `"} 0.4`,
		`hvdd_gpu_lost{gpu="0",uuid="` + uuid0 + `"} 0`,
		`hvdd_gpu_lost{gpu="1",uuid="` + uuid1 + `"} 1`,
		`hvdd_gpu_xid_errors_total{gpu="1",uuid="` + uuid1 + `",xid="79"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
	d.Process.Signal(syscall.SIGTERM)
	<-logDone
	if err := d.Wait(); err != nil {
		t.Fatalf("hvdd serve after SIGTERM: %v\n%s", err, log.String())
	}
	if !strings.Contains(log.String(), `msg="NVML reports a GPU lost that the daemon does not use" index=1 uuid=`+uuid1) {
		t.Errorf("the daemon did not say that NVML lost a GPU it does not use:\n%s", log.String())
	}
}
