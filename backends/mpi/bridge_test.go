//go:build mpi

package mpi

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"
)

// TestMPIBridge: every rank but 0 opens a stream to rank 0 and sends a
// message larger than a bridge chunk, starting with its bridge's secret;
// rank 0 checks that it starts with its own (every bridge has the one rank 0
// made), echoes each stream back and closes it; the senders read their bytes
// back, then EOF.
func TestMPIBridge(t *testing.T) {
	if !underMPI() {
		out := mpirun(t, job{np: 3, run: "^TestMPIBridge$"})
		checkRanks(t, out, 3)
		return
	}
	br, err := NewBridge()
	if err != nil {
		t.Fatal(err)
	}
	if len(br.Secret()) != 32 || bytes.Equal(br.Secret(), make([]byte, 32)) {
		t.Fatalf("secret %x: want 32 random bytes", br.Secret())
	}
	payload := func(r int) []byte {
		hello := bytes.Repeat([]byte(fmt.Sprintf("rank %d says hello; ", r)), 20000) // ~400 KB
		return append(bytes.Clone(br.Secret()), hello...)
	}
	if br.Rank() == 0 {
		var wg sync.WaitGroup
		for i := 1; i < br.Size(); i++ {
			c, peer, err := br.Accept()
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := io.ReadAll(io.LimitReader(c, int64(len(payload(peer)))))
				if err != nil || !bytes.Equal(got, payload(peer)) {
					t.Errorf("from rank %d: %d bytes, %v", peer, len(got), err)
				}
				c.Write(got)
				c.Close()
			}()
		}
		wg.Wait()
	} else {
		c, err := br.Dial(context.Background(), 0)
		if err != nil {
			t.Fatal(err)
		}
		go c.Write(payload(br.Rank()))
		got, err := io.ReadAll(c) // the echo, then EOF when rank 0 closes
		if err != nil || !bytes.Equal(got, payload(br.Rank())) {
			t.Errorf("echo: %d bytes, %v", len(got), err)
		}
		c.Close()
	}
	if _, err := br.Dial(context.Background(), br.Rank()); err == nil {
		t.Error("dialled ourselves")
	}
	// Every rank is done with its streams before any closes its bridge.
	b, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	br.Close()
	b.Close()
	Finalize()
	if !t.Failed() {
		markOK(b, "bridge")
	}
}

// TestNextWait: the receiver's idle waits double from the least to the cap,
// and a lower cap takes effect at once.
func TestNextWait(t *testing.T) {
	const us = time.Microsecond
	minW, maxW := 20*us, 5*time.Millisecond
	var got []time.Duration
	w := time.Duration(0)
	for range 11 {
		w = nextWait(w, minW, maxW)
		got = append(got, w)
	}
	want := []time.Duration{20 * us, 40 * us, 80 * us, 160 * us, 320 * us, 640 * us, 1280 * us, 2560 * us, 5000 * us, 5000 * us, 5000 * us}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("waits %v, want %v", got, want)
	}
	if w := nextWait(50*time.Millisecond, minW, maxW); w != maxW {
		t.Fatalf("after a 50 ms wait with a 5 ms cap: %v, want %v", w, maxW)
	}
	if w := nextWait(1<<62, minW, 50*time.Millisecond); w != 50*time.Millisecond {
		t.Fatalf("a huge wait: %v, want the cap", w)
	}
}
