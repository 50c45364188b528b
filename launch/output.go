package launch

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// output serialises every write to the job's stdout and stderr, so that
// lines from different ranks (and from the daemon and Run itself) never
// interleave, even when Stdout and Stderr are the same writer.
type output struct {
	// mu guards writes to both writers.
	mu     sync.Mutex
	stdout io.Writer
	stderr io.Writer
	// verbose turns on verbosef (Config.Verbose).
	verbose bool
}

func (o *output) write(w io.Writer, p []byte) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, err := w.Write(p)
	return err
}

// logf writes one "hvdd run: " message line to stderr.
func (o *output) logf(format string, args ...any) {
	msg := fmt.Sprintf("hvdd run: "+format, args...)
	if !strings.HasSuffix(msg, "\n") {
		msg += "\n"
	}
	o.write(o.stderr, []byte(msg))
}

// verbosef is logf when Config.Verbose is set.
func (o *output) verbosef(format string, args ...any) {
	if o.verbose {
		o.logf(format, args...)
	}
}

// lockedWriter is an io.Writer that writes through output's lock, used for
// untagged output that is not an *os.File.
type lockedWriter struct {
	o *output
	w io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	if err := l.o.write(l.w, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// lineWriter prefixes every line written to it and passes only whole lines
// on, so that a line is written with one Write under output's lock. A line
// longer than max bytes (newline excluded) is passed on in max-sized pieces,
// each ending in a newline of its own, rather than buffered without bound. Write and Flush must not
// be called concurrently (os/exec copies each pipe from one goroutine).
type lineWriter struct {
	o      *output
	w      io.Writer
	prefix []byte
	max    int
	tail   *tailBuffer // if non-nil, also receives the untagged bytes
	// file, if non-nil, also receives the tagged lines (a rank's
	// --output-filename file); it is written outside output's lock.
	file io.Writer
	// stamp puts the local time before every line's prefix, as
	// horovodrun --prefix-output-with-timestamp does (time.asctime).
	stamp bool
	// drop, if non-nil, sees every line (with its newline, if any) before
	// it is written, and returns true to leave it out.
	drop func(line []byte) bool

	buf []byte // the current incomplete line
	out []byte // scratch: the tagged lines of one Write
}

func newLineWriter(o *output, w io.Writer, prefix string, max int) *lineWriter {
	return &lineWriter{o: o, w: w, prefix: []byte(prefix), max: max}
}

func (lw *lineWriter) Write(p []byte) (int, error) {
	n := len(p)
	if lw.tail != nil {
		lw.tail.Write(p)
	}
	out := lw.out[:0]
	for len(p) > 0 {
		if len(lw.buf) == lw.max {
			// A full piece of a long line, held back until we see whether
			// the line ends right after it, so as not to emit an empty
			// line for that newline.
			if p[0] == '\n' {
				p = p[1:]
			}
			out = lw.appendLine(out, lw.buf)
			lw.buf = lw.buf[:0]
			continue
		}
		room := lw.max - len(lw.buf)
		if nl := bytes.IndexByte(p, '\n'); nl >= 0 && nl <= room {
			line := p[:nl+1]
			p = p[nl+1:]
			if len(lw.buf) == 0 {
				out = lw.appendLine(out, line) // the common case: no copy into buf
				continue
			}
			lw.buf = append(lw.buf, line...)
			out = lw.appendLine(out, lw.buf)
			lw.buf = lw.buf[:0]
			continue
		}
		k := min(len(p), room)
		lw.buf = append(lw.buf, p[:k]...)
		p = p[k:]
	}
	lw.out = out[:0]
	if cap(out) > 4*lw.max {
		lw.out = nil // don't keep a huge scratch buffer alive
	}
	if len(out) > 0 {
		if err := lw.emit(out); err != nil {
			return n, err
		}
	}
	return n, nil
}

// emit writes tagged lines to the job's writer and to the file, if any.
func (lw *lineWriter) emit(out []byte) error {
	err := lw.o.write(lw.w, out)
	if lw.file != nil {
		if _, ferr := lw.file.Write(out); err == nil {
			err = ferr
		}
	}
	return err
}

// Flush writes out a final line that had no newline, adding one.
func (lw *lineWriter) Flush() error {
	if len(lw.buf) == 0 {
		return nil
	}
	out := lw.appendLine(nil, lw.buf)
	lw.buf = lw.buf[:0]
	return lw.emit(out)
}

func (lw *lineWriter) appendLine(out, line []byte) []byte {
	if lw.drop != nil && lw.drop(line) {
		return out
	}
	if lw.stamp {
		// Python's time.asctime(), which horovodrun puts there.
		out = time.Now().AppendFormat(out, time.ANSIC)
	}
	out = append(out, lw.prefix...)
	out = append(out, line...)
	if line[len(line)-1] != '\n' {
		out = append(out, '\n')
	}
	return out
}

// tailBuffer keeps the last bytes written to it, to quote a daemon's last
// output lines in an error message. It is safe for concurrent use.
type tailBuffer struct {
	mu  sync.Mutex // guards buf
	buf []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// lines returns up to n of the last complete or partial lines, each
// indented for inclusion in a multi-line error, or "(no output)".
func (t *tailBuffer) lines(n int) string {
	t.mu.Lock()
	s := string(t.buf)
	full := len(t.buf) < t.max
	t.mu.Unlock()
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if !full && len(ls) > 1 {
		ls = ls[1:] // the first line was cut
	}
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	if len(ls) == 1 && strings.TrimSpace(ls[0]) == "" {
		return "\t(no output)"
	}
	return "\t" + strings.Join(ls, "\n\t")
}
