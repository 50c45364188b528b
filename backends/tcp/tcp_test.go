package tcp

import (
	"context"
	"fmt"
	"github.com/hvdd/hvdd/tensor"
	"log/slog"
	"strings"
	"sync"
	"testing"

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
