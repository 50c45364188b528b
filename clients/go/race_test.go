//go:build race

package hvdd_test

// raceEnabled is whether the race detector is on: a few multi-node tests
// too slow under it run in scripts/test.sh's stage without it instead.
const raceEnabled = true
