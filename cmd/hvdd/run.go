package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"

	"github.com/hvdd/hvdd/backends/mpi"
	"github.com/hvdd/hvdd/launch"
)

func runMain(args []string) int {
	cfg, err := launch.ParseArgs(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Print(launch.Usage)
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "hvdd run: %v\n", err)
		return 2
	}
	switch {
	case cfg.PrintVersion:
		fmt.Println("hvdd", version())
		return 0
	case cfg.CheckBuild:
		err := launch.CheckBuild(context.Background(), os.Stdout, launch.BuildInfo{Version: version(), MPI: mpi.Available(), Verbose: cfg.Verbose})
		if err != nil {
			fmt.Fprintf(os.Stderr, "hvdd run: %v\n", err)
			return 1
		}
		return 0
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "hvdd run: cannot find the hvdd binary to start a daemon: %v\n", err)
		return 1
	}
	cfg.DaemonCommand = []string{exe, "serve", "--slots", strconv.Itoa(cfg.NP), "--socket", cfg.Socket}
	if cfg.ElasticTimeout > 0 {
		cfg.DaemonCommand = append(cfg.DaemonCommand, "--elastic-timeout", cfg.ElasticTimeout.String())
	}
	// The job's log level (the daemon a job starts for itself speaks up
	// only when something is wrong) and knobs.
	cfg.DaemonCommand = append(cfg.DaemonCommand, cfg.ServeFlags()...)
	cfg.HvddPath = exe // the daemons of a job across hosts
	code, err := launch.Run(context.Background(), cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hvdd run: %v\n", err)
	}
	return code
}
