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
		{"root, 7", []uint32{0, 7}, ""},
		{"5,no-such-group-hvdd", nil, `--allow-gid "no-such-group-hvdd": no such group (create it: groupadd --system no-such-group-hvdd, or give its numeric id)`},
		{"4294967296", nil, `--allow-gid "4294967296": want group names or numeric group ids`},
		{"5x", nil, `--allow-gid "5x": want group names or numeric group ids`},
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

// TestServeAutotune: the autotune flags and HOROVOD_AUTOTUNE* variables
// reach Config.Autotune (a flag given wins), and the settings given by a
// flag or a variable are held fixed.
func TestServeAutotune(t *testing.T) {
	tests := []struct {
		name string
		argv []string
		env  map[string]string
		want daemon.AutotuneConfig
	}{
		{"off", nil, nil, daemon.AutotuneConfig{}},
		{"flags", []string{"--autotune", "--autotune-log-file", "/tmp/at.csv", "--autotune-warmup-samples", "0",
			"--autotune-steps-per-sample", "4", "--autotune-bayes-opt-max-samples", "5", "--autotune-gaussian-process-noise", "0.5",
			"--fusion-threshold", "1024", "--spin", "0s", "--tcp-small-bytes", "-1"}, nil,
			daemon.AutotuneConfig{Enabled: true, LogFile: "/tmp/at.csv", WarmupSamples: -1, StepsPerSample: 4, MaxSamples: 5, Noise: 0.5,
				Fixed: []string{daemon.KnobFusion, daemon.KnobSmall, daemon.KnobSpin}}},
		{"environment", nil, map[string]string{"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": "a.csv", "HOROVOD_CYCLE_TIME": "2",
			"HVDD_TCP_STREAMS": "4", "HVDD_TCP_CHUNK_BYTES": "65536", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "7"},
			daemon.AutotuneConfig{Enabled: true, LogFile: "a.csv", MaxSamples: 7, Fixed: []string{daemon.KnobChunk, daemon.KnobCycle, daemon.KnobStreams}}},
		{"flag wins", []string{"--autotune=false", "--autotune-bayes-opt-max-samples", "3"}, map[string]string{"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "7"},
			daemon.AutotuneConfig{MaxSamples: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range []string{"HOROVOD_AUTOTUNE", "HOROVOD_AUTOTUNE_LOG", "HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD",
				"HVDD_TCP_STREAMS", "HVDD_TCP_CHUNK_BYTES", "HVDD_TCP_SMALL_BYTES", "HVDD_SPIN", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES"} {
				t.Setenv(k, tt.env[k])
			}
			args, err := parseServeArgs(append([]string{"--slots", "1"}, tt.argv...))
			if err != nil {
				t.Fatal(err)
			}
			cfg, _, err := serveConfig(args)
			if err != nil {
				t.Fatal(err)
			}
			got := cfg.Autotune
			if got.Enabled != tt.want.Enabled || got.LogFile != tt.want.LogFile || got.WarmupSamples != tt.want.WarmupSamples ||
				got.StepsPerSample != tt.want.StepsPerSample || got.MaxSamples != tt.want.MaxSamples || got.Noise != tt.want.Noise ||
				!slices.Equal(got.Fixed, tt.want.Fixed) {
				t.Fatalf("Autotune = %+v, want %+v", got, tt.want)
			}
		})
	}
}
