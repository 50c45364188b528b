// Command goclient times N 4-byte allreduces through the Go client, the
// baseline that bench/overhead.py subtracts from the Python client's time.
// It is its own module (see go.mod) so the main module's build ignores it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
)

func main() {
	n := flag.Int("n", 2000, "allreduces to time")
	warm := flag.Int("warmup", 200, "untimed allreduces first")
	flag.Parse()
	ctx := context.Background()
	c, err := hvdd.Init(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer c.Close()
	x := []float32{1}
	lat := make([]float64, 0, *n)
	for i := 0; i < *warm+*n; i++ {
		t0 := time.Now()
		if err := hvdd.Allreduce(ctx, c, x, hvdd.WithName("bench"), hvdd.WithOp(hvdd.Sum)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if i >= *warm {
			lat = append(lat, float64(time.Since(t0).Nanoseconds())/1e3)
		}
	}
	sort.Float64s(lat)
	if c.Rank() == 0 {
		fmt.Printf("go median_us=%.1f n=%d\n", lat[len(lat)/2], *n)
	}
}
