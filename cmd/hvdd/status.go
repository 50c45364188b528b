package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

const statusUsage = `Usage: hvdd status [flags]

Shows what the node's daemon is doing: its jobs (name, user, state, ranks with
their pids, uids and hosts), what each job waits on now (the tensors some
ranks submitted, and the ranks missing), its recent errors, and the bytes and
throughput of its links to the other nodes, and the node's GPUs as its last
sampling round saw them (utilization, memory, temperature, power, PCIe and
NVLink throughput, ECC and XID errors, lost GPUs). Across nodes, node 0's daemon
(the coordinator) lists every node's ranks and every pending tensor.

Root and the daemon's own user see every job; other users see their own.

Flags:
`

// statusArgs holds hvdd status's flags.
type statusArgs struct {
	socket     string
	json       bool
	watch      bool
	interval   time.Duration
	maxPending int
}

// statusMain is hvdd status; it returns the exit status.
func statusMain(argv []string) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	var a statusArgs
	fs.StringVar(&a.socket, "socket", "", "the daemon's socket (default $HVDD_SOCKET, else the default path)")
	fs.BoolVar(&a.json, "json", false, "print the status as JSON (one object per line with --watch), for scripts")
	fs.BoolVar(&a.watch, "watch", false, "refresh in place, like top, until interrupted")
	fs.DurationVar(&a.interval, "interval", time.Second, "with --watch, how often to refresh")
	fs.IntVar(&a.maxPending, "max-pending", 20, "pending tensors to list per job")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), statusUsage)
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), "\nExamples:\n  hvdd status\n  hvdd status --watch\n  hvdd status --json | jq '.jobs[].pending'\n")
	}
	if err := fs.Parse(argv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "hvdd status: unexpected argument %q (see hvdd status --help)\n", fs.Arg(0))
		return 2
	}
	if a.interval <= 0 {
		fmt.Fprintln(os.Stderr, "hvdd status: --interval must be positive")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runStatus(ctx, a, os.Stdout); err != nil && ctx.Err() == nil {
		fmt.Fprintf(os.Stderr, "hvdd status: %v\n", err)
		return 1
	}
	return 0
}

// runStatus prints the daemon's status once, or until ctx ends with watch.
func runStatus(ctx context.Context, a statusArgs, out io.Writer) error {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	sc, err := hvdd.DialStatus(dctx, a.socket)
	cancel()
	if err != nil {
		return err
	}
	defer sc.Close()
	var prev *ipcpb.Status
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := sc.Status(rctx, a.maxPending)
		cancel()
		if err != nil {
			return err
		}
		switch {
		case a.json:
			b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: false}.Marshal(st)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "%s\n", b)
		case a.watch:
			// Home and clear, as top redraws.
			fmt.Fprint(out, "\x1b[H\x1b[2J")
			fmt.Fprint(out, formatStatus(st, prev))
		default:
			fmt.Fprint(out, formatStatus(st, prev))
		}
		if !a.watch {
			return nil
		}
		prev = st
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(a.interval):
		}
	}
}

