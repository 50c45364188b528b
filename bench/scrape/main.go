// Command scrape fetches a Prometheus endpoint at a fixed interval, as a
// Prometheus server would, until SIGINT or SIGTERM; it then prints the
// scrapes made, the failures, and the median time of a scrape. It keeps one
// connection alive, so that its own cost on the machine is a scrape's, not
// a process start's (bench/metrics.sh runs it beside the daemon).
//
// Usage: go run ./bench/scrape [-every 100ms] URL
package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"
)

func main() {
	every := flag.Duration("every", 100*time.Millisecond, "time between the starts of two scrapes")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: scrape [-every 100ms] URL")
		os.Exit(2)
	}
	url := flag.Arg(0)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	t := time.NewTicker(*every)
	defer t.Stop()
	var took []time.Duration
	failed := 0
	for {
		select {
		case <-stop:
			slices.Sort(took)
			med := time.Duration(0)
			if len(took) > 0 {
				med = took[len(took)/2]
			}
			fmt.Printf("scrapes %d failed %d median %v\n", len(took), failed, med)
			return
		case <-t.C:
		}
		start := time.Now()
		resp, err := http.Get(url)
		if err != nil {
			failed++
			continue
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			failed++
			continue
		}
		took = append(took, time.Since(start))
	}
}
