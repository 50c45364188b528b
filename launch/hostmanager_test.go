package launch

import (
	"maps"
	"slices"
	"testing"
	"time"
)

// fakeClock is the host manager's injected clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newTestManager(cooldown CooldownRange) (*hostManager, *fakeClock) {
	c := &fakeClock{t: time.Unix(1000, 0)}
	return newHostManager(cooldown, c.now, func() float64 { return 0.5 }), c
}

// TestCooldownDelay: Horovod's HostState: min·2^n + u·min, within [min, max].
func TestCooldownDelay(t *testing.T) {
	s := time.Second
	for _, tt := range []struct {
		r        CooldownRange
		failures int
		u        float64
		want     time.Duration
	}{
		{CooldownRange{10 * s, 100 * s}, 1, 0, 20 * s},
		{CooldownRange{10 * s, 100 * s}, 1, 0.5, 25 * s},
		{CooldownRange{10 * s, 100 * s}, 2, 0.5, 45 * s},
		{CooldownRange{10 * s, 100 * s}, 3, 0.5, 85 * s},
		{CooldownRange{10 * s, 100 * s}, 4, 0, 100 * s}, // capped at max
		{CooldownRange{10 * s, 100 * s}, 5000, 0.9, 100 * s},
		{CooldownRange{s, s}, 1, 0.99, s},
		{CooldownRange{15 * s, 30 * s}, 1, 0, 30 * s},
	} {
		if got := tt.r.delay(tt.failures, tt.u); got != tt.want {
			t.Errorf("%v.delay(%d, %g) = %v, want %v", tt.r, tt.failures, tt.u, got, tt.want)
		}
	}
}

// TestHostManagerOrder: Horovod's assignment order: hosts keep their place,
// new ones come last in discovery's order, and one that left and came back
// comes last.
func TestHostManagerOrder(t *testing.T) {
	m, _ := newTestManager(CooldownRange{})
	names := func() []string {
		var n []string
		for _, h := range m.available() {
			n = append(n, h.Name)
		}
		return n
	}
	for _, step := range []struct {
		discovered []Host
		want       []string
	}{
		{[]Host{{"b", 1}, {"a", 2}}, []string{"b", "a"}},
		{[]Host{{"c", 1}, {"a", 2}, {"b", 1}}, []string{"b", "a", "c"}},
		{[]Host{{"c", 1}, {"a", 2}}, []string{"a", "c"}},
		{[]Host{{"b", 1}, {"c", 1}, {"a", 2}}, []string{"a", "c", "b"}},
		{[]Host{{"b", 1}, {"c", 0}, {"a", 2}}, []string{"a", "b"}}, // 0 slots: not available
		{nil, nil},
	} {
		m.setDiscovered(step.discovered)
		if got := names(); !slices.Equal(got, step.want) {
			t.Errorf("discovered %v: order %v, want %v", step.discovered, got, step.want)
		}
	}
}