// formatStatus renders st for a terminal; with prev (the last snapshot of
// --watch) the links show their throughput since then.
func formatStatus(st, prev *ipcpb.Status) string {
	var b strings.Builder
	up := time.Duration(st.GetNowMs()-st.GetStartedMs()) * time.Millisecond
	fmt.Fprintf(&b, "hvdd %s on %s (pid %d), node %d of %d, up %s; slots %d, %d in use; %d connections; %d goroutines, %d fds\n",
		st.GetVersion(), st.GetHost(), st.GetPid(), st.GetNodeRank(), st.GetNodes(), up.Round(time.Second),
		st.GetSlots(), st.GetSlotsUsed(), st.GetClients(), st.GetGoroutines(), st.GetOpenFds())
	if len(st.GetJobs()) == 0 {
		b.WriteString("no jobs\n")
	}
	if n := st.GetHiddenJobs(); n > 0 {
		fmt.Fprintf(&b, "(%d jobs of other users not shown)\n", n)
	}
	for _, j := range st.GetJobs() {
		name := j.GetName()
		if name == "" {
			name = "(unnamed)"
		}
		fmt.Fprintf(&b, "\njob %d %s (uid %d): %s", j.GetId(), name, j.GetUid(), j.GetState())
		if j.GetSize() > 0 {
			fmt.Fprintf(&b, ", %d ranks (%d here)", j.GetSize(), j.GetLocalSize())
		} else {
			fmt.Fprintf(&b, ", %d here", j.GetLocalSize())
		}
		if j.GetElastic() {
			fmt.Fprintf(&b, ", elastic epoch %d", j.GetEpoch())
		}
		if ms := j.GetFormedMs(); ms > 0 {
			fmt.Fprintf(&b, ", formed %s ago", (time.Duration(st.GetNowMs()-ms) * time.Millisecond).Round(time.Second))
		}
		if j.GetEngine() != "" {
			fmt.Fprintf(&b, ", engine %s", j.GetEngine())
		}
		fmt.Fprintf(&b, "\n  ran %d batches, %d fused responses, %d tensors, %s\n", j.GetBatches(), j.GetResponses(), j.GetTensors(), byteSize(j.GetBytes()))
		if e := j.GetError(); e != "" {
			fmt.Fprintf(&b, "  error: %s\n", e)
		}
		ranks := append([]*ipcpb.RankStatus(nil), j.GetRanks()...)
		sort.SliceStable(ranks, func(x, y int) bool { return ranks[x].GetRank() < ranks[y].GetRank() })
		fmt.Fprintf(&b, "  %5s %5s %5s %8s %6s %-16s %9s\n", "rank", "local", "node", "pid", "uid", "host", "in-flight")
		for _, r := range ranks {
			rank, uid, inflight := fmt.Sprint(r.GetRank()), "-", "-"
			if r.GetRank() < 0 {
				rank = "-"
			}
			if r.GetUidKnown() {
				uid, inflight = fmt.Sprint(r.GetUid()), fmt.Sprint(r.GetInFlight())
			}
			fmt.Fprintf(&b, "  %5s %5d %5d %8d %6s %-16s %9s\n", rank, r.GetLocalRank(), r.GetNode(), r.GetPid(), uid, r.GetHost(), inflight)
		}
		if n := j.GetPendingTotal(); n > 0 {
			fmt.Fprintf(&b, "  waiting on %d tensors:\n", n)
			for _, p := range j.GetPending() {
				name := p.GetName()
				if p.GetProcessSet() != 0 {
					name += fmt.Sprintf(" (process set %d)", p.GetProcessSet())
				}
				fmt.Fprintf(&b, "    %s for %s: submitted by ranks %s, missing %s\n", name,
					(time.Duration(p.GetWaitingMs()) * time.Millisecond).Round(time.Millisecond), ranksList(p.GetSubmitted()), ranksList(p.GetMissing()))
			}
			if int(n) > len(j.GetPending()) {
				fmt.Fprintf(&b, "    ... and %d more\n", int(n)-len(j.GetPending()))
			}
		}
		for _, l := range j.GetLinks() {
			fmt.Fprintf(&b, "  link to node %d: sent %s, received %s", l.GetPeerNode(), byteSize(l.GetSentBytes()), byteSize(l.GetRecvBytes()))
			if pl := prevLink(prev, j.GetId(), l.GetPeerNode()); pl != nil {
				dt := float64(st.GetNowMs()-prev.GetNowMs()) / 1000
				if dt > 0 {
					fmt.Fprintf(&b, " (%s/s out, %s/s in)", byteSize(int64(float64(l.GetSentBytes()-pl.GetSentBytes())/dt)),
						byteSize(int64(float64(l.GetRecvBytes()-pl.GetRecvBytes())/dt)))
				}
			}
			b.WriteByte('\n')
		}
	}
	formatGPUs(&b, st)
	if errs := st.GetErrors(); len(errs) > 0 {
		b.WriteString("\nrecent errors:\n")
		for _, e := range errs {
			at := time.UnixMilli(e.GetAtMs()).Format("15:04:05")
			job := ""
			if e.GetJob() != 0 {
				job = fmt.Sprintf(" job %d", e.GetJob())
				if e.GetJobName() != "" {
					job += " " + e.GetJobName()
				}
				job += ":"
			}
			fmt.Fprintf(&b, "  %s%s %s\n", at, job, e.GetError())
		}
	}
	return b.String()
}

