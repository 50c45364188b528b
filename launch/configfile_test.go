package launch

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// horovodConfig is a config file with every section horovodrun reads
// (the layout of Horovod's docs), plus a key it does not know.
const horovodConfig = `
controller: gloo
params:
  fusion_threshold_mb: 32
  cycle_time_ms: 10
  cache_capacity: 2048
  hierarchical_allreduce: false
  hierarchical_allgather: true
autotune:
  enabled: true
  log_file: tune.csv
  warmup_samples: 3
  steps_per_sample: 10
  bayes_opt_max_samples: 20
  gaussian_process_noise: 0.8
timeline:
  filename: tl.json
  mark_cycles: true
stall_check:
  enabled: true
  warning_time_seconds: 60
  shutdown_time_seconds: 120
library_options:
  mpi_threads_disable: false
  num_nccl_streams: 2
  gloo_timeout_seconds: 30
logging:
  level: DEBUG
  with_timestamp: true
extra: 1
`

func TestConfigFile(t *testing.T) {
	t.Setenv("HOROVOD_LOG_LEVEL", "")
	dir := t.TempDir()
	file := func(body string) string {
		p := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+".yaml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	abs := func(p string) string { return must(filepath.Abs(p)) }
	tests := []struct {
		name     string
		body     string
		flags    []string // before and after --config-file FILE
		after    []string
		env      []string
		serve    []string
		warnings []string // substrings, in order
		wantErr  string
	}{
		{
			name: "every section",
			body: horovodConfig,
			env: []string{"HOROVOD_FUSION_THRESHOLD=33554432", "HOROVOD_CYCLE_TIME=10", "HOROVOD_CACHE_CAPACITY=2048",
				"HOROVOD_HIERARCHICAL_ALLREDUCE=0", "HOROVOD_HIERARCHICAL_ALLGATHER=1",
				"HOROVOD_AUTOTUNE=1", "HOROVOD_AUTOTUNE_LOG=" + abs("tune.csv"), "HOROVOD_AUTOTUNE_WARMUP_SAMPLES=3",
				"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE=10", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=20",
				"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE=0.8",
				"HOROVOD_TIMELINE=" + abs("tl.json"), "HOROVOD_TIMELINE_MARK_CYCLES=1",
				"HOROVOD_STALL_CHECK_DISABLE=0", "HOROVOD_STALL_CHECK_TIME_SECONDS=60", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=120",
				"HOROVOD_LOG_LEVEL=DEBUG", "HOROVOD_LOG_HIDE_TIME=0"},
			serve: []string{"--log-level", "debug", "--fusion-threshold", "33554432", "--cycle-time", "10ms",
				"--autotune", "--autotune-log-file", abs("tune.csv"), "--autotune-warmup-samples", "3", "--autotune-steps-per-sample", "10",
				"--autotune-bayes-opt-max-samples", "20", "--autotune-gaussian-process-noise", "0.8",
				"--stall-check", "1m0s", "--stall-shutdown", "2m0s"},
			warnings: []string{
				"line 30: unknown key extra is ignored",
				"controller: gloo is ignored: hvdd's daemons are the controller",
				"library_options.gloo_timeout_seconds is ignored: there is no Gloo in hvdd",
				"library_options.mpi_threads_disable is ignored",
				"library_options.num_nccl_streams is ignored: hvdd does not use NCCL",
			},
		},
		{
			// horovodrun: a flag given anywhere on the command line wins.
			name:  "flags win, before and after",
			body:  "params:\n  fusion_threshold_mb: 32\n  cycle_time_ms: 10\nlogging:\n  level: DEBUG\nstall_check:\n  enabled: false\n",
			flags: []string{"--fusion-threshold-mb", "8"},
			after: []string{"--log-level", "ERROR", "--stall-check"},
			env: []string{"HOROVOD_FUSION_THRESHOLD=8388608", "HOROVOD_CYCLE_TIME=10",
				"HOROVOD_STALL_CHECK_DISABLE=0", "HOROVOD_LOG_LEVEL=ERROR"},
			serve: []string{"--log-level", "error", "--fusion-threshold", "8388608", "--cycle-time", "10ms"},
		},
		{
			name:  "stall check disabled",
			body:  "stall_check:\n  enabled: false\n",
			env:   []string{"HOROVOD_STALL_CHECK_DISABLE=1"},
			serve: []string{"--log-level", "warning", "--stall-check", "-1s"},
		},
		{
			// horovodrun: an autotune section without enabled turns it off,
			// unless --autotune is given.
			name:  "autotune section without enabled",
			body:  "autotune:\n  warmup_samples: 4\n",
			serve: []string{"--log-level", "warning"},
		},
		{
			name:  "autotune flag over a section without enabled",
			body:  "autotune:\n  warmup_samples: 4\n",
			flags: []string{"--autotune"},
			env:   []string{"HOROVOD_AUTOTUNE=1", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES=4"},
			serve: []string{"--log-level", "info", "--autotune", "--autotune-warmup-samples", "4"},
		},
		{
			name:     "unknown key in a section",
			body:     "params:\n  fusion_threshold: 32\n",
			serve:    []string{"--log-level", "warning"},
			warnings: []string{"line 2: unknown key params.fusion_threshold is ignored (horovodrun ignores it too; check its spelling)"},
		},
		{name: "empty", body: "", serve: []string{"--log-level", "warning"}},
		{name: "wrong type", body: "params:\n  fusion_threshold_mb: lots\n", wantErr: "line 2: cannot unmarshal !!str `lots` into int64"},
		{name: "not a mapping", body: "- a\n- b\n", wantErr: "want a mapping of sections"},
		{name: "bad yaml", body: "params: [\n", wantErr: "yaml:"},
		{name: "bad controller", body: "controller: nccl\n", wantErr: "No such controller supported: nccl"},
		{name: "bad value", body: "autotune:\n  gaussian_process_noise: 3\n", wantErr: "--autotune-gaussian-process-noise 3 must be in [0, 1]"},
		{name: "bad level", body: "logging:\n  level: chatty\n", wantErr: `--log-level "chatty"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append(append([]string{"-np", "2"}, tt.flags...), "--config-file", file(tt.body))
			args = append(append(args, tt.after...), "cmd")
			c, err := ParseArgs(args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseArgs error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if env := c.withDefaults().Env; !slices.Equal(env, tt.env) {
				t.Errorf("environment %q\nwant %q", env, tt.env)
			}
			if serve := c.ServeFlags(); !slices.Equal(serve, tt.serve) {
				t.Errorf("ServeFlags %q\nwant %q", serve, tt.serve)
			}
			if len(c.Warnings) != len(tt.warnings) {
				t.Fatalf("warnings %q\nwant %q", c.Warnings, tt.warnings)
			}
			for i, w := range tt.warnings {
				if !strings.Contains(c.Warnings[i], w) {
					t.Errorf("warning %d %q, want it to contain %q", i, c.Warnings[i], w)
				}
			}
		})
	}
	if _, err := ParseArgs([]string{"-np", "2", "--config-file", filepath.Join(dir, "missing.yaml"), "cmd"}); err == nil || !strings.Contains(err.Error(), "--config-file: open") {
		t.Errorf("missing file: %v", err)
	}
}
