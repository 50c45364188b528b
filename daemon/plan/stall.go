package plan

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Stall is a tensor that some, but not all, ranks of its set have submitted.
type Stall struct {
	ProcessSet  int32  // the tensor's process set
	Name        string // the tensor's name
	Submitted   []int  // global ranks that submitted it, ascending
	Missing     []int  // global ranks that neither submitted it nor joined, ascending
	FirstSubmit int64  // logical time of the first submission
}

// Stalls returns the tensors that are still waiting for some ranks and whose
// first submission is more than olderThan before now (both in the caller's
// logical time unit), in submission order. It changes nothing: this is
// Horovod's stall inspector without the clock and the log.
func (t *Table) Stalls(now, olderThan int64) []Stall {
	var es []*entry
	for _, e := range t.entries {
		if !e.ready && now-e.first > olderThan {
			es = append(es, e)
		}
	}
	slices.SortFunc(es, func(a, b *entry) int { return cmpSeq(a.seq, b.seq) })
	out := make([]Stall, 0, len(es))
	for _, e := range es {
		s := Stall{ProcessSet: e.key.set, Name: e.key.name, Submitted: e.submitted(), FirstSubmit: e.first}
		for i, ok := range e.have {
			if r := e.set.ranks[i]; !ok && !t.joined[r] {
				s.Missing = append(s.Missing, r)
			}
		}
		out = append(out, s)
	}
	return out
}

// StallOptions tunes StallMessage.
type StallOptions struct {
	// WarnSeconds is the N of "for more than N seconds": the stall-check
	// time the caller used.
	WarnSeconds int64
	// Stalled are the ranks stalled beyond the shutdown time; they are
	// marked with "!" and the shutdown sentence is appended. Empty: a plain
	// warning.
	Stalled []int
	// ShutdownSeconds is the shutdown time named in the shutdown sentence.
	ShutdownSeconds int64
}

// stallNames is how many names StallMessage lists per rank before " ...".
const stallNames = 6

// StallMessage formats stalls as Horovod's stall inspector logs them:
//
//	One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and are waiting for remainder of ranks for more than 60 seconds. This may indicate ... which will cause deadlock.
//	Missing ranks:
//	1: [grad.0, grad.1]
//	3!: [grad.0]
//
// One line per missing rank, ascending; each lists up to six of the names it
// is missing, sorted, then " ..." if there are more. Names of sets other than
// 0 are qualified as "name (process set N)". It returns "" for no stalls.
func StallMessage(stalls []Stall, opts StallOptions) string {
	if len(stalls) == 0 {
		return ""
	}
	missing := make(map[int][]string)
	var ranks []int
	for _, s := range stalls {
		name := s.Name
		if s.ProcessSet > 0 { // a pair's (< 0) is named by its transfer
			name += " (process set " + strconv.Itoa(int(s.ProcessSet)) + ")"
		}
		for _, r := range s.Missing {
			if _, ok := missing[r]; !ok {
				ranks = append(ranks, r)
			}
			missing[r] = append(missing[r], name)
		}
	}
	slices.Sort(ranks)

	var b strings.Builder
	fmt.Fprintf(&b, msgStallWarningFormat, opts.WarnSeconds)
	b.WriteString("\nMissing ranks:")
	for _, r := range ranks {
		names := missing[r]
		slices.Sort(names)
		names = slices.Compact(names)
		fmt.Fprintf(&b, "\n%d", r)
		if slices.Contains(opts.Stalled, r) {
			b.WriteByte('!')
		}
		more := len(names) > stallNames
		if more {
			names = names[:stallNames]
		}
		b.WriteString(": [")
		b.WriteString(strings.Join(names, ", "))
		if more {
			b.WriteString(" ...")
		}
		b.WriteByte(']')
	}
	if len(opts.Stalled) > 0 {
		b.WriteByte('\n')
		fmt.Fprintf(&b, msgStallShutdownFormat, opts.ShutdownSeconds)
	}
	return b.String()
}
