package launch

import (
	"bytes"
	"strings"
	"testing"
)

func TestLineWriter(t *testing.T) {
	tests := []struct {
		name   string
		writes []string
		max    int
		want   string // after Flush
	}{
		{"one line", []string{"a\n"}, 8, "P:a\n"},
		{"lines in one write", []string{"a\nb\nc\n"}, 8, "P:a\nP:b\nP:c\n"},
		{"line across writes", []string{"ab", "c", "d\ne"}, 8, "P:abcd\nP:e\n"},
		{"empty line", []string{"\n\n"}, 8, "P:\nP:\n"},
		{"partial flushed", []string{"x\nyz"}, 8, "P:x\nP:yz\n"},
		{"exactly max with newline", []string{"1234\n"}, 5, "P:1234\n"},
		{"long line split", []string{"12345678901\n"}, 4, "P:1234\nP:5678\nP:901\n"},
		{"long line split across writes", []string{"12", "3456", "78\n"}, 4, "P:1234\nP:5678\n"},
		{"newline right after split", []string{"1234", "\n"}, 4, "P:1234\n"},
		{"max bytes then newline", []string{"1234\n5"}, 4, "P:1234\nP:5\n"},
		{"full piece flushed", []string{"12345678"}, 4, "P:1234\nP:5678\n"},
		{"nothing", nil, 4, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			lw := newLineWriter(&output{}, &b, "P:", tt.max)
			for _, w := range tt.writes {
				if n, err := lw.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", w, n, err)
				}
			}
			if err := lw.Flush(); err != nil {
				t.Fatal(err)
			}
			if b.String() != tt.want {
				t.Errorf("got %q, want %q", b.String(), tt.want)
			}
		})
	}
}

// TestLineWriterWholeLinesPerWrite checks that each Write to the
// destination holds whole lines only.
func TestLineWriterWholeLinesPerWrite(t *testing.T) {
	var rec recorder
	lw := newLineWriter(&output{}, &rec, "[0]", 16)
	for _, w := range []string{"ab", "c\nde", "f\n", strings.Repeat("z", 40), "\n"} {
		lw.Write([]byte(w))
	}
	lw.Flush()
	for _, w := range rec.writes {
		if !strings.HasSuffix(w, "\n") {
			t.Errorf("write %q does not end a line", w)
		}
		for _, l := range strings.SplitAfter(w, "\n") {
			if l != "" && !strings.HasPrefix(l, "[0]") {
				t.Errorf("write %q holds an untagged line %q", w, l)
			}
		}
	}
}

type recorder struct{ writes []string }

func (r *recorder) Write(p []byte) (int, error) {
	r.writes = append(r.writes, string(p))
	return len(p), nil
}

func TestTailBuffer(t *testing.T) {
	tests := []struct {
		name   string
		writes []string
		max, n int
		want   string
	}{
		{"empty", nil, 64, 3, "\t(no output)"},
		{"few lines", []string{"a\nb\n"}, 64, 3, "\ta\n\tb"},
		{"last n", []string{"a\nb\nc\nd\n"}, 64, 2, "\tc\n\td"},
		{"partial last line", []string{"a\nb"}, 64, 3, "\ta\n\tb"},
		{"cut first line dropped", []string{"xxxxxxxx\nyy\nzz\n"}, 8, 5, "\tyy\n\tzz"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := &tailBuffer{max: tt.max}
			for _, w := range tt.writes {
				tb.Write([]byte(w))
			}
			if got := tb.lines(tt.n); got != tt.want {
				t.Errorf("lines(%d) = %q, want %q", tt.n, got, tt.want)
			}
		})
	}
}
