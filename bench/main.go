// Package bench is `hvdd bench`, the project's nccl-tests: it times hvdd's
// collectives through a real daemon and reports, per size, the median time
// per iteration (the maximum over ranks of each iteration) with the
// algorithm and bus bandwidth as nccl-tests defines them. It also has two
// profiles: resnet50 (161 asynchronous gradient allreduces per step against
// one fused allreduce) and idle (the CPU an idle daemon and its clients use).
//
// Main is the whole command. Run as a rank of a job (HVDD_SOCKET and
// HVDD_LOCAL_RANK set, as under `hvdd run`) it is one rank; with --np N it
// starts a private daemon and N copies of itself through package launch.
// The pure parts (sizes, statistics, bandwidth, check references) are
// exported for tests and for other tools.
package bench

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/launch"
	"github.com/hvdd/hvdd/tensor"
)

// Main runs `hvdd bench` with args (the arguments after "bench") and
// returns the exit status: 0 on success, 1 on a failure or a failed
// --check, 2 on a usage error.
func Main(args []string, stdout, stderr io.Writer) int {
	var help bytes.Buffer
	cfg, err := ParseArgs(args, &help)
	if errors.Is(err, flag.ErrHelp) {
		stdout.Write(help.Bytes())
		return 0
	}
	if err != nil {
		if help.Len() > 0 {
			// The flag package's own message comes first.
			line, _, _ := strings.Cut(help.String(), "\n")
			fmt.Fprintf(stderr, "hvdd bench: %s (see hvdd bench --help)\n", line)
		} else {
			fmt.Fprintf(stderr, "hvdd bench: %v\n", err)
		}
		return 2
	}
	inJob := os.Getenv("HVDD_LOCAL_RANK") != "" && os.Getenv("HVDD_SOCKET") != ""
	if cfg.NP > 0 && !inJob {
		return launchJob(cfg, args, stdout, stderr)
	}
	if !inJob && cfg.Socket == "" && os.Getenv("HVDD_SOCKET") == "" {
		fmt.Fprintln(stderr, "hvdd bench: not part of a job: pass --np N to start one (hvdd bench --np 2), run under hvdd run, or set HVDD_SOCKET")
		return 2
	}
	if err := Worker(context.Background(), cfg, stdout, stderr); err != nil {
		if !errors.Is(err, errCheckFailed) {
			fmt.Fprintf(stderr, "hvdd bench: %v\n", err)
		} else {
			fmt.Fprintln(stderr, "hvdd bench: --check found wrong results")
		}
		return 1
	}
	return 0
}

// launchJob starts a daemon and cfg.NP ranks of this executable running the
// same bench (the arguments minus --np), and returns the job's exit status.
func launchJob(cfg Config, args []string, stdout, stderr io.Writer) int {
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "hvdd bench: cannot find the hvdd binary: %v\n", err)
		return 1
	}
	socket := cfg.Socket
	if socket == "" {
		dir, err := os.MkdirTemp("", "hvdd-bench-")
		if err != nil {
			fmt.Fprintf(stderr, "hvdd bench: %v\n", err)
			return 1
		}
		defer os.RemoveAll(dir)
		socket = filepath.Join(dir, "hvdd.sock")
	}
	np := strconv.Itoa(cfg.NP)
	lc := launch.Config{
		NP:            cfg.NP,
		Command:       append([]string{exe, "bench"}, StripFlag(args, "np")...),
		Socket:        socket,
		DaemonCommand: []string{exe, "serve", "--slots", np, "--socket", socket, "--log-level", "warning"},
		NoTagOutput:   true,
		Stdout:        stdout,
		Stderr:        stderr,
	}
	if cfg.Device != "" {
		lc.DaemonCommand = append(lc.DaemonCommand, "--gpu", cfg.Device)
	}
	code, err := launch.Run(context.Background(), lc)
	if err != nil {
		fmt.Fprintf(stderr, "hvdd bench: %v\n", err)
	}
	return code
}

// StripFlag removes every occurrence of the flag name ("-name V",
// "--name V", "-name=V", "--name=V") from args, stopping at "--".
func StripFlag(args []string, name string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		bare := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if strings.HasPrefix(a, "-") && bare == name {
			i++ // skip the value too
			continue
		}
		if strings.HasPrefix(a, "-") && strings.HasPrefix(bare, name+"=") {
			continue
		}
		out = append(out, a)
	}
	return out
}

// Worker runs the benchmark as one rank: it connects to the daemon (cfg.Socket
// or $HVDD_SOCKET), runs the sweep or profile, and prints rank 0's rows to
// stdout. It returns an error wrapping a failure or a failed check.
func Worker(ctx context.Context, cfg Config, stdout, stderr io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	c := &hvdd.Client{Socket: cfg.Socket}
	if err := c.Init(ctx); err != nil {
		return err
	}
	if cfg.NP > 0 && cfg.NP != c.Size() {
		fmt.Fprintf(stderr, "hvdd bench: warning: --np %d ignored: the job has %d ranks\n", cfg.NP, c.Size())
	}
	err := traced(ctx, c, cfg, func() error { return dispatch(ctx, c, cfg, stdout, stderr) })
	if err != nil && !errors.Is(err, errCheckFailed) {
		err = fmt.Errorf("rank %d: %w", c.Rank(), err)
	}
	if cerr := c.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("rank %d: close: %w", c.Rank(), cerr)
	}
	return err
}

// traced runs f with the timeline of --timeline on, if asked for: rank 0
// starts it and every rank waits for that (a barrier), so the whole run is
// in the file; after f, rank 0 stops it, which returns once the daemon has
// completed the file.
func traced(ctx context.Context, c *hvdd.Client, cfg Config, f func() error) error {
	if cfg.Timeline == "" || cfg.TimelineCompare {
		return f() // with TimelineCompare the profile starts and stops it
	}
	if c.Rank() == 0 {
		if err := c.StartTimeline(ctx, cfg.Timeline, cfg.TimelineMarkCycles); err != nil {
			return fmt.Errorf("start the timeline: %w", err)
		}
	}
	if err := c.Barrier(ctx); err != nil {
		return err
	}
	err := f()
	if c.Rank() == 0 {
		if serr := c.StopTimeline(ctx); serr != nil && err == nil {
			err = fmt.Errorf("stop the timeline: %w", serr)
		}
	}
	return err
}

// dispatch runs the profile or the sweep cfg asks for, on cfg.DType's
// elements.
func dispatch(ctx context.Context, c *hvdd.Client, cfg Config, out, errOut io.Writer) error {
	if cfg.Profile == "idle" {
		return idle(ctx, c, cfg, out, errOut)
	}
	el, ok := picks[cfg.DType]
	if !ok {
		return fmt.Errorf("unsupported dtype %s", cfg.DType)
	}
	if cfg.Profile == "resnet50" {
		return resnet(ctx, c, cfg, el, out, errOut)
	}
	return sweep(ctx, c, cfg, el, out, errOut)
}

// picks holds the element type of each dtype hvdd bench measures.
var picks = map[tensor.DType]elems{
	tensor.Uint8:    &typed[uint8]{},
	tensor.Int8:     &typed[int8]{},
	tensor.Uint16:   &typed[uint16]{},
	tensor.Int16:    &typed[int16]{},
	tensor.Int32:    &typed[int32]{},
	tensor.Int64:    &typed[int64]{},
	tensor.Float16:  &typed[hvdd.Float16]{},
	tensor.BFloat16: &typed[hvdd.BFloat16]{},
	tensor.Float32:  &typed[float32]{},
	tensor.Float64:  &typed[float64]{},
	tensor.Bool:     &typed[bool]{},
}
