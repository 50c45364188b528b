//go:build !race

package backendtest

const raceEnabled = false
