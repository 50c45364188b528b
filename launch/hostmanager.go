package launch

import (
	"maps"
	"math"
	"slices"
	"time"
)

// The elastic driver's view of the hosts, Horovod's HostManager and
// HostState (horovod/runner/elastic/discovery.py): what discovery found,
// which hosts are blacklisted and until when, and the order in
// which hosts get ranks. It is pure: no I/O, and the clock and the
// randomness of the cooldown are injected.

// CooldownRange is horovodrun's --blacklist-cooldown-range: how long a
// blacklisted host stays out of an elastic job. The n-th
// blacklisting of a host lasts Min·2^n plus a random fraction of Min, kept
// within [Min, Max] (Horovod's HostState). The zero value means no
// cooldown: a blacklisted host never returns.
type CooldownRange struct {
	Min, Max time.Duration
}

// Horovod's bounds on --blacklist-cooldown-range (DEFAULT_COOLDOWN_LOWER_LIMIT_SECONDS
// and DEFAULT_COOLDOWN_UPPER_LIMIT_SECONDS).
const (
	CooldownLowerLimit = time.Second
	CooldownUpperLimit = time.Hour
)

// set reports whether r is a range (blacklisted hosts return).
func (r CooldownRange) set() bool { return r.Max > 0 }

// delay is the cooldown of the failures-th blacklisting (1 for the first),
// with u drawn uniformly from [0, 1).
func (r CooldownRange) delay(failures int, u float64) time.Duration {
	lo, hi := float64(r.Min), float64(r.Max)
	d := math.Ldexp(lo, min(failures, 1000)) + u*lo
	return time.Duration(max(lo, min(hi, d)))
}

// hostState is what the driver knows of one host besides its slots.
type hostState struct {
	// failures counts the host's blacklistings that started a cooldown;
	// each one doubles the next.
	failures    int
	blacklisted bool
	until       time.Time // blacklisted: when its cooldown ends; zero: never
}

// hostManager tracks the hosts of an elastic job. The zero value is not
// usable; see newHostManager.
type hostManager struct {
	cooldown CooldownRange
	now      func() time.Time
	rand     func() float64 // uniform in [0, 1)

	discovered []Host   // discovery's last answer, in its order
	order      []string // the hosts available at the last call of available, oldest first
	states     map[string]*hostState
}

func newHostManager(cooldown CooldownRange, now func() time.Time, rand func() float64) *hostManager {
	return &hostManager{cooldown: cooldown, now: now, rand: rand, states: map[string]*hostState{}}
}

func (m *hostManager) state(host string) *hostState {
	s := m.states[host]
	if s == nil {
		s = &hostState{}
		m.states[host] = s
	}
	return s
}

// setDiscovered records what discovery found.
func (m *hostManager) setDiscovered(hosts []Host) {
	m.discovered = append(m.discovered[:0:0], hosts...)
}

// slots returns the slots discovery last gave host (0 if it is not listed).
func (m *hostManager) slots(host string) int {
	for _, h := range m.discovered {
		if h.Name == host {
			return h.Slots
		}
	}
	return 0
}

// blacklistHost blacklists host (a rank of it failed, or its daemon died)
// and returns how long it stays out: zero means for good (no cooldown
// range). A host still in its cooldown keeps it, as Horovod's
// HostState.blacklist does.
func (m *hostManager) blacklistHost(host string) time.Duration {
	s := m.state(host)
	now := m.now()
	if s.blacklisted && s.until.After(now) {
		return s.until.Sub(now)
	}
	s.blacklisted, s.until = true, time.Time{}
	if !m.cooldown.set() {
		return 0
	}
	s.failures++
	d := m.cooldown.delay(s.failures, m.rand())
	s.until = now.Add(d)
	return d
}

// isBlacklisted reports whether host is blacklisted.
func (m *hostManager) isBlacklisted(host string) bool {
	s := m.states[host]
	return s != nil && s.blacklisted
}

