package ipc

import (
	"testing"
	"time"
)

func TestAdaptSpin(t *testing.T) {
	const us = time.Microsecond
	tests := []struct {
		name             string
		cur, slept, want time.Duration
	}{
		{"short gap keeps base", 50 * us, 1 * us, 50 * us},
		{"gap past the window widens it", 50 * us, 80 * us, 105 * us},
		{"repeated gaps converge above the gap", 105 * us, 80 * us, 132*us + 500},
		{"capped", 400 * us, 450 * us, 500 * us},
		{"long sleep resets", 500 * us, 2 * time.Millisecond, 50 * us},
		{"idle resets", 300 * us, time.Hour, 50 * us},
	}
	for _, tc := range tests {
		if got := AdaptSpin(tc.cur, 50*us, tc.slept); got != tc.want {
			t.Errorf("%s: adaptSpin(%v, 50µs, %v) = %v, want %v", tc.name, tc.cur, tc.slept, got, tc.want)
		}
	}
}
