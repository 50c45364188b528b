package plan

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/hvdd/hvdd/tensor"
)

func mustNew(t *testing.T, cfg Config) *Table {
	t.Helper()
	tbl, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

func ar(rank int, name string, shape ...int64) Request {
	return Request{Rank: rank, Name: name, Op: tensor.Allreduce, DType: tensor.Float32, Shape: shape, ReduceOp: tensor.Sum, Prescale: 1, Postscale: 1}
}

func TestNewConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"zero", Config{}, false},
		{"negative size", Config{Size: -1}, false},
		{"negative threshold", Config{Size: 2, FusionThreshold: -1}, false},
		{"one", Config{Size: 1}, true},
		{"fused", Config{Size: 8, FusionThreshold: 64 << 20, LookAhead: -1}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if (err == nil) != tt.ok {
				t.Fatalf("New(%+v) = %v, want ok=%v", tt.cfg, err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("error %v does not wrap ErrInvalidArgument", err)
			}
		})
	}
}

func TestSubmitErrors(t *testing.T) {
	tests := []struct {
		name  string
		setup []Request
		req   Request
		want  error
		text  string
	}{
		{"rank too big", nil, ar(4, "w"), ErrInvalidArgument, "rank 4 out of range"},
		{"negative rank", nil, ar(-1, "w"), ErrInvalidArgument, "out of range"},
		{"unknown set", nil, Request{Rank: 0, Name: "w", Op: tensor.Allreduce, DType: tensor.Float32, ProcessSet: 9}, ErrInvalidArgument, "ALLREDUCE: Process set provided does not exist, or has not been registered"},
		{"not a member", nil, Request{Rank: 1, Name: "w", Op: tensor.Allgather, DType: tensor.Float32, ProcessSet: 1}, ErrInvalidArgument, "ALLGATHER: Rank 1 is not a member of the provided process set"},
		{"invalid op", nil, Request{Rank: 0, Name: "w", DType: tensor.Float32}, ErrInvalidArgument, "invalid op"},
		{"invalid dtype", nil, Request{Rank: 0, Name: "w", Op: tensor.Allreduce}, ErrInvalidArgument, "invalid dtype"},
		{"invalid reduce op", nil, Request{Rank: 0, Name: "w", Op: tensor.Allreduce, DType: tensor.Int8, ReduceOp: 99}, ErrInvalidArgument, "invalid reduce op"},
		{"no name", nil, ar(0, ""), ErrInvalidArgument, "without a tensor name"},
		{"duplicate", []Request{ar(0, "w", 4)}, ar(0, "w", 4), ErrDuplicateName, "same name as another tensor that is currently being processed"},
		{"joined", []Request{{Rank: 2, Op: tensor.Join}}, ar(2, "w", 4), ErrJoined, "rank 2 joined"},
		{"joined twice", []Request{{Rank: 2, Op: tensor.Join}}, Request{Rank: 2, Op: tensor.Join}, ErrJoined, "joined already"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tbl := mustNew(t, Config{Size: 4})
			if err := tbl.AddProcessSet(1, []int{0, 2}); err != nil {
				t.Fatal(err)
			}
			for _, r := range tt.setup {
				if err := tbl.Submit(r, 0); err != nil {
					t.Fatal(err)
				}
			}
			before := tbl.Len()
			err := tbl.Submit(tt.req, 0)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Submit = %v, want %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("Submit = %q, want it to contain %q", err, tt.text)
			}
			if tbl.Len() != before {
				t.Fatalf("a failed Submit recorded something: Len %d -> %d", before, tbl.Len())
			}
		})
	}
}

