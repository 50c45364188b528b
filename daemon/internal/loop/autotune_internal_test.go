package loop

import (
	"slices"
	"strings"
	"testing"
)

func TestJobAutotune(t *testing.T) {
	daemonCfg := AutotuneConfig{Enabled: true, MaxSamples: 9, Fixed: []string{KnobSpin}}
	tests := []struct {
		name string
		base AutotuneConfig
		env  []string
		want AutotuneConfig
		err  string
	}{
		{"rank 0 turns it on", AutotuneConfig{}, []string{"HOROVOD_AUTOTUNE=1", "HOROVOD_AUTOTUNE_LOG=/tmp/a.csv", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES=0"},
			AutotuneConfig{Enabled: true, LogFile: "/tmp/a.csv", WarmupSamples: -1}, ""},
		{"details over the daemon's", daemonCfg, []string{"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=4", "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE=0.2"},
			AutotuneConfig{Enabled: true, MaxSamples: 4, Noise: 0.2, Fixed: []string{KnobSpin}}, ""},
		{"rank 0 turns it off", daemonCfg, []string{"HOROVOD_AUTOTUNE=0"},
			AutotuneConfig{MaxSamples: 9, Fixed: []string{KnobSpin}}, ""},
		{"not an autotune variable", daemonCfg, []string{"HOROVOD_FUSION_THRESHOLD=1"}, daemonCfg, "not a HOROVOD_AUTOTUNE* variable"},
		{"bad number", daemonCfg, []string{"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE=x"}, daemonCfg, "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"},
		{"noise out of range", daemonCfg, []string{"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE=3"}, daemonCfg, "noise 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := jobAutotune(tt.base, tt.env)
			if (err == nil) != (tt.err == "") || err != nil && !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("err %v, want %q", err, tt.err)
			}
			if got.Enabled != tt.want.Enabled || got.LogFile != tt.want.LogFile || got.WarmupSamples != tt.want.WarmupSamples ||
				got.MaxSamples != tt.want.MaxSamples || got.Noise != tt.want.Noise || !slices.Equal(got.Fixed, tt.want.Fixed) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	// The daemon's settings are not changed underneath.
	if !slices.Equal(daemonCfg.Fixed, []string{KnobSpin}) || daemonCfg.MaxSamples != 9 {
		t.Fatalf("daemon settings changed: %+v", daemonCfg)
	}
}
