package launch

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestParseArgsHorovodFlags checks what horovodrun's flags become: the
// ranks' HOROVOD_* variables (as config_parser.set_env_from_args sets
// them) and the flags of the daemons hvdd run starts.
func TestParseArgsHorovodFlags(t *testing.T) {
	t.Setenv("HOROVOD_LOG_LEVEL", "")
	t.Setenv("HOROVOD_START_TIMEOUT", "")
	abs := func(p string) string { return must(filepath.Abs(p)) }
	tests := []struct {
		name      string
		args      []string
		env       []string // the knobs' variables, after any -x
		serve     []string // Config.ServeFlags
		warning   string   // substring of the one warning; empty for none
		check     func(t *testing.T, c Config)
		wantError string
	}{
		{
			name:  "none",
			args:  []string{"-np", "2", "cmd"},
			serve: []string{"--log-level", "warning"},
		},
		{
			name:  "fusion and cycle time",
			args:  []string{"-np", "2", "--fusion-threshold-mb", "64", "--cycle-time-ms=2.5", "cmd"},
			env:   []string{"HOROVOD_FUSION_THRESHOLD=67108864", "HOROVOD_CYCLE_TIME=2.5"},
			serve: []string{"--log-level", "warning", "--fusion-threshold", "67108864", "--cycle-time", "2.5ms"},
		},
		{
			name:  "fusion off",
			args:  []string{"-np", "2", "--fusion-threshold-mb", "0", "cmd"},
			env:   []string{"HOROVOD_FUSION_THRESHOLD=0"},
			serve: []string{"--log-level", "warning", "--fusion-threshold", "0"},
		},
		{
			name: "cache and hierarchical: environment only",
			args: []string{"-np", "2", "--cache-capacity", "2048", "--hierarchical-allreduce", "--no-hierarchical-allgather", "--disable-cache", "cmd"},
			env: []string{"HOROVOD_CACHE_CAPACITY=2048", "HOROVOD_HIERARCHICAL_ALLREDUCE=1",
				"HOROVOD_HIERARCHICAL_ALLGATHER=0"},
			serve: []string{"--log-level", "warning"},
		},
		{
			name: "autotune",
			args: []string{"-np", "2", "--autotune", "--autotune-log-file", "at.csv", "--autotune-warmup-samples", "5",
				"--autotune-steps-per-sample", "3", "--autotune-bayes-opt-max-samples", "7",
				"--autotune-gaussian-process-noise", "0.5", "cmd"},
			env: []string{"HOROVOD_AUTOTUNE=1", "HOROVOD_AUTOTUNE_LOG=" + abs("at.csv"), "HOROVOD_AUTOTUNE_WARMUP_SAMPLES=5",
				"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE=3", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=7",
				"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE=0.5"},
			// The daemons tune, and say how at info level.
			serve: []string{"--log-level", "info", "--autotune", "--autotune-log-file", abs("at.csv"), "--autotune-warmup-samples", "5",
				"--autotune-steps-per-sample", "3", "--autotune-bayes-opt-max-samples", "7", "--autotune-gaussian-process-noise", "0.5"},
		},
		{
			name:  "autotune with a log level and a fixed fusion threshold",
			args:  []string{"-np", "2", "--autotune", "--log-level", "ERROR", "--fusion-threshold-mb", "8", "cmd"},
			env:   []string{"HOROVOD_FUSION_THRESHOLD=8388608", "HOROVOD_AUTOTUNE=1", "HOROVOD_LOG_LEVEL=ERROR"},
			serve: []string{"--log-level", "error", "--fusion-threshold", "8388608", "--autotune"},
		},
		{
			// horovodrun sets the autotune details only with --autotune.
			name:  "autotune details without autotune",
			args:  []string{"-np", "2", "--autotune-warmup-samples", "5", "--no-autotune", "cmd"},
			serve: []string{"--log-level", "warning"},
		},
		{
			name:  "stall check off",
			args:  []string{"-np", "2", "--no-stall-check", "--stall-check-warning-time-seconds", "30", "cmd"},
			env:   []string{"HOROVOD_STALL_CHECK_DISABLE=1", "HOROVOD_STALL_CHECK_TIME_SECONDS=30"},
			serve: []string{"--log-level", "warning", "--stall-check", "-1s"},
		},
		{
			name:  "stall times",
			args:  []string{"-np", "2", "--stall-check", "--stall-check-warning-time-seconds", "30", "--stall-check-shutdown-time-seconds", "90", "cmd"},
			env:   []string{"HOROVOD_STALL_CHECK_DISABLE=0", "HOROVOD_STALL_CHECK_TIME_SECONDS=30", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=90"},
			serve: []string{"--log-level", "warning", "--stall-check", "30s", "--stall-shutdown", "1m30s"},
		},
		{
			name:  "logging",
			args:  []string{"-np", "2", "--log-level", "debug", "--log-without-timestamp", "cmd"},
			env:   []string{"HOROVOD_LOG_LEVEL=DEBUG", "HOROVOD_LOG_HIDE_TIME=1"},
			serve: []string{"--log-level", "debug"},
		},
		{
			name:  "logging, deprecated spelling",
			args:  []string{"-np", "2", "--log-level", "TRACE", "--no-log-hide-timestamp", "cmd"},
			env:   []string{"HOROVOD_LOG_LEVEL=TRACE", "HOROVOD_LOG_HIDE_TIME=0"},
			serve: []string{"--log-level", "trace"},
		},
		{
			name:  "timeline after -x",
			args:  []string{"-np", "2", "-x", "A=1", "--timeline-filename", "tl.json", "--timeline-mark-cycles", "cmd"},
			env:   []string{"A=1", "HOROVOD_TIMELINE=" + abs("tl.json"), "HOROVOD_TIMELINE_MARK_CYCLES=1"},
			serve: []string{"--log-level", "warning"},
		},
		{
			name:  "output, verbose, timestamps",
			args:  []string{"-np", "2", "--output-filename", "out", "--verbose", "-prefix-timestamp", "cmd"},
			serve: []string{"--log-level", "warning"},
			check: func(t *testing.T, c Config) {
				if c.OutputFilename != abs("out") || !c.Verbose || !c.PrefixTimestamp {
					t.Errorf("OutputFilename %q Verbose %v PrefixTimestamp %v; want %q true true", c.OutputFilename, c.Verbose, c.PrefixTimestamp, abs("out"))
				}
			},
		},
		{
			name:  "network interfaces",
			args:  []string{"-np", "2", "--network-interface", "eth0", "--network-interfaces", "ib0,eth0", "--network-interface=eth1", "cmd"},
			serve: []string{"--log-level", "warning"},
			check: func(t *testing.T, c Config) {
				if want := []string{"eth0", "ib0", "eth1"}; !slices.Equal(c.NetworkInterfaces, want) {
					t.Errorf("NetworkInterfaces %q, want %q", c.NetworkInterfaces, want)
				}
			},
		},
		{
			name:  "wire compression",
			args:  []string{"-np", "2", "--wire-compression", "fp16", "cmd"},
			serve: []string{"--log-level", "warning", "--wire-compression", "fp16"},
		},
		{
			name:      "wire compression unknown",
			args:      []string{"-np", "2", "--wire-compression", "fp8", "cmd"},
			wantError: `--wire-compression "fp8": choose none, fp16 or bf16`,
		},
		{
			name:  "job name",
			args:  []string{"-np", "2", "--job", "train-1", "cmd"},
			serve: []string{"--log-level", "warning"},
			check: func(t *testing.T, c Config) {
				if c.JobName != "train-1" {
					t.Errorf("JobName %q, want train-1", c.JobName)
				}
			},
		},
		{
			name:  "start timeout in seconds",
			args:  []string{"-np", "2", "--start-timeout", "45", "cmd"},
			serve: []string{"--log-level", "warning"},
			check: wantStartTimeout(45 * time.Second),
		},
		{
			name:  "start timeout as a duration",
			args:  []string{"-np", "2", "--start-timeout", "2m", "cmd"},
			serve: []string{"--log-level", "warning"},
			check: wantStartTimeout(2 * time.Minute),
		},
		{
			name:  "elastic aliases",
			args:  []string{"-np", "2", "--min-num-proc", "1", "--max-num-proc", "4", "-H", "localhost:4", "cmd"},
			serve: []string{"--log-level", "warning"},
			check: func(t *testing.T, c Config) {
				if c.MinNP != 1 || c.MaxNP != 4 {
					t.Errorf("MinNP %d MaxNP %d, want 1 4", c.MinNP, c.MaxNP)
				}
			},
		},
		{
			name: "check build needs no -np",
			args: []string{"-cb"},
			check: func(t *testing.T, c Config) {
				if !c.CheckBuild {
					t.Error("CheckBuild not set")
				}
			},
		},
		{
			name: "version",
			args: []string{"--version"},
			check: func(t *testing.T, c Config) {
				if !c.PrintVersion {
					t.Error("PrintVersion not set")
				}
			},
		},
		{name: "negative fusion", args: []string{"-np", "2", "--fusion-threshold-mb", "-1", "cmd"}, wantError: "--fusion-threshold-mb -1 must be >= 0"},
		{name: "fusion not a number", args: []string{"-np", "2", "--fusion-threshold-mb", "64MB", "cmd"}, wantError: `invalid value "64MB" for flag -fusion-threshold-mb: want a whole number`},
		{name: "negative cycle time", args: []string{"-np", "2", "--cycle-time-ms", "-1", "cmd"}, wantError: "--cycle-time-ms -1 must be between 0"},
		{name: "noise above 1", args: []string{"-np", "2", "--autotune-gaussian-process-noise", "1.5", "cmd"}, wantError: "--autotune-gaussian-process-noise 1.5 must be in [0, 1]"},
		{name: "negative cache", args: []string{"-np", "2", "--cache-capacity", "-5", "cmd"}, wantError: "--cache-capacity -5 must be >= 0"},
		{name: "bad log level", args: []string{"-np", "2", "--log-level", "LOUD", "cmd"}, wantError: `--log-level "LOUD": choose from TRACE, DEBUG, INFO, WARNING, ERROR, FATAL`},
		{name: "bad start timeout", args: []string{"-np", "2", "--start-timeout", "soon", "cmd"}, wantError: "want seconds (e.g. 30) or a duration"},
		{name: "zero start timeout", args: []string{"-np", "2", "--start-timeout", "0", "cmd"}, wantError: "--start-timeout must be positive"},
		{name: "bad interface", args: []string{"-np", "2", "--network-interface", "a b", "cmd"}, wantError: "is not a network interface name"},
		{name: "bad bool", args: []string{"-np", "2", "--autotune=maybe", "cmd"}, wantError: "want no value, or =true or =false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseArgs(tt.args)
			if tt.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantError) {
					t.Fatalf("ParseArgs(%q) error = %v, want one containing %q", tt.args, err, tt.wantError)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseArgs(%q): %v", tt.args, err)
			}
			if tt.check != nil {
				tt.check(t, c)
			}
			if c.CheckBuild || c.PrintVersion {
				return
			}
			if env := c.withDefaults().Env; !slices.Equal(env, tt.env) {
				t.Errorf("environment %q\nwant %q", env, tt.env)
			}
			if serve := c.ServeFlags(); !slices.Equal(serve, tt.serve) {
				t.Errorf("ServeFlags %q, want %q", serve, tt.serve)
			}
			switch {
			case tt.warning == "" && len(c.Warnings) > 0:
				t.Errorf("warnings %q, want none", c.Warnings)
			case tt.warning != "" && (len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], tt.warning)):
				t.Errorf("warnings %q, want one containing %q", c.Warnings, tt.warning)
			}
		})
	}
}