// TestErrorFields checks the structured side of each mismatch and that the
// message starts with Horovod's exact text.
func TestErrorFields(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(rank int, r *Request) // applied to ar(rank, "x", 4) for ranks 0..2
		attr   string
		ranks  []int
		sides  []Side
		prefix string
	}{
		{
			name: "dtype",
			edit: func(rank int, r *Request) {
				if rank == 1 {
					r.DType = tensor.Int32
				}
			},
			attr:   "dtype",
			ranks:  []int{1},
			sides:  []Side{{"float32", []int{0, 2}}, {"int32", []int{1}}},
			prefix: "Mismatched data types: One rank had type float32, but another rank had type int32.",
		},
		{
			name: "shape",
			edit: func(rank int, r *Request) {
				r.Shape = tensor.Shape{17, 17, 17}
				if rank > 0 {
					r.Shape = tensor.Shape{18, 18, 18}
				}
			},
			attr:   "shape",
			ranks:  []int{1, 2},
			sides:  []Side{{"[17, 17, 17]", []int{0}}, {"[18, 18, 18]", []int{1, 2}}},
			prefix: "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [17, 17, 17], but another rank sent a tensor of shape [18, 18, 18].",
		},
		{
			name: "op",
			edit: func(rank int, r *Request) {
				if rank == 2 {
					r.Op = tensor.Allgather
				}
			},
			attr:   "op",
			ranks:  []int{2},
			sides:  []Side{{"ALLREDUCE", []int{0, 1}}, {"ALLGATHER", []int{2}}},
			prefix: "Mismatched operations: One rank did an ALLREDUCE, but another rank did an ALLGATHER.",
		},
		{
			name: "root",
			edit: func(rank int, r *Request) {
				r.Op = tensor.Broadcast
				r.Root = rank % 2
			},
			attr:   "root",
			ranks:  []int{1},
			sides:  []Side{{"root 0", []int{0, 2}}, {"root 1", []int{1}}},
			prefix: "Mismatched BROADCAST root ranks: One rank specified root rank 0, but another rank specified root rank 1.",
		},
		{
			name: "reduce op",
			edit: func(rank int, r *Request) {
				if rank == 0 {
					r.ReduceOp = tensor.Max
				}
			},
			attr:   "reduce_op",
			ranks:  []int{1, 2},
			sides:  []Side{{"Max", []int{0}}, {"Sum", []int{1, 2}}},
			prefix: "Mismatched reduction operation: One rank sent reduction op 4, but another rank sent reduction op 1.",
		},
		{
			name: "scale",
			edit: func(rank int, r *Request) {
				if rank == 2 {
					r.Prescale, r.Postscale = 0.25, 4
				}
			},
			attr:   "scale",
			ranks:  []int{2},
			sides:  []Side{{"factors (1, 1)", []int{0, 1}}, {"factors (0.25, 4)", []int{2}}},
			prefix: "Mismatched prescale and/or postscale factors: One rank sent factors (1, 1), but another rank sent factors (0.25, 4).",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tbl := mustNew(t, Config{Size: 3, FusionThreshold: 1 << 20})
			for rank := range 3 {
				r := ar(rank, "x", 4)
				tt.edit(rank, &r)
				if err := tbl.Submit(r, 0); err != nil {
					t.Fatal(err)
				}
			}
			rs := tbl.Ready()
			if len(rs) != 1 || rs[0].Err == nil {
				t.Fatalf("Ready = %v, want one error response", rs)
			}
			e := rs[0].Err
			var asErr error = e
			if asErr.Error() != e.Msg {
				t.Fatalf("Error() = %q, want Msg %q", asErr.Error(), e.Msg)
			}
			if e.Attr != tt.attr || e.Tensor != "x" || !slices.Equal(e.Ranks, tt.ranks) {
				t.Fatalf("Err = attr %q tensor %q ranks %v, want %q %q %v", e.Attr, e.Tensor, e.Ranks, tt.attr, "x", tt.ranks)
			}
			if !slices.EqualFunc(e.Sides, tt.sides, func(a, b Side) bool { return a.Value == b.Value && slices.Equal(a.Ranks, b.Ranks) }) {
				t.Fatalf("Sides = %v, want %v", e.Sides, tt.sides)
			}
			if !strings.HasPrefix(e.Msg, tt.prefix+` (tensor "x": ranks `) {
				t.Fatalf("Msg = %q, want prefix %q", e.Msg, tt.prefix)
			}
		})
	}
}

// TestOwnership checks that the Table copies what it keeps.
func TestOwnership(t *testing.T) {
	tbl := mustNew(t, Config{Size: 2})
	shape := tensor.Shape{4, 4}
	splits := []int32{2, 2}
	for rank := range 2 {
		r := Request{Rank: rank, Name: "a2a", Op: tensor.Alltoall, DType: tensor.Int64, Shape: shape, Splits: splits}
		if err := tbl.Submit(r, 0); err != nil {
			t.Fatal(err)
		}
		shape[0], splits[0] = 99, 99 // the caller reuses its buffers
		shape, splits = tensor.Shape{4, 4}, []int32{2, 2}
	}
	rs := tbl.Ready()
	if len(rs) != 1 || rs[0].Err != nil {
		t.Fatalf("Ready = %v", rs)
	}
	tn := rs[0].Tensors[0]
	if !tn.Shape.Equal(tensor.Shape{4, 4}) || tn.Splits[0][0] != 2 || rs[0].Bytes != 2*16*8 {
		t.Fatalf("got %v", rs[0].String())
	}
}

