package launch

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hvdd/hvdd/ipc"
)

func TestParseArgs(t *testing.T) {
	t.Setenv("HVDD_SOCKET", "/env/hvdd.sock")
	t.Setenv("HVDD_TEST_EXPORTED", "from-parent")
	tests := []struct {
		name    string
		args    []string
		want    Config
		wantErr string // substring; empty for success
	}{
		{
			name: "minimal",
			args: []string{"-np", "2", "python", "train.py"},
			want: Config{NP: 2, Command: []string{"python", "train.py"}, Socket: "/env/hvdd.sock"},
		},
		{
			name: "double dash stops flags",
			args: []string{"-np", "2", "--socket", "/s.sock", "--", "python", "-np", "3"},
			want: Config{NP: 2, Command: []string{"python", "-np", "3"}, Socket: "/s.sock"},
		},
		{
			name: "first non-flag stops flags",
			args: []string{"--np=4", "./train", "--socket", "x", "--", "y"},
			want: Config{NP: 4, Command: []string{"./train", "--socket", "x", "--", "y"}, Socket: "/env/hvdd.sock"},
		},
		{
			name: "all flags",
			args: []string{"--num-proc", "8", "--no-tag-output", "--start-timeout", "1m", "--kill-grace=2s",
				"-x", "A=1", "-x", "HVDD_TEST_EXPORTED", "-x", "HVDD_TEST_UNSET", "-x", "B=", "--", "cmd"},
			want: Config{
				NP: 8, Command: []string{"cmd"}, Socket: "/env/hvdd.sock", NoTagOutput: true,
				StartTimeout: time.Minute, KillGrace: 2 * time.Second,
				Env: []string{"A=1", "HVDD_TEST_EXPORTED=from-parent", "B="},
			},
		},
		{
			name: "timeline",
			args: []string{"-np", "2", "-x", "A=1", "--timeline-filename", "/tmp/tl.json", "--timeline-mark-cycles", "cmd"},
			want: Config{NP: 2, Command: []string{"cmd"}, Socket: "/env/hvdd.sock",
				Env: []string{"A=1", "HOROVOD_TIMELINE=/tmp/tl.json", "HOROVOD_TIMELINE_MARK_CYCLES=1"}},
		},
		{
			name: "timeline relative",
			args: []string{"-np", "2", "--timeline-filename", "tl.json", "cmd"},
			want: Config{NP: 2, Command: []string{"cmd"}, Socket: "/env/hvdd.sock",
				Env: []string{"HOROVOD_TIMELINE=" + must(filepath.Abs("tl.json"))}},
		},
		{name: "help", args: []string{"--help"}, wantErr: "help requested"},
		{name: "np missing", args: []string{"python"}, wantErr: "-np is required"},
		{name: "np zero", args: []string{"-np", "0", "python"}, wantErr: "at least 1"},
		{name: "np negative", args: []string{"-np", "-1", "python"}, wantErr: "at least 1"},
		{name: "np not a number", args: []string{"-np", "two", "python"}, wantErr: "see 'hvdd run --help'"},
		{name: "no command", args: []string{"-np", "2"}, wantErr: "no command"},
		{name: "no command after dash dash", args: []string{"-np", "2", "--"}, wantErr: "no command"},
		{name: "unknown flag", args: []string{"-np", "2", "--hostsfile", "h", "python"}, wantErr: "flag provided but not defined: -hostsfile; see 'hvdd run --help'"},
		{name: "bad duration", args: []string{"-np", "2", "--kill-grace", "5", "python"}, wantErr: "kill-grace"},
		{name: "zero duration", args: []string{"-np", "2", "--kill-grace", "0s", "python"}, wantErr: "--kill-grace must be positive"},
		{name: "negative duration", args: []string{"-np", "2", "--start-timeout", "-1s", "python"}, wantErr: "must not be negative"},
		{name: "bad -x", args: []string{"-np", "2", "-x", "=v", "python"}, wantErr: "not NAME or NAME=VALUE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseArgs(tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseArgs(%q) error = %v, want one containing %q", tt.args, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseArgs(%q): %v", tt.args, err)
			}
			if got.NP != tt.want.NP || !slices.Equal(got.Command, tt.want.Command) || got.Socket != tt.want.Socket ||
				got.NoTagOutput != tt.want.NoTagOutput || got.StartTimeout != tt.want.StartTimeout ||
				got.KillGrace != tt.want.KillGrace || !slices.Equal(got.withDefaults().Env, tt.want.Env) {
				t.Errorf("ParseArgs(%q) =\n%+v\nwant\n%+v", tt.args, got, tt.want)
			}
		})
	}
}

