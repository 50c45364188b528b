package main

// hvdd serve under systemd (deploy/systemd): the listening socket that
// hvdd.socket passes (sd_listen_fds(3)), and the Type=notify protocol
// (sd_notify(3)): READY=1 once the event loop runs, STATUS= lines as its
// jobs come and go, STOPPING=1 at a stop, and WATCHDOG=1 pings for
// WatchdogSec= that only an answering event loop earns. Every function here
// does nothing when systemd did not ask for it, so hvdd serve behaves the
// same by hand.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hvdd/hvdd/daemon"
)

// listenFDsStart is SD_LISTEN_FDS_START: the first descriptor systemd
// passes.
const listenFDsStart = 3

// listenFDs reads the socket-activation variables the way
// sd_listen_fds_with_names(3) does: LISTEN_PID must name this process (else
// the descriptors are someone else's: none), LISTEN_FDS counts the
// descriptors from fd 3, and LISTEN_FDNAMES, when set, names each of them
// (FileDescriptorName=, by default the socket unit's name). Values that do
// not parse are errors, as sd_listen_fds reports -EINVAL.
func listenFDs(getenv func(string) string, pid int) (n int, names []string, err error) {
	lp := getenv("LISTEN_PID")
	if lp == "" {
		return 0, nil, nil
	}
	p, err := strconv.Atoi(lp)
	if err != nil || p <= 0 {
		return 0, nil, fmt.Errorf("socket activation: LISTEN_PID=%q is not a process id", lp)
	}
	if p != pid {
		return 0, nil, nil
	}
	lf := getenv("LISTEN_FDS")
	n, err = strconv.Atoi(lf)
	if err != nil || n < 0 || n > 1<<20 {
		return 0, nil, fmt.Errorf("socket activation: LISTEN_FDS=%q is not a descriptor count", lf)
	}
	if v := getenv("LISTEN_FDNAMES"); v != "" && n > 0 {
		names = strings.Split(v, ":")
		if len(names) != n {
			return 0, nil, fmt.Errorf("socket activation: LISTEN_FDNAMES=%q names %d descriptors, LISTEN_FDS=%d", v, len(names), n)
		}
	}
	return n, names, nil
}

// systemdListener returns the Unix socket that systemd passed (hvdd.socket,
// or systemd-socket-activate), or nil when none was passed. Like
// sd_listen_fds(3) it removes LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES
// from the environment and sets FD_CLOEXEC on every passed descriptor, so
// that nothing the daemon starts inherits them. hvdd serves one socket: it
// refuses several, and a descriptor that is not a listening Unix stream
// socket, saying which setting of the socket unit to change.
func systemdListener() (*net.UnixListener, error) {
	n, names, err := listenFDs(os.Getenv, os.Getpid())
	for _, k := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		os.Unsetenv(k)
	}
	if err != nil || n == 0 {
		return nil, err
	}
	for fd := listenFDsStart; fd < listenFDsStart+n; fd++ {
		unix.CloseOnExec(fd)
	}
	if n > 1 {
		what := fmt.Sprintf("%d sockets", n)
		if names != nil {
			what += " (" + strings.Join(names, ", ") + ")"
		}
		return nil, fmt.Errorf("systemd passed %s; hvdd serves one: give hvdd.socket exactly one ListenStream= and let no other socket unit name hvdd.service", what)
	}
	name := "systemd-socket"
	if names != nil {
		name = names[0]
	}
	if err := checkListening(listenFDsStart, name); err != nil {
		return nil, err
	}
	f := os.NewFile(listenFDsStart, name)
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("socket %s from systemd: %w", name, err)
	}
	return ln.(*net.UnixListener), nil
}

// checkListening checks that fd is what hvdd.socket declares: a listening
// Unix stream socket.
func checkListening(fd int, name string) error {
	domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return fmt.Errorf("descriptor %d (%s) from systemd is not a socket: %w", fd, name, err)
	}
	typ, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	listening, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	switch {
	case domain != unix.AF_UNIX:
		return fmt.Errorf("socket %s from systemd is not a Unix socket: hvdd serves local processes only; use ListenStream=/run/hvdd/hvdd.sock", name)
	case typ != unix.SOCK_STREAM:
		return fmt.Errorf("socket %s from systemd is not a stream socket: use ListenStream=, not ListenDatagram= or ListenSequentialPacket=", name)
	case listening == 0:
		return fmt.Errorf("socket %s from systemd is a connection, not a listening socket: remove Accept=yes from hvdd.socket", name)
	}
	return nil
}

// notifier sends sd_notify(3) messages to $NOTIFY_SOCKET (a path, or an
// abstract name that starts with @). Its zero value, for a daemon that
// systemd does not supervise with Type=notify, sends nothing.
type notifier struct {
	addr *net.UnixAddr
}

// newNotifier reads $NOTIFY_SOCKET and removes it from the environment.
// An address sd_notify would not use either (systemd's vsock: form
// included, which hvdd does not speak) is an error.
func newNotifier() (notifier, error) {
	path := os.Getenv("NOTIFY_SOCKET")
	os.Unsetenv("NOTIFY_SOCKET")
	if path == "" {
		return notifier{}, nil
	}
	if path[0] != '/' && path[0] != '@' || len(path) < 2 {
		return notifier{}, fmt.Errorf("NOTIFY_SOCKET=%q: hvdd speaks to a Unix datagram socket path or @abstract name only", path)
	}
	// Go's net maps a leading @ to the abstract namespace.
	return notifier{addr: &net.UnixAddr{Name: path, Net: "unixgram"}}, nil
}

