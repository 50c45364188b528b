package autotune

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestPurity keeps the package a pure core, as the package doc promises: in
// its non-test files, no import that does I/O, synchronises or reaches
// global randomness, no reading of the clock (package time for its Duration
// type only: the caller passes the time), no go statement, and no
// package-level variable other than the Err sentinels.
func TestPurity(t *testing.T) {
	forbidden := []string{
		"os", "io", "net", "sync", "log", "syscall", "unsafe", "runtime",
		"math/rand", // v1: a global source; math/rand/v2 is allowed for *rand.Rand
		"crypto/rand", "context", "embed", "plugin", "C",
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			for _, bad := range forbidden {
				if path == bad || strings.HasPrefix(path, bad+"/") && !(bad == "math/rand" && path == "math/rand/v2") {
					t.Errorf("%s imports %q", name, path)
				}
			}
		}
		for _, decl := range f.Decls {
			g, ok := decl.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, spec := range g.Specs {
				for _, id := range spec.(*ast.ValueSpec).Names {
					if !strings.HasPrefix(id.Name, "Err") {
						t.Errorf("%s: package-level variable %s (global state)", fset.Position(id.Pos()), id.Name)
					}
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if g, ok := n.(*ast.GoStmt); ok {
				t.Errorf("%s: go statement", fset.Position(g.Pos()))
			}
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == "time" && sel.Sel.Name != "Duration" && sel.Sel.Name != "Microsecond" {
					t.Errorf("%s: time.%s (only the Duration type and its units: the caller keeps the clock)", fset.Position(sel.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
	if checked < 4 {
		t.Fatalf("checked %d files, want the package's (doc, linalg, gp, bayes, ...)", checked)
	}
}
