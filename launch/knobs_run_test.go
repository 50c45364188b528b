package launch

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
)

// Real jobs run with horovodrun's flags: real hvdd daemons and ranks of the
// Go client (knobsHelper).

// knobsHelper is a rank that sums 1 over the ranks, prints its rank and
// the Horovod knobs in its environment on stdout, and a line on stderr.
func knobsHelper() int {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := hvdd.Init(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "init:", err)
		return 1
	}
	defer c.Close()
	x := []float32{1}
	if err := hvdd.Allreduce(ctx, c, x, hvdd.WithOp(hvdd.Sum)); err != nil {
		fmt.Fprintln(os.Stderr, "allreduce:", err)
		return 1
	}
	var knobs []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "HOROVOD_") && !slices.Contains(rankVars, name) && name != "HOROVOD_ELASTIC" {
			knobs = append(knobs, kv)
		}
	}
	slices.Sort(knobs)
	fmt.Printf("rank=%d sum=%g knobs=%s\n", c.Rank(), x[0], strings.Join(knobs, ","))
	fmt.Fprintf(os.Stderr, "rank %d done\n", c.Rank())
	return 0
}

// parseRun is ParseArgs for a test: args then the knobs helper as the
// command, with output captured and a private signal channel.
func parseRun(t *testing.T, args ...string) (Config, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	cfg, err := ParseArgs(append(append(args, "--"), helperCmd("knobs")...))
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	cfg.Stdout, cfg.Stderr, cfg.Signals = &stdout, &stderr, make(chan os.Signal)
	cfg.HvddPath = buildHvdd(t)
	return cfg, &stdout, &stderr
}

// sharedDaemon sets cfg's DaemonCommand as cmd/hvdd does: hvdd serve on
// cfg's socket with the job's ServeFlags.
func sharedDaemon(cfg *Config) {
	cfg.DaemonCommand = append([]string{cfg.HvddPath, "serve", "--slots", fmt.Sprint(cfg.NP), "--socket", cfg.Socket}, cfg.ServeFlags()...)
}

func runJob(t *testing.T, cfg Config, stdout, stderr *bytes.Buffer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	code, err := Run(ctx, cfg)
	if testing.Verbose() || code != 0 || err != nil {
		t.Logf("code %d, err %v\nstdout:\n%.4000s\nstderr:\n%.4000s", code, err, stdout, stderr)
	}
	if code != 0 || err != nil {
		t.Fatalf("Run = %d, %v; want 0, nil", code, err)
	}
}

// TestRunKnobsAndOutputFiles runs a job on one node whose daemon hvdd run
// starts: the knobs of the config file and of the flags (the flags win)
// reach the daemon (its log shows its fusion threshold; --verbose its
// command line) and the ranks' environment, and --output-filename holds
// each rank's lines as the terminal shows them.
func TestRunKnobsAndOutputFiles(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	conf := filepath.Join(dir, "horovod.yaml")
	os.WriteFile(conf, []byte("params:\n  fusion_threshold_mb: 5\n  cycle_time_ms: 2\n  hierarchical_allreduce: true\n"), 0o644)
	out := filepath.Join(dir, "out")
	cfg, stdout, stderr := parseRun(t, "-np", "2", "--socket", filepath.Join(dir, "hvdd.sock"), "--config-file", conf,
		"--fusion-threshold-mb", "3", "--log-level", "info", "--output-filename", out, "--verbose")
	sharedDaemon(&cfg)
	runJob(t, cfg, stdout, stderr)

	knobs := "HOROVOD_CYCLE_TIME=2,HOROVOD_FUSION_THRESHOLD=3145728,HOROVOD_HIERARCHICAL_ALLREDUCE=1,HOROVOD_LOG_LEVEL=INFO"
	for rank := range 2 {
		want := fmt.Sprintf("[%d]<stdout>:rank=%d sum=2 knobs=%s\n", rank, rank, knobs)
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q", want)
		}
		got, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("rank.%d", rank), "stdout"))
		if err != nil || string(got) != want {
			t.Errorf("rank.%d/stdout = %q, %v; want %q", rank, got, err, want)
		}
		wantErr := fmt.Sprintf("[%d]<stderr>:rank %d done\n", rank, rank)
		got, err = os.ReadFile(filepath.Join(out, fmt.Sprintf("rank.%d", rank), "stderr"))
		if err != nil || string(got) != wantErr || !strings.Contains(stderr.String(), wantErr) {
			t.Errorf("rank.%d/stderr = %q, %v; want %q, also on the terminal", rank, got, err, wantErr)
		}
	}
	for _, re := range []string{
		`(?m)^hvdd run: starting the hvdd daemon: \S+ serve --slots 2 --socket \S+ --log-level info --fusion-threshold 3145728 --cycle-time 2ms$`,
		`(?m)^\[hvdd\] .*msg="hvdd daemon listening" .*fusion_threshold=3145728 `,
		`(?m)^hvdd run: starting rank 1: `,
	} {
		if !regexp.MustCompile(re).MatchString(stderr.String()) {
			t.Errorf("stderr does not match %s", re)
		}
	}
}

