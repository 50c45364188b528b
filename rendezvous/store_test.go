package rendezvous

import (
	"bytes"
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// waitObserver is implemented by stores under test that can report a Wait
// parking (the Memory behind them calls back), so the suite can order a
// Set after the Wait has blocked without sleeping.
type waitObserver interface {
	// onWaitBlocked returns a channel that receives each time a Wait parks.
	onWaitBlocked(t *testing.T) <-chan struct{}
}

// observe returns a channel that receives each time the Memory's Wait parks.
func observe(t *testing.T, m *Memory) <-chan struct{} {
	ch := make(chan struct{}, 64)
	f := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	m.testHookWaitBlocked.Store(&f)
	t.Cleanup(func() { m.testHookWaitBlocked.Store(nil) })
	return ch
}

// parked waits until s reports a parked Wait, when s can; otherwise it
// returns at once and the test runs with whatever interleaving it gets,
// which must be correct too.
func parked(t *testing.T, blocked <-chan struct{}) {
	t.Helper()
	if blocked == nil {
		return
	}
	select {
	case <-blocked:
	case <-time.After(10 * time.Second):
		t.Fatal("Wait never blocked")
	}
}

func blockedChan(t *testing.T, s Store) <-chan struct{} {
	if o, ok := s.(waitObserver); ok {
		return o.onWaitBlocked(t)
	}
	return nil
}

// testStore is the conformance suite every Store implementation runs.
// newStore returns a fresh, empty store.
func testStore(t *testing.T, newStore func(t *testing.T) Store) {
	tests := []struct {
		name string
		run  func(t *testing.T, ctx context.Context, s Store)
	}{
		{"SetGet", testSetGet},
		{"GetMissing", func(t *testing.T, ctx context.Context, s Store) {
			_, err := s.Get(ctx, "nope")
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("Get(missing) = %v, want ErrNotFound", err)
			}
		}},
		{"Delete", testDelete},
		{"Add", testAdd},
		{"AddConcurrent", testAddConcurrent},
		{"WaitPresent", func(t *testing.T, ctx context.Context, s Store) {
			mustSet(t, s, "a", "1")
			mustSet(t, s, "b", "")
			got, err := s.Wait(ctx, "a", "b", "a")
			if err != nil {
				t.Fatal(err)
			}
			if string(got["a"]) != "1" || got["b"] == nil || len(got["b"]) != 0 || len(got) != 2 {
				t.Fatalf("Wait = %q", got)
			}
			got, err = s.Wait(ctx)
			if err != nil || len(got) != 0 {
				t.Fatalf("Wait() = %v, %v; want empty map", got, err)
			}
		}},
		{"WaitReleasedBySet", testWaitReleasedBySet},
		{"WaitReleasedByAdd", func(t *testing.T, ctx context.Context, s Store) {
			blocked := blockedChan(t, s)
			res := goWait(ctx, s, "n")
			parked(t, blocked)
			if _, err := s.Add(ctx, "n", 7); err != nil {
				t.Fatal(err)
			}
			r := <-res
			if r.err != nil || string(r.vals["n"]) != "7" {
				t.Fatalf("Wait = %q, %v", r.vals, r.err)
			}
		}},
		{"WaitManyWaiters", func(t *testing.T, ctx context.Context, s Store) {
			blocked := blockedChan(t, s)
			const n = 8
			var res []<-chan waitResult
			for range n {
				res = append(res, goWait(ctx, s, "go"))
			}
			for range n {
				parked(t, blocked)
			}
			mustSet(t, s, "go", "now")
			for _, c := range res {
				if r := <-c; r.err != nil || string(r.vals["go"]) != "now" {
					t.Fatalf("Wait = %q, %v", r.vals, r.err)
				}
			}
		}},
		{"WaitCancel", func(t *testing.T, ctx context.Context, s Store) {
			blocked := blockedChan(t, s)
			ctx, cancel := context.WithCancel(ctx)
			mustSet(t, s, "here", "x")
			res := goWait(ctx, s, "here", "never")
			parked(t, blocked)
			cancel()
			r := <-res
			if !errors.Is(r.err, context.Canceled) {
				t.Fatalf("Wait after cancel = %v, want context.Canceled", r.err)
			}
			if !strings.Contains(r.err.Error(), `never"`) {
				t.Errorf("error %q should name the missing key", r.err)
			}
		}},
		{"WaitDeadline", func(t *testing.T, ctx context.Context, s Store) {
			ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			mustSet(t, s, "here", "x")
			_, err := s.Wait(ctx, "here", "never")
			if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), `never"`) {
				t.Fatalf("Wait past deadline = %v, want DeadlineExceeded naming the key", err)
			}
		}},
		{"InvalidArguments", testInvalid},
		{"Prefix", testPrefix},
		{"Copies", func(t *testing.T, ctx context.Context, s Store) {
			v := []byte("abc")
			if err := s.Set(ctx, "k", v); err != nil {
				t.Fatal(err)
			}
			v[0] = 'X'
			got, _ := s.Get(ctx, "k")
			got[1] = 'Y'
			again, _ := s.Get(ctx, "k")
			if string(again) != "abc" {
				t.Fatalf("store shares memory with caller: %q", again)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			tc.run(t, ctx, newStore(t))
		})
	}
}

