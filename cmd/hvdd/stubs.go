package main

import (
	"fmt"
	"os"
)

func benchMain(args []string) int {
	fmt.Fprintln(os.Stderr, "hvdd bench: not wired yet")
	return 2
}
