package mpi

import (
	"testing"
	"time"
)

func TestPacer(t *testing.T) {
	const ms = time.Millisecond
	type step struct {
		at  time.Duration // when
		msg bool          // a message arrived (else: check hot)
		hot bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"idle from the start", []step{{at: 0, hot: false}, {at: time.Hour, hot: false}}},
		{"a lone message restarts the doubling, no hot window", []step{
			{at: time.Second, msg: true},
			{at: time.Second + ms, hot: false},
		}},
		{"two messages within the window: hot until a window after the second", []step{
			{at: time.Second, msg: true},
			{at: time.Second + 5*ms, msg: true},
			{at: time.Second + 6*ms, hot: true},
			{at: time.Second + 24*ms, hot: true},
			{at: time.Second + 25*ms, hot: false},
		}},
		{"heartbeats a second apart never go hot", []step{
			{at: time.Second, msg: true}, {at: time.Second + ms, hot: false},
			{at: 2 * time.Second, msg: true}, {at: 2*time.Second + ms, hot: false},
			{at: 3 * time.Second, msg: true}, {at: 3*time.Second + ms, hot: false},
		}},
		{"a conversation stays hot while messages keep coming", []step{
			{at: 0, msg: true}, {at: ms, msg: true},
			{at: 15 * ms, hot: true},
			{at: 19 * ms, msg: true},
			{at: 38 * ms, hot: true},
			{at: 39 * ms, hot: false},
		}},
		{"messages 20 ms apart or more stay idle", []step{
			{at: 0, msg: true}, {at: 20 * ms, msg: true}, {at: 21 * ms, hot: false},
			{at: 45 * ms, msg: true}, {at: 46 * ms, hot: false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pacer{window: 20 * ms}
			t0 := time.Unix(1000, 0)
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				switch {
				case s.msg:
					p.wait = 3 * ms // as if idle for a while
					p.message(now)
					if p.wait != 0 {
						t.Fatalf("step %d: a message left the wait at %v; want the doubling restarted", i, p.wait)
					}
				default:
					if got := p.hot(now); got != s.hot {
						t.Fatalf("step %d (at %v): hot %v, want %v", i, s.at, got, s.hot)
					}
				}
			}
		})
	}
	p := pacer{window: 20 * ms, wait: 5 * ms}
	p.sent()
	if p.wait != 0 {
		t.Fatalf("a send left the wait at %v; want the doubling restarted", p.wait)
	}
}