func mustSet(t *testing.T, s Store, k, v string) {
	t.Helper()
	if err := s.Set(context.Background(), k, []byte(v)); err != nil {
		t.Fatalf("Set(%q): %v", k, err)
	}
}

func mustGet(t *testing.T, s Store, k string) string {
	t.Helper()
	v, err := s.Get(context.Background(), k)
	if err != nil {
		t.Fatalf("Get(%q): %v", k, err)
	}
	return string(v)
}

type waitResult struct {
	vals map[string][]byte
	err  error
}

func goWait(ctx context.Context, s Store, keys ...string) <-chan waitResult {
	c := make(chan waitResult, 1)
	go func() {
		v, err := s.Wait(ctx, keys...)
		c <- waitResult{v, err}
	}()
	return c
}

func testSetGet(t *testing.T, ctx context.Context, s Store) {
	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	tests := []struct {
		key   string
		value []byte
	}{
		{"plain", []byte("host:1234")},
		{"empty value", []byte{}},
		{"binary", binary},
		{"a/b/c", []byte("slashes")},
		{"?q=1&x#frag %2F %", []byte("url syntax")},
		{"ключ/日本", []byte("unicode")},
		{strings.Repeat("k", 400), []byte("long key")},
		{"..", []byte("dots")},
	}
	for _, tc := range tests {
		if err := s.Set(ctx, tc.key, tc.value); err != nil {
			t.Fatalf("Set(%q): %v", tc.key, err)
		}
	}
	for _, tc := range tests {
		got, err := s.Get(ctx, tc.key)
		if err != nil || !bytes.Equal(got, tc.value) {
			t.Errorf("Get(%q) = %q, %v; want %q", tc.key, got, err, tc.value)
		}
	}
	mustSet(t, s, "plain", "replaced")
	if got := mustGet(t, s, "plain"); got != "replaced" {
		t.Errorf("after overwrite Get = %q", got)
	}
}

func testDelete(t *testing.T, ctx context.Context, s Store) {
	mustSet(t, s, "k", "v")
	if err := s.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "k"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after Delete = %v, want ErrNotFound", err)
	}
	if err := s.Delete(ctx, "k"); err != nil {
		t.Fatalf("Delete(missing) = %v, want nil", err)
	}
	mustSet(t, s, "k", "again")
	if got := mustGet(t, s, "k"); got != "again" {
		t.Fatalf("Set after Delete: Get = %q", got)
	}
}

