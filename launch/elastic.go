package launch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"
)

// The elastic driver runs the jobs whose hosts can change: an elastic job
// with a host discovery script, or with -H and --min-np (Horovod's
// FixedHosts). It follows horovodrun's ElasticDriver
// (horovod/runner/elastic/driver.py): it waits up to the elastic timeout
// for -np slots, starts a rank on every available slot (up to --max-np),
// and then, every second, looks at the hosts again and adds or removes
// ranks (elastic_hosts.go), while it supervises them (elastic_loop.go).
//
// Every host gets a daemon of its own for the job, started with --elastic
// (even a single host that is this machine); the first host's daemon is
// node 0. A host that joins later is node K, the next index (never
// reused), started with --nodes K+1 --node-rank K. The driver serves the
// job's rendezvous store itself (elastic_rendezvous.go), and every daemon
// is its client (--rendezvous-external): the daemons keep the current
// coordinator's address there, so the job's coordination can move from
// node 0 to another node. The driver only starts and stops processes: the
// daemons re-form the job around the ranks that come and go.
//
// Failures. As Horovod's driver, the driver blacklists the host of a failed
// worker: a rank that exits with a non-zero status (an exception, a
// signal) or cannot start, or the host's daemon (or the daemon's agent)
// dying. The host's other ranks are stopped, its daemon once they have
// exited, and it comes back after the cooldown of
// --blacklist-cooldown-range as a new node (never without one). The ranks
// on the other hosts see the failed rank leave (the daemons end the epoch,
// the Python client's exit tells its daemon so), restore their last commit
// and re-form. Host 0 is a host like the others: a rank of it may fail,
// its daemon may die, it may leave, and the job goes on on the other
// hosts.

// driver is the elastic driver of one job. Only the goroutine running Run
// touches it; other goroutines report to it on its channels.
type driver struct {
	j        *job
	hm       *hostManager
	discover discoverFunc
	every    time.Duration // how often discovery runs
	timeout  time.Duration // the elastic timeout
	path     string        // the command on this machine, once looked up

	ranks   []driverRank   // by output tag (j.workers' index)
	nodes   []driverNode   // by node index, beside j.nodes
	current map[string]int // host -> its node that runs its ranks now
	resets  int            // membership changes so far

	state     int   // jobRunning, ...
	code      int   // the job's exit code
	err       error // what to return with it
	lastFail  int   // the exit code of the last failed rank (exitLaunchFailed if none)
	finishing bool  // a rank finished with status 0: the job ends as the others do
	killC     <-chan time.Time
	minWait   *time.Timer // running while fewer than --min-np ranks run
	// discFailing is when the discovery script began failing (zero: it
	// works).
	discFailing time.Time

	ctx     context.Context // cancelled when supervise returns
	daemonC chan *daemonProc
	readyC  chan readyEvent
	discC   chan discovery
	quit    chan struct{}

	// ms decides each epoch's members (elastic_members.go); storeC
	// signals a change of the job's rendezvous store, reportWait bounds
	// the wait for the daemons' reports, formWait that for an epoch
	// decided to form, and exitWait that for the exit of a rank that said
	// its process exits.
	ms         membership
	storeC     chan struct{}
	reportWait time.Duration
	formWait   time.Duration
	exitWait   time.Duration
}

// driverRank is a rank the driver started.
type driverRank struct {
	node     int
	stopping bool      // asked to stop: its host lost its daemon, or left the job and the rank did not
	stopAt   time.Time // when it was asked
	killed   bool      // SIGKILLed after the kill grace
	// leaving: its host was removed from the job and its daemon told so
	// (removeNode); the daemon refuses the rank at the ranks' next reset,
	// and its exit, whatever its status, is expected.
	leaving bool
}

// driverNode is a node (a host's daemon) the driver started.
type driverNode struct {
	d        *daemonProc
	ready    bool
	dead     bool // its daemon exited
	retired  bool // its host runs no ranks on it any more; its daemon is stopped once they have exited
	stopped  bool // the driver stopped its daemon
	reserved int  // ranks to start once its daemon is ready
	// removedAt is when the driver told the node's daemon that its host
	// was removed from the job (zero: never); its ranks still running
	// --elastic-timeout later are stopped.
	removedAt time.Time
}

type readyEvent struct {
	node int
	err  error
}

type discovery struct {
	hosts []Host
	err   error
}

func newDriver(j *job) *driver {
	cfg := j.cfg
	drv := &driver{
		j:        j,
		hm:       newHostManager(cfg.BlacklistCooldown, time.Now, rand.Float64),
		every:    DefaultDiscoverEvery,
		timeout:  DefaultElasticTimeout,
		current:  map[string]int{},
		lastFail: exitLaunchFailed,
		daemonC:  make(chan *daemonProc),
		readyC:   make(chan readyEvent),
		discC:    make(chan discovery),
		quit:     make(chan struct{}),

		storeC:     make(chan struct{}, 1),
		reportWait: DefaultReportWait,
		formWait:   DefaultFormWait,
		exitWait:   DefaultExitWait,
	}
	if cfg.reportWait > 0 {
		drv.reportWait = cfg.reportWait
	}
	if cfg.formWait > 0 {
		drv.formWait = cfg.formWait
	}
	if cfg.exitWait > 0 {
		drv.exitWait = cfg.exitWait
	}
	if cfg.discoverEvery > 0 {
		drv.every = cfg.discoverEvery
	}
	if cfg.ElasticTimeout > 0 {
		drv.timeout = cfg.ElasticTimeout
	}
	if cfg.HostDiscoveryScript != "" {
		drv.discover = scriptDiscovery(cfg.HostDiscoveryScript, cfg.Dir, cfg.SlotsPerHost)
	} else {
		drv.discover = fixedHosts(cfg.Hosts)
	}
	return drv
}

