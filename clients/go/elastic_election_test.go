package hvdd_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/rendezvous"
)

// heldSet holds the first Set of one key at the rendezvous (through
// rendezvous.ServerConfig.Intercept) until drop, and then fails it
// unapplied: the Set of a node that was lost with it in flight.
type heldSet struct {
	key   string
	once  sync.Once
	held  chan []byte // the value, once the Set is held
	drop  chan struct{}
	close sync.Once
}

func holdSet(key string) *heldSet {
	return &heldSet{key: key, held: make(chan []byte, 1), drop: make(chan struct{})}
}

func (h *heldSet) intercept(op, key string, value []byte) error {
	if op != "set" || key != h.key {
		return nil
	}
	first := false
	h.once.Do(func() { first = true })
	if !first {
		return nil
	}
	h.held <- bytes.Clone(value)
	<-h.drop
	return fmt.Errorf("the test dropped it: %w", rendezvous.ErrClosed)
}

// release lets the held Set fail; it is idempotent.
func (h *heldSet) release() { h.close.Do(func() { close(h.drop) }) }

// TestElasticCoordinatorWinnerLostBeforePublishing (issue 31, item 2): node
// 0, the coordinator, is lost; nodes 1 and 2 claim the coordination of the
// next epoch, and the winner is lost after it sealed its win and before its
// publication reached the rendezvous (the test holds that Set, stops the
// winner's daemon, and drops it). The other node, which waited for the
// publication for a peer timeout and found the round sealed, must not wait
// on for a publication only the lost winner could make: it finds the
// winner gone, claims the next round, and forms the epoch alone.
func TestElasticCoordinatorWinnerLostBeforePublishing(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node suite is long")
	}
	hold := holdSet("elastic/1/0")
	ss := startNodesCfg(t, func(n int, c *daemon.Config) {
		c.Elastic, c.ExternalRendezvous = true, true
		if n == 0 {
			srv, err := rendezvous.NewServer(rendezvous.ServerConfig{Addr: c.Rendezvous, Secret: testSecret, Intercept: hold.intercept})
			if err != nil {
				t.Fatal(err)
			}
			go srv.Serve(context.Background())
			t.Cleanup(func() { srv.Close() })
		}
	}, 1, 1, 1)
	t.Cleanup(hold.release) // before the server closes: cleanups run last first
	ws := spawnNodesEnv(t, ss, "elastic", []string{"HVDD_TEST_VICTIM=0", "HVDD_TEST_ANY_RANK=1", "HVDD_TEST_VICTIM_HANGS=1", "HVDD_TEST_SIZE_AFTER=1"}, 1, 1, 1)
	ws[0][0].WaitOutput(t, "VICTIM HANGS", 60*time.Second)
	ss[0].Stop(t)
	ws[0][0].Cmd.Process.Kill()

	var winner int
	select {
	case v := <-hold.held:
		var addr string
		if _, err := fmt.Sscan(string(v), &winner, &addr); err != nil || winner < 1 || winner > 2 {
			t.Fatalf("the winner published %q, want \"NODE ADDR\" of node 1 or 2", v)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("no node published its win of epoch 1's first round within 60s")
	}
	ss[winner].Stop(t)
	ws[winner][0].Cmd.Process.Kill()
	hold.release()

	survivor := 3 - winner
	w := ws[survivor][0]
	if err := w.Wait(60 * time.Second); err != nil || !strings.Contains(w.Output(), "REFORMED rank 0 of 1\n") {
		t.Errorf("node %d's rank (node %d won and was lost): %v (want it re-formed alone)\n%s", survivor, winner, err, w.Output())
	}
	if logs := ss[survivor].Logs(); !strings.Contains(logs, "this node coordinates the job from now on") {
		t.Errorf("node %d did not take over the coordination:\n%s", survivor, logs)
	}
}
