package plan

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/hvdd/hvdd/tensor"
)

// Every user-visible text the package produces is written in this file, so
// that the wording stays Horovod's (common.h, controller.cc, operations.cc)
// and can be reviewed in one place.

// ErrDuplicateName is wrapped by the error Submit returns when a rank submits
// a name that the same rank already has in flight in the same process set
// (submitted, and not yet returned by Ready), or joins twice. Its text is
// Horovod's DUPLICATE_NAME_ERROR.
var ErrDuplicateName = errors.New("plan: Requested to allreduce, allgather, or broadcast a tensor with the same name as another tensor that is currently being processed.  If you want to request another tensor, use a different tensor name.")

// ErrInvalidArgument is wrapped by the error Submit, New, AddProcessSet and
// RemoveProcessSet return when the argument itself is wrong: a rank out of
// range, an unknown process set or one the rank is not a member of, an
// invalid op or dtype, a negative dimension, an empty name.
var ErrInvalidArgument = errors.New("plan: invalid argument")

// ErrJoined is wrapped by the error Submit returns when a rank that has
// joined (and whose join has not yet completed with a JOIN response) submits
// anything: a joined rank has run out of data and may only wait.
var ErrJoined = errors.New("plan: rank has joined")

// Error is the failure of one tensor (or of a whole group) that every rank
// receives: the ranks disagreed on an attribute, or asked for something the
// plan cannot do. It implements error.
type Error struct {
	// Msg is the full message: Horovod's text, then the tensor name, the
	// attribute and the ranks on each side in parentheses.
	Msg string
	// Tensor is the name of the tensor whose requests were wrong (in a
	// failed group, the failing member whose name sorts first).
	Tensor string
	// Attr names what was wrong: "op", "dtype", "shape", "reduce_op",
	// "scale", "root", "splits", "group" or "join".
	Attr string
	// Ranks are the global ranks at fault: for a disagreement, every rank
	// whose value differs from the lowest submitting rank's; for an invalid
	// request, the ranks that sent it; for "join", the joined ranks.
	Ranks []int
	// Sides groups the submitting ranks by the value they sent, in order of
	// the lowest rank on each side (Sides[0] holds the lowest rank). It has
	// one element for an invalid request that every rank agreed on.
	Sides []Side
}

// Side is one camp of a disagreement: the ranks that sent Value.
type Side struct {
	Value string // the attribute as those ranks sent it ("float32", "[4, 4]")
	Ranks []int  // global ranks, ascending
}

// Error returns e.Msg.
func (e *Error) Error() string { return e.Msg }

// newError builds an Error from Horovod's text and the sides. The suffix is
// what Horovod lacks: ` (tensor "w": ranks [0 2] sent float32, ranks [1]
// sent int32)`.
func newError(name, attr, horovod string, ranks []int, sides []Side) *Error {
	var b strings.Builder
	b.WriteString(horovod)
	fmt.Fprintf(&b, " (tensor %q", name)
	for i, s := range sides {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString(", ")
		}
		if attr == "join" {
			fmt.Fprintf(&b, "ranks %v have joined", s.Ranks)
		} else {
			fmt.Fprintf(&b, "ranks %v sent %s", s.Ranks, s.Value)
		}
	}
	b.WriteByte(')')
	return &Error{Msg: b.String(), Tensor: name, Attr: attr, Ranks: ranks, Sides: sides}
}

// Horovod's ConstructResponse texts. a is the lowest submitting rank's value,
// b the first value that differs from it.

func msgMismatchedOps(a, b tensor.OpType) string {
	return fmt.Sprintf("Mismatched operations: One rank did an %s, but another rank did an %s.", a, b)
}

func msgMismatchedDTypes(a, b tensor.DType) string {
	return fmt.Sprintf("Mismatched data types: One rank had type %s, but another rank had type %s.", a, b)
}

func msgMismatchedShapes(op tensor.OpType, a, b tensor.Shape) string {
	return fmt.Sprintf("Mismatched %s tensor shapes: One rank sent a tensor of shape %s, but another rank sent a tensor of shape %s.", op, a, b)
}

func msgMismatchedNDims(op tensor.OpType, a, b int) string {
	return fmt.Sprintf("Mismatched %s tensor shapes: One rank sent a tensor of rank %d, but another rank sent a tensor of rank %d.", op, a, b)
}

func msgMismatchedDim(op tensor.OpType, dim int, a, b int64) string {
	return fmt.Sprintf("Mismatched %s tensor shapes: One rank sent a tensor with dimension %d equal to %d, but another rank sent a tensor with dimension %d equal to %d.", op, dim, a, dim, b)
}

func msgScalar(op tensor.OpType) string {
	return fmt.Sprintf("Process-set rank zero tried to %s a rank-zero tensor.", op)
}

