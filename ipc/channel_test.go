package ipc

import (
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/shm"
)

// channelPair maps one region twice, as the client and the daemon do.
func channelPair(t testing.TB, ring int) (client, daemon *Channel, mem []byte) {
	t.Helper()
	r, err := shm.Create("channel-test", int64(ChannelBytes(ring)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	r2, err := shm.Open(dupFD(t, r.FD()), r.Size())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r2.Close() })
	if client, err = NewChannel(r.Bytes(), ClientSide); err != nil {
		t.Fatal(err)
	}
	if daemon, err = NewChannel(r2.Bytes(), DaemonSide); err != nil {
		t.Fatal(err)
	}
	return client, daemon, r2.Bytes()
}

func dupFD(t testing.TB, fd int) int {
	t.Helper()
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return nfd
}

// send encodes m and publishes it, as the clients and the daemon do.
func send(ch *Channel, kind uint8, id uint32, m proto.Message) (bool, error) {
	b, err := ch.Encode(kind, id, m)
	if err != nil {
		return false, err
	}
	return ch.SendFrame(b)
}

func enqueue(name string) *ipcpb.ClientMessage {
	return &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Enqueue{Enqueue: &ipcpb.Enqueue{Name: name}}}
}

// TestChannelOrderAndWrap sends many more frames than the ring holds from one
// goroutine while another reads them, both ways, and checks each arrives once,
// in order, intact, across the ring's wrap-around.
func TestChannelOrderAndWrap(t *testing.T) {
	client, daemon, _ := channelPair(t, 4096)
	const n = 5000
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < n; i++ {
			m := enqueue(fmt.Sprintf("t%d.%s", i, strings.Repeat("y", i%300)))
			for {
				ok, err := send(client, KindClient, uint32(i), m)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					break
				}
			}
		}
	}()
	for i := 0; i < n; {
		daemon.Snapshot()
		for {
			f, ok, err := daemon.Next()
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			id, m, err := DecodeClient(f)
			if err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("t%d.%s", i, strings.Repeat("y", i%300))
			if id != uint32(i) || m.GetEnqueue().GetName() != want {
				t.Fatalf("frame %d: got id %d name %.20q", i, id, m.GetEnqueue().GetName())
			}
			i++
		}
	}
	wg.Wait()
	if !client.Empty() || daemon.Pending() {
		t.Fatal("channel not empty after every frame was read")
	}
	// The other direction, through the same region.
	done := &ipcpb.ServerMessage{Msg: &ipcpb.ServerMessage_Done{Done: &ipcpb.Done{}}}
	if ok, err := send(daemon, KindServer, 7, done); !ok || err != nil {
		t.Fatalf("send: %v %v", ok, err)
	}
	client.Snapshot()
	f, ok, err := client.Next()
	if !ok || err != nil || f.Kind != KindServer || f.ID != 7 {
		t.Fatalf("daemon->client frame: %+v %v %v", f, ok, err)
	}
}

// TestChannelFullAndTooBig: a full ring refuses a frame without writing any of
// it; a frame over MaxFrame is refused whatever the room.
func TestChannelFullAndTooBig(t *testing.T) {
	client, daemon, _ := channelPair(t, 4096)
	if ok, _ := send(client, KindClient, 1, enqueue(strings.Repeat("z", client.MaxFrame()))); ok {
		t.Fatal("a frame over MaxFrame was sent through the ring")
	}
	sent := 0
	for {
		ok, err := send(client, KindClient, uint32(sent), enqueue("fill"))
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		sent++
	}
	if client.Room(30) || client.Empty() {
		t.Fatal("full ring reports room")
	}
	daemon.Snapshot()
	got := 0
	for {
		_, ok, err := daemon.Next()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		got++
	}
	if got != sent || !client.Empty() {
		t.Fatalf("sent %d frames, read %d (empty %v)", sent, got, client.Empty())
	}
}

