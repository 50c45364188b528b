package deptest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// module is hvdd's module path (go.mod).
const module = "github.com/hvdd/hvdd"

// dep is one package in a build, as go list describes it.
type dep struct {
	path     string
	standard bool
	cgoFiles int
}

// goBin returns the go command: the one on $PATH, else the one of the
// toolchain that built this test.
func goBin(t *testing.T) string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no go command on $PATH or in %s", filepath.Dir(p))
	}
	return p
}

// deps lists pkg (a path inside the module) and every package its build
// imports, directly or not, built with tags (comma-separated, or empty) and
// with env added to the go command's environment.
func deps(t *testing.T, pkg, tags string, env ...string) []dep {
	t.Helper()
	cmd := exec.Command(goBin(t), "list", "-deps", "-tags", tags, "-f", "{{.ImportPath}} {{.Standard}} {{len .CgoFiles}}", module+"/"+pkg)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr.Bytes())
	}
	var ds []dep
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var d dep
		if _, err := fmt.Sscanf(line, "%s %t %d", &d.path, &d.standard, &d.cgoFiles); err != nil {
			t.Fatalf("go list -deps %s: line %q: %v", pkg, line, err)
		}
		ds = append(ds, d)
	}
	if len(ds) == 0 || ds[len(ds)-1].path != module+"/"+pkg {
		t.Fatalf("go list -deps %s did not list the package itself:\n%s", pkg, out)
	}
	return ds
}

// inside reports whether path is the module package rel or lies below it.
func inside(path, rel string) bool {
	p := module + "/" + rel
	return path == p || strings.HasPrefix(path, p+"/")
}

func TestDeps(t *testing.T) {
	tests := []struct {
		pkgs []string
		env  []string
		rule string
		// bad reports whether d breaks the rule.
		bad func(d dep) bool
	}{
		{
			pkgs: []string{"daemon/plan"},
			rule: "imports only tensor and the standard library",
			bad: func(d dep) bool {
				return !d.standard && d.path != module+"/tensor" && d.path != module+"/daemon/plan"
			},
		},
		{
			pkgs: []string{"daemon/autotune"},
			rule: "imports nothing from hvdd",
			bad: func(d dep) bool {
				return strings.HasPrefix(d.path, module+"/") && d.path != module+"/daemon/autotune"
			},
		},
		{
			pkgs: []string{"tensor", "shm", "ipc"},
			rule: "imports nothing of the daemon or the backends",
			bad:  func(d dep) bool { return inside(d.path, "daemon") || inside(d.path, "backends") },
		},
		{
			// The metrics read no daemon state: the daemon counts into them.
			pkgs: []string{"daemon/metrics"},
			rule: "imports only tensor and ipc/ipcpb of hvdd",
			bad: func(d dep) bool {
				return strings.HasPrefix(d.path, module+"/") && d.path != module+"/daemon/metrics" &&
					d.path != module+"/tensor" && d.path != module+"/ipc/ipcpb"
			},
		},
		{
			pkgs: []string{"auth"},
			rule: "imports nothing from hvdd",
			bad:  func(d dep) bool { return strings.HasPrefix(d.path, module+"/") && d.path != module+"/auth" },
		},
		{
			// The seam of the GPU path: the daemon and both drivers
			// (gpu/cuda, gpu/fake) import it, it imports neither.
			pkgs: []string{"gpu"},
			rule: "imports only tensor and the standard library",
			bad: func(d dep) bool {
				return !d.standard && d.path != module+"/tensor" && d.path != module+"/gpu"
			},
		},
		{
			// The engines take the gpu seam's interfaces: the caller picks
			// the binding (gpu/cuda on a GPU machine, gpu/fake in tests),
			// so an engine builds and runs its conformance suite on both.
			pkgs: []string{"backends", "backends/nccl", "backends/devicetest", "backends/tcp"},
			rule: "imports neither gpu binding (gpu/cuda, gpu/fake)",
			bad:  func(d dep) bool { return inside(d.path, "gpu/cuda") || inside(d.path, "gpu/fake") },
		},
		{
			// Discovery and the sampler stand alone on go-nvml (built
			// with cgo, so that its binding is in the list: without cgo
			// gpu/nvml imports no go-nvml, TestDepsWithoutCgo).
			pkgs: []string{"gpu/nvml"},
			env:  []string{"CGO_ENABLED=1"},
			rule: "imports nothing from hvdd, and outside the standard library only github.com/NVIDIA/go-nvml",
			bad: func(d dep) bool {
				return !d.standard && d.path != module+"/gpu/nvml" && !strings.HasPrefix(d.path, goNVML+"/")
			},
		},
		{
			// CGO_ENABLED=1 so that cgo files count even where the
			// default has cgo off (no C compiler).
			pkgs: []string{"cmd/hvdd"},
			env:  []string{"CGO_ENABLED=1"},
			rule: "builds (without the mpi tag) no cgo outside the standard library but the dlopen loaders (" + strings.Join(cgoAllowed, ", ") + ")",
			bad:  badCgo,
		},
	}
	for _, tc := range tests {
		for _, pkg := range tc.pkgs {
			t.Run(pkg, func(t *testing.T) {
				for _, d := range deps(t, pkg, "", tc.env...) {
					if !tc.bad(d) {
						continue
					}
					what := d.path
					if d.cgoFiles > 0 {
						what += fmt.Sprintf(" (%d cgo files)", d.cgoFiles)
					}
					t.Errorf("%s %s, but its build pulls in %s", pkg, tc.rule, what)
				}
			})
		}
	}
}

