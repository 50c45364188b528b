package timeline

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// event is a trace event as the viewers read it.
type event struct {
	Name string         `json:"name"`
	Ph   string         `json:"ph"`
	Pid  int            `json:"pid"`
	Ts   *int64         `json:"ts"`
	Dur  *int64         `json:"dur"`
	S    string         `json:"s"`
	Args map[string]any `json:"args"`
}

func parse(t *testing.T, b []byte) []event {
	t.Helper()
	var evs []event
	if err := json.Unmarshal(b, &evs); err != nil {
		t.Fatalf("timeline is not a JSON array of events: %v\n%s", err, b)
	}
	return evs
}

// rows maps each tensor's pid to its name, from the process_name metadata.
func rows(evs []event) map[int]string {
	m := make(map[int]string)
	for _, e := range evs {
		if e.Ph == "M" && e.Name == "process_name" && e.Pid > 0 {
			m[e.Pid] = e.Args["name"].(string)
		}
	}
	return m
}

// summary lists the non-metadata events as "tensor:ph:name".
func summary(evs []event) []string {
	names := rows(evs)
	var s []string
	for _, e := range evs {
		switch e.Ph {
		case "M":
		case "i":
			s = append(s, "*:i:"+e.Name)
		default:
			s = append(s, names[e.Pid]+":"+e.Ph+":"+e.Name)
		}
	}
	return s
}

func TestWriter(t *testing.T) {
	tests := []struct {
		name  string
		write func(w *Writer)
		want  []string
	}{
		{"empty", func(*Writer) {}, nil},
		{"negotiate and run", func(w *Writer) {
			w.Event("grad.0", Begin, "NEGOTIATE_ALLREDUCE")
			w.RankReady("grad.0", 1)
			w.RankReady("grad.0", 0)
			w.Event("grad.0", End, "")
			w.Event("grad.0", Begin, "ALLREDUCE")
			w.Event("grad.0", Begin, "SHM_ALLREDUCE")
			w.Event("grad.0", End, "")
			w.Event("grad.0", End, "")
		}, []string{
			"grad.0:B:NEGOTIATE_ALLREDUCE", "grad.0:X:1", "grad.0:X:0", "grad.0:E:",
			"grad.0:B:ALLREDUCE", "grad.0:B:SHM_ALLREDUCE", "grad.0:E:", "grad.0:E:",
		}},
		{"a row per tensor, names escaped", func(w *Writer) {
			w.Event(`a"b\c`, Begin, "BROADCAST")
			w.Event("ü\n", Begin, "ALLGATHER")
			w.Mark("CYCLE_START")
			w.Event(`a"b\c`, End, "")
		}, []string{`a"b\c:B:BROADCAST`, "ü\n:B:ALLGATHER", "*:i:CYCLE_START", `a"b\c:E:`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "timeline.json")
			w, err := Create(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			tt.write(w)
			// Complete before Close, at every batch.
			if err := w.Sync(); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if got := summary(parse(t, b)); !equal(got, tt.want) {
				t.Errorf("before Close: events\n%q\nwant\n%q", got, tt.want)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			b, err = os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			evs := parse(t, b)
			if got := summary(evs); !equal(got, tt.want) {
				t.Errorf("after Close: events\n%q\nwant\n%q", got, tt.want)
			}
			if _, ok := evs[0].Args["start_time_since_epoch_in_micros"]; !ok {
				t.Errorf("first record %+v lacks start_time_since_epoch_in_micros", evs[0])
			}
			seen := make(map[string]int)
			for pid, name := range rows(evs) {
				if p, ok := seen[name]; ok {
					t.Errorf("tensor %q has two rows, pids %d and %d", name, p, pid)
				}
				seen[name] = pid
			}
			var last int64
			for _, e := range evs {
				if e.Ph == "M" {
					continue
				}
				if e.Ts == nil || *e.Ts < last {
					t.Errorf("event %+v: timestamp missing or going back (last %d)", e, last)
				} else {
					last = *e.Ts
				}
				if e.Ph == "X" && (e.Dur == nil || *e.Dur != 0) {
					t.Errorf("rank tick %+v: want dur 0", e)
				}
			}
		})
	}
}

// TestTruncated cuts a timeline at every line, as a crash in the middle of a
// batch leaves it: with the last partial line dropped and "]" appended, what
// is left parses, a prefix of the events.
func TestTruncated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timeline.json")
	w, err := Create(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		w.Event("t", Begin, "ALLREDUCE")
		w.RankReady("t", i)
		w.Event("t", End, "")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	full := summary(parse(t, b))
	body := strings.TrimSuffix(string(b), terminator)
	for cut := 1; cut < len(body); cut++ {
		kept := body[:cut]
		if i := strings.LastIndexByte(kept, '\n'); i >= 0 {
			kept = kept[:i] // drop the partial line
		}
		kept = strings.TrimSuffix(kept, ",")
		if kept == "" {
			continue
		}
		got := summary(parse(t, []byte(kept+"]")))
		if !equal(got, full[:len(got)]) {
			t.Fatalf("cut at %d: events %q are not a prefix of %q", cut, got, full)
		}
	}
}

// TestDropWhenFull fills a Writer whose goroutine has not started: Event
// never blocks, the excess is counted, and what was written is valid.
func TestDropWhenFull(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timeline.json")
	w, err := create(path, Options{Buffer: 4})
	if err != nil {
		t.Fatal(err)
	}
	const n = 10
	for i := 0; i < n; i++ {
		w.RankReady("t", i)
	}
	go w.run()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	written := bytes.Count(b, []byte(`"ph": "X"`))
	if written != 4 || w.Dropped() != n-4 {
		t.Errorf("written %d, dropped %d; want 4 and %d", written, w.Dropped(), n-4)
	}
	parse(t, b)
}

func TestCreateError(t *testing.T) {
	_, err := Create(filepath.Join(t.TempDir(), "missing", "timeline.json"), Options{})
	if err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("Create in a missing directory: err %v, want one naming the path", err)
	}
}