func wantStartTimeout(d time.Duration) func(*testing.T, Config) {
	return func(t *testing.T, c Config) {
		if c.StartTimeout != d {
			t.Errorf("StartTimeout %v, want %v", c.StartTimeout, d)
		}
	}
}

// TestParseArgsHorovodEnvDefaults: HOROVOD_START_TIMEOUT (seconds) and
// HOROVOD_LOG_LEVEL apply when the flags are not given, as in horovodrun.
func TestParseArgsHorovodEnvDefaults(t *testing.T) {
	t.Setenv("HOROVOD_START_TIMEOUT", "20")
	t.Setenv("HOROVOD_LOG_LEVEL", "INFO")
	c, err := ParseArgs([]string{"-np", "1", "cmd"})
	if err != nil {
		t.Fatal(err)
	}
	if c.StartTimeout != 20*time.Second || !slices.Equal(c.ServeFlags(), []string{"--log-level", "info"}) {
		t.Errorf("StartTimeout %v, ServeFlags %q; want 20s, --log-level info", c.StartTimeout, c.ServeFlags())
	}
	c, err = ParseArgs([]string{"-np", "1", "--start-timeout", "5", "--log-level", "ERROR", "cmd"})
	if err != nil {
		t.Fatal(err)
	}
	if c.StartTimeout != 5*time.Second || !slices.Equal(c.ServeFlags(), []string{"--log-level", "error"}) {
		t.Errorf("with flags: StartTimeout %v, ServeFlags %q; want 5s, --log-level error", c.StartTimeout, c.ServeFlags())
	}
	t.Setenv("HOROVOD_START_TIMEOUT", "soon")
	if _, err := ParseArgs([]string{"-np", "1", "cmd"}); err == nil || !strings.Contains(err.Error(), "HOROVOD_START_TIMEOUT=soon") {
		t.Errorf("HOROVOD_START_TIMEOUT=soon: %v, want an error naming it", err)
	}
}