// TestChannelSocketCount: the receiver learns, after the ring's head, how many
// socket frames were sent before it.
func TestChannelSocketCount(t *testing.T) {
	client, daemon, _ := channelPair(t, 4096)
	client.SocketSent(2)
	send(client, KindClient, 1, enqueue("after"))
	if got := daemon.Snapshot(); got != 2 {
		t.Fatalf("socket count %d, want 2", got)
	}
	if !daemon.Pending() {
		t.Fatal("ring frame not pending")
	}
	// Asleep flags are seen by the other side only.
	daemon.SetAsleep(true)
	if !client.PeerAsleep() || daemon.PeerAsleep() {
		t.Fatal("asleep flag on the wrong side")
	}
}

// TestChannelCorruption: a peer that moves counters where they cannot be, or
// publishes bytes that are not frames, gets a protocol error, never a panic or
// a read outside the ring.
func TestChannelCorruption(t *testing.T) {
	put := func(mem []byte, off int, v uint64) { binary.LittleEndian.PutUint64(mem[off:], v) }
	cases := []struct {
		name string
		fn   func(mem []byte)
		want string
	}{
		{"head past the ring", func(m []byte) { put(m, 0, 1<<20) }, "head"},
		{"head backwards", func(m []byte) { put(m, 0, ^uint64(0)) }, "head"},
		{"short header", func(m []byte) { put(m, 0, 5) }, "less than a frame header"},
		{"bad magic", func(m []byte) { copy(m[ChannelHeader:], "XX\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00"); put(m, 0, 12) }, "magic"},
		{"body past head", func(m []byte) {
			copy(m[ChannelHeader:], "HV\x01\x00\x00\x00\x00\x00\x40\x00\x00\x00")
			put(m, 0, 20)
		}, "runs past"},
		{"oversized body", func(m []byte) {
			copy(m[ChannelHeader:], "HV\x01\x00\x00\x00\x00\x00\xff\xff\xff\x7f")
			put(m, 0, 4096)
		}, "exceeds"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, daemon, mem := channelPair(t, 4096)
			tc.fn(mem)
			daemon.Snapshot()
			_, _, err := daemon.Next()
			if !IsProtocol(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a protocol error mentioning %q", err, tc.want)
			}
		})
	}
	// The daemon writes the daemon->client ring; a client that moves its tail
	// beyond the daemon's head makes Send fail, not overwrite unread frames.
	_, daemon, mem := channelPair(t, 4096)
	put(mem, 192, 1<<40)
	if _, err := send(daemon, KindServer, 1, &ipcpb.ServerMessage{Msg: &ipcpb.ServerMessage_Done{Done: &ipcpb.Done{}}}); !IsProtocol(err) {
		t.Fatalf("send with a corrupt tail: %v", err)
	}
}

func TestChannelGeometry(t *testing.T) {
	for _, n := range []int{0, 100, ChannelHeader, ChannelBytes(1000), ChannelBytes(2048), ChannelBytes(32 << 20)} {
		if _, err := NewChannel(make([]byte, n), DaemonSide); err == nil {
			t.Errorf("%d-byte region accepted", n)
		}
	}
}

// FuzzChannel writes arbitrary bytes and counters into the daemon's view of a
// client's ring: Next must return frames that decode or protocol errors, and
// never read outside the ring or panic.
func FuzzChannel(f *testing.F) {
	hello, _ := proto.Marshal(enqueue("w"))
	f.Add(uint64(12+len(hello)), frameBytes(KindClient, 0, 1, hello))
	f.Add(uint64(12), frameBytes(KindWake, 0, 0, nil))
	f.Add(uint64(4095), []byte("HV\x01"))
	f.Add(uint64(1<<63), []byte{})
	f.Fuzz(func(t *testing.T, head uint64, ring []byte) {
		_, daemon, mem := channelPair(t, 4096)
		copy(mem[ChannelHeader:ChannelHeader+4096], ring)
		binary.LittleEndian.PutUint64(mem[0:], head)
		daemon.Snapshot()
		for i := 0; i < 1000; i++ {
			f, ok, err := daemon.Next()
			if err != nil {
				if !IsProtocol(err) {
					t.Fatalf("non-protocol error %v", err)
				}
				return
			}
			if !ok {
				return
			}
			if f.Kind == KindClient {
				DecodeClient(f)
			}
		}
	})
}