// TestAlltoallMatrix checks the explicit send matrix.
func TestAlltoallMatrix(t *testing.T) {
	tbl := mustNew(t, Config{Size: 4})
	if err := tbl.AddProcessSet(3, []int{3, 1, 2}); err != nil {
		t.Fatal(err)
	}
	in := map[int]struct {
		shape  tensor.Shape
		splits []int32
	}{
		1: {tensor.Shape{6, 2}, nil},
		2: {tensor.Shape{5, 2}, []int32{0, 5, 0}},
		3: {tensor.Shape{3, 2}, []int32{1, 1, 0}},
	}
	for _, rank := range []int{3, 1, 2} {
		r := Request{Rank: rank, ProcessSet: 3, Name: "t", Op: tensor.Alltoall, DType: tensor.Float32, Shape: in[rank].shape, Splits: in[rank].splits}
		if err := tbl.Submit(r, 0); err != nil {
			t.Fatal(err)
		}
	}
	rs := tbl.Ready()
	if len(rs) != 1 || rs[0].Err != nil {
		t.Fatalf("Ready = %v", rs)
	}
	tn := rs[0].Tensors[0]
	want := [][]int32{{2, 2, 2}, {0, 5, 0}, {1, 1, 0}} // set ranks 0,1,2 = global 1,2,3
	if !slices.EqualFunc(tn.Splits, want, slices.Equal) {
		t.Fatalf("Splits = %v, want %v", tn.Splits, want)
	}
	if !slices.Equal(tn.Ranks, []int{1, 2, 3}) || !tn.RankShapes[2].Equal(tensor.Shape{3, 2}) {
		t.Fatalf("Ranks %v RankShapes %v", tn.Ranks, tn.RankShapes)
	}
	if rs[0].Bytes != (6+5+3)*2*4 {
		t.Fatalf("Bytes = %d", rs[0].Bytes)
	}
}

func TestStallMessageEmpty(t *testing.T) {
	if got := StallMessage(nil, StallOptions{WarnSeconds: 60}); got != "" {
		t.Fatalf("StallMessage(nil) = %q", got)
	}
}

func TestReadyEmpty(t *testing.T) {
	tbl := mustNew(t, Config{Size: 2})
	if rs := tbl.Ready(); rs != nil {
		t.Fatalf("Ready on an empty table = %v", rs)
	}
}

// TestSetFusionThreshold changes the threshold between two rounds of the
// same tensors (what the autotuner does): the first round fuses all four
// 400-byte tensors, the second at most two per response.
func TestSetFusionThreshold(t *testing.T) {
	tbl := mustNew(t, Config{Size: 1, FusionThreshold: 1 << 20})
	round := func() []int {
		for _, n := range []string{"a", "b", "c", "d"} {
			if err := tbl.Submit(ar(0, n, 100), 0); err != nil {
				t.Fatal(err)
			}
		}
		var sizes []int
		for _, r := range tbl.Ready() {
			sizes = append(sizes, len(r.Tensors))
		}
		return sizes
	}
	if got := round(); !slices.Equal(got, []int{4}) {
		t.Fatalf("tensors per response at 1 MiB: %v, want [4]", got)
	}
	if err := tbl.SetFusionThreshold(800); err != nil {
		t.Fatal(err)
	}
	if got := tbl.FusionThreshold(); got != 800 {
		t.Fatalf("FusionThreshold() = %d, want 800", got)
	}
	if got := round(); !slices.Equal(got, []int{2, 2}) {
		t.Fatalf("tensors per response at 800 bytes: %v, want [2 2]", got)
	}
	if err := tbl.SetFusionThreshold(-1); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("SetFusionThreshold(-1) = %v, want ErrInvalidArgument", err)
	}
}

// TestFusionKeepsDevicesApart: allreduces and allgathers of GPU tensors
// (Request.Device) never fuse with host ones, though they agree on
// everything else; each kind still fuses with its own.
func TestFusionKeepsDevicesApart(t *testing.T) {
	tbl := mustNew(t, Config{Size: 1, FusionThreshold: 1 << 20})
	for _, n := range []string{"h1", "d1", "h2", "d2"} {
		r := ar(0, n, 100)
		r.Device = n[0] == 'd'
		if err := tbl.Submit(r, 0); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, r := range tbl.Ready() {
		var names []string
		for _, tn := range r.Tensors {
			names = append(names, tn.Name)
		}
		got = append(got, fmt.Sprintf("%v%v", r.Device, names))
	}
	if want := []string{"false[h1 h2]", "true[d1 d2]"}; !slices.Equal(got, want) {
		t.Fatalf("allreduce responses %v, want %v", got, want)
	}
	for _, n := range []string{"g1", "g2"} {
		r := Request{Rank: 0, Name: n, Op: tensor.Allgather, DType: tensor.Float32, Shape: []int64{4}, Device: n == "g2"}
		if err := tbl.Submit(r, 0); err != nil {
			t.Fatal(err)
		}
	}
	if rs := tbl.Ready(); len(rs) != 2 || rs[0].Device == rs[1].Device {
		t.Fatalf("a host and a GPU allgather: %d responses, want 2 apart", len(rs))
	}
}
