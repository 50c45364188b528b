package launch

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"
)

// BuildInfo is what the caller of CheckBuild knows of the hvdd binary.
type BuildInfo struct {
	// Version is hvdd's version.
	Version string
	// MPI reports whether the binary was built with the MPI engine
	// (-tags mpi).
	MPI bool
	// Python is the interpreter whose hvdd client is checked. Empty means
	// python3, else python, looked up in $PATH.
	Python string
	// Verbose adds why a framework is missing (horovodrun --check-build
	// --verbose).
	Verbose bool
}

// frameworks are the framework modules of hvdd's Python client, in
// horovodrun's order (MXNet, which hvdd does not have, stays unchecked).
var frameworks = []struct{ name, module string }{
	{"TensorFlow", "hvdd.tensorflow"},
	{"PyTorch", "hvdd.torch"},
	{"MXNet", ""},
	{"Keras", "hvdd.keras"},
}

// probeScript imports each module named in argv and prints "MODULE ok" or
// "MODULE no REASON".
const probeScript = `
import importlib, sys
for m in sys.argv[1:]:
    try:
        importlib.import_module(m)
        print(m, "ok", flush=True)
    except BaseException as e:
        msg = (str(e).splitlines() or [""])[0]
        print(m, "no", type(e).__name__ + (": " + msg if msg else ""), flush=True)
`

// CheckBuild writes what this hvdd has, in the layout of horovodrun
// --check-build: the frameworks whose hvdd module imports in b.Python
// (which takes a few seconds: it imports the frameworks), the controllers
// and the tensor operations.
func CheckBuild(ctx context.Context, w io.Writer, b BuildInfo) error {
	mark := func(ok bool) string {
		if ok {
			return "X"
		}
		return " "
	}
	var out strings.Builder
	fmt.Fprintf(&out, "hvdd %s (Horovod's API through a per-node daemon):\n\n", b.Version)
	out.WriteString("Available Frameworks:\n")
	found, notes := probeFrameworks(ctx, b)
	for _, f := range frameworks {
		m, ok := found[f.module]
		switch {
		case f.module == "":
			m = " "
		case !ok:
			m = "?"
		default:
			m = mark(m == "ok")
		}
		fmt.Fprintf(&out, "    [%s] %s\n", m, f.name)
	}
	for _, n := range notes {
		fmt.Fprintf(&out, "    (%s)\n", n)
	}
	fmt.Fprintf(&out, `
Available Controllers:
    [%s] MPI (between the daemons: hvdd serve --backend mpi --control mpi)
    [ ] Gloo
    [X] hvdd (the node daemons; TCP links between hosts)

Available Tensor Operations:
    [ ] NCCL
    [ ] DDL
    [ ] CCL
    [%s] MPI (hvdd run --backend mpi)
    [ ] Gloo
    [X] hvdd (shared memory within a node; the tcp engine between hosts)
`, mark(b.MPI), mark(b.MPI))
	_, err := io.WriteString(w, out.String())
	return err
}

// probeFrameworks runs b.Python on probeScript. found maps a module to
// "ok" or "no"; a module missing from it was not checked. notes say with
// what, or why not.
func probeFrameworks(ctx context.Context, b BuildInfo) (found map[string]string, notes []string) {
	py := b.Python
	if py == "" {
		for _, name := range []string{"python3", "python"} {
			if p, err := exec.LookPath(name); err == nil {
				py = p
				break
			}
		}
	}
	if py == "" {
		return nil, []string{"not checked: no python3 or python in $PATH"}
	}
	var modules []string
	for _, f := range frameworks {
		if f.module != "" {
			modules = append(modules, f.module)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, append([]string{"-c", probeScript}, modules...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	found = map[string]string{}
	noClient := false
	sc := bufio.NewScanner(bytes.NewReader(stdout))
	for sc.Scan() {
		mod, rest, _ := strings.Cut(sc.Text(), " ")
		status, why, _ := strings.Cut(rest, " ")
		found[mod] = status
		noClient = noClient || strings.Contains(why, "No module named 'hvdd'")
		if status != "ok" && b.Verbose {
			notes = append(notes, mod+": "+why)
		}
	}
	if noClient {
		notes = append(notes, "hvdd's Python client is not importable by "+py+": install clients/python there (pip install), or set PYTHONPATH")
	}
	if err != nil && len(found) < len(modules) {
		tail, _, _ := strings.Cut(strings.TrimSpace(stderr.String()), "\n")
		return found, append(notes, fmt.Sprintf("%s failed: %v %s", py, err, tail))
	}
	notes = append(notes, "checked: hvdd's framework modules imported by "+py)
	return found, notes
}