// formatGPUs renders the node's GPUs of st's last sampling round: per GPU
// a line of identity and the gauges, a line of the links and error
// counts; a figure the round did not read is left out.
func formatGPUs(b *strings.Builder, st *ipcpb.Status) {
	if e := st.GetGpuSamplingError(); e != "" {
		fmt.Fprintf(b, "\nGPU sampling: %s\n", e)
	}
	gpus := st.GetGpus()
	if len(gpus) == 0 {
		return
	}
	ago := time.Duration(st.GetNowMs()-st.GetGpusSampledMs()) * time.Millisecond
	fmt.Fprintf(b, "\nGPUs (NVML, sampled %s ago):\n", ago.Round(time.Second))
	for _, g := range gpus {
		has := func(f string) bool { return slices.Contains(g.GetValid(), f) }
		fmt.Fprintf(b, "  GPU %d %s (PCI %s)", g.GetIndex(), g.GetUuid(), g.GetPciBusId())
		if g.GetLost() {
			fmt.Fprintf(b, ": LOST (%s): its GPU tensors fail\n", g.GetLostReason())
		} else {
			var gauges []string
			if has("utilization") {
				gauges = append(gauges, fmt.Sprintf("%d%% busy, memory %d%% busy", g.GetUtilizationGpu(), g.GetUtilizationMemory()))
			}
			if has("memory") {
				gauges = append(gauges, fmt.Sprintf("%s of %s used", byteSize(int64(g.GetMemoryUsed())), byteSize(int64(g.GetMemoryTotal()))))
			}
			if has("temperature") {
				gauges = append(gauges, fmt.Sprintf("%d C", g.GetTemperature()))
			}
			if has("power") {
				gauges = append(gauges, fmt.Sprintf("%.1f W", float64(g.GetPowerMilliwatts())/1000))
			}
			if len(gauges) > 0 {
				fmt.Fprintf(b, ": %s", strings.Join(gauges, ", "))
			}
			b.WriteByte('\n')
		}
		var more []string
		if has("pcie") {
			more = append(more, fmt.Sprintf("PCIe %s/s out, %s/s in", byteSize(int64(g.GetPcieTxBytesPerSecond())), byteSize(int64(g.GetPcieRxBytesPerSecond()))))
		}
		if has("nvlink") {
			more = append(more, fmt.Sprintf("NVLink %s sent, %s received", byteSize(int64(g.GetNvlinkTxBytes())), byteSize(int64(g.GetNvlinkRxBytes()))))
		}
		if has("ecc") {
			more = append(more, fmt.Sprintf("ECC errors %d corrected, %d uncorrected", g.GetEccCorrected(), g.GetEccUncorrected()))
		}
		if xs := g.GetXids(); len(xs) > 0 {
			var parts []string
			for _, x := range xs {
				parts = append(parts, fmt.Sprintf("%d (x%d)", x.GetXid(), x.GetCount()))
			}
			more = append(more, "XID errors "+strings.Join(parts, ", "))
		}
		if len(more) > 0 {
			fmt.Fprintf(b, "    %s\n", strings.Join(more, "; "))
		}
		if errs := g.GetErrors(); len(errs) > 0 {
			fmt.Fprintf(b, "    NVML errors: %s\n", strings.Join(errs, "; "))
		}
	}
}

// prevLink finds a job's link in the previous snapshot.
func prevLink(prev *ipcpb.Status, job uint64, peer int32) *ipcpb.LinkStatus {
	if prev == nil {
		return nil
	}
	for _, j := range prev.GetJobs() {
		if j.GetId() != job {
			continue
		}
		for _, l := range j.GetLinks() {
			if l.GetPeerNode() == peer {
				return l
			}
		}
	}
	return nil
}

// ranksList prints ranks compactly: "0-3,5".
func ranksList(rs []int32) string {
	if len(rs) == 0 {
		return "none"
	}
	var parts []string
	for i := 0; i < len(rs); {
		j := i
		for j+1 < len(rs) && rs[j+1] == rs[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", rs[i], rs[j]))
		} else {
			parts = append(parts, fmt.Sprint(rs[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// byteSize prints a byte count with a binary unit.
func byteSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
