package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/backends/mpi"
	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/rendezvous"
	"github.com/hvdd/hvdd/tensor"
)

func TestOnlineCPUs(t *testing.T) {
	for _, c := range []struct {
		list string
		want int
	}{
		{"0\n", 1},
		{"0-1\n", 2},
		{"0-3,8,10-11", 7},
		{"", 0},
		{"3-1", 0},
		{"a-b", 0},
	} {
		if got := onlineCPUs(c.list); got != c.want {
			t.Errorf("onlineCPUs(%q) = %d, want %d", c.list, got, c.want)
		}
	}
}

// TestBoundWarning: only a daemon bound to one CPU of several is warned,
// and the warning says what to do.
func TestBoundWarning(t *testing.T) {
	for _, c := range []struct {
		allowed, online int
		warn            bool
	}{
		{1, 2, true},
		{1, 64, true},
		{1, 1, false},
		{2, 2, false},
		{8, 64, false}, // a cpuset or --bind-to socket: deliberate
		{1, 0, false},  // online CPUs unknown
	} {
		w := boundWarning(c.allowed, c.online)
		if (w != "") != c.warn {
			t.Errorf("boundWarning(%d, %d) = %q, want a warning: %v", c.allowed, c.online, w, c.warn)
		}
		if w != "" && !strings.Contains(w, "--bind-to none") {
			t.Errorf("the warning does not say what to do: %q", w)
		}
	}
}

func TestResolveControl(t *testing.T) {
	for _, c := range []struct {
		control, backend, rendezvous string
		want, err                    string
	}{
		{"auto", "mpi", "", "mpi", ""},               // a bare mpirun: MPI is all the daemons share
		{"auto", "mpi", "10.0.0.1:29500", "tcp", ""}, // hvdd run --backend mpi gives a rendezvous
		{"auto", "tcp", "10.0.0.1:29500", "tcp", ""},
		{"auto", "tcp", "", "tcp", ""}, // the daemon then asks for --rendezvous
		{"tcp", "mpi", "", "tcp", ""},
		{"mpi", "mpi", "10.0.0.1:29500", "mpi", ""},
		{"mpi", "tcp", "", "", "needs --backend mpi"},
		{"udp", "mpi", "", "", `unknown --control "udp"`},
	} {
		got, err := resolveControl(c.control, c.backend, c.rendezvous)
		if got != c.want || (err == nil) != (c.err == "") || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("resolveControl(%q, %q, %q) = %q, %v; want %q, error %q", c.control, c.backend, c.rendezvous, got, err, c.want, c.err)
		}
	}
}

// TestWithoutMPI: a build without the mpi tag refuses --backend mpi and
// --control mpi with what to do about it.
func TestWithoutMPI(t *testing.T) {
	if mpi.Available() {
		t.Skip("built with MPI (-tags mpi)")
	}
	_, err := backendFactory("mpi", tcpSettings{streams: 8})
	if want := "--backend mpi: this hvdd was built without MPI; rebuild with `go build -tags mpi ./cmd/hvdd` (needs libopenmpi-dev)"; err == nil || err.Error() != want {
		t.Errorf("backendFactory(mpi) = %v, want %q", err, want)
	}
	_, err = mpiControl(0, 2)
	if want := "this hvdd was built without MPI; rebuild with `go build -tags mpi ./cmd/hvdd`"; err == nil || err.Error() != want {
		t.Errorf("mpiControl = %v, want %q", err, want)
	}
}

// TestWireCompressionFactory builds two nodes' tcp engines through
// backendFactory, as two daemons would: with the same --wire-compression a
// float32 sum crosses in 16 bits (half the bytes), with different ones the
// nodes refuse each other and say how to fix it; the MPI engine refuses to
// compress.
func TestWireCompressionFactory(t *testing.T) {
	_, err := backendFactory("mpi", tcpSettings{streams: 8, compression: backends.CompressFP16})
	if err == nil || !strings.Contains(err.Error(), "--wire-compression fp16 needs --backend tcp") {
		t.Errorf("backendFactory(mpi, fp16) = %v, want a refusal naming --backend tcp", err)
	}
	start := func(c0, c1 backends.Compression) ([]backends.Backend, []error) {
		store := rendezvous.NewMemory()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		bs, errs := make([]backends.Backend, 2), make([]error, 2)
		var wg sync.WaitGroup
		for r, c := range []backends.Compression{c0, c1} {
			f, err := backendFactory("tcp", tcpSettings{streams: 2, compression: c})
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				bs[r], errs[r] = f(ctx, daemon.MultiNodeJob{ID: "job", NodeRank: r, Nodes: 2, Slots: []int{1, 1},
					Store: store, Host: "127.0.0.1", Secret: []byte("0123456789abcdef0123456789abcdef"),
					Logger: slog.New(slog.DiscardHandler)})
				if errs[r] != nil {
					cancel() // the other node would wait for this one
				}
			})
		}
		wg.Wait()
		t.Cleanup(func() {
			for _, b := range bs {
				if b != nil {
					b.Close()
				}
			}
		})
		return bs, errs
	}

	bs, errs := start(backends.CompressBF16, backends.CompressBF16)
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("same compression: %v, %v", errs[0], errs[1])
	}
	const size = 1 << 20
	var wg sync.WaitGroup
	for r, b := range bs {
		wg.Go(func() {
			buf := make([]byte, size)
			if err := b.Allreduce(context.Background(), buf, tensor.Float32, tensor.Sum); err != nil {
				t.Errorf("rank %d: %v", r, err)
			}
		})
	}
	wg.Wait()
	if sent := bs[0].(backends.StatsReporter).Stats().SentBytes[1]; sent > size/2+size/100 || sent < size/2 {
		t.Errorf("rank 0 sent %d bytes of a %d-byte allreduce over 2 nodes, want about %d (in bfloat16)", sent, size, size/2)
	}

	_, errs = start(backends.CompressFP16, backends.CompressNone)
	if err := errors.Join(errs...); err == nil || !strings.Contains(err.Error(), "give every node the same --wire-compression") {
		t.Errorf("different compressions: %v, want a refusal saying to give every node the same --wire-compression", err)
	}
}

// TestWireCompressionFlag: --wire-compression, else $HVDD_WIRE_COMPRESSION,
// parsed on every daemon, with an error that lists the choices.
func TestWireCompressionFlag(t *testing.T) {
	tests := []struct {
		argv []string
		env  string
		want backends.Compression
		err  string
	}{
		{nil, "", backends.CompressNone, ""},
		{[]string{"--wire-compression", "fp16"}, "", backends.CompressFP16, ""},
		{nil, "bf16", backends.CompressBF16, ""},
		{[]string{"--wire-compression", "none"}, "bf16", backends.CompressNone, ""},
		{[]string{"--wire-compression", "int8"}, "", 0, `--wire-compression: unknown wire compression "int8" (want none, fp16 or bf16)`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.argv, " ")+" env="+tt.env, func(t *testing.T) {
			t.Setenv("HVDD_WIRE_COMPRESSION", tt.env)
			args, err := parseServeArgs(append([]string{"--slots", "1"}, tt.argv...))
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = serveConfig(args)
			if (err == nil) != (tt.err == "") || err != nil && err.Error() != tt.err {
				t.Fatalf("serveConfig: %v, want %q", err, tt.err)
			}
			if err == nil {
				// serveConfig took args by value; parse as it did.
				got, _ := backends.ParseCompression(args.wireCompression)
				if got != tt.want {
					t.Errorf("compression %v, want %v", got, tt.want)
				}
			}
		})
	}
}
