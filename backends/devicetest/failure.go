package devicetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/tensor"
)

// testClose: engines close cleanly when idle; every later call fails with
// backends.ErrClosed, and Close and Abort again return nil.
func testClose(t *testing.T, newGroup Factory) {
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			w := newWorld(t, newGroup, n)
			usable(t, w, "before Close")
			for k, x := range w.ranks {
				if err := x.e.Close(); err != nil {
					t.Errorf("rank %d: Close: %v", k, err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), failTimeout)
			defer cancel()
			for k, x := range w.ranks {
				p := x.buf(t, &x.send, 4096)
				if err := x.e.Allreduce(x.s, p, p, 4, tensor.Float32, tensor.Sum); !errors.Is(err, backends.ErrClosed) {
					t.Errorf("rank %d: Allreduce after Close returned %v, want an error wrapping backends.ErrClosed", k, err)
				}
				if err := x.e.Wait(ctx, x.s); !errors.Is(err, backends.ErrClosed) {
					t.Errorf("rank %d: Wait after Close returned %v, want an error wrapping backends.ErrClosed", k, err)
				}
				if err := x.e.Close(); err != nil {
					t.Errorf("rank %d: a second Close returned %v", k, err)
				}
				if err := x.e.Abort(); err != nil {
					t.Errorf("rank %d: Abort after Close returned %v", k, err)
				}
			}
		})
	}
}

// testFailure checks that a Wait blocked on a collective the peers never
// join returns, with the right error, on each way out.
func testFailure(t *testing.T, newGroup Factory, opts Options) {
	// end ends rank 0's blocked Wait from another goroutine.
	ends := []struct {
		name string
		end  func(t *testing.T, w *world)
		// want is what the Wait's error wraps (nil: any error but a
		// context's).
		want error
	}{
		{"Abort", func(t *testing.T, w *world) { w.ranks[0].e.Abort() }, backends.ErrAborted},
		{"Close", func(t *testing.T, w *world) { w.ranks[0].e.Close() }, backends.ErrClosed},
		{"AbortAndCloseAtOnce", func(t *testing.T, w *world) {
			// Every way at once, from several goroutines.
			var wg sync.WaitGroup
			for _, x := range w.ranks {
				wg.Go(func() { x.e.Abort() })
				wg.Go(func() { x.e.Close() })
			}
			wg.Wait()
		}, nil},
		{"PeerAbort", func(t *testing.T, w *world) { w.ranks[w.n()-1].e.Abort() }, nil},
		{"AsyncError", func(t *testing.T, w *world) { opts.InjectAsyncError(t, w.ranks[0].e) }, nil},
	}
	for _, c := range ends {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "AsyncError" && opts.InjectAsyncError == nil {
				t.Skip("no way to inject an asynchronous error (Options.InjectAsyncError)")
			}
			for _, n := range []int{2, 3} {
				t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
					w := newWorld(t, newGroup, n)
					x := w.ranks[0]
					lone(t, x)
					done := waitAsync(x, opTimeout)
					select {
					case r := <-done:
						t.Fatalf("Wait on a collective no peer joined returned %v before the failure", r.err)
					case <-time.After(50 * time.Millisecond):
					}
					at := time.Now()
					c.end(t, w)
					var err error
					select {
					case r := <-done:
						err = r.err
						if d := r.at.Sub(at); d > failTimeout {
							t.Errorf("Wait took %v to return", d)
						}
					case <-time.After(failTimeout):
						t.Fatalf("Wait still blocked %v after the failure (%s)", failTimeout, c.name)
					}
					switch {
					case err == nil:
						t.Fatalf("Wait returned nil after the failure (%s)", c.name)
					case c.want != nil && !errors.Is(err, c.want):
						t.Errorf("Wait returned %v, want an error wrapping %v", err, c.want)
					case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
						t.Errorf("Wait returned its context's error %v: the failure went unnoticed", err)
					}
					afterFailure(t, x)
				})
			}
		})
	}
	t.Run("Cancel", func(t *testing.T) {
		w := newWorld(t, newGroup, 2)
		x := w.ranks[0]
		lone(t, x)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := x.e.Wait(ctx, x.s)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait with an expiring context returned %v, want an error wrapping context.DeadlineExceeded", err)
		}
		if d := time.Since(start); d > failTimeout {
			t.Errorf("Wait took %v to give up", d)
		}
		afterFailure(t, x)
	})
}

// lone enqueues on x an allreduce that no other rank joins.
func lone(t *testing.T, x *rank) {
	t.Helper()
	p := x.buf(t, &x.send, 4096)
	if err := x.e.Allreduce(x.s, p, p, 1024, tensor.Float32, tensor.Sum); err != nil {
		t.Fatalf("rank %d: Allreduce: %v", x.e.Rank(), err)
	}
}

type waited struct {
	err error
	at  time.Time
}

// waitAsync runs x's Wait (bounded by d) on a goroutine of its own.
func waitAsync(x *rank, d time.Duration) <-chan waited {
	done := make(chan waited, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		err := x.e.Wait(ctx, x.s)
		done <- waited{err, time.Now()}
	}()
	return done
}

// afterFailure checks that x stays ended: calls fail with ErrAborted or
// ErrClosed, Abort and Close return nil.
func afterFailure(t *testing.T, x *rank) {
	t.Helper()
	p := x.buf(t, &x.send, 4096)
	err := x.e.Allreduce(x.s, p, p, 4, tensor.Float32, tensor.Sum)
	if !errors.Is(err, backends.ErrAborted) && !errors.Is(err, backends.ErrClosed) {
		t.Errorf("Allreduce after the failure returned %v, want an error wrapping backends.ErrAborted or ErrClosed", err)
	}
	if err := x.e.Abort(); err != nil {
		t.Errorf("Abort after the failure returned %v", err)
	}
	if err := x.e.Close(); err != nil {
		t.Errorf("Close after the failure returned %v", err)
	}
}
