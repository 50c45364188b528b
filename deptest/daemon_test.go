package deptest

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

// daemonLayers are the rules of the daemon's internal packages
// (daemon/doc.go): the Server (package daemon) wires them; loop and nodes
// are siblings that meet only at package job's seams; the executor serves
// both and imports neither, and its host path does not know the device
// path (which stages onto it); the core both paths share (exec/sched: the
// schedule of engine calls, the layouts) knows neither path nor any GPU
// library; job is the vocabulary and imports no sibling; poll is a leaf.
var daemonLayers = []struct {
	pkg    string
	denied []string // packages of the module it must not import, directly or not
}{
	{"daemon/internal/poll", []string{"daemon", "backends", "cluster", "gpu"}},
	{"daemon/internal/job", []string{"daemon/internal/loop", "daemon/internal/nodes", "daemon/internal/exec", "daemon/internal/poll"}},
	{"daemon/internal/exec", []string{"daemon/internal/loop", "daemon/internal/nodes", "backends/nccl"}},
	{"daemon/internal/exec/sched", []string{"daemon/internal/exec/host", "daemon/internal/exec/device", "daemon/internal/loop", "daemon/internal/nodes", "backends/nccl", "gpu/cuda"}},
	{"daemon/internal/exec/host", []string{"daemon/internal/exec/device", "daemon/internal/loop", "daemon/internal/nodes"}},
	{"daemon/internal/exec/device", []string{"daemon/internal/loop", "daemon/internal/nodes", "backends/nccl"}},
	{"daemon/internal/nodes", []string{"daemon/internal/loop", "daemon/internal/exec"}},
	{"daemon/internal/loop", []string{"daemon/internal/nodes"}},
}

// daemonDirect are rules on what a daemon package imports itself, where its
// build still pulls the package in through another: the loop hands work to
// the executor, which runs the host path, but names nothing of that path
// (the timeline's row and phase names it writes are package job's).
var daemonDirect = []struct {
	pkg    string
	denied []string // packages of the module it must not import itself
}{
	{"daemon/internal/loop", []string{"daemon/internal/exec/host"}},
}

// deniedBy returns the package of denied that path is or lies below, or "".
// Package daemon itself is denied alone, not its sub-packages (which the
// rules name one by one).
func deniedBy(path string, denied []string) string {
	for _, d := range denied {
		if d == "daemon" {
			if path == module+"/daemon" {
				return d
			}
			continue
		}
		if inside(path, d) {
			return d
		}
	}
	return ""
}

// TestDaemonLayers checks that no package of the daemon's imports, directly
// or through another, what its layer must not: package daemon (the Server)
// from any of them, and the rules of daemonLayers.
func TestDaemonLayers(t *testing.T) {
	for _, l := range daemonLayers {
		t.Run(l.pkg, func(t *testing.T) {
			denied := append([]string{"daemon"}, l.denied...)
			for _, d := range deps(t, l.pkg, "") {
				if by := deniedBy(d.path, denied); by != "" && !inside(d.path, l.pkg) {
					t.Errorf("%s must not import %s, but its build pulls in %s", l.pkg, by, d.path)
				}
			}
		})
	}
}

// TestDaemonLayersCover checks that every package under daemon/internal has
// a rule, so that a new one cannot slip past the layering.
func TestDaemonLayersCover(t *testing.T) {
	for _, d := range deps(t, "daemon", "") {
		if !inside(d.path, "daemon/internal") {
			continue
		}
		rel := strings.TrimPrefix(d.path, module+"/")
		found := false
		for _, l := range daemonLayers {
			if inside(d.path, l.pkg) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s has no rule in daemonLayers: say what it may not import", rel)
		}
	}
}

// TestDaemonDirectImports checks the rules of daemonDirect: no package
// there imports, in its own (non-test) files, what its rule denies.
func TestDaemonDirectImports(t *testing.T) {
	for _, l := range daemonDirect {
		t.Run(l.pkg, func(t *testing.T) {
			for _, imp := range imports(t, l.pkg) {
				if by := deniedBy(imp, l.denied); by != "" {
					t.Errorf("%s must not import %s itself, but it imports %s", l.pkg, by, imp)
				}
			}
		})
	}
}

// imports lists the packages that pkg (a path inside the module) imports
// in its own files, test files left out.
func imports(t *testing.T, pkg string) []string {
	t.Helper()
	cmd := exec.Command(goBin(t), "list", "-f", `{{join .Imports "\n"}}`, module+"/"+pkg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", pkg, err, stderr.Bytes())
	}
	return strings.Fields(string(out))
}