// enabled reports whether systemd listens.
func (n notifier) enabled() bool { return n.addr != nil }

// send sends one message, newline-separated assignments such as
// "READY=1\nSTATUS=idle". Like sd_notify, each message goes through a
// socket of its own (systemd may have been re-executed since the last).
// Safe from any goroutine.
func (n notifier) send(state string) error {
	if n.addr == nil {
		return nil
	}
	c, err := net.DialUnix("unixgram", nil, n.addr)
	if err != nil {
		return fmt.Errorf("sd_notify %s: %w", n.addr.Name, err)
	}
	defer c.Close()
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("sd_notify %s: %w", n.addr.Name, err)
	}
	return nil
}

// watchdogInterval reads WatchdogSec= the way sd_watchdog_enabled(3) does:
// WATCHDOG_USEC is the interval in microseconds, and WATCHDOG_PID, when
// set, must name this process (else the watchdog is another's: 0). Zero
// means no watchdog; a value that does not parse is an error.
func watchdogInterval(getenv func(string) string, pid int) (time.Duration, error) {
	us := getenv("WATCHDOG_USEC")
	if us == "" {
		return 0, nil
	}
	v, err := strconv.ParseUint(us, 10, 64)
	if err != nil || v == 0 || v > uint64(1<<62)/1000 {
		return 0, fmt.Errorf("WATCHDOG_USEC=%q is not a positive number of microseconds", us)
	}
	if wp := getenv("WATCHDOG_PID"); wp != "" {
		p, err := strconv.Atoi(wp)
		if err != nil || p <= 0 {
			return 0, fmt.Errorf("WATCHDOG_PID=%q is not a process id", wp)
		}
		if p != pid {
			return 0, nil
		}
	}
	return time.Duration(v) * time.Microsecond, nil
}

// service is hvdd serve's side of Type=notify: it gives systemd the
// daemon's status lines (from Config.OnStatus) and, with WatchdogSec=,
// pings the watchdog for every probe of the event loop that is answered.
type service struct {
	n        notifier
	log      *slog.Logger
	watchdog time.Duration      // WatchdogSec; 0: off
	statusc  chan daemon.Status // the latest status not yet sent
}

// newService reads NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID (and
// removes them from the environment, as sd_notify and sd_watchdog_enabled
// do when asked to). A setting that cannot be used is logged and left off:
// the daemon still serves.
func newService(log *slog.Logger) *service {
	s := &service{log: log, statusc: make(chan daemon.Status, 1)}
	var err error
	if s.n, err = newNotifier(); err != nil {
		log.Warn("not telling systemd the daemon's state", "err", err)
	}
	s.watchdog, err = watchdogInterval(os.Getenv, os.Getpid())
	os.Unsetenv("WATCHDOG_USEC")
	os.Unsetenv("WATCHDOG_PID")
	if err != nil {
		log.Warn("no watchdog pings", "err", err)
	}
	if !s.n.enabled() {
		s.watchdog = 0
	}
	return s
}

// onStatus is Config.OnStatus: it keeps the latest status for run to send
// and returns at once (it runs on the daemon's event loop).
func (s *service) onStatus(st daemon.Status) {
	for {
		select {
		case s.statusc <- st:
			return
		default:
		}
		select {
		case <-s.statusc: // an older status nobody sent yet
		default:
		}
	}
}

// send sends a message to systemd, logging a failure.
func (s *service) send(state string) {
	if err := s.n.send(state); err != nil {
		s.log.Warn("cannot tell systemd", "state", state, "err", err)
	}
}

// run sends READY=1 with the first status (the event loop has started, and
// the socket listens) and each later status as STATUS=, and starts the
// watchdog pings, until ctx ends.
func (s *service) run(ctx context.Context, srv prober) {
	if !s.n.enabled() {
		return
	}
	if s.watchdog > 0 {
		go s.pingWatchdog(ctx, srv, s.watchdog/2)
	}
	ready := false
	for {
		select {
		case <-ctx.Done():
			return
		case st := <-s.statusc:
			msg := "STATUS=" + st.String()
			if !ready {
				msg = "READY=1\n" + msg
				ready = true
			}
			s.send(msg)
		}
	}
}

// prober is what the watchdog needs of the daemon (daemon.Server).
type prober interface {
	Probe(ctx context.Context) (daemon.Status, error)
}

// pingWatchdog probes the event loop every half watchdog interval and
// sends WATCHDOG=1 only when it answered (daemon.Server.Probe: the answer
// comes from the loop itself, between two passes over its events, so a
// loop stuck anywhere earns no ping and systemd ends the daemon after
// WatchdogSec). A probe waits until the next one is due. While the loop
// does not answer, each miss is sent as a STATUS= line instead, which
// systemctl status shows; nothing is logged then, since a stuck logger is
// one way for the loop to be stuck.
func (s *service) pingWatchdog(ctx context.Context, srv prober, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	missed := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, every)
		st, err := srv.Probe(pctx)
		cancel()
		switch {
		case err == nil && missed > 0:
			s.send("WATCHDOG=1\nSTATUS=" + st.String())
			s.log.Warn("the event loop answers again; watchdog pings resumed", "missed_checks", missed, "check_every", every)
			missed = 0
		case err == nil:
			s.send("WATCHDOG=1")
		case ctx.Err() != nil || errors.Is(err, daemon.ErrServerClosed):
			return
		default:
			missed++
			s.send(fmt.Sprintf("STATUS=event loop not answering: %d watchdog checks missed (one every %v); no watchdog ping", missed, every))
		}
	}
}
