package launch

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// torchNames are the variables torchVars sets.
var torchNames = append(slices.Clone(torchRankVars), "MASTER_ADDR", "MASTER_PORT")

// TestTorchVars checks torch.distributed's variables in the ranks' rank
// variables: the rank's place as torchrun gives it, where rank 0's store
// listens, and the user's own values left alone. Not parallel: it sets
// variables in our environment.
func TestTorchVars(t *testing.T) {
	for _, name := range torchNames {
		t.Setenv(name, "") // restored at the end
		os.Unsetenv(name)
	}
	remote := func(string) bool { return false }
	tests := []struct {
		name  string
		cfg   Config
		osEnv []string // NAME=VALUE set in our environment
		node  int
		local int
		want  []string // MASTER_PORT=* is any port
	}{{
		name:  "one machine",
		cfg:   Config{NP: 3},
		node:  0,
		local: 2,
		want: []string{"RANK=2", "WORLD_SIZE=3", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=3", "GROUP_RANK=0",
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT=*"},
	}, {
		name:  "user's values in Config.Env",
		cfg:   Config{NP: 2, Env: []string{"RANK=7", "MASTER_PORT=1234", "OTHER=1"}},
		node:  0,
		local: 1,
		want:  []string{"WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "GROUP_RANK=0", "MASTER_ADDR=127.0.0.1"},
	}, {
		name:  "user's values in our environment",
		cfg:   Config{NP: 2},
		osEnv: []string{"LOCAL_RANK=5", "MASTER_ADDR=10.0.0.1", "MASTER_PORT=2345"},
		node:  0,
		local: 0,
		want:  []string{"RANK=0", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2", "GROUP_RANK=0"},
	}, {
		name: "hosts, node 0 another machine",
		cfg: Config{NP: 5, Hosts: []Host{{Name: "h0", Slots: 2}, {Name: "h1", Slots: 3}},
			RendezvousPort: 4000, HvddPath: "hvdd", localHost: remote},
		node:  1,
		local: 1,
		want: []string{"RANK=3", "WORLD_SIZE=5", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=3", "GROUP_RANK=1",
			"MASTER_ADDR=h0", "MASTER_PORT=4001"},
	}, {
		name: "hosts, node 0 this machine",
		cfg: Config{NP: 3, Hosts: []Host{{Name: "127.0.0.1", Slots: 1}, {Name: "h1", Slots: 2}},
			HvddPath: "hvdd", localHost: func(h string) bool { return h == "127.0.0.1" }},
		node:  0,
		local: 0,
		want: []string{"RANK=0", "WORLD_SIZE=3", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "GROUP_RANK=0",
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT=*"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, kv := range tt.osEnv {
				name, val, _ := strings.Cut(kv, "=")
				t.Setenv(name, val)
			}
			j, code, err := newJob(&tt.cfg)
			if err != nil {
				t.Fatalf("newJob = %d, %v", code, err)
			}
			got := torchOnly(j.rankEnv(tt.node, tt.local))
			if !matchVars(got, tt.want) {
				t.Errorf("torch variables = %q, want %q", got, tt.want)
			}
			if j.shared() || j.nodes[0].Local {
				if p := j.torchMaster[1]; p != "" && strings.HasSuffix(j.rendezvous, ":"+p) {
					t.Errorf("MASTER_PORT %s is the rendezvous port (%s)", p, j.rendezvous)
				}
			}
		})
	}
}

// TestTorchVarsElastic checks an elastic rank not yet assigned (rank and
// size unknown): only what is known, and no MASTER_ADDR or MASTER_PORT in a
// job the elastic driver runs.
func TestTorchVarsElastic(t *testing.T) {
	for _, name := range torchNames {
		t.Setenv(name, "")
		os.Unsetenv(name)
	}
	j := &job{cfg: &Config{}, nodes: []node{{Host: "h0"}, {Host: "h1"}}}
	got := j.torchVars(1, slotInfo{rank: -1, size: -1, local: 0, localSize: 2, cross: -1, crossSize: -1})
	want := []string{"LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "GROUP_RANK=1"}
	if !slices.Equal(got, want) {
		t.Errorf("torchVars = %q, want %q", got, want)
	}
}

// torchOnly is env's entries of torch's variables.
func torchOnly(env []string) []string {
	var got []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if slices.Contains(torchNames, name) {
			got = append(got, kv)
		}
	}
	return got
}

// matchVars reports whether got is want, where "MASTER_PORT=*" matches
// any valid port.
func matchVars(got, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	for k := range got {
		if want[k] == "MASTER_PORT=*" {
			p, err := strconv.Atoi(strings.TrimPrefix(got[k], "MASTER_PORT="))
			if !strings.HasPrefix(got[k], "MASTER_PORT=") || err != nil || p <= 0 || p > 65535 {
				return false
			}
			continue
		}
		if got[k] != want[k] {
			return false
		}
	}
	return true
}
