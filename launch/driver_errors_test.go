package launch

import (
	"testing"
	"time"
)

// Error paths of the elastic driver with real daemons and Go ranks
// (driver_test.go), where what the daemons do matters.

// TestDriverE2EAddedRankFails: the rank started on a host added by
// discovery exits at once (its command cannot start there). The new
// host's daemon, which has joined the job, runs on without a rank; the
// first host's rank goes on in its epoch of one (it does not wait for the
// joiner that never came), finishes the job, and Run returns 0.
func TestDriverE2EAddedRankFails(t *testing.T) {
	t.Parallel()
	bin := buildHvdd(t)
	dir := testDir(t)
	rj := startReal(t, dir, bin, Config{NP: 1, HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.71:1\n"), Env: []string{envFailNode + "=1"}})
	rj.epoch(1, 0)
	setHosts(t, dir, "127.0.0.71:1\n127.0.0.72:1\n")
	rj.stderr.waitFor(t, "hvdd run: host 127.0.0.72 joins the elastic job: starting its hvdd daemon (node 1) for 1 rank (reset 1)\n", 10*time.Second)
	rj.stderr.waitFor(t, "[1]<stderr>:train: error while loading shared libraries: libcudart.so.12: cannot open shared object file\n", 20*time.Second)
	rj.stderr.waitFor(t, ") exited with status 127; the elastic job goes on with 1 rank (--min-np 1; reset 2)\n", 20*time.Second)
	rj.stderr.waitFor(t, "hvdd run: blacklisting its slot on 127.0.0.72 for good (no --blacklist-cooldown-range); the host's daemon and other ranks go on\n", 20*time.Second)
	rj.finish()
	rj.checkCleanedUp()
}