func TestParseArgsHelpIsErrHelp(t *testing.T) {
	for _, arg := range []string{"-h", "--help", "-help"} {
		if _, err := ParseArgs([]string{arg}); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("ParseArgs(%q) = %v, want flag.ErrHelp", arg, err)
		}
	}
}

// TestUsageNamesEveryFlag keeps Usage in step with ParseArgs.
func TestUsageNamesEveryFlag(t *testing.T) {
	for _, f := range []string{"-np N", "--num-proc", "--socket PATH", "--no-tag-output", "--start-timeout", "--kill-grace", "-x NAME[=VALUE]", `"--"`, "--help", "-H HOST[:SLOTS]", "--hosts", "--hostfile FILE", "--backend tcp|mpi", "--rendezvous-port PORT", "-p PORT", "--ssh-port", "-i FILE", "--ssh-identity-file", "--agent COMMAND", "--hvdd-path PATH",
		"--min-np MIN", "--max-np MAX", "--host-discovery-script SCRIPT", "--slots-per-host S", "--slots S",
		"--blacklist-cooldown-range MIN MAX", "--reset-limit K", "--elastic-timeout SECONDS",
		"--start-timeout SECONDS", "--output-filename DIR", "--prefix-output-with-timestamp", "-prefix-timestamp",
		"--verbose", "--check-build", "-cb", "--version", "--fusion-threshold-mb MB", "--cycle-time-ms MS",
		"--no-stall-check", "--stall-check-warning-time-seconds S", "--stall-check-shutdown-time-seconds S",
		"--log-level TRACE", "--log-with-timestamp", "--log-without-timestamp", "--cache-capacity N",
		"--hierarchical-allreduce", "--hierarchical-allgather", "--autotune,", "--autotune-log-file FILE",
		"--autotune-warmup-samples N", "--autotune-steps-per-sample N", "--autotune-bayes-opt-max-samples N",
		"--autotune-gaussian-process-noise X", "--timeline-filename FILE", "--timeline-mark-cycles",
		"--disable-cache", "--config-file FILE", "--network-interface NAME", "--network-interfaces NAME,NAME",
		"--min-num-proc", "--max-num-proc"} {
		if !strings.Contains(Usage, f) {
			t.Errorf("Usage does not mention %s", f)
		}
	}
}

// TestUsageNamesRefusedFlags keeps the list of refused flags in Usage in
// step with refusedFlags.
func TestUsageNamesRefusedFlags(t *testing.T) {
	for _, f := range refusedFlags {
		if !strings.Contains(Usage, "--"+f.names[0]+",") && !strings.Contains(Usage, "--"+f.names[0]+".") {
			t.Errorf("Usage does not list the refused --%s", f.names[0])
		}
	}
}

// TestSocketPath checks the socket resolution that ParseArgs and Run use
// (ipc.SocketPath).
func TestSocketPath(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/1000")
	t.Setenv("TMPDIR", "/tmp/x")
	var wantDefault string
	switch uid := strconv.Itoa(os.Getuid()); {
	case os.Geteuid() == 0:
		wantDefault = "/run/hvdd/hvdd.sock"
	default:
		wantDefault = "/run/user/1000/hvdd.sock"
		t.Run("no XDG_RUNTIME_DIR", func(t *testing.T) {
			t.Setenv("XDG_RUNTIME_DIR", "")
			if got, want := ipc.DefaultSocket(), filepath.Join("/tmp/x", "hvdd-"+uid, "hvdd.sock"); got != want {
				t.Errorf("DefaultSocket() = %q, want %q", got, want)
			}
		})
	}
	if got := ipc.DefaultSocket(); got != wantDefault {
		t.Errorf("DefaultSocket() = %q, want %q", got, wantDefault)
	}
	t.Setenv("HVDD_SOCKET", "")
	if got := ipc.SocketPath(""); got != wantDefault {
		t.Errorf("SocketPath(\"\") without $HVDD_SOCKET = %q, want %q", got, wantDefault)
	}
	t.Setenv("HVDD_SOCKET", "/env.sock")
	if got := ipc.SocketPath(""); got != "/env.sock" {
		t.Errorf("SocketPath(\"\") = %q, want $HVDD_SOCKET", got)
	}
	if got := ipc.SocketPath("/flag.sock"); got != "/flag.sock" {
		t.Errorf("SocketPath(flag) = %q, want the flag", got)
	}
}

