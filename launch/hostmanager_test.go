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

// TestHostManagerBlacklist: without a cooldown range a blacklisted host or
// slot never returns; with one, it returns when its cooldown is over, and
// the next failure of the host waits twice as long.
func TestHostManagerBlacklist(t *testing.T) {
	s := time.Second
	t.Run("no cooldown", func(t *testing.T) {
		m, clock := newTestManager(CooldownRange{})
		m.setDiscovered([]Host{{"a", 2}, {"b", 2}})
		if d := m.blacklistHost("b"); d != 0 {
			t.Errorf("blacklistHost = %v, want 0 (for good)", d)
		}
		if d := m.blacklistSlot("a"); d != 0 {
			t.Errorf("blacklistSlot = %v, want 0 (for good)", d)
		}
		clock.advance(time.Hour)
		if back, freed := m.expire(); back != nil || freed != nil {
			t.Errorf("expire = %v, %v; nothing returns without a cooldown", back, freed)
		}
		if got := m.available(); !slices.Equal(got, []Host{{"a", 1}}) {
			t.Errorf("available = %v, want [a:1]", got)
		}
		if m.recoverable() || m.allBlacklisted() || !m.isBlacklisted("b") {
			t.Errorf("recoverable %v, allBlacklisted %v, b blacklisted %v", m.recoverable(), m.allBlacklisted(), m.isBlacklisted("b"))
		}
		m.blacklistSlot("a")
		if !m.allBlacklisted() {
			t.Error("every slot of a and host b are out, but allBlacklisted is false")
		}
	})

	t.Run("cooldown", func(t *testing.T) {
		m, clock := newTestManager(CooldownRange{10 * s, 100 * s})
		m.setDiscovered([]Host{{"a", 2}, {"b", 1}})
		if d := m.blacklistHost("b"); d != 25*s {
			t.Errorf("first blacklisting: %v, want 25s", d)
		}
		// Blacklisted again during its cooldown: the cooldown stays.
		clock.advance(5 * s)
		if d := m.blacklistHost("b"); d != 20*s {
			t.Errorf("blacklisted again during the cooldown: %v, want the 20s left", d)
		}
		if !m.recoverable() || m.allBlacklisted() {
			t.Errorf("recoverable %v, allBlacklisted %v", m.recoverable(), m.allBlacklisted())
		}
		clock.advance(19 * s)
		if back, _ := m.expire(); back != nil {
			t.Errorf("b back after 24s of 25: %v", back)
		}
		clock.advance(s)
		if back, _ := m.expire(); !slices.Equal(back, []string{"b"}) {
			t.Errorf("expire = %v, want b back", back)
		}
		if got := m.available(); !slices.Equal(got, []Host{{"a", 2}, {"b", 1}}) {
			t.Errorf("available = %v", got)
		}
		// The second failure waits 10·4 + 5.
		if d := m.blacklistHost("b"); d != 45*s {
			t.Errorf("second blacklisting: %v, want 45s", d)
		}
		// A slot of a: its own cooldown, from a's failures.
		if d := m.blacklistSlot("a"); d != 25*s {
			t.Errorf("slot cooldown %v, want 25s", d)
		}
		if got := m.available(); !slices.Equal(got, []Host{{"a", 1}}) {
			t.Errorf("available = %v, want a:1", got)
		}
		clock.advance(25 * s)
		back, freed := m.expire()
		if back != nil || !maps.Equal(freed, map[string]int{"a": 1}) {
			t.Errorf("expire = %v, %v; want a's slot freed", back, freed)
		}
		if got := m.available(); !slices.Equal(got, []Host{{"a", 2}}) {
			t.Errorf("available = %v, want a:2", got)
		}
		clock.advance(20 * s)
		if back, _ := m.expire(); !slices.Equal(back, []string{"b"}) {
			t.Errorf("expire = %v, want b back after 45s", back)
		}
		if m.recoverable() {
			t.Error("recoverable with nothing blacklisted")
		}
	})

	t.Run("host blacklisting clears its slots", func(t *testing.T) {
		m, clock := newTestManager(CooldownRange{s, s})
		m.setDiscovered([]Host{{"a", 2}})
		m.blacklistSlot("a")
		m.blacklistHost("a")
		clock.advance(s)
		m.expire()
		if got := m.available(); !slices.Equal(got, []Host{{"a", 2}}) {
			t.Errorf("available = %v, want a:2", got)
		}
	})
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
