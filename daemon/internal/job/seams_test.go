package job

import (
	"testing"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// oneCoord is a coordination of one node: no part across nodes.
type oneCoord struct{}

func (oneCoord) Submit(*Op) *ipcpb.Done           { return nil }
func (oneCoord) Next() []plan.Response            { return nil }
func (oneCoord) Stalls(int64, int64) []plan.Stall { return nil }
func (oneCoord) SetRequest(SetReq)                {}
func (oneCoord) Coordinates() bool                { return true }
func (oneCoord) Retune(Settings)                  {}

// acrossCoord is a coordination across nodes, with its engine.
type acrossCoord struct {
	oneCoord
	b backends.Backend
}

func (acrossCoord) Flush()                           {}
func (acrossCoord) Expect(bool)                      {}
func (c acrossCoord) Engine() backends.Backend       { return c.b }
func (acrossCoord) NCCLID() []byte                   { return nil }
func (acrossCoord) Abort(ipcpb.Code, string, bool)   {}
func (acrossCoord) Lost(int)                         {}
func (acrossCoord) End()                             {}
func (acrossCoord) HostsUpdated(*ipcpb.HostsUpdated) {}
func (acrossCoord) TraceSink() EventSink             { return nil }
func (acrossCoord) TraceSent()                       {}

// engine is a data engine that only has a name.
type engine struct{ backends.Backend }

func (engine) Name() string { return "test" }

func TestSetCoordProbesAcross(t *testing.T) {
	var j Job
	j.SetCoord(oneCoord{})
	if j.Across != nil || j.Engine() != nil {
		t.Errorf("a coordination of one node: Across %v, Engine %v; want both nil", j.Across, j.Engine())
	}
	b := engine{}
	j.SetCoord(acrossCoord{b: b})
	if j.Across == nil {
		t.Fatal("a coordination across nodes: Across is nil")
	}
	if got := j.Engine(); got != b {
		t.Errorf("Engine() = %v, want the coordination's engine", got)
	}
}
