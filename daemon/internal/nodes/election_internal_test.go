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
)

var electionSecret = []byte("election-test-secret-0123456789")

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