// TestRunKnobsRunningDaemon: a daemon that was already running keeps its
// settings, and hvdd run says so; the ranks still get the variables.
func TestRunKnobsRunningDaemon(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	socket := filepath.Join(dir, "hvdd.sock")
	daemon := exec.Command(buildHvdd(t), "serve", "--slots", "1", "--socket", socket, "--log-level", "warning")
	daemon.Stderr = os.Stderr
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { daemon.Process.Kill(); daemon.Wait() })
	for deadline := time.Now().Add(20 * time.Second); probe(socket) != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("hvdd serve did not listen within 20s")
		}
	}
	cfg, stdout, stderr := parseRun(t, "-np", "1", "--socket", socket, "--fusion-threshold-mb", "3", "--no-stall-check", "--cache-capacity", "0")
	sharedDaemon(&cfg)
	runJob(t, cfg, stdout, stderr)
	want := "hvdd run: warning: the hvdd daemon on " + socket + " was already running: it keeps the settings it was started with, so --fusion-threshold-mb, --no-stall-check have no effect on it"
	if !strings.Contains(stderr.String(), want) || !strings.Contains(stderr.String(), "hvdd serve --slots N --socket "+socket+" --log-level warning --fusion-threshold 3145728 --stall-check -1s'") {
		t.Errorf("stderr lacks the warning %q and the command to restart the daemon with", want)
	}
	if want := "[0]<stdout>:rank=0 sum=1 knobs=HOROVOD_CACHE_CAPACITY=0,HOROVOD_FUSION_THRESHOLD=3145728,HOROVOD_STALL_CHECK_DISABLE=1\n"; stdout.String() != want {
		t.Errorf("stdout %q, want %q", stdout, want)
	}
}

// TestMultiHostKnobs runs a job across two "hosts" of this machine: both
// daemons get the knobs, and --network-interface lo makes them advertise
// and bind lo's address (127.0.0.1) instead of their host's (127.0.0.2,
// 127.0.0.3). Output lines carry a timestamp.
func TestMultiHostKnobs(t *testing.T) {
	t.Parallel()
	cfg, stdout, stderr := parseRun(t, "-np", "2", "-H", "127.0.0.2:1,127.0.0.3:1", "--network-interface", "lo",
		"--fusion-threshold-mb", "7", "--log-level", "info", "--prefix-output-with-timestamp", "--autotune")
	runJob(t, cfg, stdout, stderr)
	for _, re := range []string{
		`(?m)^\[hvdd 127\.0\.0\.2\] .*msg="autotune: tuning" .*knobs=cycle_time_ms,spin_us,streams,chunk_kb,small_kb fixed=fusion_threshold_mb `,
		`(?m)^\[hvdd 127\.0\.0\.2\] .*msg="hvdd daemon listening" .*fusion_threshold=7340032 `,
		`(?m)^\[hvdd 127\.0\.0\.3\] .*msg="hvdd daemon listening" .*fusion_threshold=7340032 `,
		`(?m)^\[hvdd 127\.0\.0\.2\] .*msg="coordinator listening" .*control=127\.0\.0\.1:\d+ `,
	} {
		if !regexp.MustCompile(re).MatchString(stderr.String()) {
			t.Errorf("stderr does not match %s", re)
		}
	}
	// time.asctime, then the tag.
	stamp := `[A-Z][a-z]{2} [A-Z][a-z]{2} [ 1-3]\d \d\d:\d\d:\d\d \d{4}`
	for rank := range 2 {
		re := fmt.Sprintf(`(?m)^%s\[%d\]<stdout>:rank=%d sum=2 knobs=HOROVOD_AUTOTUNE=1,HOROVOD_FUSION_THRESHOLD=7340032,HOROVOD_LOG_LEVEL=INFO$`, stamp, rank, rank)
		if !regexp.MustCompile(re).MatchString(stdout.String()) {
			t.Errorf("stdout does not match %s", re)
		}
	}
}

// TestRunOutputFilenameRaw: the output files hold what reaches the
// terminal, a last line without newline included: tagged lines (the
// tagger ends the line), or the raw bytes with --no-tag-output.
func TestRunOutputFilenameRaw(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		noTag              bool
		wantOut, wantErr   string
		stdoutIsFileAsWell bool
	}{
		{false, "[0]<stdout>:first\n[0]<stdout>:no newline at end\n", "[0]<stderr>:err partial\n", false},
		{true, "first\nno newline at end", "err partial", false},
		{true, "first\nno newline at end", "err partial", true}, // ranks would share an *os.File stdout
	} {
		dir := testDir(t)
		out := filepath.Join(dir, "out", "nested")
		cfg := Config{NP: 1, Command: helperCmd("partial"), NoTagOutput: tt.noTag, OutputFilename: out}
		var stdout *os.File
		if tt.stdoutIsFileAsWell {
			var err error
			if stdout, err = os.Create(filepath.Join(dir, "terminal")); err != nil {
				t.Fatal(err)
			}
			defer stdout.Close()
			cfg.Stdout = stdout
		}
		r := run(t, cfg)
		if r.code != 0 || r.err != nil {
			t.Fatalf("Run = %d, %v\n%s", r.code, r.err, r.stderr)
		}
		for stream, want := range map[string]string{"stdout": tt.wantOut, "stderr": tt.wantErr} {
			got, err := os.ReadFile(filepath.Join(out, "rank.0", stream))
			if err != nil || string(got) != want {
				t.Errorf("noTag %v: rank.0/%s = %q, %v; want %q", tt.noTag, stream, got, err, want)
			}
		}
		terminal := r.stdout
		if stdout != nil {
			terminal = string(must(os.ReadFile(stdout.Name())))
		}
		if terminal != tt.wantOut {
			t.Errorf("noTag %v: the terminal got %q, want %q", tt.noTag, terminal, tt.wantOut)
		}
	}
}