// TestParseArgsRefused: every horovodrun flag without meaning here is
// refused with its reason, wherever it stands among the flags and whether
// or not it takes a value.
func TestParseArgsRefused(t *testing.T) {
	for _, f := range refusedFlags {
		for _, name := range f.names {
			args := []string{"-np", "2", "--" + name}
			if f.value {
				args = append(args, "--map-by ppr:6:node") // a value that looks like a flag
			}
			args = append(args, "--fusion-threshold-mb", "1", "python", "train.py")
			_, err := ParseArgs(args)
			want := "--" + name + " is not supported: " + f.why
			if err == nil || err.Error() != want {
				t.Errorf("ParseArgs(%q) = %v\nwant %s", args, err, want)
			}
		}
	}
	// The first refused flag is named.
	_, err := ParseArgs([]string{"-np", "2", "--tcp", "--gloo", "cmd"})
	if err == nil || !strings.HasPrefix(err.Error(), "--tcp is not supported") {
		t.Errorf("--tcp --gloo: %v, want --tcp named", err)
	}
	// After the command, they are the command's.
	c, err := ParseArgs([]string{"-np", "2", "python", "--gloo"})
	if err != nil || !slices.Equal(c.Command, []string{"python", "--gloo"}) {
		t.Errorf("python --gloo: %v, %q", err, c.Command)
	}
}

