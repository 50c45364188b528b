package main

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hvdd/hvdd/daemon"
)

func TestParseServeArgs(t *testing.T) {
	tests := []struct {
		argv []string
		code int    // usageError's exit status; -1: no usageError
		err  string // other error text
	}{
		{argv: []string{"--slots", "2", "--nodes", "-1"}, code: -1},
		{argv: []string{"--help"}, code: 0},
		{argv: []string{"--no-such-flag"}, code: 2},
		{argv: []string{"--slots", "2", "extra"}, code: -1, err: `unexpected argument "extra" (see hvdd serve --help)`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.argv, " "), func(t *testing.T) {
			_, err := parseServeArgs(tt.argv)
			var usage usageError
			switch {
			case tt.code >= 0:
				if !errors.As(err, &usage) || usage.code != tt.code {
					t.Fatalf("parseServeArgs = %v, want exit status %d", err, tt.code)
				}
			case tt.err != "":
				if err == nil || err.Error() != tt.err {
					t.Fatalf("parseServeArgs = %v, want %q", err, tt.err)
				}
			case err != nil:
				t.Fatalf("parseServeArgs = %v", err)
			}
		})
	}
}

func TestParseGIDs(t *testing.T) {
	tests := []struct {
		list string
		want []uint32
		err  string
	}{
		{"", nil, ""},
		{"5", []uint32{5}, ""},
		{" 5, ,7 ", []uint32{5, 7}, ""},
		{"5,wheel", nil, `--allow-gid "wheel": want numeric group ids`},
		{"4294967296", nil, `--allow-gid "4294967296": want numeric group ids`},
	}
	for _, tt := range tests {
		got, err := parseGIDs(tt.list)
		if !slices.Equal(got, tt.want) || (err == nil) != (tt.err == "") || err != nil && err.Error() != tt.err {
			t.Errorf("parseGIDs(%q) = %v, %v; want %v, %q", tt.list, got, err, tt.want, tt.err)
		}
	}
}

// TestOverrideHorovodEnv: a flag given wins over the HOROVOD_* value
// already in the config; a flag left at its sentinel does not touch it.
func TestOverrideHorovodEnv(t *testing.T) {
	env := daemon.Config{FusionThreshold: 1 << 20, CycleTime: time.Millisecond, StallCheck: time.Minute, StallShutdown: time.Hour}
	unset := serveArgs{fusion: -2, cycle: -1, stallCheck: -2, stallShutdown: -1}
	tests := []struct {
		name string
		args func(a *serveArgs)
		want daemon.Config
	}{
		{"none given", func(*serveArgs) {}, env},
		{"fusion 0 disables", func(a *serveArgs) { a.fusion = 0 },
			daemon.Config{FusionThreshold: -1, CycleTime: time.Millisecond, StallCheck: time.Minute, StallShutdown: time.Hour}},
		{"all given", func(a *serveArgs) { a.fusion, a.cycle, a.stallCheck, a.stallShutdown = 64, 0, -1, 0 },
			daemon.Config{FusionThreshold: 64, CycleTime: 0, StallCheck: -1, StallShutdown: 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, args := env, unset
			tt.args(&args)
			overrideHorovodEnv(&cfg, args)
			if cfg.FusionThreshold != tt.want.FusionThreshold || cfg.CycleTime != tt.want.CycleTime ||
				cfg.StallCheck != tt.want.StallCheck || cfg.StallShutdown != tt.want.StallShutdown {
				t.Fatalf("got fusion %d cycle %v stall %v/%v, want %d %v %v/%v", cfg.FusionThreshold, cfg.CycleTime, cfg.StallCheck, cfg.StallShutdown,
					tt.want.FusionThreshold, tt.want.CycleTime, tt.want.StallCheck, tt.want.StallShutdown)
			}
		})
	}
}