// TestHostManagerBlacklist: Horovod's HostState, step by step. Without a
// cooldown range a blacklisted host never returns; with one, it returns
// when its cooldown is over (min·2^n + u·min, u = 0.5 here), a host
// blacklisted again during its cooldown keeps it, and the next failure of
// a host that came back waits twice as long. A host blacklisted is out with
// all its slots (Horovod blacklists the host of a failed worker).
func TestHostManagerBlacklist(t *testing.T) {
	s := time.Second
	type step struct {
		advance   time.Duration
		blacklist string        // a host to blacklist ("" none)
		cool      time.Duration // blacklistHost's answer
		back      []string      // expire's answer
		avail     []Host
		all, rec  bool // allBlacklisted, recoverable
	}
	for _, tt := range []struct {
		name     string
		cooldown CooldownRange
		hosts    []Host
		steps    []step
	}{
		{"no cooldown: for good", CooldownRange{}, []Host{{"a", 2}, {"b", 2}}, []step{
			{blacklist: "b", avail: []Host{{"a", 2}}},
			{advance: time.Hour, avail: []Host{{"a", 2}}},
			{blacklist: "a", all: true},
			{advance: time.Hour, all: true},
		}},
		{"cooldown: back, then twice as long", CooldownRange{10 * s, 100 * s}, []Host{{"a", 2}, {"b", 1}}, []step{
			{blacklist: "b", cool: 25 * s, avail: []Host{{"a", 2}}, rec: true},
			{advance: 5 * s, blacklist: "b", cool: 20 * s, avail: []Host{{"a", 2}}, rec: true}, // keeps its cooldown
			{advance: 19 * s, avail: []Host{{"a", 2}}, rec: true},
			{advance: s, back: []string{"b"}, avail: []Host{{"a", 2}, {"b", 1}}},
			{blacklist: "b", cool: 45 * s, avail: []Host{{"a", 2}}, rec: true},
			{blacklist: "a", cool: 25 * s, all: true, rec: true},
			{advance: 25 * s, back: []string{"a"}, avail: []Host{{"a", 2}}, rec: true},
			{advance: 20 * s, back: []string{"b"}, avail: []Host{{"a", 2}, {"b", 1}}},
		}},
		{"every host one after the other", CooldownRange{}, []Host{{"a", 2}, {"b", 2}, {"c", 1}}, []step{
			{blacklist: "a", avail: []Host{{"b", 2}, {"c", 1}}},
			{blacklist: "b", avail: []Host{{"c", 1}}},
			{blacklist: "c", all: true},
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, clock := newTestManager(tt.cooldown)
			m.setDiscovered(tt.hosts)
			for i, st := range tt.steps {
				clock.advance(st.advance)
				if st.blacklist != "" {
					if d := m.blacklistHost(st.blacklist); d != st.cool {
						t.Errorf("step %d: blacklistHost(%s) = %v, want %v", i, st.blacklist, d, st.cool)
					}
				} else if back := m.expire(); !slices.Equal(back, st.back) {
					t.Errorf("step %d: expire = %v, want %v", i, back, st.back)
				}
				if got := m.available(); !slices.Equal(got, st.avail) {
					t.Errorf("step %d: available = %v, want %v", i, got, st.avail)
				}
				if m.allBlacklisted() != st.all || m.recoverable() != st.rec {
					t.Errorf("step %d: allBlacklisted %v, recoverable %v; want %v, %v", i, m.allBlacklisted(), m.recoverable(), st.all, st.rec)
				}
			}
		})
	}
}

func TestAssign(t *testing.T) {
	hosts := []Host{{"a", 2}, {"b", 2}, {"c", 2}}
	for _, tt := range []struct {
		name    string
		hosts   []Host
		running map[string]int
		maxNP   int
		want    map[string]int
	}{
		{"start, no bound", hosts, nil, 0, map[string]int{"a": 2, "b": 2, "c": 2}},
		{"start, max-np", hosts, nil, 3, map[string]int{"a": 2, "b": 1}},
		{"oldest hosts first", hosts, map[string]int{"a": 2, "b": 2}, 5, map[string]int{"a": 2, "b": 2, "c": 1}},
		{"running ranks go on", []Host{{"a", 3}, {"b", 2}}, map[string]int{"a": 2, "b": 2}, 4, map[string]int{"a": 2, "b": 2}},
		{"freed slot refilled first on older host", hosts, map[string]int{"a": 1, "b": 2, "c": 1}, 5, map[string]int{"a": 2, "b": 2, "c": 1}},
		{"fewer slots: ranks stop", []Host{{"a", 1}}, map[string]int{"a": 2, "b": 1}, 0, map[string]int{"a": 1}},
		{"none", nil, map[string]int{"a": 1}, 0, map[string]int{}},
	} {
		if got := assign(tt.hosts, tt.running, tt.maxNP); !maps.Equal(got, tt.want) {
			t.Errorf("%s: assign = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestSlotInfos(t *testing.T) {
	got := slotInfos([]Host{{"a", 2}, {"b", 1}, {"c", 2}}, map[string]int{"a": 2, "c": 2})
	want := map[string][]slotInfo{
		"a": {{0, 4, 0, 2, 0, 2}, {1, 4, 1, 2, 0, 2}},
		"c": {{2, 4, 0, 2, 1, 2}, {3, 4, 1, 2, 1, 2}},
	}
	if !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("slotInfos = %v, want %v", got, want)
	}
}