// TestParseArgsElasticDriver: the elastic driver's flags as horovodrun takes
// them, and their refusals, each saying what to do.
func TestParseArgsElasticDriver(t *testing.T) {
	dir := t.TempDir()
	hf := filepath.Join(dir, "hosts")
	os.WriteFile(hf, []byte("a slots=2\n"), 0o600)
	c, err := ParseArgs([]string{"-np", "2", "--min-np", "1", "--max-np", "8", "--host-discovery-script", "./discover.sh arg",
		"--slots-per-host", "4", "--blacklist-cooldown-range", "10", "100", "--reset-limit", "3", "--", "cmd", "x"})
	if err != nil {
		t.Fatal(err)
	}
	if c.MinNP != 1 || c.MaxNP != 8 || c.HostDiscoveryScript != "./discover.sh arg" || c.SlotsPerHost != 4 ||
		c.BlacklistCooldown != (CooldownRange{10 * time.Second, 100 * time.Second}) || c.ResetLimit != 3 || !slices.Equal(c.Command, []string{"cmd", "x"}) {
		t.Errorf("ParseArgs = %+v", c)
	}
	if !c.driven() {
		t.Error("a job with a discovery script is not driven")
	}
	// --slots; the cooldown range last before the command; a discovery
	// script makes the job elastic with --min-np = -np (Run's defaults).
	c, err = ParseArgs([]string{"-np", "3", "--host-discovery-script", "d", "--slots", "2", "--blacklist-cooldown-range=1", "1", "cmd"})
	if err != nil || c.SlotsPerHost != 2 || c.BlacklistCooldown != (CooldownRange{time.Second, time.Second}) || !slices.Equal(c.Command, []string{"cmd"}) {
		t.Errorf("ParseArgs = %+v, %v", c, err)
	}
	if d := c.withDefaults(); d.MinNP != 3 || !d.elastic() {
		t.Errorf("discovery script: MinNP %d, elastic %v; want -np and elastic", d.MinNP, d.elastic())
	}
	// -H with --min-np is driven; --min-np alone is not (the shared daemon).
	c, err = ParseArgs([]string{"-np", "2", "--min-np", "1", "-H", "a:2,b:2", "--blacklist-cooldown-range", "5", "60", "--max-np", "4", "cmd"})
	if err != nil || !c.driven() || c.MaxNP != 4 {
		t.Errorf("-H with --min-np: %+v, %v", c, err)
	}
	if c, err := ParseArgs([]string{"-np", "2", "--min-np", "1", "cmd"}); err != nil || c.driven() {
		t.Errorf("--min-np alone: driven %v, %v", c.driven(), err)
	}
	for _, tt := range []struct {
		args    string
		wantErr string
	}{
		{"--blacklist-cooldown-range 10 -- cmd", "--blacklist-cooldown-range takes two whole numbers of seconds, MIN MAX"},
		{"--blacklist-cooldown-range 10", "takes two whole numbers"},
		{"--blacklist-cooldown-range x 10 cmd", "takes two whole numbers"},
		{"--blacklist-cooldown-range 0 10 cmd", "Provided cooldown lower limit: 0 cannot be lower than default cooldown lower limit: 1"},
		{"--blacklist-cooldown-range 10 3601 cmd", "Provided cooldown upper limit: 3601 cannot be higher than default cooldown upper limit: 3600"},
		{"--blacklist-cooldown-range 20 10 cmd", "MIN is above MAX"},
		{"-H a:2 --host-discovery-script d cmd", "both name the hosts; pass one of them"},
		{"--hostfile " + hf + " --host-discovery-script d cmd", "both name the hosts"},
		{"--min-np 1 -H a:2 --slots-per-host 2 cmd", "give every host's slots as HOST:SLOTS"},
		{"--max-np 4 cmd", "--max-np applies to elastic jobs"},
		{"--min-np 1 --max-np 4 cmd", "--max-np needs hosts for the job to grow on"},
		{"--host-discovery-script d --max-np 1 cmd", "--max-np 1 is less than -np 2"},
		{"--max-np -1 cmd", "must not be negative"},
		{"--min-np 1 --blacklist-cooldown-range 1 2 cmd", "--blacklist-cooldown-range applies to elastic jobs on hosts"},
		{"--host-discovery-script d --backend mpi cmd", "drop --backend mpi"},
		{"--host-discovery-script d --min-np 3 cmd", "--min-np 3 must be between 1 and -np 2"},
		{"-H a:1 --min-np 1 cmd", "-np 2 is more than the 1 slots"},
	} {
		_, err := ParseArgs(append([]string{"-np", "2"}, strings.Fields(tt.args)...))
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("ParseArgs(%s) = %v, want an error containing %q", tt.args, err, tt.wantErr)
		}
	}
	if err := (&Config{NP: 2, Command: []string{"x"}, HostDiscoveryScript: "d", ElasticTimeout: time.Second, ResetLimit: 1}).validate(); err != nil {
		t.Errorf("--reset-limit and --elastic-timeout with a discovery script: %v", err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
