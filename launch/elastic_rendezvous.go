package launch

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"

	"github.com/hvdd/hvdd/rendezvous"
)

// The elastic driver serves the job's rendezvous store itself, in hvdd
// run's process, for the life of the job, so that the store outlives any
// host's daemon: node 0's may die, or its host leave, and the daemons
// move the job's coordination to another node, which they find through
// the store's "coordinator" key. Every daemon, node 0's included, is
// started with --rendezvous ADDR --rendezvous-external.
//
// Where it listens: on 127.0.0.1 when the hosts are fixed (-H) and all of
// them are this machine; otherwise (a remote host, or a discovery script,
// which may add one later) on every interface. The port is
// --rendezvous-port, else a free one. Each daemon gets the address of this
// machine its host reaches: 127.0.0.1 for a host that is this machine,
// else the local address of this machine's route to the host (as hvdd
// serve picks its --advertise address), or this machine's host name when
// there is no route. The store authenticates every request with the job's
// secret, as node 0's daemon's does.

// removedKey is the key of the job's rendezvous store by which the driver
// tells node k's daemon that its host has been removed from the job; the
// value is the host's name. The daemon then has its ranks leave the job at
// their next reset (see removeNode).
func removedKey(k int) string { return "elastic/removed/" + strconv.Itoa(k) }

// driverRendezvous is the rendezvous server of a job the elastic driver
// runs. Only the goroutine running Run touches it.
type driverRendezvous struct {
	srv    *rendezvous.Server
	port   string
	served chan error        // Serve's result
	addrs  map[string]string // by host: the address its daemon gets
}

// serveRendezvous starts the job's rendezvous server (see above) and sets
// j.rdv; the caller closes it with closeRendezvous once the daemons are
// stopped. The exit code goes with a non-nil error.
func (j *job) serveRendezvous() (int, error) {
	cfg := j.cfg
	loopback := cfg.HostDiscoveryScript == ""
	for _, h := range cfg.Hosts {
		loopback = loopback && j.isLocal(h.Name)
	}
	host := ""
	if loopback {
		host = "127.0.0.1"
	}
	addr := net.JoinHostPort(host, strconv.Itoa(cfg.RendezvousPort))
	srv, err := rendezvous.NewServer(rendezvous.ServerConfig{Addr: addr, Secret: j.key, Logger: j.o.logger(), AllowAll: !loopback})
	if err != nil {
		return exitLaunchFailed, fmt.Errorf("serve the elastic job's rendezvous on %s: %w; pass another --rendezvous-port", addr, err)
	}
	_, port, _ := net.SplitHostPort(srv.Addr())
	r := &driverRendezvous{srv: srv, port: port, served: make(chan error, 1), addrs: map[string]string{}}
	go func() { r.served <- srv.Serve(context.Background()) }()
	j.rdv = r
	return 0, nil
}

// closeRendezvous stops the job's rendezvous server, if it runs, and waits
// for it.
func (j *job) closeRendezvous() {
	if j.rdv == nil {
		return
	}
	j.rdv.srv.Close()
	<-j.rdv.served
}

// rendezvousFor is the --rendezvous address of node i's daemon: node 0's
// HOST:PORT, or the address of the driver's server that node i's host
// reaches.
func (j *job) rendezvousFor(i int) string {
	if j.rdv == nil {
		return j.rendezvous
	}
	n := j.nodes[i]
	if n.Local {
		return net.JoinHostPort("127.0.0.1", j.rdv.port)
	}
	if a, ok := j.rdv.addrs[n.Host]; ok {
		return a
	}
	host := routeTo(n.Host)
	if host == "" {
		host, _ = os.Hostname()
		j.o.logf("warning: no route from this machine to host %s; its daemon gets the rendezvous at %s (this machine's host name), which it must reach", n.Host, net.JoinHostPort(host, j.rdv.port))
	}
	a := net.JoinHostPort(host, j.rdv.port)
	j.rdv.addrs[n.Host] = a
	return a
}

// routeTo returns this machine's address on its route to host, or "" when
// there is none (host does not resolve, or no route): a UDP "connection"
// sends nothing, but picks the source address.
func routeTo(host string) string {
	c, err := net.Dial("udp", net.JoinHostPort(host, "9"))
	if err != nil {
		return ""
	}
	defer c.Close()
	ip, _, _ := net.SplitHostPort(c.LocalAddr().String())
	return ip
}

// logger returns a logger whose records (warnings and above) become
// "hvdd run: " lines, for the packages hvdd run drives in process.
func (o *output) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(logfWriter{o}, &slog.HandlerOptions{
		Level: slog.LevelWarn,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{} // logf's lines carry no time either
			}
			return a
		},
	}))
}

// logfWriter writes every Write (one slog record) as one logf line.
type logfWriter struct{ o *output }

func (w logfWriter) Write(p []byte) (int, error) {
	w.o.logf("%s", bytes.TrimRight(p, "\n"))
	return len(p), nil
}