// cgoAllowed lists the modules whose cgo the default build may compile:
// they link no library at build time and load theirs with dlopen at run
// time, so the binary builds without CUDA and runs without a GPU. purego,
// whose cgo files build only with CGO_ENABLED=1, loads libcuda.so.1 and
// libnccl.so.2 (gpu/cuda); go-nvml (gpu/nvml) compiles against its own
// copy of nvml.h, leaves NVML's symbols unresolved at link time and
// dlopens libnvidia-ml.so.1 (RTLD_GLOBAL) when NVML is initialised.
var cgoAllowed = []string{"github.com/ebitengine/purego", goNVML}

// goNVML is NVIDIA's NVML binding, gpu/nvml's one dependency.
const goNVML = "github.com/NVIDIA/go-nvml"

// badCgo reports whether d is cgo that the default build must not
// compile: cgo outside the standard library and cgoAllowed.
func badCgo(d dep) bool {
	if d.standard || d.cgoFiles == 0 {
		return false
	}
	for _, m := range cgoAllowed {
		if d.path == m || strings.HasPrefix(d.path, m+"/") {
			return false
		}
	}
	return true
}

// TestDepsSeesCgo checks that the cgo rule can fail: with the mpi tag,
// cmd/hvdd's build compiles cgo (backends/mpi's) that the rule forbids,
// and without it every allowance is used (the build does compile purego's
// cgo and go-nvml's), so none is stale.
func TestDepsSeesCgo(t *testing.T) {
	var forbidden []string
	for _, d := range deps(t, "cmd/hvdd", "mpi", "CGO_ENABLED=1") {
		if badCgo(d) {
			forbidden = append(forbidden, d.path)
		}
	}
	if len(forbidden) == 0 {
		t.Error("the cgo rule finds nothing wrong with cmd/hvdd built with -tags mpi; it checks nothing")
	}
	used := map[string]bool{}
	for _, d := range deps(t, "cmd/hvdd", "", "CGO_ENABLED=1") {
		for _, m := range cgoAllowed {
			if d.cgoFiles > 0 && (d.path == m || strings.HasPrefix(d.path, m+"/")) {
				used[m] = true
			}
		}
	}
	for _, m := range cgoAllowed {
		if !used[m] {
			t.Errorf("cmd/hvdd's default build compiles none of %s's cgo; drop it from cgoAllowed if it is no longer used", m)
		}
	}
}

// TestDepsWithoutCgo checks that cmd/hvdd builds with CGO_ENABLED=0: it
// still has gpu/nvml (whose build-tagged nocgo.go says that discovery
// needs cgo) and the CUDA driver's binding (gpu/cuda, through purego), and
// none of go-nvml, which is cgo and would not compile.
func TestDepsWithoutCgo(t *testing.T) {
	have := map[string]bool{}
	for _, d := range deps(t, "cmd/hvdd", "", "CGO_ENABLED=0") {
		if d.cgoFiles > 0 && !d.standard {
			t.Errorf("cmd/hvdd built with CGO_ENABLED=0 compiles cgo of %s", d.path)
		}
		if strings.HasPrefix(d.path, goNVML+"/") {
			t.Errorf("cmd/hvdd built with CGO_ENABLED=0 imports %s (cgo only: a file of gpu/nvml without the cgo build tag imports it)", d.path)
		}
		have[d.path] = true
	}
	for _, p := range []string{"/gpu/nvml", "/gpu/cuda"} {
		if !have[module+p] {
			t.Errorf("cmd/hvdd built with CGO_ENABLED=0 has no %s", module+p)
		}
	}
}
