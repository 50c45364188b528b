package tcp

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hvdd/hvdd/tensor"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/backends/backendtest"
	"github.com/hvdd/hvdd/rendezvous"
)

var quiet = slog.New(slog.DiscardHandler)

// testConfig is a rank's configuration on loopback with a shared store.
func testConfig(store Store, rank, size int) Config {
	return Config{
		Rank: rank, Size: size, Store: store, Prefix: "test/job",
		ListenAddr: "127.0.0.1:0", Secret: []byte("s3cret"), Logger: quiet,
	}
}

// group starts size ranks, each configured by testConfig and then tweak.
func group(t testing.TB, size int, tweak func(c *Config)) []*Backend {
	t.Helper()
	store := rendezvous.NewMemory()
	g := backendtest.NewGroup(t, size, func(ctx context.Context, r int) (backends.Backend, error) {
		c := testConfig(store, r, size)
		if tweak != nil {
			tweak(&c)
		}
		return New(ctx, c)
	})
	out := make([]*Backend, size)
	for i, b := range g {
		out[i] = b.(*Backend)
	}
	return out
}

func suite(tweak func(c *Config)) func(t *testing.T, size int) []backends.Backend {
	return func(t *testing.T, size int) []backends.Backend {
		g := group(t, size, tweak)
		out := make([]backends.Backend, size)
		for i, b := range g {
			out[i] = b
		}
		return out
	}
}

// TestConformance runs the suite with small segments and a low small-message
// threshold, so that most counts take the pipelined rings with many segments
// and several channels.
func TestConformance(t *testing.T) {
	t.Parallel()
	backendtest.Run(t, suite(func(c *Config) {
		c.ChunkBytes = 4 << 10
		c.SmallBytes = 512
		c.Streams = 3
	}))
}

// TestConformanceDefaults runs it with the default settings.
func TestConformanceDefaults(t *testing.T) {
	t.Parallel()
	if testing.Short() || raceEnabled {
		t.Skip("covered by TestConformance in -short mode and under the race detector")
	}
	backendtest.Run(t, suite(nil))
}

// TestConformanceDistinctAddrs puts every rank on its own loopback address,
// as on separate hosts, with one data stream per peer.
func TestConformanceDistinctAddrs(t *testing.T) {
	t.Parallel()
	if testing.Short() || raceEnabled {
		t.Skip("long; TestDistinctAddrs covers the addressing in -short mode and under the race detector")
	}
	backendtest.Run(t, suite(func(c *Config) {
		c.ListenAddr = fmt.Sprintf("127.0.0.%d:0", c.Rank+2)
		c.Streams = 1
		c.ChunkBytes = 64 << 10
	}))
}

// TestDistinctAddrs runs a few collectives with every rank on its own
// loopback address, as on separate hosts.
func TestDistinctAddrs(t *testing.T) {
	g := group(t, 3, func(c *Config) { c.ListenAddr = fmt.Sprintf("127.0.0.%d:0", c.Rank+2) })
	ctx := context.Background()
	var wg sync.WaitGroup
	for k, b := range g {
		if want := fmt.Sprintf("127.0.0.%d:", k+2); !strings.HasPrefix(b.Addr(), want) {
			t.Errorf("rank %d advertises %s", k, b.Addr())
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1<<20)
			for i := range buf {
				buf[i] = byte(k)
			}
			if err := b.Allreduce(ctx, buf, tensor.Uint8, tensor.Sum); err != nil {
				t.Error(err)
				return
			}
			if buf[0] != 3 || buf[len(buf)-1] != 3 {
				t.Errorf("rank %d: sum %d, want 3", k, buf[0])
			}
			if err := b.Barrier(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
}

// TestSetTuning changes the streams, segment and small-message threshold
// between collectives on every rank (what the daemon's autotuner does at a
// plan boundary) and checks the collectives that follow against a
// reference, each setting forcing another algorithm or dealing.
func TestSetTuning(t *testing.T) {
	const size = 3
	g := group(t, size, func(c *Config) { c.Streams = 4 })
	if got := g[0].MaxStreams(); got != 4 {
		t.Fatalf("MaxStreams %d, want the 4 connections opened", got)
	}
	if got, want := g[0].Tuning(), (backends.Tuning{Streams: 4, ChunkBytes: DefaultChunkBytes, SmallBytes: DefaultSmallBytes}); got != want {
		t.Fatalf("initial tuning %+v, want Config's %+v", got, want)
	}
	// A refused change names the field and changes nothing.
	for _, bad := range []backends.Tuning{{Streams: 5}, {Streams: -1}, {ChunkBytes: 10}} {
		if err := g[0].SetTuning(bad); err == nil {
			t.Errorf("SetTuning(%+v) accepted", bad)
		}
	}
	if got := g[0].Tuning().Streams; got != 4 {
		t.Fatalf("streams %d after refused changes, want 4", got)
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	tunings := []backends.Tuning{
		{Streams: 1, ChunkBytes: 4 << 10, SmallBytes: 512},
		{Streams: 3, ChunkBytes: 1 << 10, SmallBytes: -1},
		{SmallBytes: 1 << 20}, // only the threshold: the others stay
		{Streams: 4, ChunkBytes: 64 << 10, SmallBytes: 64},
	}
	small := DefaultSmallBytes // the threshold the test set
	for _, tu := range tunings {
		if tu.SmallBytes != 0 {
			small = tu.SmallBytes
		}
		for _, b := range g {
			if err := b.SetTuning(tu); err != nil {
				t.Fatal(err)
			}
		}
		if tu.Streams == 0 && g[1].Tuning().Streams != 3 {
			t.Fatalf("a zero field changed streams to %d", g[1].Tuning().Streams)
		}
		count := 100003 // odd: uneven channels, blocks and segments
		in := make([][]byte, size)
		for r := range in {
			in[r] = backendtest.Fill(rng, tensor.Float32, tensor.Sum, count)
		}
		want := backendtest.Reduce(in, tensor.Float32, tensor.Sum)
		gathered := slices.Concat(in...)
		var sent [size]int64 // rank's bytes sent by its allreduce
		var wg sync.WaitGroup
		for r, b := range g {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := slices.Clone(in[r])
				before := b.Stats().SentBytes
				if err := b.Allreduce(ctx, buf, tensor.Float32, tensor.Sum); err != nil {
					t.Error(err)
					return
				}
				for p, n := range b.Stats().SentBytes {
					sent[r] += n - before[p]
				}
				if !bytes.Equal(buf, want) {
					t.Errorf("tuning %+v: rank %d: allreduce differs from the reference", tu, r)
				}
				out := make([]byte, len(gathered))
				counts := []int{len(in[0]), len(in[1]), len(in[2])}
				if err := b.Allgatherv(ctx, in[r], out, counts); err != nil {
					t.Error(err)
					return
				}
				if !bytes.Equal(out, gathered) {
					t.Errorf("tuning %+v: rank %d: allgather differs", tu, r)
				}
			}()
		}
		wg.Wait()
		// The threshold chose the algorithm: the ring sends 2(n-1)/n of
		// the buffer from every rank, recursive doubling (3 ranks: a pair
		// and an extra rank) something else.
		ring := float64(len(want)) * 2 * (size - 1) / size
		for r, n := range sent {
			isRing := math.Abs(float64(n)-ring) < 0.01*ring
			if wantRing := len(want) > small; isRing != wantRing {
				t.Errorf("tuning %+v: rank %d sent %d bytes for %d; ring (%v) expected: %v", tu, r, n, len(want), ring, wantRing)
			}
		}
	}
}
