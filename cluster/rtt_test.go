package cluster

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/hvdd/hvdd/cluster/clusterpb"
)

// readHeartbeat reads frames from the raw end until a heartbeat, and
// returns it with the time it was read.
func readHeartbeat(t *testing.T, raw net.Conn) (*clusterpb.Heartbeat, time.Time) {
	t.Helper()
	raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		var n [4]byte
		if _, err := io.ReadFull(raw, n[:]); err != nil {
			t.Fatalf("reading the link's frames: %v", err)
		}
		b := make([]byte, binary.BigEndian.Uint32(n[:]))
		if _, err := io.ReadFull(raw, b); err != nil {
			t.Fatalf("reading the link's frames: %v", err)
		}
		var m clusterpb.Message
		if err := proto.Unmarshal(b, &m); err != nil {
			t.Fatalf("undecodable frame from the link: %v", err)
		}
		if hb := m.GetHeartbeat(); hb != nil {
			return hb, time.Now()
		}
	}
}

// beat sends the link's next heartbeat, as its ticker would (the tests'
// links tick once an hour, so that no heartbeat queues up unread).
func beat(t *testing.T, l *Link) {
	t.Helper()
	if err := l.Send(&clusterpb.Message{Msg: &clusterpb.Message_Heartbeat{Heartbeat: l.nextHeartbeat(time.Now())}}); err != nil {
		t.Fatal(err)
	}
}

// sendHeartbeat writes hb to the link from the raw end and has the link
// read it, as the daemon's loop does when the descriptor is readable.
func sendHeartbeat(t *testing.T, l *Link, raw net.Conn, hb *clusterpb.Heartbeat) {
	t.Helper()
	if _, err := raw.Write(frame(t, &clusterpb.Message{Msg: &clusterpb.Message_Heartbeat{Heartbeat: hb}})); err != nil {
		t.Fatal(err)
	}
	waitReadable(t, l)
	if m, err := l.TryRecv(); m != nil || err != nil {
		t.Fatalf("a heartbeat came out of TryRecv: %v %v", m, err)
	}
}

// TestRTTEcho plays the peer by hand: the round trip is the time from the
// link's heartbeat to the echo's arrival less what the peer says it held
// it, and the link echoes the peer's clock with its own holding time.
func TestRTTEcho(t *testing.T) {
	l, raw := rawPair(t, Config{Secret: secret, Heartbeat: time.Hour, PeerTimeout: time.Minute})
	beat(t, l)
	hb, _ := readHeartbeat(t, raw)
	if hb.GetSent() <= 0 || hb.GetEcho() != 0 {
		t.Fatalf("first heartbeat %v: want a clock and no echo (nothing received yet)", hb)
	}
	if l.RTT() != 0 {
		t.Fatalf("RTT before any echo = %v, want 0", l.RTT())
	}

	// Held 200 ms but echoed as held 0: the round trip includes the hold.
	const hold = 200 * time.Millisecond
	beat(t, l)
	hb, _ = readHeartbeat(t, raw)
	time.Sleep(hold) // the peer's holding time under test, not a wait for an event
	sendHeartbeat(t, l, raw, &clusterpb.Heartbeat{Echo: hb.GetSent()})
	if rtt := l.RTT(); rtt < hold {
		t.Fatalf("echo held %v and reported as 0: RTT = %v, want at least %v", hold, rtt, hold)
	}

	// Held 200 ms and reported so: the round trip leaves the hold out.
	beat(t, l)
	hb, at := readHeartbeat(t, raw)
	time.Sleep(hold)
	sendHeartbeat(t, l, raw, &clusterpb.Heartbeat{Echo: hb.GetSent(), Held: int64(time.Since(at))})
	if rtt := l.RTT(); rtt <= 0 || rtt >= hold/2 {
		t.Fatalf("echo held %v and reported so: RTT = %v, want more than 0 and well under the hold", hold, rtt)
	}

	// The link echoes the peer's clock, with how long it held it.
	sent := time.Now()
	sendHeartbeat(t, l, raw, &clusterpb.Heartbeat{Sent: 777})
	beat(t, l)
	hb, at = readHeartbeat(t, raw)
	if hb.GetEcho() != 777 {
		t.Fatalf("link echoed %d, want the 777 we sent", hb.GetEcho())
	}
	if held := time.Duration(hb.GetHeld()); held <= 0 || held > at.Sub(sent) {
		t.Fatalf("link held our heartbeat %v, but it came back %v after we sent it", held, at.Sub(sent))
	}
}

// TestRTTOldPeer: a peer whose heartbeats are empty (a daemon from before
// the round-trip fields) keeps the link alive and is not measured.
func TestRTTOldPeer(t *testing.T) {
	l, raw := rawPair(t, Config{Secret: secret, Heartbeat: time.Hour, PeerTimeout: time.Minute})
	for range 3 {
		sendHeartbeat(t, l, raw, &clusterpb.Heartbeat{})
		beat(t, l)
		if hb, _ := readHeartbeat(t, raw); hb.GetEcho() != 0 {
			t.Fatalf("link echoed %d from a peer that sent no clock", hb.GetEcho())
		}
	}
	if rtt := l.RTT(); rtt != 0 {
		t.Fatalf("RTT with an old peer = %v, want 0 (not measured)", rtt)
	}
	if err := l.Silent(time.Now()); err != nil {
		t.Fatalf("empty heartbeats did not keep the link alive: %v", err)
	}
}

// TestRTTBetweenLinks: two real links measure each other's round trip
// while their readers run.
func TestRTTBetweenLinks(t *testing.T) {
	d, a, derr, aerr := pair(t, Config{Secret: secret, Heartbeat: 10 * time.Millisecond, PeerTimeout: 5 * time.Second}, secret)
	if derr != nil || aerr != nil {
		t.Fatal(derr, aerr)
	}
	errc := make(chan error, 2)
	for _, l := range []*Link{d, a} {
		go func() {
			_, err := l.Recv() // returns when the link is closed
			errc <- err
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for d.RTT() == 0 || a.RTT() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no round trip measured within 10 s: dialer %v, listener %v", d.RTT(), a.RTT())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, l := range []*Link{d, a} {
		if rtt := l.RTT(); rtt > 5*time.Second {
			t.Errorf("loopback RTT %v is absurd", rtt)
		}
	}
	d.Close()
	a.Close()
	for range 2 {
		if err := <-errc; err == nil {
			t.Error("Recv returned no error after Close")
		}
	}
}
