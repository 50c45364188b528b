package nodes

import (
	"context"
	"strconv"
	"time"

	"github.com/hvdd/hvdd/daemon/internal/job"
)

// Removing a host from an elastic job, as Horovod does: nothing is lost.
// When the host discovery of hvdd run's elastic driver stops listing a host,
// the driver sets "elastic/removed/NODE" (the node's --node-rank) in the
// rendezvous store it serves, to the host's name. The node's daemon, which
// waits for that key, tells global rank 0 (HostsUpdated with Horovod's
// HostUpdateResult.removed, through the coordinator), so that every rank
// raises HostsUpdatedInterrupt at the same commit and, the update being a
// removal only, skips the state sync after its reset. At that reset the
// node's own ranks are refused ("HOST[LOCAL_RANK] has been removed from
// elastic job") and the node leaves the job (the loop's reformAfter); the
// other nodes form the next epoch without it.

// msgRemoved says that hvdd run removed this node's host.
type msgRemoved struct{ host string }

// removedKey is the rendezvous key that removes node from an elastic job.
func removedKey(node int) string { return "elastic/removed/" + strconv.Itoa(node) }

// watchRemoval (its own goroutine, while the daemon runs) waits for this
// node's removal key; the store's long polls cost an idle daemon one
// request a poll period.
func (c *multiNode) watchRemoval(ctx context.Context) {
	key, backoff := removedKey(c.rank), time.Second
	for {
		kv, err := c.store.Wait(ctx, key)
		if err == nil {
			c.p.Post(msgRemoved{host: string(kv[key])})
			return
		}
		if ctx.Err() != nil {
			return
		}
		c.log.Debug("cannot watch the rendezvous for this host's removal; trying again", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// hostRemoved records that hvdd run removed this node's host, and tells
// global rank 0 of the running elastic job.
func (c *multiNode) hostRemoved(host string) {
	if host == "" {
		host = c.host
	}
	c.removedHost = host
	c.log.Warn("this host was removed from the elastic job (hvdd run's host discovery no longer lists it); its ranks leave at their next reset", "host", host, "node", c.rank)
	c.hooks.HostsUpdated(job.HostsRemoved)
}

// Removed returns this node's host once it was removed (formation).
func (c *multiNode) Removed() string { return c.removedHost }
