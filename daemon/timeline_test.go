package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/daemon/daemontest"
)

// traceEvent is a Chrome trace event as the viewers read it.
type traceEvent struct {
	Name string         `json:"name"`
	Ph   string         `json:"ph"`
	Pid  int            `json:"pid"`
	Ts   int64          `json:"ts"`
	Args map[string]any `json:"args"`
}

// readTimeline parses a timeline file and returns, per tensor row, its
// events as "PH:NAME" (rank ticks as "X:rank"), and the global markers.
func readTimeline(t *testing.T, path string) (rows map[string][]string, marks []string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var evs []traceEvent
	if err := json.Unmarshal(b, &evs); err != nil {
		t.Fatalf("timeline is not a JSON array: %v\n%s", err, b)
	}
	names := make(map[int]string)
	rows = make(map[string][]string)
	for _, e := range evs {
		switch {
		case e.Ph == "M" && e.Name == "process_name" && e.Pid > 0:
			n := e.Args["name"].(string)
			if _, dup := rows[n]; dup {
				t.Errorf("tensor %q has more than one row", n)
			}
			names[e.Pid] = n
			rows[n] = nil
		case e.Ph == "M":
		case e.Ph == "i":
			marks = append(marks, e.Name)
		default:
			n, ok := names[e.Pid]
			if !ok {
				t.Errorf("event %+v on a row without process_name", e)
			}
			ev := e.Ph + ":" + e.Name
			if e.Ph == "X" {
				ev = "X:rank"
			}
			rows[n] = append(rows[n], ev)
		}
	}
	return rows, marks
}

// rankTicks returns the rank names of the X events on pid's row, sorted.
func rankTicks(t *testing.T, path, tensor string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var evs []traceEvent
	if err := json.Unmarshal(b, &evs); err != nil {
		t.Fatal(err)
	}
	pid := -1
	for _, e := range evs {
		if e.Ph == "M" && e.Name == "process_name" && e.Args["name"] == tensor {
			pid = e.Pid
		}
	}
	var ranks []string
	for _, e := range evs {
		if e.Pid == pid && e.Ph == "X" {
			ranks = append(ranks, e.Name)
		}
	}
	sort.Strings(ranks)
	return ranks
}

func negotiated(op string, n int) []string {
	ev := []string{"B:NEGOTIATE_" + op}
	for range n {
		ev = append(ev, "X:rank")
	}
	return append(ev, "E:")
}

// TestTimeline runs collectives with the timeline on and checks Horovod's
// events: a row per tensor, its negotiation with a tick per rank, then the
// collective and hvdd's execution phase inside it, and cycle marks.
func TestTimeline(t *testing.T) {
	const n = 3
	s := daemontest.Start(t, daemon.Config{Slots: n})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clients := daemontest.InitClients(t, ctx, s.Socket, n)
	path := filepath.Join(t.TempDir(), "timeline.json")
	// Every rank may call it; only rank 0's starts it. A relative path is
	// made absolute by the client.
	daemontest.RunAll(t, clients, func(c *hvdd.Client) error {
		if c.Rank() != 0 {
			return c.StartTimeline(ctx, "ignored.json", false)
		}
		return c.StartTimeline(ctx, path, true)
	})
	for step := 0; step < 2; step++ {
		daemontest.RunAll(t, clients, func(c *hvdd.Client) error {
			if err := hvdd.Allreduce(ctx, c, []float32{1, 2, 3}, hvdd.WithName("grad")); err != nil {
				return err
			}
			if err := hvdd.Broadcast(ctx, c, []int32{int32(c.Rank())}, 1, hvdd.WithName("weights")); err != nil {
				return err
			}
			_, err := hvdd.Allgather(ctx, c, []float64{float64(c.Rank())}, hvdd.WithName("stats"))
			return err
		})
	}
	if err := clients[0].StopTimeline(ctx); err != nil {
		t.Fatal(err)
	}
	// Stop is idempotent; the timeline is stopped when it returns.
	if err := clients[0].StopTimeline(ctx); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	rows, marks := readTimeline(t, path)
	for _, tc := range []struct {
		tensor, op, activity string
	}{
		{"grad", "ALLREDUCE", "SHM_ALLREDUCE"},
		{"weights", "BROADCAST", "SHM_BROADCAST"},
		{"stats", "ALLGATHER", "SHM_ALLGATHER"},
	} {
		var want []string
		for step := 0; step < 2; step++ {
			want = append(want, negotiated(tc.op, n)...)
			want = append(want, "B:"+tc.op, "B:"+tc.activity, "E:", "E:")
		}
		if got := rows[tc.tensor]; !slices.Equal(got, want) {
			t.Errorf("tensor %q: events\n%q\nwant\n%q", tc.tensor, got, want)
		}
		if got, want := rankTicks(t, path, tc.tensor), []string{"0", "0", "1", "1", "2", "2"}; !slices.Equal(got, want) {
			t.Errorf("tensor %q: rank ticks %q, want %q", tc.tensor, got, want)
		}
	}
	if len(rows) != 3 {
		t.Errorf("rows %v, want grad, weights and stats", rows)
	}
	if len(marks) == 0 || slices.ContainsFunc(marks, func(m string) bool { return m != "CYCLE_START" }) {
		t.Errorf("marks %q, want CYCLE_START ones", marks)
	}
	if _, err := os.Stat("ignored.json"); err == nil {
		os.Remove("ignored.json")
		t.Error("rank 1's start_timeline wrote a file")
	}
	// Stopped: later collectives leave the file alone.
	before, _ := os.ReadFile(path)
	daemontest.RunAll(t, clients, func(c *hvdd.Client) error {
		return hvdd.Allreduce(ctx, c, []float32{1}, hvdd.WithName("after"))
	})
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Error("the timeline changed after stop")
	}
}

