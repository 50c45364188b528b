package ipc

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/shm"
)

// The doorbell handshake across two processes, as the daemon and a client
// run it: the receiver raises its asleep flag, then looks at the ring; the
// sender publishes a frame, then looks at the flag. One of the two must see
// the other's write, or the receiver sleeps through a frame. Each side
// therefore needs its write ordered before its read (a store-load barrier).
// Under the race detector Go's atomic stores are release stores, and a load
// of memory that only the other process writes may pass them: the hang this
// test guards against showed up that way, in the race-enabled CI. With
// atomic stores in place of the exchanges, this test failed under -race in
// 4 runs of 4 here (1 to 45 rounds of a million missed); it needs two
// CPUs free to race at all.

// Offsets in the channel header's unused space where the two processes of
// the test meet each round.
const (
	litmusRound = 1024 // the receiver's round number
	litmusDone  = 1088 // the sender's round number << 1 | whether it saw the flag
)

const litmusEnv = "HVDD_IPC_LITMUS_SENDER"

// TestChannelHandshakeAcrossProcesses races the two halves of the handshake,
// round after round, with the sender in a child process.
func TestChannelHandshakeAcrossProcesses(t *testing.T) {
	rounds := 1000000
	if v := os.Getenv(litmusEnv); v != "" {
		litmusSender(t, v)
		return
	}
	size := ChannelBytes(minRingSize)
	r, err := shm.Create("handshake-test", int64(size))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	client, err := NewChannel(r.Bytes(), ClientSide)
	if err != nil {
		t.Fatal(err)
	}
	round := (*atomic.Uint64)(unsafe.Pointer(&r.Bytes()[litmusRound]))
	done := (*atomic.Uint64)(unsafe.Pointer(&r.Bytes()[litmusDone]))
	cmd := exec.Command(os.Args[0], "-test.run=^TestChannelHandshakeAcrossProcesses$")
	cmd.Env = append(os.Environ(), litmusEnv+"="+strconv.Itoa(rounds))
	cmd.ExtraFiles = []*os.File{os.NewFile(uintptr(dupFD(t, r.FD())), "channel")}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer func() { cmd.Process.Kill(); <-exited }()
	missed := 0
	sink := 0
	for i := uint64(1); i <= uint64(rounds); i++ {
		round.Store(i)
		// Shift the receiver's moment a little from round to round, so
		// that some rounds line it up with the sender's.
		for k := 0; k < int(i%64); k++ {
			sink += k
		}
		client.SetAsleep(true)
		pending := client.Pending()
		var d uint64
		for spins := 0; ; spins++ {
			if d = done.Load(); d>>1 == i {
				break
			}
			if spins&0xffff == 0xffff {
				select {
				case <-exited:
					t.Fatalf("the sender exited in round %d:\n%s", i, out.String())
				default:
				}
			}
		}
		if !pending && d&1 == 0 {
			missed++
		}
		client.Snapshot()
		if _, ok, err := client.Next(); !ok || err != nil {
			t.Fatalf("round %d: the frame did not arrive (%v)", i, err)
		}
		client.SetAsleep(false)
	}
	_ = sink
	if missed > 0 {
		t.Fatalf("in %d of %d rounds neither side saw the other's write: the receiver would sleep through a frame", missed, rounds)
	}
}

// litmusSender is the child process: it maps the channel (descriptor 3) and
// publishes one frame per round, reporting whether it saw the flag raised.
func litmusSender(t *testing.T, rounds string) {
	n, _ := strconv.Atoi(rounds)
	r, err := shm.Open(3, int64(ChannelBytes(minRingSize)))
	if err != nil {
		t.Fatal(err)
	}
	daemon, err := NewChannel(r.Bytes(), DaemonSide)
	if err != nil {
		t.Fatal(err)
	}
	round := (*atomic.Uint64)(unsafe.Pointer(&r.Bytes()[litmusRound]))
	done := (*atomic.Uint64)(unsafe.Pointer(&r.Bytes()[litmusDone]))
	// The frame is encoded once, so that a round costs only its publishing.
	frame, err := daemon.Encode(KindServer, 1, &ipcpb.ServerMessage{Msg: &ipcpb.ServerMessage_Done{Done: &ipcpb.Done{}}})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= uint64(n); i++ {
		for round.Load() != i {
		}
		if ok, err := daemon.SendFrame(frame); !ok || err != nil {
			t.Fatalf("round %d: publish: %v, %v", i, ok, err)
		}
		saw := uint64(0)
		if daemon.PeerAsleep() {
			saw = 1
		}
		done.Store(i<<1 | saw)
	}
}
