package ipc

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// FuzzReadClient feeds arbitrary bytes to the daemon-side decoder: it must
// return messages or an error, never panic or hang, and every decoded frame
// must re-encode within the size limit.
func FuzzReadClient(f *testing.F) {
	hello, _ := proto.Marshal(&ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Hello{Hello: &ipcpb.Hello{Version: 1, Pid: 7}}})
	enq, _ := proto.Marshal(&ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Enqueue{Enqueue: &ipcpb.Enqueue{
		Name: "w", Op: ipcpb.OpType_OP_ALLREDUCE, Dtype: ipcpb.DType_DTYPE_FLOAT32, Shape: []int64{2, 3},
		Buffer: &ipcpb.Buffer{Region: 1, Offset: 64, Length: 24}, Splits: []int32{1, 2}}}})
	for _, body := range [][]byte{hello, enq, nil, {0xff}} {
		f.Add(frameBytes(KindClient, 0, 5, body))
	}
	f.Add([]byte("HV\x01\x00\x00\x00\x00\x00\xff\xff\xff\xff"))
	f.Add(append(frameBytes(KindClient, 0, 1, hello), frameBytes(KindClient, 0, 2, enq)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := socketPair(t)
		go func() {
			a.Write(data)
			a.Close()
		}()
		c := mustConn(t, b)
		defer c.Close()
		for i := 0; i < 64; i++ {
			_, m, err := c.ReadClient(context.Background())
			if err != nil {
				if !errors.Is(err, ErrClosed) && !IsProtocol(err) {
					t.Fatalf("unexpected error kind: %v", err)
				}
				return
			}
			if m.Msg == nil {
				t.Fatal("decoded a message with no content")
			}
			if out, err := proto.Marshal(m); err != nil || len(out) > MaxBody {
				t.Fatalf("re-encode: %d bytes, %v", len(out), err)
			}
		}
	})
}

func mustConn(t testing.TB, uc *net.UnixConn) *Conn {
	t.Helper()
	c, err := NewConn(uc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func frameBytes(kind, flags byte, id uint32, body []byte) []byte {
	b := []byte{'H', 'V', kind, flags, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.LittleEndian.PutUint32(b[4:], id)
	binary.LittleEndian.PutUint32(b[8:], uint32(len(body)))
	return append(b, body...)
}

func socketPair(t testing.TB) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	dir := t.TempDir()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: dir + "/s", Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.DialUnix("unix", nil, ln.Addr().(*net.UnixAddr))
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// TestRoundTrip sends messages with and without descriptors both ways.
func TestRoundTrip(t *testing.T) {
	a, b := socketPair(t)
	ca, cb := mustConn(t, a), mustConn(t, b)
	for i := uint32(1); i <= 100; i++ {
		m := &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Enqueue{Enqueue: &ipcpb.Enqueue{Name: "t", Shape: []int64{int64(i)}}}}
		if err := ca.WriteClient(i, m, -1); err != nil {
			t.Fatal(err)
		}
		id, got, err := cb.ReadClient(context.Background())
		if err != nil || id != i || got.GetEnqueue().GetShape()[0] != int64(i) {
			t.Fatalf("frame %d: got id %d %v %v", i, id, got, err)
		}
	}
	// A large body crosses several reads.
	big := &ipcpb.ServerMessage{Msg: &ipcpb.ServerMessage_Done{Done: &ipcpb.Done{OutputShape: make([]int64, 200000)}}}
	go cb.WriteServer(9, big, -1)
	id, got, err := ca.ReadServer(context.Background())
	if err != nil || id != 9 || len(got.GetDone().GetOutputShape()) != 200000 {
		t.Fatalf("big frame: %d %v", id, err)
	}
	// Too big to send.
	huge := &ipcpb.ServerMessage{Msg: &ipcpb.ServerMessage_Done{Done: &ipcpb.Done{Error: string(make([]byte, MaxBody+1))}}}
	if err := cb.WriteServer(1, huge, -1); err == nil {
		t.Fatal("oversized message was sent")
	}
}
