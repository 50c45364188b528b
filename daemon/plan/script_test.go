package plan

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/hvdd/hvdd/tensor"
)

// The script tests replay testdata/*.txt, raft-interaction style. A file is a
// sequence of blocks:
//
//	# comments and blank lines
//	command key=value ...
//	----
//	expected output, one or more lines, ended by a blank line or EOF
//
// Run with -rewrite to regenerate the expected output. Commands:
//
//	config size=N [fusion=BYTES] [lookahead=K]
//	set id=N ranks=R,R,...           AddProcessSet
//	rmset id=N                        RemoveProcessSet (prints what it aborted)
//	submit rank=R|ranks=R,R,... name=NAME [op=allreduce] [dtype=float32]
//	       [shape=D,D,...] [set=N] [reduce=average] [pre=1] [post=1]
//	       [root=R] [splits=S,S,...] [group=KEY gsize=N] [t=TIME]
//	                                  with ranks=, a value may hold one
//	                                  alternative per rank separated by "|"
//	join rank=R|ranks=R,... [t=TIME]
//	ready                             Ready(), one response per line
//	stalls now=T older=D              Stalls(now, older), one per line
//	warn now=T older=D seconds=N [stalled=R,.. shutdown=N]   StallMessage
//	abort                             AbortAll()
//	joined                            Joined()
var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata/*.txt")

func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no scripts in testdata")
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScript(t, f) })
	}
}

type block struct {
	pre      string // comments and blank lines before the command, verbatim
	cmd      string
	line     int
	expected string
}

func parseScript(t *testing.T, path string) (blocks []block, trailer string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var pre strings.Builder
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			pre.WriteString(l + "\n")
			continue
		}
		b := block{pre: pre.String(), cmd: l, line: i + 1}
		pre.Reset()
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("%s:%d: command without ---- line", path, i+1)
		}
		i += 2
		var exp []string
		for ; i < len(lines) && lines[i] != ""; i++ {
			exp = append(exp, lines[i])
		}
		i-- // the blank line (or EOF) goes to the next block's pre
		b.expected = strings.Join(exp, "\n")
		blocks = append(blocks, b)
	}
	return blocks, pre.String()
}

func runScript(t *testing.T, path string) {
	blocks, trailer := parseScript(t, path)
	var tbl *Table
	var out strings.Builder
	for _, b := range blocks {
		got := runCommand(t, &tbl, b.cmd)
		if got == "" {
			got = "ok"
		}
		if *rewrite {
			fmt.Fprintf(&out, "%s%s\n----\n%s\n", b.pre, b.cmd, got)
			continue
		}
		if got != b.expected {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", path, b.line, b.cmd, got, b.expected)
		}
	}
	if *rewrite {
		out.WriteString(trailer)
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// args is a parsed command line.
type args map[string]string

func parseArgs(t *testing.T, fields []string) args {
	a := args{}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			t.Fatalf("argument %q is not key=value", f)
		}
		a[k] = v
	}
	return a
}

func (a args) int(t *testing.T, k string, def int) int {
	v, ok := a[k]
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", k, v, err)
	}
	return n
}

func (a args) ints(t *testing.T, k string) []int {
	v := a[k]
	if v == "" {
		return nil
	}
	var out []int
	for _, s := range strings.Split(v, ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("%s=%q: %v", k, v, err)
		}
		out = append(out, n)
	}
	return out
}

// alt returns the i-th "|" alternative of a's value for k.
func (a args) alt(k string, i int, def string) string {
	v, ok := a[k]
	if !ok {
		return def
	}
	alts := strings.Split(v, "|")
	if len(alts) == 1 {
		return v
	}
	return alts[i]
}

func runCommand(t *testing.T, tbl **Table, line string) string {
	fields := strings.Fields(line)
	cmd, a := fields[0], parseArgs(t, fields[1:])
	if cmd != "config" && *tbl == nil {
		t.Fatalf("%q before config", line)
	}
	var out []string
	switch cmd {
	case "config":
		var err error
		*tbl, err = New(Config{Size: a.int(t, "size", 1), FusionThreshold: int64(a.int(t, "fusion", 0)), LookAhead: a.int(t, "lookahead", 0)})
		if err != nil {
			return "error: " + err.Error()
		}
	case "set":
		if err := (*tbl).AddProcessSet(int32(a.int(t, "id", 0)), a.ints(t, "ranks")); err != nil {
			return "error: " + err.Error()
		}
	case "rmset":
		ab, err := (*tbl).RemoveProcessSet(int32(a.int(t, "id", 0)))
		if err != nil {
			return "error: " + err.Error()
		}
		for _, x := range ab {
			out = append(out, "aborted "+x.String())
		}
	case "submit", "join":
		ranks := a.ints(t, "ranks")
		if r, ok := a["rank"]; ok {
			n, _ := strconv.Atoi(r)
			ranks = []int{n}
		}
		for i, r := range ranks {
			req := buildRequest(t, a, i, r)
			if cmd == "join" {
				req = Request{Rank: r, Op: tensor.Join}
			}
			if err := (*tbl).Submit(req, int64(a.int(t, "t", 0))); err != nil {
				out = append(out, fmt.Sprintf("rank %d: error: %v", r, err))
			}
		}
	case "ready":
		for _, r := range (*tbl).Ready() {
			out = append(out, r.String())
		}
		if len(out) == 0 {
			out = append(out, "(none)")
		}
	case "stalls":
		for _, s := range (*tbl).Stalls(int64(a.int(t, "now", 0)), int64(a.int(t, "older", 0))) {
			out = append(out, s.String())
		}
		if len(out) == 0 {
			out = append(out, "(none)")
		}
	case "warn":
		s := (*tbl).Stalls(int64(a.int(t, "now", 0)), int64(a.int(t, "older", 0)))
		msg := StallMessage(s, StallOptions{
			WarnSeconds:     int64(a.int(t, "seconds", 60)),
			Stalled:         a.ints(t, "stalled"),
			ShutdownSeconds: int64(a.int(t, "shutdown", 0)),
		})
		if msg == "" {
			msg = "(none)"
		}
		out = append(out, msg)
	case "abort":
		for _, x := range (*tbl).AbortAll() {
			out = append(out, "aborted "+x.String())
		}
		if len(out) == 0 {
			out = append(out, "(none)")
		}
	case "joined":
		out = append(out, fmt.Sprint((*tbl).Joined()))
	default:
		t.Fatalf("unknown command %q", line)
	}
	return strings.Join(out, "\n")
}

func buildRequest(t *testing.T, a args, i, rank int) Request {
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	op, err := tensor.ParseOpType(a.alt("op", i, "allreduce"))
	must(err)
	dt := tensor.Invalid
	if s := a.alt("dtype", i, "float32"); s != "invalid" {
		dt, err = tensor.ParseDType(s)
		must(err)
	}
	ro, err := tensor.ParseReduceOp(a.alt("reduce", i, "average"))
	must(err)
	num := func(k, def string) float64 {
		f, err := strconv.ParseFloat(a.alt(k, i, def), 64)
		must(err)
		return f
	}
	integer := func(k, def string) int {
		n, err := strconv.Atoi(a.alt(k, i, def))
		must(err)
		return n
	}
	r := Request{
		Rank:       rank,
		ProcessSet: int32(integer("set", "0")),
		Name:       a.alt("name", i, ""),
		Op:         op,
		DType:      dt,
		ReduceOp:   ro,
		Prescale:   num("pre", "1"),
		Postscale:  num("post", "1"),
		Root:       integer("root", "0"),
		Group:      a.alt("group", i, ""),
		GroupSize:  integer("gsize", "0"),
	}
	if s := a.alt("shape", i, ""); s != "" {
		for _, d := range strings.Split(s, ",") {
			n, err := strconv.ParseInt(d, 10, 64)
			must(err)
			r.Shape = append(r.Shape, n)
		}
	}
	if s := a.alt("splits", i, ""); s != "" {
		for _, d := range strings.Split(s, ",") {
			n, err := strconv.ParseInt(d, 10, 32)
			must(err)
			r.Splits = append(r.Splits, int32(n))
		}
	}
	return r
}
