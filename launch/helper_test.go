package launch

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperArg, as os.Args[1], makes the test binary act as a helper process:
// a worker rank or a fake daemon (the os/exec test's helper-command trick).
const helperArg = "hvdd-launch-helper"

func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == helperArg {
		os.Exit(helper(os.Args[2], os.Args[3:]))
	}
	// Under -race every process sleeps 1s at exit unless told not to; the
	// helpers inherit this.
	if os.Getenv("GORACE") == "" {
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	code := m.Run()
	if hvddBinDir != "" {
		os.RemoveAll(hvddBinDir)
	}
	os.Exit(code)
}

// helperCmd returns the command line that runs helper mode with args.
func helperCmd(mode string, args ...string) []string {
	return append([]string{os.Args[0], helperArg, mode}, args...)
}

// Environment variables the helpers read, set through Config.Env.
const (
	envDir        = "HVDD_TEST_DIR"         // where "job" ranks and daemons leave files
	envFailRank   = "HVDD_TEST_FAIL_RANK"   // "job": these ranks (comma-separated) fail once the others are ready
	envFailCode   = "HVDD_TEST_FAIL_CODE"   // "job": with this exit status...
	envFailSignal = "HVDD_TEST_FAIL_SIGNAL" // ...or by killing itself with this signal
	envStubborn   = "HVDD_TEST_STUBBORN"    // "job": record signals but never exit
	envFailNode   = "HVDD_TEST_FAIL_NODE"   // "driver-rank": exit 127 at once on this node
	envLinger     = "HVDD_TEST_LINGER"      // "driver-rank": at the finish, CloseAtExit, then run this long
)

func helper(mode string, args []string) int {
	switch mode {
	case "env":
		// Print the rank variables Run sets.
		for _, name := range rankVars {
			fmt.Printf("%s=%s\n", name, os.Getenv(name))
		}
		fmt.Printf("HVDD_TEST_EXTRA=%s\n", os.Getenv("HVDD_TEST_EXTRA"))
		return 0

	case "lines":
		// lines COUNT SIZE: COUNT long lines to each of stdout and stderr,
		// each written in three pieces so that the pipe reader sees lines
		// split across reads.
		count, _ := strconv.Atoi(args[0])
		size, _ := strconv.Atoi(args[1])
		rank := os.Getenv("HVDD_RANK")
		for n := range count {
			for _, f := range []*os.File{os.Stdout, os.Stderr} {
				stream := map[*os.File]string{os.Stdout: "stdout", os.Stderr: "stderr"}[f]
				body := strings.Repeat(string(rune('a'+n%26)), size)
				fmt.Fprintf(f, "rank=%s stream=%s n=%d ", rank, stream, n)
				f.WriteString(body[:size/2])
				f.WriteString(body[size/2:] + "\n")
			}
		}
		return 0

	case "partial":
		os.Stdout.WriteString("first\nno newline at end")
		os.Stderr.WriteString("err partial")
		return 0

	case "longline":
		// longline SIZE: one line of SIZE bytes.
		size, _ := strconv.Atoi(args[0])
		os.Stdout.WriteString(strings.Repeat("a", size) + "\n")
		return 0

	case "cat":
		io.Copy(os.Stdout, os.Stdin)
		return 0

	case "dial":
		c, err := net.Dial("unix", os.Getenv("HVDD_SOCKET"))
		if err != nil {
			fmt.Println("dial failed:", err)
			return 1
		}
		c.Close()
		fmt.Println("dial ok")
		return 0

	case "orphan":
		// orphan DIR: leave a child holding our stdout and exit 0; the
		// child's pid goes to DIR/orphan.pid.
		child := exec.Command(os.Args[0], helperArg, "daemon-hang")
		child.Stdout = os.Stdout
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		os.WriteFile(filepath.Join(args[0], "orphan.pid"), []byte(strconv.Itoa(child.Process.Pid)), 0o600)
		fmt.Println("parent done")
		return 0

	case "job":
		return jobHelper()

	case "elastic":
		return elasticHelper()

	case "fake-serve":
		return fakeServe(args)

	case "fake-rank":
		return fakeRank()

	case "driver-rank":
		return driverRankHelper()

	case "allreduce":
		return allreduceHelper()

	case "knobs":
		return knobsHelper()

	case "daemon":
		return daemonHelper(args)

	case "daemon-crash":
		fmt.Fprintln(os.Stderr, "starting up")
		fmt.Fprintln(os.Stderr, "fatal: cannot open /dev/nvidia7")
		return 4

	case "daemon-hang":
		// daemon-hang [--dir DIR]: never listens; exits 0 on SIGTERM.
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM)
		if _, dir := daemonArgs(args); dir != "" {
			touch(filepath.Join(dir, "daemon.started"))
		}
		fmt.Fprintln(os.Stderr, "still initialising")
		<-ch
		return 0
	}
	fmt.Fprintf(os.Stderr, "unknown helper mode %q\n", mode)
	return 100
}