func testAdd(t *testing.T, ctx context.Context, s Store) {
	steps := []struct {
		delta int64
		want  int64
	}{{1, 1}, {5, 6}, {-10, -4}, {0, -4}}
	for _, st := range steps {
		got, err := s.Add(ctx, "c", st.delta)
		if err != nil || got != st.want {
			t.Fatalf("Add(%d) = %d, %v; want %d", st.delta, got, err, st.want)
		}
	}
	if got := mustGet(t, s, "c"); got != "-4" {
		t.Errorf("Get(counter) = %q, want decimal -4", got)
	}
	mustSet(t, s, "set", "41")
	if got, err := s.Add(ctx, "set", 1); err != nil || got != 42 {
		t.Errorf("Add to Set decimal = %d, %v", got, err)
	}
	mustSet(t, s, "text", "hello")
	if _, err := s.Add(ctx, "text", 1); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Add to non-counter = %v, want ErrInvalidArgument", err)
	}
	if _, err := s.Add(ctx, "big", math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(ctx, "big", 1); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("overflowing Add = %v, want ErrInvalidArgument", err)
	}
	if _, err := s.Add(ctx, "small", math.MinInt64); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(ctx, "small", -1); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("underflowing Add = %v, want ErrInvalidArgument", err)
	}
}