// runElastic is Run for a job the elastic driver runs (cfg.driven()).
func runElastic(ctx context.Context, cfg *Config, o *output, sigs <-chan os.Signal) (int, error) {
	j := &job{cfg: cfg, o: o}
	if code, err := j.prepareOwnDaemons(); err != nil {
		return code, err
	}
	drv := newDriver(j)
	var hosts []Host
	sig, err := interruptibly(ctx, sigs, func(ctx context.Context) (err error) {
		hosts, err = drv.waitForSlots(ctx, cfg.NP)
		return err
	})
	if code, err := startFailed(ctx, sig, err, "the elastic job"); err != nil {
		return code, err
	}

	// The first hosts' nodes, ranks node-major.
	target := assign(hosts, nil, cfg.MaxNP)
	for _, h := range hosts {
		if n := target[h.Name]; n > 0 {
			i := drv.addNode(h.Name, n)
			j.nodes[i].Offset = j.size
			j.size += n
		}
	}
	// The store outlives every daemon: it is closed after them (defers run
	// last to first).
	if code, err := j.serveRendezvous(); err != nil {
		return code, err
	}
	defer j.closeRendezvous()
	j.warnLoopback()
	if j.hasLocal() {
		path, code, err := lookCommand(cfg)
		if err != nil {
			return code, err
		}
		drv.path = path
	}
	sig, err = interruptibly(ctx, sigs, j.startDaemons)
	defer j.stopDaemons()
	if code, err := startFailed(ctx, sig, err, j.daemonsName()); err != nil {
		return code, err
	}
	for i, d := range j.daemons {
		drv.nodes[i].d, drv.nodes[i].ready = d, true
	}
	if code, err := j.startRanks(drv.path); err != nil {
		return code, err
	}
	for i, n := range j.nodes {
		for range n.Slots {
			drv.ranks = append(drv.ranks, driverRank{node: i})
		}
	}
	drv.startMembership()
	return drv.supervise(ctx, sigs)
}

// addNode adds the next node, for host with slots ranks, and makes it the
// host's current node. Its daemon is not started.
func (drv *driver) addNode(host string, slots int) int {
	j := drv.j
	i := len(j.nodes)
	j.nodes = append(j.nodes, node{Host: host, Slots: slots, Local: j.isLocal(host), Socket: j.socketPath(i)})
	drv.nodes = append(drv.nodes, driverNode{})
	drv.current[host] = i
	return i
}

// waitForSlots runs discovery every drv.every until the available hosts
// have np slots, and returns them; it gives up after the elastic timeout
// with Horovod's message. A failing first run of the discovery fails the
// job (horovodrun: a misconfiguration); later failures are retried.
func (drv *driver) waitForSlots(ctx context.Context, np int) ([]Host, error) {
	deadline := time.Now().Add(drv.timeout)
	var avail []Host
	for first, told := true, false; ; first = false {
		hosts, err := drv.discover(ctx)
		switch {
		case err != nil && (first || ctx.Err() != nil):
			return nil, err
		case err != nil && drv.discFailing.IsZero():
			drv.discFailing = time.Now()
			drv.j.o.logf("%v; retrying every %v", err, drv.every)
		case err == nil:
			drv.discFailing = time.Time{}
			drv.hm.setDiscovered(hosts)
		}
		avail = drv.hm.available()
		have := totalSlots(avail)
		if have >= np {
			return avail, nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				// The hosts may have more slots by now: say why they
				// were not seen.
				return nil, fmt.Errorf("%s The host discovery script has failed for the last %v: %w",
					drv.slotsTimeout(np), time.Since(drv.discFailing).Round(time.Millisecond), err)
			}
			return nil, errors.New(drv.slotsTimeout(np))
		}
		if !told {
			told = true
			drv.j.o.logf("waiting up to %v (--elastic-timeout) for %d slots; the hosts have %d (%s)", drv.timeout, np, have, hostList(avail))
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %d slots: %w", np, context.Cause(ctx))
		case <-time.After(min(drv.every, time.Until(deadline)+time.Millisecond)):
		}
	}
}

// slotsTimeout is Horovod's message when the slots for np ranks did not
// become available in time, with what the hosts have.
func (drv *driver) slotsTimeout(np int) string {
	avail := drv.hm.available()
	slots := "1 usable slot"
	if n := totalSlots(avail); n != 1 {
		slots = strconv.Itoa(n) + " usable slots"
	}
	return fmt.Sprintf("Timed out waiting for minimum number of slots to become available. Please check that you have enough resources to run at least %d Horovod processes. (After %v the hosts have %s: %s; make more available, or raise --elastic-timeout.)",
		np, drv.timeout, slots, hostList(avail))
}

func totalSlots(hosts []Host) int {
	n := 0
	for _, h := range hosts {
		n += h.Slots
	}
	return n
}

// hostList names hosts with their slots, for messages.
func hostList(hosts []Host) string {
	if len(hosts) == 0 {
		return "none"
	}
	s := make([]string, len(hosts))
	for i, h := range hosts {
		s[i] = h.String()
	}
	return strings.Join(s, ", ")
}
