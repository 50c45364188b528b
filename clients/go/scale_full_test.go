//go:build !race

package hvdd_test

import "testing"

// TestScaleNetns8Full runs every collective scenario on 8 namespaced nodes
// of one rank (TestScaleNetns4's list) and `hvdd bench --check` of every
// collective up to 4 MiB. It is left out of the race-detector build, where
// eight ranks checking every dtype on two vCPUs take minutes;
// scripts/test.sh runs it in the build without the race detector, with the
// other eight-node tests.
func TestScaleNetns8Full(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node suite is long")
	}
	c := startNetnsCluster(t, 8, 1)
	for _, scenario := range []string{"collectives", "errors", "join", "async"} {
		c.run(t, scenario)
	}
	c.run(t, "setsmulti", "HVDD_TEST_NODE0=1")
	c.benchCheck(t, "4M")
}
