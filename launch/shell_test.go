package launch

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"plain":          "plain",
		"/usr/bin/x-1.2": "/usr/bin/x-1.2",
		"A=b,c:d@e%f+g":  "A=b,c:d@e%f+g",
		"":               "''",
		"two words":      "'two words'",
		"it's":           `'it'\''s'`,
		"$HOME":          "'$HOME'",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestShellQuoteRoundTrip passes words through sh -c, and through sh -c
// twice (as the agent does), and checks that sh sees them unchanged.
func TestShellQuoteRoundTrip(t *testing.T) {
	words := []string{
		"plain", "", " ", "two words", "it's", `"double"`, `back\slash`, "$HOME", "${x:-y}", "`id`", "$(id)",
		"a;b", "a&&b", "a|b", "<in", ">out", "*", "?", "[a]", "~", "#hash", "!bang", "tab\there",
		"new\nline", "'", "''", `'\''`, "é ü 日本", "-n", "--", "x=1", "%s\n",
	}
	script := `for a in "$@"; do printf '%s\0' "$a"; done`
	check := func(name string, cmd *exec.Cmd) {
		t.Helper()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got := strings.Split(string(out), "\x00")
		got = got[:len(got)-1]
		if !slices.Equal(got, words) {
			t.Errorf("%s: sh saw %q, want %q", name, got, words)
		}
	}
	line := shellQuote(script) + " x " + shellJoin(words)
	check("once", exec.Command("sh", "-c", "sh -c "+line))
	// The agent's way: the remote login shell gets "sh -c QUOTED", and sh
	// runs the script.
	check("twice", exec.Command("sh", "-c", "sh -c "+shellQuote("sh -c "+line)))
}
