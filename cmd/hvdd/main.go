// Command hvdd is the hvdd daemon and its tools in one binary:
//
//	hvdd serve   run the node daemon
//	hvdd run     start a daemon if needed and N worker processes (horovodrun)
//	hvdd bench   measure collectives through the daemon (nccl-tests style)
//	hvdd status  what the node's daemon is doing: jobs, ranks, pending tensors
//	hvdd gpus    the node's NVIDIA GPUs and their topology (NVML)
//	hvdd rendezvous serve the rendezvous store of daemons started by hand
//	hvdd version print the version
//
// It only parses flags and wires the packages together.
package main

import (
	"fmt"
	"os"
)

const usage = `hvdd: Horovod as a per-node daemon.

Usage:
  hvdd serve [flags]            run the node daemon (hvdd serve --help)
  hvdd run -np N [flags] -- CMD run N copies of CMD through a local daemon (hvdd run --help)
  hvdd run -np N -H h1:S,h2:S -- CMD  the same across hosts, one daemon per host
  hvdd bench [flags]            benchmark collectives (hvdd bench --help)
  hvdd status [--watch|--json]  what the node's daemon is doing: jobs, ranks, what
                                they wait on, errors, links (hvdd status --help)
  hvdd gpus [--json]            this node's NVIDIA GPUs, their NVLink/PCIe topology
                                and peer access, or why none (hvdd gpus --help)
  hvdd rendezvous --addr H:P    serve the rendezvous store of daemons started by hand
                                (hvdd rendezvous --help)
  hvdd version                  print the version

Environment: HVDD_SOCKET names the daemon's socket for every subcommand.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	args := os.Args[2:]
	var code int
	switch os.Args[1] {
	case "serve":
		code = serveMain(args)
	case "run":
		code = runMain(args)
	case "bench":
		code = benchMain(args)
	case "status":
		code = statusMain(args)
	case "rendezvous":
		code = rendezvousMain(args)
	case "gpus":
		code = gpusMain(args)
	case "version", "--version", "-v":
		fmt.Println("hvdd", version())
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "hvdd: unknown command %q\n\n%s", os.Args[1], usage)
		code = 2
	}
	os.Exit(code)
}
