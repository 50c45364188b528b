package nodes

import (
	"github.com/hvdd/hvdd/cluster/clusterpb"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/tensor"
)

// Conversions between plan's types and the control plane's messages.

func requestToPB(r *plan.Request) *clusterpb.Request {
	return &clusterpb.Request{
		Rank: int32(r.Rank), ProcessSet: r.ProcessSet, Name: r.Name, Op: int32(r.Op), Dtype: int32(r.DType),
		Shape: r.Shape, ReduceOp: int32(r.ReduceOp), Prescale: r.Prescale, Postscale: r.Postscale,
		Root: int32(r.Root), Splits: r.Splits, Group: r.Group, GroupSize: int32(r.GroupSize),
		Device: r.Device, Nccl: r.NCCL,
	}
}

func requestFromPB(m *clusterpb.Request) plan.Request {
	return plan.Request{
		Rank: int(m.GetRank()), ProcessSet: m.GetProcessSet(), Name: m.GetName(), Op: tensor.OpType(m.GetOp()),
		DType: tensor.DType(m.GetDtype()), Shape: tensor.Shape(m.GetShape()), ReduceOp: tensor.ReduceOp(m.GetReduceOp()),
		Prescale: m.GetPrescale(), Postscale: m.GetPostscale(), Root: int(m.GetRoot()), Splits: m.GetSplits(),
		Group: m.GetGroup(), GroupSize: int(m.GetGroupSize()), Device: m.GetDevice(), NCCL: m.GetNccl(),
	}
}

func ints32(v []int) []int32 {
	out := make([]int32, len(v))
	for i, x := range v {
		out[i] = int32(x)
	}
	return out
}

func ints(v []int32) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}

func responseToPB(r *plan.Response) *clusterpb.Response {
	m := &clusterpb.Response{
		Op: int32(r.Op), ProcessSet: r.ProcessSet, Dtype: int32(r.DType), ReduceOp: int32(r.ReduceOp),
		Prescale: r.Prescale, Postscale: r.Postscale, Root: int32(r.Root), JoinedRanks: ints32(r.JoinedRanks),
		LastJoinedRank: int32(r.LastJoinedRank), Bytes: r.Bytes, Device: r.Device, Nccl: r.NCCL,
	}
	if e := r.Err; e != nil {
		pe := &clusterpb.Error{Msg: e.Msg, Tensor: e.Tensor, Attr: e.Attr, Ranks: ints32(e.Ranks)}
		for _, s := range e.Sides {
			pe.Sides = append(pe.Sides, &clusterpb.Side{Value: s.Value, Ranks: ints32(s.Ranks)})
		}
		m.Err = pe
	}
	for _, t := range r.Tensors {
		pt := &clusterpb.Tensor{Name: t.Name, Shape: t.Shape, Ranks: ints32(t.Ranks)}
		for _, s := range t.RankShapes {
			pt.RankShapes = append(pt.RankShapes, &clusterpb.Shape{Dims: s})
		}
		for _, s := range t.Splits {
			pt.Splits = append(pt.Splits, &clusterpb.Splits{To: s})
		}
		m.Tensors = append(m.Tensors, pt)
	}
	return m
}

func responseFromPB(m *clusterpb.Response) plan.Response {
	r := plan.Response{
		Op: tensor.OpType(m.GetOp()), ProcessSet: m.GetProcessSet(), DType: tensor.DType(m.GetDtype()),
		ReduceOp: tensor.ReduceOp(m.GetReduceOp()), Prescale: m.GetPrescale(), Postscale: m.GetPostscale(),
		Root: int(m.GetRoot()), JoinedRanks: ints(m.GetJoinedRanks()), LastJoinedRank: int(m.GetLastJoinedRank()),
		Bytes: m.GetBytes(), Device: m.GetDevice(), NCCL: m.GetNccl(),
	}
	if e := m.GetErr(); e != nil {
		pe := &plan.Error{Msg: e.GetMsg(), Tensor: e.GetTensor(), Attr: e.GetAttr(), Ranks: ints(e.GetRanks())}
		for _, s := range e.GetSides() {
			pe.Sides = append(pe.Sides, plan.Side{Value: s.GetValue(), Ranks: ints(s.GetRanks())})
		}
		r.Err = pe
	}
	for _, t := range m.GetTensors() {
		pt := plan.Tensor{Name: t.GetName(), Shape: tensor.Shape(t.GetShape()), Ranks: ints(t.GetRanks())}
		for _, s := range t.GetRankShapes() {
			pt.RankShapes = append(pt.RankShapes, tensor.Shape(s.GetDims()))
		}
		for _, s := range t.GetSplits() {
			pt.Splits = append(pt.Splits, s.GetTo())
		}
		r.Tensors = append(r.Tensors, pt)
	}
	return r
}
