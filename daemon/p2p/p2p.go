// Package p2p is the pure core of hvdd's point-to-point transfers (torch's
// send and recv): it matches a rank's sends with another rank's recvs by
// (process set, sender, receiver, tag), in the order each side made them,
// and checks that the two sides agree. No I/O, no goroutines, no clock: the
// loop (daemon/internal/loop) moves the bytes and answers the ranks.
package p2p

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/hvdd/hvdd/tensor"
)

// Key is a transfer's channel: sends and recvs with the same key match in
// their order.
type Key struct {
	Set      int32 // the process set (0: every rank)
	Src, Dst int   // global ranks: the sender, the receiver
	Tag      int64
}

// String names the channel in errors.
func (k Key) String() string {
	s := fmt.Sprintf("rank %d to rank %d, tag %d", k.Src, k.Dst, k.Tag)
	if k.Set != 0 {
		s += fmt.Sprintf(", process set %d", k.Set)
	}
	return s
}

// Desc is what the two sides of a transfer must agree on.
type Desc struct {
	DType tensor.DType
	Bytes int
}

// Entry is one side of a transfer waiting in a Table.
type Entry[T any] struct {
	Desc Desc
	V    T
}

// Pair is a matched transfer: its send and its recv.
type Pair[T any] struct {
	Key        Key
	Send, Recv Entry[T]
	// Err says why the two cannot be one transfer (nil: they can).
	Err error
}

// Table holds the sends and recvs not matched yet.
type Table[T any] struct {
	sends map[Key][]Entry[T]
	recvs map[Key][]Entry[T]
	n     int
	seq   map[Key]int // Next's numbers
}

// New returns an empty table.
func New[T any]() *Table[T] {
	return &Table[T]{sends: map[Key][]Entry[T]{}, recvs: map[Key][]Entry[T]{}}
}

// Send adds a send: matched with the oldest recv waiting on k, if any.
func (t *Table[T]) Send(k Key, d Desc, v T) (Pair[T], bool) {
	e := Entry[T]{Desc: d, V: v}
	r, ok := t.add(t.sends, t.recvs, k, e)
	if !ok {
		return Pair[T]{}, false
	}
	return pair(k, e, r), true
}

// Recv adds a recv: matched with the oldest send waiting on k, if any.
func (t *Table[T]) Recv(k Key, d Desc, v T) (Pair[T], bool) {
	e := Entry[T]{Desc: d, V: v}
	s, ok := t.add(t.recvs, t.sends, k, e)
	if !ok {
		return Pair[T]{}, false
	}
	return pair(k, s, e), true
}

// add takes the oldest entry waiting on k in other (the other side's
// queue), or else queues e in mine: the matched entry and true, or false.
func (t *Table[T]) add(mine, other map[Key][]Entry[T], k Key, e Entry[T]) (Entry[T], bool) {
	if o, ok := t.take(other, k); ok {
		return o, true
	}
	t.put(mine, k, e)
	return Entry[T]{}, false
}

// Next numbers a rank's transfers on a channel k whose other side is on
// another node: it returns how many it numbered on k before (0 for the
// first). Each side numbers its own (the sender its sends, the receiver its
// recvs) in the order it made them, so the n-th send and the n-th recv of a
// channel get the same number on their two nodes: across nodes a transfer
// is negotiated by the name that number makes (loop/p2p.go).
func (t *Table[T]) Next(k Key) int {
	if t.seq == nil {
		t.seq = map[Key]int{}
	}
	n := t.seq[k]
	t.seq[k] = n + 1
	return n
}

// Len is how many sends and recvs wait.
func (t *Table[T]) Len() int { return t.n }

// Drain empties the table and returns what waited (a failed job answers it).
func (t *Table[T]) Drain() []T {
	var out []T
	for _, m := range []map[Key][]Entry[T]{t.sends, t.recvs} {
		for k, q := range m {
			for _, e := range q {
				out = append(out, e.V)
			}
			delete(m, k)
		}
	}
	t.n = 0
	return out
}

// Queue is a channel's waiting sends or recvs, oldest first.
type Queue[T any] struct {
	Key  Key
	Send bool // sends wait (else recvs)
	Ops  []T
}

// Queues returns every channel's waiting sends and recvs, ordered by key
// (sends before recvs), for status and stall reports.
func (t *Table[T]) Queues() []Queue[T] {
	var out []Queue[T]
	for send, m := range []map[Key][]Entry[T]{t.recvs, t.sends} {
		for k, q := range m {
			ops := make([]T, len(q))
			for i, e := range q {
				ops[i] = e.V
			}
			out = append(out, Queue[T]{Key: k, Send: send == 1, Ops: ops})
		}
	}
	slices.SortFunc(out, func(a, b Queue[T]) int {
		if c := cmp.Compare(a.Key.Set, b.Key.Set); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Key.Src, b.Key.Src); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Key.Dst, b.Key.Dst); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Key.Tag, b.Key.Tag); c != 0 {
			return c
		}
		if a.Send == b.Send {
			return 0
		}
		if a.Send {
			return -1
		}
		return 1
	})
	return out
}

func (t *Table[T]) take(m map[Key][]Entry[T], k Key) (Entry[T], bool) {
	q := m[k]
	if len(q) == 0 {
		return Entry[T]{}, false
	}
	e := q[0]
	var zero Entry[T]
	q[0] = zero
	if len(q) == 1 {
		delete(m, k)
	} else {
		m[k] = q[1:]
	}
	t.n--
	return e, true
}

func (t *Table[T]) put(m map[Key][]Entry[T], k Key, e Entry[T]) {
	m[k] = append(m[k], e)
	t.n++
}

func pair[T any](k Key, s, r Entry[T]) Pair[T] {
	p := Pair[T]{Key: k, Send: s, Recv: r}
	p.Err = Check(k, s.Desc, r.Desc)
	return p
}

// Check reports whether a send and a recv on k can be one transfer: the same
// dtype and byte length (torch's recv tensor must match the sent one).
func Check(k Key, s, r Desc) error {
	switch {
	case s.DType != r.DType:
		return fmt.Errorf("send/recv from %v: the send is of %v, the recv of %v (the two tensors must have the same dtype)", k, s.DType, r.DType)
	case s.Bytes != r.Bytes:
		return fmt.Errorf("send/recv from %v: the send has %d bytes, the recv %d (the two tensors must have the same size)", k, s.Bytes, r.Bytes)
	}
	return nil
}
