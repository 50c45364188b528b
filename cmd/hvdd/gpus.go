package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/nvml"
)

const gpusUsage = `Usage: hvdd gpus [flags]

Lists this node's NVIDIA GPUs as NVML (the driver's management library,
libnvidia-ml.so.1, loaded at run time) sees them: index, name, UUID, PCI bus
id, memory used and total, compute capability and active NVLinks; then, with
two GPUs or more, the topology between each pair (as nvidia-smi topo -m
shows it: NV# for NVLinks, else the PCIe path) and whether peer-to-peer reads
work (nvidia-smi topo -p2p r). Last, whether NVIDIA MPS runs: without it,
processes that share a GPU (several ranks of a job, and the daemon that
reduces their tensors there) take turns on it.

Indices are NVML's, the node's: CUDA_VISIBLE_DEVICES does not renumber them.
Match GPUs by UUID.

On a node without the NVIDIA driver or without a GPU it says so and exits 0:
hvdd runs CPU-only there. It exits 1 only when NVML started and failed.

Flags:
`

// gpusMain is hvdd gpus; it returns the exit status.
func gpusMain(argv []string) int {
	fs := flag.NewFlagSet("gpus", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the report as one JSON object, for scripts (\"available\": false and a \"reason\" without GPUs)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), gpusUsage)
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), "\nExamples:\n  hvdd gpus\n  hvdd gpus --json | jq -r '.gpus[].uuid'\n")
	}
	if err := fs.Parse(argv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "hvdd gpus: unexpected argument %q (see hvdd gpus --help)\n", fs.Arg(0))
		return 2
	}
	r, err := nvml.Discover()
	if err != nil {
		fmt.Fprintf(os.Stderr, "hvdd gpus: %v\n", err)
		return 1
	}
	if err := printGPUs(os.Stdout, r, gpu.DetectMPS(), *asJSON); err != nil {
		fmt.Fprintf(os.Stderr, "hvdd gpus: %v\n", err)
		return 1
	}
	return 0
}

// printGPUs writes r as a table and matrices, then whether NVIDIA MPS
// runs (where there are GPUs), or all of it as JSON.
func printGPUs(w io.Writer, r nvml.Report, mps gpu.MPS, asJSON bool) error {
	if !asJSON {
		if err := r.Format(w); err != nil {
			return err
		}
		if r.Available {
			_, err := fmt.Fprintf(w, "\n%s\n", mps.Advice())
			return err
		}
		return nil
	}
	// Empty lists rather than null, so that jq '.gpus[]' works without GPUs.
	if r.GPUs == nil {
		r.GPUs = []nvml.GPU{}
	}
	if r.Pairs == nil {
		r.Pairs = []nvml.Pair{}
	}
	b, err := json.Marshal(struct {
		nvml.Report
		MPS gpu.MPS `json:"mps"`
	}{r, mps})
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// logGPUs logs the node's GPUs (or that it runs CPU-only) once, at info
// level, for hvdd serve. NVML can take seconds to start, so serve calls it
// on a goroutine of its own: it never delays the daemon's readiness.
func logGPUs(log *slog.Logger) {
	r, err := nvml.Discover()
	if err != nil {
		log.Warn("GPU discovery failed; the GPU list is unknown", "err", err)
		return
	}
	r.Log(log)
	if r.Available {
		log.Info(gpu.DetectMPS().Advice())
	}
}
