package nodes

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hvdd/hvdd/cluster"
	"github.com/hvdd/hvdd/cluster/clusterpb"
	"github.com/hvdd/hvdd/daemon/internal/poll"
	"github.com/hvdd/hvdd/rendezvous"
)

var electionSecret = []byte("election-test-secret-0123456789")

// TestElasticWaitWinner: a claimant that lost round 0's claim reads the
// round's outcome from the store, whatever the other claimants did before
// they were lost, and never waits for a key that only a lost node could
// write. Each case is the store as the other claimants left it; the
// claimant under test then waits (a peer timeout), seals, and decides.
func TestElasticWaitWinner(t *testing.T) {
	key := electionKey(1, 0)
	const winner = "2 127.0.0.4:1" // node 2's record, at an address nobody serves
	tests := []struct {
		name string
		// before is what the other claimants did, in order: a key with a
		// value is a Set, without one an Add of 1.
		before [][2]string
		// want is the record returned (the winner to dial), "" for a void
		// round (nil, nil).
		want string
	}{
		{"the winner published", [][2]string{{key + "/claim", ""}, {key + "/addr", winner}, {key + "/seal", ""}, {key, winner}}, winner},
		{"the winner withdrew", [][2]string{{key + "/claim", ""}, {key + "/addr", winner}, {key + "/seal", ""}, {key, "\x00"}}, ""},
		{"the winner was lost before it named itself", [][2]string{{key + "/claim", ""}}, ""},
		{"the winner was lost before it sealed", [][2]string{{key + "/claim", ""}, {key + "/addr", winner}}, ""},
		// The seal is the winner's: it publishes, or it is lost and the dial
		// says so; its record is there, written before it sealed.
		{"the winner sealed and was lost before publishing", [][2]string{{key + "/claim", ""}, {key + "/addr", winner}, {key + "/seal", ""}}, winner},
		// The seal is another claimant's, which voided the round and was
		// lost before it said so: the winner never named itself.
		{"a claimant voided the round and was lost", [][2]string{{key + "/claim", ""}, {key + "/seal", ""}}, ""},
		// Another claimant voided the round, and the winner, which named
		// itself first, found it void: dialling it tells (it may coordinate
		// a later round, or refuse as moved).
		{"a claimant voided the round, the winner lives", [][2]string{{key + "/claim", ""}, {key + "/addr", winner}, {key + "/seal", ""}, {key + "/seal", ""}}, winner},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			store := rendezvous.NewMemory()
			for _, kv := range tc.before {
				var err error
				switch {
				case kv[1] == "\x00":
					err = store.Set(ctx, kv[0], nil)
				case kv[1] != "":
					err = store.Set(ctx, kv[0], []byte(kv[1]))
				default:
					_, err = store.Add(ctx, kv[0], 1)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if _, err := store.Add(ctx, key+"/claim", 1); err != nil { // this claimant lost the claim
				t.Fatal(err)
			}
			c := &multiNode{store: store, log: slog.New(slog.DiscardHandler), ccfg: cluster.Config{PeerTimeout: 20 * time.Millisecond}}
			kv, err := c.waitWinner(ctx, key)
			if err != nil {
				t.Fatalf("waitWinner: %v", err)
			}
			switch got, ok := kv[key]; {
			case tc.want == "" && kv != nil && ok && len(got) > 0:
				t.Errorf("waitWinner = %q, want a void round", got)
			case tc.want != "" && string(got) != tc.want:
				t.Errorf("waitWinner = %q (void: %v), want the winner's record %q", got, kv == nil, tc.want)
			}
		})
	}
}

// TestElasticJoinAfterLoopClosed: a node dials this node's control
// listener as its daemon stops, and its Join arrives after the loop has
// closed (the poller drops the message that would hand the link over). The
// link must close: left open, its heartbeats keep it alive on the dialling
// node, which then follows a coordinator that is gone and never hears so.
func TestElasticJoinAfterLoopClosed(t *testing.T) {
	cfg := cluster.Config{Secret: electionSecret, Heartbeat: 10 * time.Millisecond, PeerTimeout: 200 * time.Millisecond}.WithDefaults()
	ln, err := cluster.Listen("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	p, err := poll.NewPoller()
	if err != nil {
		t.Fatal(err)
	}
	c := &multiNode{p: p, log: slog.New(slog.DiscardHandler), ccfg: cfg, ctrl: ln}
	c.life, c.endLife = context.WithCancel(context.Background())
	go c.accept()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	link, err := cluster.Dial(ctx, ln.Addr(), cfg, "node 1")
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	// The daemon stops: the loop closes the formation, then its poller.
	c.Close()
	p.Close()
	if err := link.Send(&clusterpb.Message{Msg: &clusterpb.Message_Join{Join: &clusterpb.Join{NodeRank: 1, Epoch: 1, Elastic: true, Announce: true}}}); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := link.Recv()
		got <- err
	}()
	select {
	case err := <-got:
		if err == nil || strings.Contains(err.Error(), "silent") {
			t.Errorf("Recv = %v, want the link closed by the stopped daemon", err)
		}
	case <-time.After(20 * cfg.PeerTimeout):
		t.Fatalf("the link to a stopped daemon is still open after %v (its heartbeats keep it alive): the Join it took after its loop closed left it open", 20*cfg.PeerTimeout)
	}
}

// TestElasticDialInRefusedAsMoved: a node that dials this node to join the
// next epoch, while this node follows another coordinator, is refused as
// moved, so that it claims the next round, which leads it to the
// coordinator, rather than giving the epoch up.
func TestElasticDialInRefusedAsMoved(t *testing.T) {
	cfg := cluster.Config{Secret: electionSecret}.WithDefaults()
	ln, err := cluster.Listen("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	accepted := make(chan *cluster.Link, 1)
	go func() {
		link, _, err := ln.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- link
	}()
	dialer, err := cluster.Dial(ctx, ln.Addr(), cfg, "node 1")
	if err != nil {
		t.Fatal(err)
	}
	defer dialer.Close()
	in := <-accepted
	if in == nil {
		return
	}
	c := &multiNode{rank: 2, lead: 3, log: slog.New(slog.DiscardHandler),
		next: &nextEpoch{epoch: 1, prev: []int{0, 1, 2, 3}, links: map[int]*cluster.Link{}, won: -1}}
	c.epochDialIn(nodeJoin{link: in, join: &clusterpb.Join{NodeRank: 1, Epoch: 1, Elastic: true, Announce: true}})
	m, err := dialer.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if a := m.GetAbort(); a == nil || !a.GetMoved() {
		t.Errorf("the dial-in got %v, want an Abort with moved set", m)
	}
}
