//go:build !race

package hvdd_test

import (
	"testing"
	"time"
)

// TestMultiNodeWide runs the scenarios on 4 nodes x 2 ranks of the tcp
// engine. It is left out of the race-detector build: there, eight ranks
// checking every dtype on two vCPUs take longer than a scenario's minute.
// scripts/test.sh runs it in the build without the race detector.
func TestMultiNodeWide(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node suite is long")
	}
	slots := []int{2, 2, 2, 2}
	ss := startNodes(t, slots...)
	for _, scenario := range []string{"collectives", "errors", "join", "async"} {
		for _, node := range spawnNodes(t, ss, scenario, slots...) {
			for _, w := range node {
				if err := w.Wait(180 * time.Second); err != nil {
					t.Errorf("%s: rank %d: %v\n%s", scenario, w.Rank, err, w.Output())
				}
			}
		}
	}
}