// TestRankOutputNames checks horovodrun's layout of --output-filename:
// rank.N/stdout and rank.N/stderr, N zero-padded to the width of NP-1.
func TestRankOutputNames(t *testing.T) {
	tests := []struct {
		np, rank int
		want     string
	}{
		{1, 0, "rank.0"},
		{2, 1, "rank.1"},
		{10, 9, "rank.9"},
		{11, 3, "rank.03"},
		{101, 7, "rank.007"},
		{4, 12, "rank.12"}, // a rank an elastic job added
	}
	for _, tt := range tests {
		cfg := &Config{NP: tt.np, OutputFilename: t.TempDir()}
		f, err := openRankOutput(cfg, tt.rank, "stderr")
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		if _, err := os.Stat(filepath.Join(cfg.OutputFilename, tt.want, "stderr")); err != nil {
			t.Errorf("np %d rank %d: %v", tt.np, tt.rank, err)
		}
	}
}

// TestDefaultJobName: without --job, a job is named after its command with
// four random hex digits, different each time.
func TestDefaultJobName(t *testing.T) {
	a, err := ParseArgs([]string{"-np", "2", "--", "/usr/bin/python3", "train.py"})
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^python3-[0-9a-f]{4}$`).MatchString(a.JobName) {
		t.Fatalf("JobName %q, want python3-XXXX", a.JobName)
	}
	for i := 0; i < 5; i++ {
		b, err := ParseArgs([]string{"-np", "2", "--", "/usr/bin/python3", "train.py"})
		if err != nil {
			t.Fatal(err)
		}
		if b.JobName != a.JobName {
			return
		}
	}
	t.Fatalf("six jobs all named %q", a.JobName)
}
