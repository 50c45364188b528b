package plan

import (
	"fmt"
	"strings"

	"github.com/hvdd/hvdd/tensor"
)

// String formats r on one line, stably, for logs and test traces:
//
//	ALLREDUCE set=0 float32 Sum bytes=96 tensors=[a b] joined=[2]
//	ALLGATHER set=0 float32 bytes=80 tensors=[g{[2, 3] [3, 3]}]
//	ALLTOALL set=0 int32 bytes=32 tensors=[t{[4] [4] splits [[2 2] [1 3]]}]
//	BROADCAST set=1 float32 root=2 bytes=16 tensors=[b]
//	ERROR ALLREDUCE set=0 tensors=[w] attr=dtype ranks=[1]: Mismatched data types: ...
//	JOIN last=2
func (r Response) String() string {
	var b strings.Builder
	if r.Err != nil {
		fmt.Fprintf(&b, "ERROR %s set=%d tensors=[%s] attr=%s ranks=%v: %s",
			r.Op, r.ProcessSet, names(r.Tensors), r.Err.Attr, r.Err.Ranks, r.Err.Msg)
		return b.String()
	}
	if r.Op == tensor.Join {
		return fmt.Sprintf("JOIN last=%d", r.LastJoinedRank)
	}
	fmt.Fprintf(&b, "%s set=%d", r.Op, r.ProcessSet)
	switch r.Op {
	case tensor.Allreduce, tensor.Reducescatter:
		fmt.Fprintf(&b, " %s %s", r.DType, r.ReduceOp)
		if r.Prescale != 1 || r.Postscale != 1 {
			fmt.Fprintf(&b, " pre=%s post=%s", fmtFloat(r.Prescale), fmtFloat(r.Postscale))
		}
	case tensor.Broadcast:
		fmt.Fprintf(&b, " %s root=%d", r.DType, r.Root)
	case tensor.Allgather, tensor.Alltoall:
		fmt.Fprintf(&b, " %s", r.DType)
	}
	if r.Op != tensor.Barrier {
		fmt.Fprintf(&b, " bytes=%d", r.Bytes)
	}
	b.WriteString(" tensors=[")
	for i, tn := range r.Tensors {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(tn.Name)
		if len(tn.RankShapes) > 0 {
			b.WriteByte('{')
			for j, s := range tn.RankShapes {
				if j > 0 {
					b.WriteByte(' ')
				}
				b.WriteString(s.String())
			}
			if tn.Splits != nil {
				fmt.Fprintf(&b, " splits %v", tn.Splits)
			}
			b.WriteByte('}')
		}
	}
	b.WriteByte(']')
	if len(r.JoinedRanks) > 0 {
		fmt.Fprintf(&b, " joined=%v", r.JoinedRanks)
	}
	return b.String()
}

func names(ts []Tensor) string {
	ns := make([]string, len(ts))
	for i, t := range ts {
		ns[i] = t.Name
	}
	return strings.Join(ns, " ")
}

// String formats s on one line: `w set=0 t=5 submitted=[0 1] missing=[2]`.
func (s Stall) String() string {
	return fmt.Sprintf("%s set=%d t=%d submitted=%v missing=%v", s.Name, s.ProcessSet, s.FirstSubmit, s.Submitted, s.Missing)
}

// String formats a on one line: `ALLREDUCE w set=0 ranks=[0 1]`.
func (a Aborted) String() string {
	if a.Op == tensor.Join {
		return fmt.Sprintf("JOIN ranks=%v", a.Ranks)
	}
	return fmt.Sprintf("%s %s set=%d ranks=%v", a.Op, a.Name, a.ProcessSet, a.Ranks)
}