func testAddConcurrent(t *testing.T, ctx context.Context, s Store) {
	const workers, each = 8, 40
	var mu sync.Mutex
	var seen []int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range each {
				n, err := s.Add(ctx, "ctr", 1)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				seen = append(seen, n)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	slices.Sort(seen)
	for i, n := range seen {
		if n != int64(i+1) {
			t.Fatalf("Add results not 1..%d: position %d holds %d", workers*each, i, n)
		}
	}
	if got := mustGet(t, s, "ctr"); got != strconv.Itoa(workers*each) {
		t.Fatalf("final counter %q, want %d", got, workers*each)
	}
}

func testWaitReleasedBySet(t *testing.T, ctx context.Context, s Store) {
	blocked := blockedChan(t, s)
	mustSet(t, s, "a", "early")
	res := goWait(ctx, s, "a", "b", "c")
	parked(t, blocked)
	mustSet(t, s, "b", "mid")
	parked(t, blocked) // woken by b, still missing c, parks again
	mustSet(t, s, "c", "late")
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	want := map[string]string{"a": "early", "b": "mid", "c": "late"}
	if len(r.vals) != len(want) {
		t.Fatalf("Wait = %q", r.vals)
	}
	for k, v := range want {
		if string(r.vals[k]) != v {
			t.Errorf("Wait[%q] = %q, want %q", k, r.vals[k], v)
		}
	}
}

func testInvalid(t *testing.T, ctx context.Context, s Store) {
	long := strings.Repeat("x", MaxKeyLen+1)
	tests := []struct {
		name string
		call func() error
		want error
	}{
		{"Set empty key", func() error { return s.Set(ctx, "", nil) }, ErrInvalidArgument},
		{"Get empty key", func() error { _, err := s.Get(ctx, ""); return err }, ErrInvalidArgument},
		{"Wait empty key", func() error { _, err := s.Wait(ctx, "a", ""); return err }, ErrInvalidArgument},
		{"Add empty key", func() error { _, err := s.Add(ctx, "", 1); return err }, ErrInvalidArgument},
		{"Delete empty key", func() error { return s.Delete(ctx, "") }, ErrInvalidArgument},
		{"Set long key", func() error { return s.Set(ctx, long, nil) }, ErrTooLarge},
		{"Get long key", func() error { _, err := s.Get(ctx, long); return err }, ErrTooLarge},
		{"Wait long key", func() error { _, err := s.Wait(ctx, long); return err }, ErrTooLarge},
		{"Set bad UTF-8", func() error { return s.Set(ctx, "a\xffb", nil) }, ErrInvalidArgument},
		{"Set huge value", func() error { return s.Set(ctx, "v", make([]byte, MaxValueLen+1)) }, ErrTooLarge},
	}
	for _, tc := range tests {
		if err := tc.call(); !errors.Is(err, tc.want) {
			t.Errorf("%s = %v, want %v", tc.name, err, tc.want)
		}
	}
}

func testPrefix(t *testing.T, ctx context.Context, s Store) {
	a, b := Prefix(s, "job1"), Prefix(s, "job2")
	nested := Prefix(a, "gen3")
	mustSet(t, a, "k", "a")
	mustSet(t, b, "k", "b")
	mustSet(t, nested, "k", "n")
	for _, tc := range []struct {
		s    Store
		key  string
		want string
	}{{a, "k", "a"}, {b, "k", "b"}, {nested, "k", "n"}, {s, "job1/k", "a"}, {s, "job1/gen3/k", "n"}, {a, "gen3/k", "n"}} {
		if got := mustGet(t, tc.s, tc.key); got != tc.want {
			t.Errorf("Get(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
	if _, err := s.Get(ctx, "k"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unprefixed Get = %v, want ErrNotFound", err)
	}
	got, err := nested.Wait(ctx, "k")
	if err != nil || len(got) != 1 || string(got["k"]) != "n" {
		t.Errorf("prefixed Wait = %q, %v; want map[k:n]", got, err)
	}
	if n, err := b.Add(ctx, "ctr", 2); err != nil || n != 2 {
		t.Errorf("prefixed Add = %d, %v", n, err)
	}
	if _, err := a.Get(ctx, "ctr"); !errors.Is(err, ErrNotFound) {
		t.Errorf("counter leaked across prefixes: %v", err)
	}
	if err := a.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, b, "k"); got != "b" {
		t.Errorf("Delete in job1 touched job2: %q", got)
	}
	if err := a.Set(ctx, "", nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("prefixed empty key = %v, want ErrInvalidArgument", err)
	}
	if Prefix(s, "") != s {
		t.Error("Prefix with empty prefix should return the store itself")
	}
}

// memoryUnderTest lets the suite observe its Waits.
type memoryUnderTest struct{ *Memory }

func (m memoryUnderTest) onWaitBlocked(t *testing.T) <-chan struct{} { return observe(t, m.Memory) }

func TestMemory(t *testing.T) {
	testStore(t, func(t *testing.T) Store { return memoryUnderTest{NewMemory()} })
}

func TestPrefixedMemory(t *testing.T) {
	testStore(t, func(t *testing.T) Store { return Prefix(NewMemory(), "outer") })
}

func TestMemoryClose(t *testing.T) {
	m := NewMemory()
	blocked := observe(t, m)
	res := goWait(context.Background(), m, "never")
	parked(t, blocked)
	m.Close()
	if r := <-res; !errors.Is(r.err, ErrClosed) {
		t.Fatalf("Wait after Close = %v, want ErrClosed", r.err)
	}
	if err := m.Set(context.Background(), "k", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Set after Close = %v, want ErrClosed", err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
}

func TestMemoryWaitNamesMissing(t *testing.T) {
	m := NewMemory()
	mustSet(t, m, "here", "x")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := m.Wait(ctx, "here", "never")
	if want := `wait: 1 key(s) missing ["never"]: context canceled`; err == nil || err.Error() != want {
		t.Fatalf("Wait = %v, want %q", err, want)
	}
}

func TestMemoryLongestKey(t *testing.T) {
	m := NewMemory()
	k := strings.Repeat("k", MaxKeyLen)
	mustSet(t, m, k, "v")
	if got := mustGet(t, m, k); got != "v" {
		t.Fatalf("Get = %q", got)
	}
}

func TestMemoryFull(t *testing.T) {
	ctx := context.Background()
	m := newMemory(2)
	mustSet(t, m, "a", "1")
	if _, err := m.Add(ctx, "b", 1); err != nil {
		t.Fatal(err)
	}
	if err := m.Set(ctx, "c", nil); !errors.Is(err, ErrFull) {
		t.Fatalf("Set beyond MaxKeys = %v, want ErrFull", err)
	}
	if _, err := m.Add(ctx, "c", 1); !errors.Is(err, ErrFull) {
		t.Fatalf("Add beyond MaxKeys = %v, want ErrFull", err)
	}
	mustSet(t, m, "a", "overwrite is fine")
	if _, err := m.Add(ctx, "b", 1); err != nil {
		t.Fatalf("Add to existing key when full = %v", err)
	}
	if err := m.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	mustSet(t, m, "c", "room again")
	if m.Len() != 2 {
		t.Fatalf("Len = %d", m.Len())
	}
}
