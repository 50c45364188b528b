package hvdd_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon/daemontest"
)

// timelineRows parses a timeline file and returns, per tensor row, its
// events as "PH:NAME" and the names of its rank ticks (X events), sorted.
func timelineRows(t *testing.T, path string) (rows map[string][]string, ticks map[string][]string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var evs []struct {
		Name string         `json:"name"`
		Ph   string         `json:"ph"`
		Pid  int            `json:"pid"`
		Args map[string]any `json:"args"`
	}
	if err := json.Unmarshal(b, &evs); err != nil {
		t.Fatalf("timeline is not a JSON array: %v\n%s", err, b)
	}
	names := make(map[int]string)
	rows, ticks = make(map[string][]string), make(map[string][]string)
	for _, e := range evs {
		switch {
		case e.Ph == "M" && e.Name == "process_name" && e.Pid > 0:
			names[e.Pid], _ = e.Args["name"].(string)
		case e.Ph == "M" || e.Ph == "i":
		case e.Ph == "X":
			n := names[e.Pid]
			rows[n] = append(rows[n], "X:rank")
			ticks[n] = append(ticks[n], e.Name)
		default:
			n, ok := names[e.Pid]
			if !ok {
				t.Errorf("event %+v on a row without process_name", e)
			}
			rows[n] = append(rows[n], e.Ph+":"+e.Name)
		}
	}
	for _, ts := range ticks {
		sort.Strings(ts)
	}
	return rows, ticks
}

// TestMultiNodeTimeline runs allreduces on 2 nodes of 2 ranks with
// HOROVOD_TIMELINE set, and checks node 0's file: every global rank ticks in
// each tensor's negotiation, and the cross-node execution shows its phases
// (local reduction, the engine's transfer, the write-back) inside ALLREDUCE.
func TestMultiNodeTimeline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timeline.json")
	t.Setenv("HOROVOD_TIMELINE", path)
	t.Setenv("HOROVOD_TIMELINE_MARK_CYCLES", "0")
	ss := startNodes(t, 2, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var clients []*hvdd.Client
	for _, s := range ss {
		for lr := range 2 {
			clients = append(clients, &hvdd.Client{Socket: s.Socket, RequestedLocalRank: &lr})
		}
	}
	run := func(f func(c *hvdd.Client) error) { daemontest.RunAll(t, clients, f) }
	run(func(c *hvdd.Client) error { return c.Init(ctx) })
	tensors := []string{"first", "second"}
	for _, name := range tensors {
		run(func(c *hvdd.Client) error {
			data := []float32{1, 2, 3}
			if err := hvdd.Allreduce(ctx, c, data, hvdd.WithName(name), hvdd.WithOp(hvdd.Sum)); err != nil {
				return err
			}
			if !slices.Equal(data, []float32{4, 8, 12}) {
				t.Errorf("%s: allreduced %v, want [4 8 12]", name, data)
			}
			return nil
		})
	}
	for _, c := range clients {
		c.Close()
	}
	ss[0].WaitLog(t, "timeline written", 10*time.Second)
	rows, ticks := timelineRows(t, path)
	want := []string{"B:NEGOTIATE_ALLREDUCE", "X:rank", "X:rank", "X:rank", "X:rank", "E:",
		"B:ALLREDUCE", "B:SHM_ALLREDUCE", "E:", "B:TCP_ALLREDUCE", "E:", "B:MEMCPY_OUT_FUSION_BUFFER", "E:", "E:"}
	for _, name := range tensors {
		if got := rows[name]; !slices.Equal(got, want) {
			t.Errorf("%s: events %q, want %q", name, got, want)
		}
		if got := ticks[name]; !slices.Equal(got, []string{"0", "1", "2", "3"}) {
			t.Errorf("%s: rank ticks %q, want every global rank", name, got)
		}
	}
}
