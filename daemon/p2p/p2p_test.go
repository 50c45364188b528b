package p2p

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/hvdd/hvdd/tensor"
)

type step struct {
	send bool
	key  Key
	desc Desc
	v    string
	// the match it must make ("" none), and an error it must contain
	match string
	err   string
}

func TestTable(t *testing.T) {
	k01 := Key{Src: 0, Dst: 1}
	k01t := Key{Src: 0, Dst: 1, Tag: 7}
	k10 := Key{Src: 1, Dst: 0}
	k01s := Key{Set: 2, Src: 0, Dst: 1}
	f4 := Desc{DType: tensor.Float32, Bytes: 4}
	f8 := Desc{DType: tensor.Float32, Bytes: 8}
	i4 := Desc{DType: tensor.Int32, Bytes: 4}
	cases := []struct {
		name  string
		steps []step
		left  int
	}{
		{"send then recv", []step{{send: true, key: k01, desc: f4, v: "s"}, {key: k01, desc: f4, v: "r", match: "s"}}, 0},
		{"recv then send", []step{{key: k01, desc: f4, v: "r"}, {send: true, key: k01, desc: f4, v: "s", match: "r"}}, 0},
		{"in order", []step{
			{send: true, key: k01, desc: f4, v: "s1"}, {send: true, key: k01, desc: f4, v: "s2"},
			{key: k01, desc: f4, v: "r1", match: "s1"}, {key: k01, desc: f4, v: "r2", match: "s2"},
		}, 0},
		{"tags apart", []step{
			{send: true, key: k01t, desc: f4, v: "s7"}, {send: true, key: k01, desc: f4, v: "s0"},
			{key: k01, desc: f4, v: "r0", match: "s0"}, {key: k01t, desc: f4, v: "r7", match: "s7"},
		}, 0},
		{"directions apart", []step{{send: true, key: k01, desc: f4, v: "s"}, {key: k10, desc: f4, v: "r"}}, 2},
		{"process sets apart", []step{{send: true, key: k01, desc: f4, v: "s"}, {key: k01s, desc: f4, v: "r"}}, 2},
		{"two recvs wait", []step{{key: k01, desc: f4, v: "r1"}, {key: k01, desc: f4, v: "r2"}, {send: true, key: k01, desc: f4, v: "s", match: "r1"}}, 1},
		{"sizes differ", []step{{send: true, key: k01, desc: f4, v: "s"}, {key: k01, desc: f8, v: "r", match: "s", err: "the send has 4 bytes, the recv 8"}}, 0},
		{"dtypes differ", []step{{send: true, key: k01, desc: f4, v: "s"}, {key: k01, desc: i4, v: "r", match: "s", err: "the send is of float32, the recv of int32"}}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tb := New[string]()
			for i, s := range c.steps {
				var p Pair[string]
				var ok bool
				if s.send {
					p, ok = tb.Send(s.key, s.desc, s.v)
				} else {
					p, ok = tb.Recv(s.key, s.desc, s.v)
				}
				if ok != (s.match != "") {
					t.Fatalf("step %d (%s): matched %v, want a match %q", i, s.v, ok, s.match)
				}
				if !ok {
					continue
				}
				other := p.Send.V
				if s.send {
					other = p.Recv.V
				}
				if other != s.match || p.Key != s.key {
					t.Fatalf("step %d (%s): matched %q on %v, want %q on %v", i, s.v, other, p.Key, s.match, s.key)
				}
				if s.err == "" && p.Err != nil || s.err != "" && (p.Err == nil || !strings.Contains(p.Err.Error(), s.err)) {
					t.Fatalf("step %d (%s): error %v, want one containing %q", i, s.v, p.Err, s.err)
				}
			}
			if tb.Len() != c.left {
				t.Fatalf("%d left, want %d", tb.Len(), c.left)
			}
			n := 0
			for _, q := range tb.Queues() {
				n += len(q.Ops)
				for _, v := range q.Ops {
					if q.Send != strings.HasPrefix(v, "s") {
						t.Fatalf("queue %v (send %v) holds %q", q.Key, q.Send, v)
					}
				}
			}
			if n != c.left {
				t.Fatalf("Queues holds %d, want %d", n, c.left)
			}
			if d := tb.Drain(); len(d) != c.left || tb.Len() != 0 {
				t.Fatalf("drained %v (left %d), want %d", d, tb.Len(), c.left)
			}
		})
	}
}

// TestQueues checks the waiting queues' order: by key, sends first, each
// queue oldest first.
func TestQueues(t *testing.T) {
	tb := New[string]()
	f4 := Desc{DType: tensor.Float32, Bytes: 4}
	tb.Recv(Key{Src: 1, Dst: 0}, f4, "r10")
	tb.Send(Key{Src: 0, Dst: 1, Tag: 2}, f4, "s2a")
	tb.Send(Key{Src: 0, Dst: 1, Tag: 2}, f4, "s2b")
	tb.Recv(Key{Src: 0, Dst: 1}, f4, "r01")
	tb.Send(Key{Set: 1, Src: 0, Dst: 1}, f4, "set")
	var got []string
	for _, q := range tb.Queues() {
		got = append(got, fmt.Sprintf("%v send=%v %v", q.Key, q.Send, q.Ops))
	}
	want := []string{
		"rank 0 to rank 1, tag 0 send=false [r01]",
		"rank 0 to rank 1, tag 2 send=true [s2a s2b]",
		"rank 1 to rank 0, tag 0 send=false [r10]",
		"rank 0 to rank 1, tag 0, process set 1 send=true [set]",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Queues:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestKeyString(t *testing.T) {
	if s := (Key{Set: 3, Src: 1, Dst: 2, Tag: 5}).String(); s != "rank 1 to rank 2, tag 5, process set 3" {
		t.Fatal(s)
	}
}

func TestNext(t *testing.T) {
	tb := New[string]()
	k01, k01t, k10 := Key{Src: 0, Dst: 1}, Key{Src: 0, Dst: 1, Tag: 3}, Key{Src: 1, Dst: 0}
	for i, c := range []struct {
		k    Key
		want int
	}{{k01, 0}, {k01, 1}, {k01t, 0}, {k10, 0}, {k01, 2}, {k01t, 1}} {
		if got := tb.Next(c.k); got != c.want {
			t.Fatalf("step %d: Next(%v) = %d, want %d", i, c.k, got, c.want)
		}
	}
	// Draining the waiting transfers (a failed job) keeps the numbers.
	tb.Drain()
	if got := tb.Next(k01); got != 3 {
		t.Fatalf("Next after Drain = %d, want 3", got)
	}
}
