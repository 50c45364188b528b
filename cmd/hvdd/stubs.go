package main

import (
	"fmt"
	"os"
)

func runMain(args []string) int {
	fmt.Fprintln(os.Stderr, "hvdd run: not wired yet")
	return 2
}

func benchMain(args []string) int {
	fmt.Fprintln(os.Stderr, "hvdd bench: not wired yet")
	return 2
}