// jobHelper is a rank that either fails (rank $HVDD_TEST_FAIL_RANK, once
// every other rank is ready) or waits for a signal and records it in
// $HVDD_TEST_DIR/sig.<rank>.
func jobHelper() int {
	dir := os.Getenv(envDir)
	rank, _ := strconv.Atoi(os.Getenv("HVDD_RANK"))
	size, _ := strconv.Atoi(os.Getenv("HVDD_SIZE"))
	if slices.Contains(strings.Split(os.Getenv(envFailRank), ","), strconv.Itoa(rank)) {
		// Ready too, for another failing rank that waits for this one.
		touch(filepath.Join(dir, "ready."+strconv.Itoa(rank)))
		var others []string
		for r := range size {
			if r != rank {
				others = append(others, "ready."+strconv.Itoa(r))
			}
		}
		if err := waitForFiles(dir, others, 20*time.Second); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 99
		}
		if s := os.Getenv(envFailSignal); s != "" {
			n, _ := strconv.Atoi(s)
			syscall.Kill(os.Getpid(), syscall.Signal(n))
			select {}
		}
		code, _ := strconv.Atoi(os.Getenv(envFailCode))
		fmt.Fprintf(os.Stderr, "rank %d failing with %d\n", rank, code)
		return code
	}
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	touch(filepath.Join(dir, "ready."+strconv.Itoa(rank)))
	for {
		sig := (<-ch).(syscall.Signal)
		f, err := os.OpenFile(filepath.Join(dir, "sig."+strconv.Itoa(rank)), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err == nil {
			fmt.Fprintln(f, signame(sig))
			f.Close()
		}
		if os.Getenv(envStubborn) == "" {
			return 128 + int(sig)
		}
	}
}

// daemonHelper is a fake daemon: daemon --socket PATH [--dir DIR]. It
// listens on PATH, accepts and drops connections, and exits 0 on SIGTERM,
// leaving DIR/daemon.started and DIR/daemon.term behind.
func daemonHelper(args []string) int {
	socket, dir := daemonArgs(args)
	if dir != "" {
		touch(filepath.Join(dir, "daemon.started"))
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM)
	ln, err := net.Listen("unix", socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake daemon:", err)
		return 3
	}
	fmt.Fprintf(os.Stderr, "fake daemon listening on %s\n", socket)
	fmt.Println("fake daemon stdout")
	go acceptAndDrop(ln)
	<-ch
	ln.Close()
	if dir != "" {
		touch(filepath.Join(dir, "daemon.term"))
	}
	return 0
}

// acceptAndDrop accepts connections on ln and closes them, until ln is
// closed.
func acceptAndDrop(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		c.Close()
	}
}

func daemonArgs(args []string) (socket, dir string) {
	for i := 0; i+1 < len(args); i += 2 {
		switch args[i] {
		case "--socket":
			socket = args[i+1]
		case "--dir":
			dir = args[i+1]
		}
	}
	return socket, dir
}

func touch(name string) {
	if f, err := os.Create(name); err == nil {
		f.Close()
	}
}

// waitForFiles polls until every named file exists in dir.
func waitForFiles(dir string, names []string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, name := range names {
		for {
			if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s did not appear in %s within %v", name, dir, timeout)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	return nil
}

// readLines returns the lines of a file, or nil if it does not exist.
func readLines(name string) []string {
	f, err := os.Open(name)
	if err != nil {
		return nil
	}
	defer f.Close()
	var ls []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		ls = append(ls, sc.Text())
	}
	return ls
}

var rankVars = []string{
	"HVDD_SOCKET", "HVDD_RANK", "HVDD_SIZE", "HVDD_LOCAL_RANK", "HVDD_LOCAL_SIZE",
	"HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
	"HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE",
}
