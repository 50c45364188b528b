package main

import (
	"os"

	"github.com/hvdd/hvdd/bench"
)

// benchMain is `hvdd bench`: see package bench.
func benchMain(args []string) int { return bench.Main(args, os.Stdout, os.Stderr) }
