package main

import (
	"context"
	"time"

	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/daemon/metrics"
)

// startMetrics serves the daemon's Prometheus metrics on addr
// (--metrics-addr; metrics.Addr says how it binds) and sets cfg.Metrics;
// with addr empty it does nothing. The returned func stops the endpoint.
func startMetrics(cfg *daemon.Config, addr string) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := metrics.Listen(addr)
	if err != nil {
		return nil, err
	}
	m := metrics.New(metrics.Options{Version: daemon.Version})
	srv := m.Serve(ln, cfg.Logger)
	cfg.Metrics = m
	cfg.Logger.Info("serving metrics", "url", "http://"+srv.Addr()+"/metrics")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}, nil
}
