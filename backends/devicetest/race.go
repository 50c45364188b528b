//go:build race

package devicetest

// raceEnabled trims the suite under the race detector, whose instrumented
// copies and reductions are an order of magnitude slower.
const raceEnabled = true
