package launch

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// Host is one entry of -H or --hostfile: a machine and how many ranks it may
// run.
type Host struct {
	// Name is the host as given: a name or an address (IPv6 without
	// brackets). It is what the agent (ssh) connects to and what the host's
	// daemon advertises to the other hosts.
	Name string
	// Slots is the number of ranks the host may run, at least 1.
	Slots int
}

func (h Host) String() string {
	name := h.Name
	if strings.Contains(name, ":") {
		name = "[" + name + "]"
	}
	return name + ":" + strconv.Itoa(h.Slots)
}

// ParseHosts parses horovodrun's -H value: comma-separated host[:slots]
// entries (slots default to 1; IPv6 addresses go in brackets, [::1]:2).
func ParseHosts(s string) ([]Host, error) {
	var hosts []Host
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("-H %q has an empty entry; write it as host1:slots,host2:slots", s)
		}
		h, err := parseHost(item)
		if err != nil {
			return nil, fmt.Errorf("-H: %v", err)
		}
		hosts = append(hosts, h)
	}
	return hosts, checkHosts(hosts)
}

// parseHost parses host, host:N, [v6] or [v6]:N.
func parseHost(s string) (Host, error) {
	name, slots := s, ""
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 {
			return Host{}, fmt.Errorf("%q: missing ']' after an IPv6 address", s)
		}
		name = s[1:end]
		rest := s[end+1:]
		switch {
		case rest == "":
		case strings.HasPrefix(rest, ":"):
			slots = rest[1:]
		default:
			return Host{}, fmt.Errorf("%q: want [address]:slots", s)
		}
	} else if i := strings.LastIndex(s, ":"); i >= 0 {
		if strings.Count(s, ":") > 1 {
			return Host{}, fmt.Errorf("%q: put an IPv6 address in brackets, e.g. [%s]:1", s, s)
		}
		name, slots = s[:i], s[i+1:]
	}
	return newHost(s, name, slots)
}

func newHost(entry, name, slots string) (Host, error) {
	if err := checkHostName(entry, name); err != nil {
		return Host{}, err
	}
	h := Host{Name: name, Slots: 1}
	if slots != "" {
		n, err := strconv.Atoi(slots)
		if err != nil || n < 1 {
			return Host{}, fmt.Errorf("%q: slots must be a whole number of at least 1, not %q", entry, slots)
		}
		h.Slots = n
	}
	return h, nil
}

// checkHostName refuses an empty name, and one that is not a host name or
// address (entry is the text it came from, for the message).
func checkHostName(entry, name string) error {
	if name == "" {
		return fmt.Errorf("%q: the host name is empty", entry)
	}
	if strings.ContainsAny(name, " \t\r\n'\"\\$`;&|<>()*?[]{}!#~=,") || strings.HasPrefix(name, "-") {
		return fmt.Errorf("%q: %q is not a host name or address", entry, name)
	}
	return nil
}

// ReadHostfile reads horovodrun's (and mpirun's) hostfile: one host per line
// as "host slots=N", "host:N" or "host" (1 slot); blank lines and text after
// '#' are ignored.
func ReadHostfile(path string) ([]Host, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--hostfile: %w", err)
	}
	defer f.Close()
	var hosts []Host
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		var h Host
		switch {
		case len(fields) == 1:
			h, err = parseHost(fields[0])
		case len(fields) == 2 && strings.HasPrefix(fields[1], "slots="):
			name := strings.TrimSuffix(strings.TrimPrefix(fields[0], "["), "]")
			h, err = newHost(line, name, strings.TrimPrefix(fields[1], "slots="))
		default:
			err = fmt.Errorf("%q: want \"host slots=N\" or \"host:N\"", strings.TrimSpace(line))
		}
		if err != nil {
			return nil, fmt.Errorf("--hostfile %s line %d: %v", path, n, err)
		}
		hosts = append(hosts, h)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--hostfile %s: %w", path, err)
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("--hostfile %s names no hosts; write one \"host slots=N\" per line", path)
	}
	return hosts, checkHosts(hosts)
}

func checkHosts(hosts []Host) error {
	seen := map[string]bool{}
	for _, h := range hosts {
		if seen[h.Name] {
			return fmt.Errorf("host %s is listed twice; give it once with all its slots (e.g. %s:4)", h.Name, h.Name)
		}
		seen[h.Name] = true
	}
	return nil
}

// A node is a host with the ranks the job places on it, and the daemon
// they talk to.
type node struct {
	Host   string // empty for this machine when no hosts were given
	Slots  int    // ranks on this host, at least 1
	Offset int    // global rank of its local rank 0
	Local  bool   // one of this machine's own addresses: started directly, not through the agent
	// Shared marks the node of a job on this machine only: its daemon is
	// the machine's shared one on Config.Socket, used if it runs and else
	// started for the job. Other nodes get a daemon of their own.
	Shared bool
	Socket string // the daemon's socket, HVDD_SOCKET of the node's ranks
}

// layout places np ranks on hosts node-major, filling each host's slots in
// order as horovodrun does; hosts left with no rank are dropped.
func layout(hosts []Host, np int) ([]node, error) {
	if len(hosts) == 0 {
		return nil, errors.New("no hosts given")
	}
	total := 0
	for _, h := range hosts {
		if h.Slots < 1 {
			return nil, fmt.Errorf("host %s has %d slots; give every host at least 1", h.Name, h.Slots)
		}
		total += h.Slots
	}
	if np > total {
		list := make([]string, len(hosts))
		for i, h := range hosts {
			list[i] = h.String()
		}
		return nil, fmt.Errorf("-np %d is more than the %d slots of the hosts (%s); lower -np or give the hosts more slots", np, total, strings.Join(list, ","))
	}
	var nodes []node
	offset := 0
	for _, h := range hosts {
		if offset == np {
			break
		}
		n := min(h.Slots, np-offset)
		nodes = append(nodes, node{Host: h.Name, Slots: n, Offset: offset})
		offset += n
	}
	return nodes, nil
}

// crossRank returns Horovod's cross rank and size for local rank lr on node
// i: among the nodes that have a local rank lr, node i's index and their
// count (the daemon computes the same).
func crossRank(nodes []node, i, lr int) (rank, size int) {
	for k, n := range nodes {
		if n.Slots > lr {
			if k < i {
				rank++
			}
			size++
		}
	}
	return rank, size
}

// isLocalHost reports whether host names this machine: "localhost", a
// loopback address (127.0.0.0/8, ::1), one of net.InterfaceAddrs(), this
// machine's host name, or a name that resolves to one of those.
func isLocalHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	if hn, err := os.Hostname(); err == nil && strings.EqualFold(host, hn) {
		return true
	}
	ips := []net.IP{net.ParseIP(host)}
	if ips[0] == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
		if err != nil {
			return false // the agent will say what is wrong with it
		}
		ips = ips[:0]
		for _, a := range addrs {
			ips = append(ips, a.IP)
		}
	}
	own, _ := net.InterfaceAddrs()
	for _, ip := range ips {
		if ip.IsLoopback() {
			return true
		}
		for _, a := range own {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return true
			}
		}
	}
	return false
}
