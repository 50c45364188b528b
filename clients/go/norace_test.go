//go:build !race

package hvdd_test

const raceEnabled = false
