package hvdd_test

import (
	"context"
	"encoding/json"
	"fmt"
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
// Events on another node's track (tid N > 0) are under "ROW@N".
func timelineRows(t *testing.T, path string) (rows map[string][]string, ticks map[string][]string) {
	rows, ticks, _ = timelineEvents(t, path)
	return rows, ticks
}

// timelineEvents is timelineRows with each row's timestamps, in the order
// of its events.
func timelineEvents(t *testing.T, path string) (rows map[string][]string, ticks map[string][]string, ts map[string][]int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var evs []struct {
		Name string         `json:"name"`
		Ph   string         `json:"ph"`
		Pid  int            `json:"pid"`
		Tid  int            `json:"tid"`
		Ts   int64          `json:"ts"`
		Args map[string]any `json:"args"`
	}
	if err := json.Unmarshal(b, &evs); err != nil {
		t.Fatalf("timeline is not a JSON array: %v\n%s", err, b)
	}
	names := make(map[int]string)
	rows, ticks, ts = make(map[string][]string), make(map[string][]string), make(map[string][]int64)
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
			if e.Tid > 0 {
				n = fmt.Sprintf("%s@%d", n, e.Tid)
			}
			rows[n] = append(rows[n], e.Ph+":"+e.Name)
			ts[n] = append(ts[n], e.Ts)
		}
	}
	for _, ts := range ticks {
		sort.Strings(ts)
	}
	return rows, ticks, ts
}

// TestMultiNodeTimeline runs allreduces on 2 nodes of 2 ranks with
// HOROVOD_TIMELINE set, and checks node 0's file: every global rank ticks in
// each tensor's negotiation, the cross-node execution shows its phases
// (local reduction, the engine's transfer, the write-back) inside ALLREDUCE,
// and node 1's own phases are on its track of each row, on node 0's clock:
// about when the negotiation they followed ended, before the row's end.
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
	// Node 1's ranks leave first: its phases travel ahead of its Bye, while
	// node 0's job (and timeline) still runs.
	for _, c := range clients[2:] {
		c.Close()
	}
	ss[1].WaitLog(t, "job ended", 10*time.Second)
	for _, c := range clients[:2] {
		c.Close()
	}
	ss[0].WaitLog(t, "timeline written", 10*time.Second)
	rows, ticks, ts := timelineEvents(t, path)
	want := []string{"B:NEGOTIATE_ALLREDUCE", "X:rank", "X:rank", "X:rank", "X:rank", "E:",
		"B:ALLREDUCE", "B:SHM_ALLREDUCE", "E:", "B:TCP_ALLREDUCE", "E:", "B:MEMCPY_OUT_FUSION_BUFFER", "E:", "E:"}
	for _, name := range tensors {
		if got := rows[name]; !slices.Equal(got, want) {
			t.Errorf("%s: events %q, want %q", name, got, want)
		}
		if got := ticks[name]; !slices.Equal(got, []string{"0", "1", "2", "3"}) {
			t.Errorf("%s: rank ticks %q, want every global rank", name, got)
		}
		node1 := want[6:]
		if got := rows[name+"@1"]; !slices.Equal(got, node1) {
			t.Errorf("%s: node 1's events %q, want %q", name, got, node1)
			continue
		}
		negotiated, end := ts[name][5], ts[name][len(ts[name])-1]
		first, last := ts[name+"@1"][0], ts[name+"@1"][len(node1)-1]
		// The plan's clock is read as it is sent, a moment before node 0
		// ends the negotiation on its row: allow for that (the
		// conversion itself is TestNodeTraceClock's).
		if first < negotiated-20000 || last < first || last > end+1e6 {
			t.Errorf("%s: node 1's phases span [%d, %d] µs, want about from the negotiation's end (%d) on, within a second of the row's end (%d)",
				name, first, last, negotiated, end)
		}
	}
}
