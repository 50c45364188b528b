package launch

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hvdd/hvdd/rendezvous"
)

// The driver's decisions (decide) against its real rendezvous store, the
// daemons' side played by the test: it writes their reports and the
// coordinator's formed mark as package nodes does, and reads what the
// driver publishes.

// decideRig is a driver of hosts nodes, each with the ranks of ranksOf,
// all running, with the first epoch formed over them.
type decideRig struct {
	t      *testing.T
	drv    *driver
	st     *rendezvous.Memory
	stderr bytes.Buffer
}

func newDecideRig(t *testing.T, minNP int, ranksOf ...[]int) *decideRig {
	t.Helper()
	srv, err := rendezvous.NewServer(rendezvous.ServerConfig{Addr: "127.0.0.1:0", Secret: []byte("0123456789abcdef0123")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r := &decideRig{t: t, st: srv.Store()}
	j := &job{cfg: &Config{MinNP: minNP}, o: &output{stdout: &r.stderr, stderr: &r.stderr}, rdv: &driverRendezvous{srv: srv}}
	drv := &driver{j: j, ctx: ctx, state: jobRunning, reportWait: time.Hour, formWait: time.Hour,
		hm: newHostManager(CooldownRange{}, time.Now, func() float64 { return 0 })}
	for i, tags := range ranksOf {
		j.nodes = append(j.nodes, node{Host: "host" + strconv.Itoa(i)})
		drv.nodes = append(drv.nodes, driverNode{ready: true})
		for range tags {
			drv.ranks = append(drv.ranks, driverRank{node: i})
			j.exited = append(j.exited, false)
		}
	}
	drv.startMembership()
	r.drv = drv
	return r
}

// set writes key as a daemon would and lets the driver decide.
func (r *decideRig) set(key, value string) {
	r.t.Helper()
	if err := r.st.Set(context.Background(), key, []byte(value)); err != nil {
		r.t.Fatal(err)
	}
	r.drv.decide()
}

// published returns the driver's decisions for epoch, in order.
func (r *decideRig) published(epoch uint64) []string {
	var out []string
	for v := 1; ; v++ {
		b, err := r.st.Get(context.Background(), membersKey(epoch, v))
		if err != nil {
			return out
		}
		out = append(out, string(b))
	}
}

// join adds a node that joins the running job with n new ranks, its daemon
// ready: it returns the node's index and its ranks' tags.
func (r *decideRig) join(n int) (int, []int) {
	drv := r.drv
	i := len(drv.nodes)
	drv.j.nodes = append(drv.j.nodes, node{Host: "host" + strconv.Itoa(i)})
	drv.nodes = append(drv.nodes, driverNode{ready: true})
	var tags []int
	for range n {
		tags = append(tags, len(drv.ranks))
		drv.ranks = append(drv.ranks, driverRank{node: i})
		drv.j.exited = append(drv.j.exited, false)
	}
	return i, tags
}

// reported is tags as a daemon reports them.
func reported(tags []int) string {
	var s []string
	for _, t := range tags {
		s = append(s, strconv.Itoa(t))
	}
	return strings.Join(s, " ")
}

// TestDecideWaitsForEveryNodeAndExit: no decision until every node of the
// last epoch has reported and every rank left out has exited; then the
// nodes that go on with the ranks they reported.
func TestDecideWaitsForEveryNodeAndExit(t *testing.T) {
	r := newDecideRig(t, 1, []int{0, 1}, []int{2, 3})
	r.set(reportKey(1, 1), "2 3")
	if got := r.published(1); len(got) != 0 {
		t.Fatalf("decided %q before node 0 reported", got)
	}
	r.set(reportKey(1, 0), "1") // rank 0 is left out but has not exited
	if got := r.published(1); len(got) != 0 {
		t.Fatalf("decided %q before rank 0's exit was judged", got)
	}
	r.drv.j.exited[0] = true
	r.drv.decide()
	if got, want := r.published(1), []string{"0:1 1:2"}; !slices.Equal(got, want) {
		t.Fatalf("epoch 1's decisions = %q, want %q", got, want)
	}
}

// TestDecideMinNP: nothing is published while fewer than --min-np ranks
// would be in the epoch.
func TestDecideMinNP(t *testing.T) {
	r := newDecideRig(t, 3, []int{0, 1}, []int{2, 3})
	r.drv.j.exited[0], r.drv.j.exited[1] = true, true
	r.set(reportKey(1, 0), "")
	r.set(reportKey(1, 1), "2 3")
	if got := r.published(1); len(got) != 0 {
		t.Fatalf("decided %q with 2 ranks, below --min-np 3", got)
	}
}

// TestDecideFormedWithEarlierVersion is the campaign's finding (seed 11):
// two hosts back from their cooldown in the same second. The first is
// ready, and the epoch is decided with it; the second becomes ready while
// the epoch forms, and the driver decides again, with it. The coordinator
// formed the epoch with the first decision, and the second host waits to
// join the next. The driver must take the epoch's members from the
// decision it formed with: before, it took the latest, counted the second
// host a member of the formed epoch, waited for its report of the next
// epoch (it reports as a joiner instead), and after the report wait
// blacklisted the healthy host as failed.
func TestDecideFormedWithEarlierVersion(t *testing.T) {
	r := newDecideRig(t, 1, []int{0, 1}, []int{2, 3})
	// Rank 0 failed; node 0's daemon goes on with rank 1, node 1 with 2
	// and 3; node 2 (ranks 4, 5) waits to join.
	r.drv.j.exited[0] = true
	n2, t2 := r.join(2)
	r.set(joiningKey(n2), reported(t2))
	n3, t3 := r.join(2)
	r.drv.nodes[n3].ready = false
	r.set(reportKey(1, 0), "1")
	r.set(reportKey(1, 1), "2 3")
	first := "0:1 1:2 2:2"
	if got := r.published(1); !slices.Equal(got, []string{first}) {
		t.Fatalf("epoch 1's decisions = %q, want %q", got, first)
	}
	// Node 3 becomes ready and reports while epoch 1 forms.
	r.drv.nodes[n3].ready = true
	r.set(joiningKey(n3), reported(t3))
	if got, want := r.published(1), []string{first, "0:1 1:2 2:2 3:2"}; !slices.Equal(got, want) {
		t.Fatalf("epoch 1's decisions = %q, want %q", got, want)
	}
	// The coordinator formed epoch 1 with version 1 (without node 3), then
	// a host update resets the job: epoch 2, node 3 joins it.
	r.set(formedKey(1), "1")
	r.set(reportKey(2, 0), "1")
	r.set(reportKey(2, 1), "2 3")
	r.set(reportKey(2, 2), reported(t2))
	if got, want := r.published(2), []string{"0:1 1:2 2:2 3:2"}; !slices.Equal(got, want) {
		t.Fatalf("epoch 2's decisions = %q, want %q (node 3 joins it; it was not in epoch 1)\n%s", got, want, r.stderr.String())
	}
	if strings.Contains(r.stderr.String(), "taking it as failed") {
		t.Fatalf("a healthy host was taken as failed:\n%s", r.stderr.String())
	}
}

// TestDecidedEpochThatNeverFormsEndsTheJob: a decision whose epoch the
// daemons never form (no formed mark, no report of a later epoch) ends the
// job with an error once the form wait is over, where the driver waited
// without end; an epoch that formed before the wait ran out is not failed.
func TestDecidedEpochThatNeverFormsEndsTheJob(t *testing.T) {
	for _, formed := range []bool{false, true} {
		t.Run(map[bool]string{false: "never formed", true: "formed"}[formed], func(t *testing.T) {
			r := newDecideRig(t, 1, []int{0, 1}, []int{2, 3})
			r.drv.j.exited[0] = true
			r.set(reportKey(1, 0), "1")
			r.set(reportKey(1, 1), "2 3")
			if got, want := r.published(1), []string{"0:1 1:2"}; !slices.Equal(got, want) {
				t.Fatalf("epoch 1's decisions = %q, want %q", got, want)
			}
			if r.drv.formWaitC() == nil {
				t.Fatal("no form wait armed by the decision")
			}
			if formed {
				r.set(formedKey(1), "1")
			}
			// What the supervise loop does when the form wait fires.
			r.drv.decide()
			r.drv.formOverdue()
			if formed {
				if r.drv.state != jobRunning || r.drv.formWaitC() != nil {
					t.Fatalf("a formed epoch failed the job (state %v, err %v) or kept its form wait", r.drv.state, r.drv.err)
				}
				return
			}
			if r.drv.state != jobFailed || r.drv.err == nil || !strings.Contains(r.drv.err.Error(), "epoch 1, decided") || !strings.Contains(r.drv.err.Error(), "has not formed") {
				t.Fatalf("state %v, err %v; want the job failed naming the unformed epoch 1", r.drv.state, r.drv.err)
			}
		})
	}
}

// TestDecideWaitsForRanksThatSayTheyExit is run 11's failure of the test
// command: at the job's end every rank said Goodbye with exiting set, their
// daemons reported empty parts for the next epoch, and on the loaded
// machine the processes still ran at the report wait. The driver stopped
// them as ranks left out that still run, their signal exits were judged
// failures, and the job that finished ended with "No hosts from previous
// set remaining". A rank whose daemon says it exits is waited for, up to
// the exit wait; one that said nothing is stopped at the report wait.
func TestDecideWaitsForRanksThatSayTheyExit(t *testing.T) {
	r := newDecideRig(t, 1, []int{0, 1}, []int{2, 3})
	r.drv.exitWait = time.Hour
	for _, tag := range []int{0, 1, 2} {
		if err := r.st.Set(context.Background(), exitingKey(strconv.Itoa(tag)), nil); err != nil {
			t.Fatal(err)
		}
	}
	r.set(reportKey(1, 0), "")
	r.set(reportKey(1, 1), "")
	r.drv.ms.overdue = true // the report wait is over
	r.drv.decide()
	for tag, want := range []bool{false, false, false, true} {
		if got := r.drv.ranks[tag].stopping; got != want {
			t.Errorf("rank %d stopping = %v, want %v (exiting keys for 0, 1, 2; stderr:\n%s)", tag, got, want, r.stderr.String())
		}
	}
	if n := strings.Count(r.stderr.String(), "waiting up to"); n != 3 {
		t.Errorf("the driver said it waits %d times, want once for each of ranks 0, 1, 2:\n%s", n, r.stderr.String())
	}
	r.drv.decide() // another event: the wait is not logged again
	if n := strings.Count(r.stderr.String(), "waiting up to"); n != 3 {
		t.Errorf("the wait was logged %d times after a second decision, want 3:\n%s", n, r.stderr.String())
	}

	// Ranks 0 and 1 exit (status 0); rank 2 still runs past the exit wait.
	r.drv.j.exited[0], r.drv.j.exited[1] = true, true
	r.drv.ms.since = time.Now().Add(-2 * time.Hour)
	r.drv.decide()
	if !r.drv.ranks[2].stopping {
		t.Errorf("rank 2 still runs after the exit wait but was not stopped:\n%s", r.stderr.String())
	}
	if !strings.Contains(r.stderr.String(), "rank 2 said its process exits but still runs") {
		t.Errorf("stderr does not say why rank 2 was stopped:\n%s", r.stderr.String())
	}
	if got := r.published(1); len(got) != 0 {
		t.Errorf("decided %q while ranks 2 and 3 have not exited", got)
	}
}
