package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

const tableHeader = "#       bytes        count     dtype   iters    median_us       min_us       max_us  algbw_GB/s  busbw_GB/s  check"

// printer writes rows as a table or as JSON lines; only rank 0's prints.
type printer struct {
	cfg Config
	w   io.Writer
	on  bool
}

func newPrinter(cfg Config, w io.Writer, on bool) *printer {
	return &printer{cfg: cfg, w: w, on: on}
}

// header prints comment lines before the table (not in JSON mode).
func (p *printer) header(lines ...string) {
	if !p.on || p.cfg.JSON {
		return
	}
	fmt.Fprintln(p.w, strings.Join(lines, "\n"))
}

// row prints one sweep row.
func (p *printer) row(r Row) {
	if !p.on {
		return
	}
	if p.cfg.JSON {
		p.json(r)
		return
	}
	fmt.Fprintf(p.w, "%13d %12d %9s %7d %12.2f %12.2f %12.2f %11.3f %11.3f  %s\n",
		r.Bytes, r.Count, r.DType, r.Iters, r.MedianUS, r.MinUS, r.MaxUS, r.AlgBW, r.BusBW, r.Check)
}

// json prints r as one line of JSON.
func (p *printer) json(r Row) {
	if !p.on {
		return
	}
	b, err := json.Marshal(r)
	if err != nil {
		panic(err) // Row always marshals
	}
	fmt.Fprintf(p.w, "%s\n", b)
}

// text prints a line as is (not in JSON mode).
func (p *printer) text(format string, args ...any) {
	if !p.on || p.cfg.JSON {
		return
	}
	fmt.Fprintf(p.w, format, args...)
}
