package loop

import (
	"fmt"
	"slices"
	"strings"

	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/p2p"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

// copyInline is the largest transfer the loop copies itself; larger ones
// copy on a goroutine of their own, which posts msgP2PDone back, so that
// the loop goes on negotiating meanwhile.
const copyInline = 1 << 20

// msgP2PDone says that a transfer's bytes are in the recv's buffer.
type msgP2PDone struct{ send, recv *job.Op }

// p2p takes a send or recv (tensor.Send, tensor.Recv) of a formed job: it
// waits in the job's table (package p2p) for the other side, and once both
// are here the daemon copies the send's bytes into the recv's buffer, from
// one client's shared memory into the other's, and answers both. No other
// rank takes part. With the other side on another node it goes to the
// job's coordination instead (p2pAcross).
func (l *Loop) p2p(j *job.Job, o *job.Op) {
	me := o.Req.Rank
	peer := o.Peer
	set := o.Req.ProcessSet
	kind := o.Type.Lower()
	bad := func(code ipcpb.Code, format string, a ...any) {
		o.Finish(&ipcpb.Done{Code: code, Error: fmt.Sprintf("%s %q of rank %d: ", kind, o.Name, me) + fmt.Sprintf(format, a...)})
	}
	switch {
	case peer < 0:
		bad(ipcpb.Code_CODE_UNIMPLEMENTED, "a recv from any source is not supported: name the sending rank")
		return
	case peer >= j.Members.Size:
		bad(ipcpb.Code_CODE_INVALID_ARGUMENT, "peer rank %d is not in the job of %d ranks", peer, j.Members.Size)
		return
	case peer == me:
		bad(ipcpb.Code_CODE_INVALID_ARGUMENT, "a rank cannot %s to itself", kind)
		return
	case o.Dev != nil:
		bad(ipcpb.Code_CODE_UNIMPLEMENTED, "send/recv of GPU tensors through CUDA IPC is not supported: stage them through host memory")
		return
	}
	if set != 0 {
		members, ok := j.Sets[set]
		switch {
		case !ok:
			bad(ipcpb.Code_CODE_INVALID_ARGUMENT, "unknown process set %d", set)
			return
		case !slices.Contains(members, me) || !slices.Contains(members, peer):
			bad(ipcpb.Code_CODE_INVALID_ARGUMENT, "ranks %d and %d must both be members of process set %d %v", me, peer, set, members)
			return
		}
	}
	if j.P2P == nil {
		j.P2P = p2p.New[*job.Op]()
	}
	if n := j.Members.Nodes(); n > 1 && j.Members.NodeOf(peer) != j.Members.Node {
		if j.Members.Size > plan.MaxPairRanks {
			bad(ipcpb.Code_CODE_UNIMPLEMENTED, "send/recv across nodes is limited to jobs of %d ranks (this one has %d)", plan.MaxPairRanks, j.Members.Size)
			return
		}
		l.p2pAcross(j, o)
		return
	}
	d := p2p.Desc{DType: o.Req.DType, Bytes: len(o.Buf)}
	o.Queued = l.Now()
	var pr p2p.Pair[*job.Op]
	var ok bool
	if o.Type == tensor.Send {
		pr, ok = j.P2P.Send(p2p.Key{Set: set, Src: me, Dst: peer, Tag: o.Tag}, d, o)
	} else {
		pr, ok = j.P2P.Recv(p2p.Key{Set: set, Src: peer, Dst: me, Tag: o.Tag}, d, o)
	}
	if !ok {
		return
	}
	s, r := pr.Send.V, pr.Recv.V
	if pr.Err != nil {
		msg := pr.Err.Error()
		l.noteError(j, msg)
		d := &ipcpb.Done{Code: ipcpb.Code_CODE_MISMATCH, Error: msg}
		s.Finish(d)
		r.Finish(d)
		return
	}
	if len(s.Buf) <= copyInline {
		copy(r.Buf, s.Buf)
		l.p2pDone(msgP2PDone{s, r})
		return
	}
	// The ops hold their regions' references until they are answered.
	go func() {
		copy(r.Buf, s.Buf)
		l.p.Post(msgP2PDone{s, r})
	}()
}

// p2pAcross sends a transfer whose other side is on another node through
// the job's coordination, as the broadcast from the sender over the pair
// set of the two ranks (plan.PairSet), which the coordinator negotiates
// like any collective and both nodes run in plan order on the engine's
// group of their two nodes. Its name, the same on both sides, carries the
// channel and the transfer's number on it (p2p.Table.Next), so that the
// n-th send of a channel meets its n-th recv. The shape is flattened: the
// two sides must agree on dtype and size only, as on one node.
func (l *Loop) p2pAcross(j *job.Job, o *job.Op) {
	me, peer := o.Req.Rank, o.Peer
	src, dst := me, peer
	if o.Type == tensor.Recv {
		src, dst = peer, me
	}
	k := p2p.Key{Set: o.Req.ProcessSet, Src: src, Dst: dst, Tag: o.Tag}
	n := j.P2P.Next(k)
	numel := int64(0)
	if sz := o.Req.DType.Size(); sz > 0 {
		numel = int64(len(o.Buf) / sz)
	}
	o.Type, o.Req.Op = tensor.Broadcast, tensor.Broadcast
	o.Req.Root = src
	o.Req.Shape = tensor.Shape{numel}
	o.Req.ProcessSet = plan.PairSet(src, dst, j.Members.Size)
	o.Name = fmt.Sprintf("send/recv from %v, #%d", k, n)
	o.Req.Name = o.Name
	l.submit(j, o)
}

// p2pError is the error of a transfer across nodes whose two sides
// disagree (r: the pair set's broadcast, r.Root the sender) in the words of
// send and recv, as on one node (p2p.Check), not of a broadcast.
func p2pError(r *plan.Response) string {
	e := r.Err
	what := map[string]string{"dtype": "dtype", "shape": "size"}[e.Attr]
	if what == "" || len(e.Sides) != 2 {
		return e.Error()
	}
	var send, recv string
	for _, s := range e.Sides {
		v := s.Value
		if e.Attr == "shape" {
			v = strings.Trim(v, "[]") + " elements"
		}
		if slices.Contains(s.Ranks, r.Root) {
			send = v
		} else {
			recv = v
		}
	}
	return fmt.Sprintf("%s: the send has %s, the recv %s (the two tensors must have the same %s)", e.Tensor, send, recv, what)
}

// p2pDone answers a transfer's two ranks.
func (l *Loop) p2pDone(m msgP2PDone) {
	ok := &ipcpb.Done{}
	m.send.Finish(ok)
	m.recv.Finish(ok)
}

// failP2P answers every send and recv of a failed job that waits for its
// other side.
func failP2P(j *job.Job) {
	if j.P2P == nil {
		return
	}
	for _, o := range j.P2P.Drain() {
		o.Finish(j.Failed)
	}
}

// p2pStalls lists j's transfers on this node whose oldest side has waited
// for its other side more than olderThan ms (every one when negative), as
// stalls of no process set (a pair's, as across nodes): what hvdd status
// shows and the stall check warns about. A send or recv that waits stops
// no job: torch's timeout bounds it.
func (l *Loop) p2pStalls(j *job.Job, now, olderThan int64) []plan.Stall {
	if j.P2P == nil || j.P2P.Len() == 0 {
		return nil
	}
	var out []plan.Stall
	for _, q := range j.P2P.Queues() {
		first := q.Ops[0].Queued
		if olderThan >= 0 && now-first <= olderThan {
			continue
		}
		side, waiting, missing := "recv", q.Key.Dst, q.Key.Src
		if q.Send {
			side, waiting, missing = "send", q.Key.Src, q.Key.Dst
		}
		name := side + " " + q.Key.String()
		if len(q.Ops) > 1 {
			name += fmt.Sprintf(" (%d waiting)", len(q.Ops))
		}
		out = append(out, plan.Stall{ProcessSet: -1, Name: name, Submitted: []int{waiting}, Missing: []int{missing}, FirstSubmit: first})
	}
	return out
}