func TestEventAfterCloseDoesNotPanic(t *testing.T) {
	w, err := Create(filepath.Join(t.TempDir(), "timeline.json"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	w.Event("t", Begin, "ALLREDUCE")
	w.Mark("CYCLE_START")
	if err := w.Sync(); err != nil {
		t.Errorf("Sync after Close: %v", err)
	}
}

func BenchmarkEvent(b *testing.B) {
	w, err := Create(filepath.Join(b.TempDir(), "timeline.json"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		w.Event("grad.0", Begin, "ALLREDUCE")
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestEventAt: another node's phases go on a track of their own, named once
// per row, with the timestamps given.
func TestEventAt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timeline.json")
	w, err := Create(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.Event("g", Begin, "ALLREDUCE")
	w.EventAt("g", Begin, "TCP_ALLREDUCE", 40, 1)
	w.EventAt("g", End, "", 90, 1)
	w.EventAt("g", Begin, "SHM_ALLREDUCE", 95, 1)
	w.EventAt("g", End, "", 99, 1)
	w.Event("g", End, "")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var evs []struct {
		Name string         `json:"name"`
		Ph   string         `json:"ph"`
		Tid  int            `json:"tid"`
		Ts   int64          `json:"ts"`
		Args map[string]any `json:"args"`
	}
	if err := json.Unmarshal(b, &evs); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	var got []string
	threads := 0
	for _, e := range evs {
		switch {
		case e.Ph == "M" && e.Name == "thread_name":
			threads++
			if e.Tid != 1 || e.Args["name"] != "node 1" {
				t.Errorf("thread metadata %+v, want tid 1 named node 1", e)
			}
		case e.Ph == "B" || e.Ph == "E":
			got = append(got, fmt.Sprintf("%s%s@%d", e.Ph, e.Name, e.Tid))
			if e.Tid == 1 && e.Ts != map[string]int64{"BTCP_ALLREDUCE": 40, "E": 0, "BSHM_ALLREDUCE": 95}[e.Ph+e.Name] && e.Ph == "B" {
				t.Errorf("node event %s at %d", e.Name, e.Ts)
			}
		}
	}
	want := []string{"BALLREDUCE@0", "BTCP_ALLREDUCE@1", "E@1", "BSHM_ALLREDUCE@1", "E@1", "E@0"}
	if !equal(got, want) || threads != 1 {
		t.Errorf("events %q (%d thread names), want %q and one", got, threads, want)
	}
}

// BenchmarkResNetStep is the timeline's whole cost for one ResNet-50 step
// of 2 ranks, as the daemon writes it: 161 rows of 8 events each (the
// negotiation with both ranks' ticks, the collective and its activity),
// then Sync, so the writer goroutine's formatting and writing are in the
// time too.
func BenchmarkResNetStep(b *testing.B) {
	w, err := Create(filepath.Join(b.TempDir(), "timeline.json"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	names := make([]string, 161)
	for i := range names {
		names[i] = fmt.Sprintf("resnet50.grad.%d", i)
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		for _, n := range names {
			w.Event(n, Begin, "NEGOTIATE_ALLREDUCE")
			w.RankReady(n, 0)
			w.RankReady(n, 1)
			w.Event(n, End, "")
			w.Event(n, Begin, "ALLREDUCE")
			w.Event(n, Begin, "SHM_ALLREDUCE")
			w.Event(n, End, "")
			w.Event(n, End, "")
		}
		if err := w.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if d := w.Dropped(); d > 0 {
		b.Fatalf("%d events dropped", d)
	}
}
