//go:build !race

package hvdd_test

import "testing"

// TestMultiNodeWide runs the scenarios on 4 nodes x 2 ranks of the tcp
// engine. It is left out of the race-detector build: there, eight ranks
// checking every dtype on two vCPUs take longer than a scenario's minute.
// scripts/test.sh runs it in the build without the race detector.
func TestMultiNodeWide(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node suite is long")
	}
	runScenarios(t, 2, 2, 2, 2)
}