// expire ends the cooldowns that are over and returns the hosts back from
// the blacklist (Horovod's whitelist), in name order.
func (m *hostManager) expire() (back []string) {
	now := m.now()
	for _, h := range slices.Sorted(maps.Keys(m.states)) {
		s := m.states[h]
		if s.blacklisted && !s.until.IsZero() && !s.until.After(now) {
			s.blacklisted, s.until = false, time.Time{}
			back = append(back, h)
		}
	}
	return back
}

// usable returns host's slots that ranks may use: discovered and not
// blacklisted.
func (m *hostManager) usable(h Host) int {
	if m.isBlacklisted(h.Name) {
		return 0
	}
	return h.Slots
}

// available returns the hosts ranks may run on now, with their usable
// slots, in Horovod's assignment order: the hosts available last time in
// their order (the oldest first), then the others in discovery's order. A
// host that was left out (blacklisted, not discovered, or without a usable
// slot) and comes back therefore comes last.
func (m *hostManager) available() []Host {
	usable := map[string]int{}
	for _, h := range m.discovered {
		if n := m.usable(h); n > 0 {
			usable[h.Name] = n
		}
	}
	var order []string
	for _, h := range m.order {
		if usable[h] > 0 {
			order = append(order, h)
		}
	}
	for _, h := range m.discovered {
		if usable[h.Name] > 0 && !slices.Contains(order, h.Name) {
			order = append(order, h.Name)
		}
	}
	m.order = order
	hosts := make([]Host, len(order))
	for i, h := range order {
		hosts[i] = Host{Name: h, Slots: usable[h]}
	}
	return hosts
}

// allBlacklisted reports whether discovery lists hosts with slots and every
// one of them is blacklisted: the job has nowhere left to run.
func (m *hostManager) allBlacklisted() bool {
	some := false
	for _, h := range m.discovered {
		if h.Slots == 0 {
			continue
		}
		if m.usable(h) > 0 {
			return false
		}
		some = true
	}
	return some
}

// recoverable reports whether some host is blacklisted for a cooldown, so
// that it will come back.
func (m *hostManager) recoverable() bool {
	for _, s := range m.states {
		if s.blacklisted && !s.until.IsZero() {
			return true
		}
	}
	return false
}

// assign returns how many ranks each host runs next, as Horovod's
// get_host_assignments does with the driver's rule that running ranks go
// on: every host keeps its running ranks (up to its usable slots), then
// free slots are filled host by host in assignment order (the oldest hosts
// first), up to maxNP ranks in all (0: no bound). hosts are available's;
// running counts each host's ranks that go on (and those about to start).
func assign(hosts []Host, running map[string]int, maxNP int) map[string]int {
	target := map[string]int{}
	total := 0
	for _, h := range hosts {
		if k := min(running[h.Name], h.Slots); k > 0 {
			target[h.Name] = k
			total += k
		}
	}
	for _, h := range hosts {
		add := h.Slots - target[h.Name]
		if maxNP > 0 {
			add = min(add, maxNP-total)
		}
		if add > 0 {
			target[h.Name] += add
			total += add
		}
	}
	return target
}

// slotInfo is where a rank sits in an assignment: Horovod's SlotInfo.
type slotInfo struct {
	rank, size, local, localSize, cross, crossSize int
}

// slotInfos lays an assignment out as Horovod does: ranks host-major in
// the hosts' order, with local and cross ranks. It returns every host's
// slots, by local rank.
func slotInfos(hosts []Host, target map[string]int) map[string][]slotInfo {
	var nodes []node
	size := 0
	for _, h := range hosts {
		if n := target[h.Name]; n > 0 {
			nodes = append(nodes, node{Host: h.Name, Slots: n, Offset: size})
			size += n
		}
	}
	infos := map[string][]slotInfo{}
	for i, n := range nodes {
		for lr := range n.Slots {
			cr, cs := crossRank(nodes, i, lr)
			infos[n.Host] = append(infos[n.Host], slotInfo{n.Offset + lr, size, lr, n.Slots, cr, cs})
		}
	}
	return infos
}
