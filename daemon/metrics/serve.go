package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The endpoint is served with net/http and promhttp rather than the
// fasthttp the rendezvous uses: promhttp is net/http-native (content
// negotiation, gzip, OpenMetrics, errors), where fasthttp would need its
// adaptor, which builds a net/http request for every call anyway; at one
// request per scrape interval fasthttp's speed buys nothing, and its
// process-long goroutines would only complicate the leak checks.

// Addr resolves a --metrics-addr value: HOST:PORT binds as given (an
// explicit 0.0.0.0 or [::] binds every interface), while a bare ":PORT" or
// "PORT" binds loopback only (127.0.0.1), so that exposing the metrics
// beyond the node is always a deliberate choice.
func Addr(addr string) (string, error) {
	if _, err := strconv.ParseUint(addr, 10, 16); err == nil {
		return net.JoinHostPort("127.0.0.1", addr), nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("metrics address %q: want HOST:PORT, :PORT or PORT: %w", addr, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", fmt.Errorf("metrics address %q: port %q is not a number from 0 to 65535", addr, port)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// Listen binds the metrics endpoint's address (see Addr).
func Listen(addr string) (net.Listener, error) {
	a, err := Addr(addr)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", a)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w (pick another --metrics-addr port)", a, err)
	}
	return ln, nil
}

// Handler serves the metrics at /metrics in Prometheus's text format (or
// OpenMetrics, when the scraper asks for it), pruning the series of jobs
// that ended more than Retain ago first; / says where they are.
func (m *Metrics) Handler() http.Handler {
	prom := promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		// A collector that fails (the daemon's loop did not answer in
		// time) leaves out its own metrics, not the others.
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
		EnableOpenMetrics:   true,
		// The exposition is about 10 KB: gzip (which Prometheus asks
		// for) cost the daemon twice the CPU of the rest of a scrape
		// (BenchmarkScrape), to save a LAN a few kilobytes.
		DisableCompression: true,
	})
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		m.Prune()
		prom.ServeHTTP(w, r)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, "hvdd daemon: metrics at /metrics")
	})
	return mux
}

// Server is the metrics endpoint, serving on its own goroutine.
type Server struct {
	hs   *http.Server
	addr string
	done chan struct{}
	err  error
}

// Serve serves m's Handler on ln from a goroutine of its own until
// Shutdown; log (nil: slog's default) hears a failure to serve.
func (m *Metrics) Serve(ln net.Listener, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{
		hs: &http.Server{
			Handler:           m.Handler(),
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       2 * time.Minute,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
		addr: ln.Addr().String(),
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.err = err
			log.Error("metrics endpoint stopped", "addr", s.addr, "err", err)
		}
	}()
	return s
}

// Addr is the address the endpoint listens on.
func (s *Server) Addr() string { return s.addr }

// Shutdown stops the endpoint: no new scrape starts, and those in progress
// finish or are cut off when ctx is done. It returns the error that stopped
// the server early, if one did.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.hs.Shutdown(ctx)
	if err != nil {
		s.hs.Close()
	}
	<-s.done
	if s.err != nil {
		return s.err
	}
	return err
}
