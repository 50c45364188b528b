package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hvdd/hvdd/cluster/clusterpb"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

func pair(t *testing.T, cfg Config, dialSecret []byte) (*Link, *Link, error, error) {
	t.Helper()
	ln, err := Listen("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		l   *Link
		who string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		l, who, err := ln.Accept()
		ch <- res{l, who, err}
	}()
	dcfg := cfg
	dcfg.Secret = dialSecret
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, derr := Dial(ctx, ln.Addr(), dcfg, "node 1")
	r := <-ch
	if r.err == nil && r.who != "node 1" {
		t.Errorf("peer introduced itself as %q", r.who)
	}
	for _, l := range []*Link{d, r.l} {
		if l != nil {
			t.Cleanup(func() { l.Close() })
		}
	}
	return d, r.l, derr, r.err
}

func TestLinkExchange(t *testing.T) {
	d, a, derr, aerr := pair(t, Config{Secret: secret, Heartbeat: 20 * time.Millisecond, PeerTimeout: time.Second}, secret)
	if derr != nil || aerr != nil {
		t.Fatal(derr, aerr)
	}
	for i := 0; i < 10; i++ {
		if err := d.Send(&clusterpb.Message{Msg: &clusterpb.Message_Plan{Plan: &clusterpb.Plan{Seq: uint64(i)}}}); err != nil {
			t.Fatal(err)
		}
	}
	// Heartbeats flow both ways but Recv never returns them.
	for i := 0; i < 10; i++ {
		m, err := a.Recv()
		if err != nil || m.GetPlan().GetSeq() != uint64(i) {
			t.Fatalf("message %d: %v %v", i, m, err)
		}
	}
	d.Close()
	if _, err := a.Recv(); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("after the peer closed: %v", err)
	}
}

func TestLinkWrongSecret(t *testing.T) {
	_, _, derr, aerr := pair(t, Config{Secret: secret}, []byte("another secret of enough length"))
	if !errors.Is(aerr, ErrAuth) {
		t.Errorf("listener side: %v, want ErrAuth", aerr)
	}
	if derr == nil || !strings.Contains(derr.Error(), "secret") {
		t.Errorf("dialing side: %v, want an error about the secret", derr)
	}
}

func TestLinkSilentPeer(t *testing.T) {
	// The dialer's heartbeat is slower than the listener's timeout: the
	// listener must report the silence, not wait forever.
	cfg := Config{Secret: secret, Heartbeat: time.Hour, PeerTimeout: 200 * time.Millisecond}
	_, a, derr, aerr := pair(t, cfg, secret)
	if derr != nil || aerr != nil {
		t.Fatal(derr, aerr)
	}
	_, err := a.Recv()
	if err == nil || !strings.Contains(err.Error(), "silent") {
		t.Fatalf("want a silence error, got %v", err)
	}
}

func TestListenRefusesAllInterfaces(t *testing.T) {
	for _, addr := range []string{":0", "0.0.0.0:0", "[::]:0"} {
		if _, err := Listen(addr, Config{Secret: secret}); err == nil {
			t.Errorf("Listen(%q) bound every interface", addr)
		}
	}
	if _, err := Listen("127.0.0.1:0", Config{}); err == nil {
		t.Error("Listen without a secret succeeded")
	}
}
