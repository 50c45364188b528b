package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Host discovery, as horovodrun's --host-discovery-script: the elastic
// driver (elastic.go) runs the script every second, and what it prints is
// the set of hosts the job may use right now, one per line, as HOST:SLOTS or
// HOST (then --slots-per-host gives the slots). A job with -H and --min-np
// instead has a fixed set (Horovod's FixedHosts).

// DefaultDiscoverEvery is how often the elastic driver runs the host
// discovery (Horovod's DISCOVER_HOSTS_FREQUENCY_SECS).
const DefaultDiscoverEvery = time.Second

// discoveryTimeout bounds one run of the discovery script; a run that takes
// longer is killed and counts as failed.
const discoveryTimeout = 30 * time.Second

// discoveryMaxOutput bounds what one run of the script may print.
const discoveryMaxOutput = 1 << 20

// discoverFunc returns the hosts available now, in a stable order.
type discoverFunc func(ctx context.Context) ([]Host, error)

// fixedHosts is the discovery of a job with -H and --min-np: always the
// same hosts.
func fixedHosts(hosts []Host) discoverFunc {
	return func(context.Context) ([]Host, error) { return hosts, nil }
}

// scriptDiscovery runs script with sh -c in dir (empty: ours) and parses
// its output, each run bounded by discoveryTimeout.
func scriptDiscovery(script, dir string, slotsPerHost int) discoverFunc {
	return func(ctx context.Context) ([]Host, error) {
		ctx, cancel := context.WithTimeout(ctx, discoveryTimeout)
		defer cancel()
		out, err := runScript(ctx, script, dir)
		if err != nil {
			return nil, err
		}
		hosts, err := parseDiscovery(out, slotsPerHost)
		if err != nil {
			return nil, fmt.Errorf("host discovery script %q: %w", script, err)
		}
		return hosts, nil
	}
}

// runScript runs script and returns its standard output. Its process group
// is killed when ctx ends.
func runScript(ctx context.Context, script, dir string) (string, error) {
	var stdout limitedBuffer
	stdout.max = discoveryMaxOutput
	stderr := &tailBuffer{max: 4 << 10}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", script)
	cmd.Dir = dir
	cmd.Env = environ()
	cmd.Stdout, cmd.Stderr = &stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	switch {
	case ctx.Err() != nil && errors.Is(context.Cause(ctx), context.DeadlineExceeded):
		return "", fmt.Errorf("the host discovery script %q did not finish within %v; make it print the hosts and exit", script, discoveryTimeout)
	case ctx.Err() != nil:
		return "", fmt.Errorf("host discovery script %q: %w", script, context.Cause(ctx))
	case stdout.over:
		return "", fmt.Errorf("the host discovery script %q printed more than %d bytes; it must print one host per line", script, discoveryMaxOutput)
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code, _ := describeExit(exit.ProcessState)
		return "", fmt.Errorf("Failed to execute discovery script: %s. Exit code: %d; its last output:\n%s\nfix the script: hvdd run runs it with /bin/sh -c in the job's working directory, and it must exit 0", script, code, stderr.lines(10))
	}
	if err != nil {
		return "", fmt.Errorf("run the host discovery script %q: %w", script, err)
	}
	return stdout.String(), nil
}

// limitedBuffer keeps up to max bytes and notes whether more came.
type limitedBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.max {
		b.over = true
		return len(p), nil
	}
	return b.Buffer.Write(p)
}

// parseDiscovery parses the output of a host discovery script: one host per
// line, as HOST:SLOTS, HOST (with slotsPerHost slots; it must then be
// positive) or [IPV6]:SLOTS. Blank lines are skipped (a script prints
// nothing when no host is ready); a host listed twice must have the same
// slots both times. Hosts come back in the order printed; a host with 0
// slots is listed, and is not used.
func parseDiscovery(out string, slotsPerHost int) ([]Host, error) {
	var hosts []Host
	seen := map[string]int{}
	for n, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		h, err := parseDiscoveredHost(line, slotsPerHost)
		if err != nil {
			return nil, fmt.Errorf("line %d: %v; print one host per line, as HOST:SLOTS, or HOST with --slots-per-host", n+1, err)
		}
		if slots, ok := seen[h.Name]; ok {
			if slots != h.Slots {
				return nil, fmt.Errorf("line %d: host %s is listed with %d slots and with %d; list it once", n+1, h.Name, slots, h.Slots)
			}
			continue
		}
		seen[h.Name] = h.Slots
		hosts = append(hosts, h)
	}
	return hosts, nil
}

// parseDiscoveredHost parses one line of a discovery script's output.
func parseDiscoveredHost(line string, slotsPerHost int) (Host, error) {
	name, slots, hasSlots := line, "", false
	if strings.HasPrefix(line, "[") {
		end := strings.Index(line, "]")
		if end < 0 {
			return Host{}, fmt.Errorf("%q: missing ']' after an IPv6 address", line)
		}
		name = line[1:end]
		switch rest := line[end+1:]; {
		case rest == "":
		case strings.HasPrefix(rest, ":"):
			slots, hasSlots = rest[1:], true
		default:
			return Host{}, fmt.Errorf("%q: want [address]:slots", line)
		}
	} else if i := strings.Index(line, ":"); i >= 0 {
		if strings.Count(line, ":") > 1 {
			return Host{}, fmt.Errorf("%q: put an IPv6 address in brackets, e.g. [%s]:1", line, line)
		}
		name, slots, hasSlots = line[:i], line[i+1:], true
	}
	if err := checkHostName(line, name); err != nil {
		return Host{}, err
	}
	if !hasSlots {
		if slotsPerHost < 1 {
			return Host{}, fmt.Errorf("%q has no slots and --slots-per-host is not given", line)
		}
		return Host{Name: name, Slots: slotsPerHost}, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(slots))
	if err != nil || n < 0 {
		return Host{}, fmt.Errorf("%q: slots must be a whole number, not %q", line, slots)
	}
	return Host{Name: name, Slots: n}, nil
}
