package launch

import "strings"

// shellQuote returns s as one word of a POSIX shell command line: unchanged
// when it holds only characters no shell treats specially, else in single
// quotes, where a single quote inside ends the quoted part, is escaped with a
// backslash, and starts a new one. The result is also one word
// for csh and fish login shells, as long as s has no newline.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool { return !shellSafe(r) }) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func shellSafe(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("@%+=:,./_-", r)
}

// shellJoin quotes every word and joins them with spaces.
func shellJoin(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = shellQuote(w)
	}
	return strings.Join(q, " ")
}
