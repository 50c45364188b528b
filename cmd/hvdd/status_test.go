package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon/daemontest"
)

// statusJSON is the part of `hvdd status --json` the test reads.
type statusJSON struct {
	Slots     int `json:"slots"`
	SlotsUsed int `json:"slots_used"`
	Jobs      []struct {
		ID    string `json:"id"`
		Name  string `json:"name"`
		State string `json:"state"`
		Size  int    `json:"size"`
		Ranks []struct {
			Rank     int  `json:"rank"`
			Pid      int  `json:"pid"`
			InFlight int  `json:"in_flight"`
			UIDKnown bool `json:"uid_known"`
		} `json:"ranks"`
		Pending []struct {
			Name      string `json:"name"`
			Submitted []int  `json:"submitted"`
			Missing   []int  `json:"missing"`
		} `json:"pending"`
		PendingTotal int `json:"pending_total"`
	} `json:"jobs"`
	Errors []struct {
		Error string `json:"error"`
	} `json:"errors"`
}

// TestStatus runs the real daemon and `hvdd status` against it: during a
// stalled collective (rank 0 submitted "lonely", rank 1 did not) --json
// names the tensor, who submitted it and the missing rank; a mismatch shows
// among the recent errors; the table names the same; with the job gone the
// daemon has no jobs.
func TestStatus(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "hvdd.sock")
	d := exec.Command(hvddBin, "serve", "--slots", "4", "--socket", sock, "--log-level", "error")
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	defer d.Process.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t.Setenv("HVDD_JOB", "stat")
	t.Setenv("HVDD_LOCAL_SIZE", "2")
	clients := daemontest.InitClients(t, ctx, sock, 2)
	// A mismatch (shapes 2 and 3) fails on both ranks and is remembered.
	errc := make(chan error, 2)
	for i, c := range clients {
		go func() { errc <- hvdd.Allreduce(ctx, c, make([]float32, 2+i), hvdd.WithName("odd")) }()
	}
	for range clients {
		if err := <-errc; !errors.Is(err, hvdd.ErrMismatch) {
			t.Fatalf("mismatch: %v", err)
		}
	}
	h, err := hvdd.AllreduceAsync(clients[0], []float32{1}, hvdd.WithName("lonely"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(hvddBin, "status", "--json", "--socket", sock).Output()
	if err != nil {
		t.Fatalf("hvdd status --json: %v\n%s", err, out)
	}
	var st statusJSON
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("hvdd status --json: %v\n%s", err, out)
	}
	if st.Slots != 4 || st.SlotsUsed != 2 || len(st.Jobs) != 1 {
		t.Fatalf("status: %+v\n%s", st, out)
	}
	j := st.Jobs[0]
	if j.Name != "stat" || j.State != "running" || j.Size != 2 || len(j.Ranks) != 2 {
		t.Fatalf("job: %+v\n%s", j, out)
	}
	pids := []int{j.Ranks[0].Pid, j.Ranks[1].Pid}
	if !slices.Equal(pids, []int{os.Getpid(), os.Getpid()}) || j.Ranks[0].InFlight != 1 || j.Ranks[1].InFlight != 0 || !j.Ranks[0].UIDKnown {
		t.Errorf("ranks: %+v, want this process's pid twice, rank 0 with one op in flight", j.Ranks)
	}
	if j.PendingTotal != 1 || len(j.Pending) != 1 || j.Pending[0].Name != "lonely" ||
		!slices.Equal(j.Pending[0].Submitted, []int{0}) || !slices.Equal(j.Pending[0].Missing, []int{1}) {
		t.Errorf("pending: %+v, want lonely submitted by 0, missing 1", j.Pending)
	}
	if len(st.Errors) == 0 || !strings.Contains(st.Errors[len(st.Errors)-1].Error, "odd") {
		t.Errorf("errors: %+v, want the mismatch of odd", st.Errors)
	}
	table, err := exec.Command(hvddBin, "status", "--socket", sock).Output()
	if err != nil {
		t.Fatalf("hvdd status: %v\n%s", err, table)
	}
	for _, want := range []string{"job 1 stat (uid", "running, 2 ranks (2 here)", "waiting on 1 tensors:", "lonely for", "submitted by ranks 0, missing 1", "recent errors:"} {
		if !strings.Contains(string(table), want) {
			t.Errorf("hvdd status lacks %q:\n%s", want, table)
		}
	}
	// Rank 1 submits: the tensor completes and the job leaves no pending.
	if err := hvdd.Allreduce(ctx, clients[1], []float32{1}, hvdd.WithName("lonely")); err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range clients {
		c.Close()
	}
	// The job has ended once its lane is gone: poll with a deadline.
	sc, err := hvdd.DialStatus(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	for {
		s, err := sc.Status(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(s.GetJobs()) == 0 && s.GetSlotsUsed() == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the job is still listed: %v", s)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, with the test's deadline
	}
}

// TestStatusNoDaemon: hvdd status without a daemon says where it looked and
// what to do, with exit status 1.
func TestStatusNoDaemon(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	out, err := exec.Command(hvddBin, "status", "--socket", sock).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "no daemon answers on "+sock) || !strings.Contains(string(out), "hvdd serve") {
		t.Fatalf("hvdd status without a daemon: %v\n%s", err, out)
	}
}