// TestTimelineErrors checks the requests that cannot start a timeline.
func TestTimelineErrors(t *testing.T) {
	s := daemontest.Start(t, daemon.Config{Slots: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := daemontest.InitClients(t, ctx, s.Socket, 1)[0]
	if err := c.StopTimeline(ctx); err != nil {
		t.Errorf("stop without a timeline: %v", err)
	}
	missing := filepath.Join(t.TempDir(), "missing", "timeline.json")
	if err := c.StartTimeline(ctx, missing, false); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("start in a missing directory: err %v, want one naming %s", err, missing)
	}
	// The job goes on.
	if err := hvdd.Allreduce(ctx, c, []float32{1}, hvdd.WithName("x")); err != nil {
		t.Fatal(err)
	}
}

// TestTimelineFromEnv starts the timeline with HOROVOD_TIMELINE at init, as
// hvdd run --timeline-filename does: it sees the job's first request, and
// the daemon completes the file when the job ends.
func TestTimelineFromEnv(t *testing.T) {
	const n = 2
	path := filepath.Join(t.TempDir(), "timeline.json")
	t.Setenv("HOROVOD_TIMELINE", path)
	t.Setenv("HOROVOD_TIMELINE_MARK_CYCLES", "0")
	s := daemontest.Start(t, daemon.Config{Slots: n})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clients := daemontest.InitClients(t, ctx, s.Socket, n)
	daemontest.RunAll(t, clients, func(c *hvdd.Client) error {
		return hvdd.Allreduce(ctx, c, []float32{1}, hvdd.WithName("first"))
	})
	for _, c := range clients {
		c.Close()
	}
	s.WaitLog(t, "timeline written", 10*time.Second)
	rows, marks := readTimeline(t, path)
	want := append(negotiated("ALLREDUCE", n), "B:ALLREDUCE", "B:SHM_ALLREDUCE", "E:", "E:")
	if got := rows["first"]; !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
	if len(marks) != 0 {
		t.Errorf("marks %q without mark cycles", marks)
	}
}

// BenchmarkTimelineOverhead measures what the timeline costs a training
// step: 2 ranks allreduce 16 named 1 KiB tensors per step (fused), with the
// timeline off and on (with cycle marks). Compare the two with benchstat.
func BenchmarkTimelineOverhead(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			const n, tensors = 2, 16
			s := daemontest.Start(b, daemon.Config{Slots: n})
			ctx := context.Background()
			clients := daemontest.InitClients(b, ctx, s.Socket, n)
			defer func() {
				for _, c := range clients {
					c.Close()
				}
			}()
			if on {
				if err := clients[0].StartTimeline(ctx, filepath.Join(b.TempDir(), "timeline.json"), true); err != nil {
					b.Fatal(err)
				}
			}
			names := make([]string, tensors)
			for i := range names {
				names[i] = fmt.Sprintf("grad.%d", i)
			}
			b.ResetTimer()
			var wg sync.WaitGroup
			errs := make([]error, n)
			for r, c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					bufs := make([][]float32, tensors)
					for i := range bufs {
						if bufs[i], errs[r] = hvdd.Alloc[float32](c, 256); errs[r] != nil {
							return
						}
					}
					hs := make([]*hvdd.Handle, tensors)
					for range b.N {
						for i, buf := range bufs {
							if hs[i], errs[r] = hvdd.AllreduceAsync(c, buf, hvdd.WithName(names[i])); errs[r] != nil {
								return
							}
						}
						for _, h := range hs {
							if errs[r] = h.Wait(ctx); errs[r] != nil {
								return
							}
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			for r, err := range errs {
				if err != nil {
					b.Fatalf("rank %d: %v", r, err)
				}
			}
			if on {
				if err := clients[0].StopTimeline(ctx); err != nil {
					b.Fatal(err)
				}
				if strings.Contains(s.Logs(), "timeline dropped events") {
					b.Log("the timeline dropped events")
				}
			}
		})
	}
}
