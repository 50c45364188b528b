//go:build mpi

package mpi

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
)

// TestMPIBridge: every rank but 0 opens a stream to rank 0 and sends a
// message larger than a bridge chunk; rank 0 echoes each stream back and
// closes it; the senders read their bytes back, then EOF.
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
	payload := func(r int) []byte {
		return bytes.Repeat([]byte(fmt.Sprintf("rank %d says hello; ", r)), 20000) // ~400 KB
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
