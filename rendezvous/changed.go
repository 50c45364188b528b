package rendezvous

// Changed returns a channel that is closed at the store's next change (a
// Set, an Add, or Close), for a process that serves the store and
// follows what its clients write without a Wait per key (hvdd run's
// elastic driver). Take the channel before reading what it guards: a change
// after the call closes it.
func (m *Memory) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}