// msgMismatchedReduceOps prints the numeric values, as Horovod streams the
// enum; the suffix carries the names.
func msgMismatchedReduceOps(a, b tensor.ReduceOp) string {
	return fmt.Sprintf("Mismatched reduction operation: One rank sent reduction op %d, but another rank sent reduction op %d.", a, b)
}

func msgMismatchedScales(a1, a2, b1, b2 float64) string {
	return fmt.Sprintf("Mismatched prescale and/or postscale factors: One rank sent factors (%s, %s), but another rank sent factors (%s, %s).",
		fmtFloat(a1), fmtFloat(a2), fmtFloat(b1), fmtFloat(b2))
}

func msgMismatchedRoots(op tensor.OpType, a, b int) string {
	return fmt.Sprintf("Mismatched %s root ranks: One rank specified root rank %d, but another rank specified root rank %d.", op, a, b)
}

// msgMismatchedGroups has no Horovod counterpart: Horovod registers groups
// locally and never compares them.
func msgMismatchedGroups(a, b string) string {
	return fmt.Sprintf("Mismatched groups: One rank placed the tensor in group %s, but another rank placed it in group %s.", a, b)
}

func msgInvalidRoot(root int) string {
	return fmt.Sprintf("broadcast received invalid root rank %d for provided process set", root)
}

const (
	msgAdasumRanks         = "Running Adasum with non-power-of-two ranks is not supported yet."
	msgAdasumDType         = "Unsupported data type: Adasum reduces float16, float32 and float64 tensors only."
	msgReducescatterOp     = "Reducescatter currently only supports AVERAGE and SUM."
	msgSplitsCount         = "Number of entries in splits does not equal number of workers."
	msgSplitsSum           = "Sum of splits entries is greater than the first dimension of tensor."
	msgSplitsNegative      = "Splits entries must be non-negative."
	msgSplitsUneven        = "splits not provided, but first dimension of tensor is not an even multiple of the number of workers."
	msgAllgatherJoin       = "Allgather is not supported with Join at this time. Specify sparse_to_dense=True if using DistributedOptimizer"
	msgAlltoallJoin        = "Alltoall is not supported with Join at this time."
	msgReducescatterJoin   = "Reducescatter is not supported with Join at this time."
	msgBroadcastJoin       = "Broadcast is not supported with Join at this time."
	msgStallWarningFormat  = "One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and are waiting for remainder of ranks for more than %d seconds. This may indicate that different ranks are trying to submit different tensors or that only subset of ranks is submitting tensors, which will cause deadlock. "
	msgStallShutdownFormat = "One or more rank (marked by \"!\") is stalled for longer than %d seconds. Will shutdown."
)

// msgJoinUnsupported is the text for op with a joined rank, "" when op
// works with joined ranks.
func msgJoinUnsupported(op tensor.OpType) string {
	switch op {
	case tensor.Allgather:
		return msgAllgatherJoin
	case tensor.Alltoall:
		return msgAlltoallJoin
	case tensor.Reducescatter:
		return msgReducescatterJoin
	case tensor.Broadcast:
		return msgBroadcastJoin
	}
	return ""
}

// Submit-time texts (Horovod's Enqueue* checks).

func errUnknownSet(op tensor.OpType, set int32) error {
	return fmt.Errorf("%w: %s: Process set provided does not exist, or has not been registered (process set %d).", ErrInvalidArgument, op, set)
}

func errNotMember(op tensor.OpType, rank int, set int32) error {
	return fmt.Errorf("%w: %s: Rank %d is not a member of the provided process set (process set %d).", ErrInvalidArgument, op, rank, set)
}

func errRankRange(rank, size int) error {
	return fmt.Errorf("%w: rank %d out of range [0, %d)", ErrInvalidArgument, rank, size)
}

func errDuplicate(rank int, set int32, name string) error {
	return fmt.Errorf("%w (rank %d, process set %d, tensor %q)", ErrDuplicateName, rank, set, name)
}

func errJoined(rank int, op tensor.OpType, name string) error {
	if op == tensor.Join {
		return fmt.Errorf("%w: rank %d joined already; its join is still waiting for the other ranks", ErrJoined, rank)
	}
	return fmt.Errorf("%w: rank %d joined and cannot submit %s %q until every rank has joined", ErrJoined, rank, op, name)
}

// fmtFloat prints a factor the way a C++ stream does for ordinary values:
// 1 -> "1", 0.5 -> "0.5".
func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// UnknownSetError is the error Submit returns for op on a process set that
// is not registered (Horovod's "Process set provided does not exist"), for a
// caller that checks a request before it reaches a Table (a node that
// forwards requests to another's).
func UnknownSetError(op tensor.OpType, set int32) error { return errUnknownSet(op, set) }

// NotMemberError is the error Submit returns when rank submits op on a
// process set it is not a member of, for callers as UnknownSetError's.
func NotMemberError(op tensor.OpType, rank int, set int32) error {
	return errNotMember(op, rank, set)
}
