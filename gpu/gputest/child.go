package gputest

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/tensor"
)

// childEnv turns a re-executed test binary into the suite's child process.
const childEnv = "HVDD_GPUTEST_CHILD"

// Factory makes the driver (and NCCL, nil if absent) under test in a child
// process; it must make the same kind of driver as the parent's.
type Factory func() (gpu.Driver, gpu.NCCL, error)

// Main runs a test binary that calls Run: as the suite's child process when
// the binary was re-executed for one (the IPC and cross-process NCCL tests
// do that), else m.Run. Call it from TestMain and exit with its result:
//
//	func TestMain(m *testing.M) { os.Exit(gputest.Main(m, factory)) }
func Main(m *testing.M, factory Factory) int {
	if os.Getenv(childEnv) == "" {
		return m.Run()
	}
	if err := serveChild(factory, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "gputest child: %v\n", err)
		return 1
	}
	return 0
}

// The child reads one command a line from stdin and answers each with one
// line, "ok [hex]" or "err <message>". Byte strings travel in hex.
//
//	dev <index>               open the device, a stream and an interprocess
//	                          event; answers that event's handle
//	open <handle> <size>      OpenMemHandle
//	evopen <handle>           OpenEventHandle: later reads wait for it
//	read <off> <n>            [WaitEvent] + CopyDtoH + Synchronize: the bytes
//	write <off> <bytes>       CopyHtoD + Record of the child's event (no sync)
//	sync                      Synchronize the stream
//	close                     CloseMemHandle
//	nccl <id> <nranks> <rank> CommInitRank (30 s bound)
//	allreduce <dtype> <op> <bytes>
//	                          an in-place Allreduce of the bytes; answers them
//	sendrecv <peer> <bytes>   Send then Recv as many bytes in a group; answers
//	                          the received bytes
//	destroy                   Comm.Destroy
//	exit
func serveChild(factory Factory, in io.Reader, out io.Writer) error {
	drv, nccl, err := factory()
	if err != nil {
		return err
	}
	var (
		dev    gpu.Device
		s      gpu.Stream
		myEv   gpu.Event
		peerEv gpu.Event
		mapped gpu.DevicePtr
		comm   gpu.Comm
	)
	ctx := context.Background()
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		res, err := func() (string, error) {
			arg := func(i int) string {
				if i < len(f) {
					return f[i]
				}
				return ""
			}
			num := func(i int) int { n, _ := strconv.Atoi(arg(i)); return n }
			bytesArg := func(i int) []byte { b, _ := hex.DecodeString(arg(i)); return b }
			switch f[0] {
			case "dev":
				var err error
				if dev, err = drv.Open(num(1)); err != nil {
					return "", err
				}
				if s, err = dev.NewStream(); err != nil {
					return "", err
				}
				if myEv, err = dev.NewEvent(true); err != nil {
					return "", err
				}
				h, err := myEv.IpcHandle()
				return hex.EncodeToString(h[:]), err
			case "open":
				var h gpu.IpcMemHandle
				copy(h[:], bytesArg(1))
				var err error
				mapped, err = dev.OpenMemHandle(h, num(2))
				return "", err
			case "evopen":
				var h gpu.IpcEventHandle
				copy(h[:], bytesArg(1))
				var err error
				peerEv, err = dev.OpenEventHandle(h)
				return "", err
			case "read":
				if peerEv != nil {
					if err := s.WaitEvent(peerEv); err != nil {
						return "", err
					}
				}
				b := make([]byte, num(2))
				if err := dev.CopyDtoH(s, b, mapped.Add(num(1))); err != nil {
					return "", err
				}
				if err := s.Synchronize(ctx); err != nil {
					return "", err
				}
				return hex.EncodeToString(b), nil
			case "write":
				if err := dev.CopyHtoD(s, mapped.Add(num(1)), bytesArg(2)); err != nil {
					return "", err
				}
				return "", myEv.Record(s)
			case "sync":
				return "", s.Synchronize(ctx)
			case "close":
				return "", dev.CloseMemHandle(mapped)
			case "nccl":
				if nccl == nil {
					return "", fmt.Errorf("no NCCL")
				}
				var id gpu.UniqueID
				copy(id[:], bytesArg(1))
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				var err error
				comm, err = nccl.CommInitRank(cctx, dev, num(2), id, num(3))
				return "", err
			case "allreduce":
				dt, err := tensor.ParseDType(arg(1))
				if err != nil {
					return "", err
				}
				op, err := tensor.ParseReduceOp(arg(2))
				if err != nil {
					return "", err
				}
				b := bytesArg(3)
				p, err := dev.Alloc(len(b))
				if err != nil {
					return "", err
				}
				defer dev.Free(p)
				if err := dev.CopyHtoD(s, p, b); err != nil {
					return "", err
				}
				if err := comm.Allreduce(s, p, p, len(b)/dt.Size(), dt, op); err != nil {
					return "", err
				}
				if err := dev.CopyDtoH(s, b, p); err != nil {
					return "", err
				}
				if err := s.Synchronize(ctx); err != nil {
					return "", err
				}
				if err := comm.AsyncError(); err != nil {
					return "", err
				}
				return hex.EncodeToString(b), nil
			case "sendrecv":
				b := bytesArg(2)
				p, err := dev.Alloc(2 * len(b))
				if err != nil {
					return "", err
				}
				defer dev.Free(p)
				if err := dev.CopyHtoD(s, p, b); err != nil {
					return "", err
				}
				if err := sendRecv(nccl, comm, s, p, p.Add(len(b)), len(b), num(1)); err != nil {
					return "", err
				}
				if err := dev.CopyDtoH(s, b, p.Add(len(b))); err != nil {
					return "", err
				}
				if err := s.Synchronize(ctx); err != nil {
					return "", err
				}
				return hex.EncodeToString(b), comm.AsyncError()
			case "destroy":
				return "", comm.Destroy()
			case "exit":
				return "exit", nil
			}
			return "", fmt.Errorf("unknown command %q", f[0])
		}()
		if res == "exit" {
			fmt.Fprintln(out, "ok")
			return nil
		}
		if err != nil {
			fmt.Fprintf(out, "err %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		} else {
			fmt.Fprintf(out, "ok %s\n", res)
		}
	}
	return sc.Err()
}

// sendRecv sends n bytes at send to peer and receives as many from it into
// recv, in one group (the way alltoall pairs them).
func sendRecv(n gpu.NCCL, c gpu.Comm, s gpu.Stream, send, recv gpu.DevicePtr, nbytes, peer int) error {
	if err := n.GroupStart(); err != nil {
		return err
	}
	err1 := c.Recv(s, recv, nbytes, tensor.Uint8, peer)
	err2 := c.Send(s, send, nbytes, tensor.Uint8, peer)
	if err := n.GroupEnd(); err != nil {
		return err
	}
	if err1 != nil {
		return err1
	}
	return err2
}

// child is a running child process.
type child struct {
	t      *testing.T
	cmd    *exec.Cmd
	in     io.WriteCloser
	lines  chan string
	stderr *strings.Builder
	mu     sync.Mutex // guards stderr
}

// startChild re-executes the test binary as the suite's child.
func startChild(t *testing.T, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"=1"), env...)
	c := &child{t: t, cmd: cmd, lines: make(chan string, 16), stderr: &strings.Builder{}}
	var err error
	if c.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = writerFunc(func(p []byte) (int, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.stderr.Write(p)
	})
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(outp)
		sc.Buffer(make([]byte, 1<<20), 1<<26)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		c.in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return c
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// send writes a command without waiting for its answer.
func (c *child) send(format string, args ...any) {
	c.t.Helper()
	if _, err := fmt.Fprintf(c.in, format+"\n", args...); err != nil {
		c.t.Fatalf("child: write command: %v", err)
	}
}

// answer waits for the next answer: its hex payload decoded, or an error for
// "err ...".
func (c *child) answer() ([]byte, error) {
	c.t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.t.Fatalf("child exited; stderr:\n%s", c.stderr.String())
		}
		if rest, ok := strings.CutPrefix(l, "err "); ok {
			return nil, fmt.Errorf("child: %s", rest)
		}
		rest, ok := strings.CutPrefix(l, "ok")
		if !ok {
			c.t.Fatalf("child answered %q", l)
		}
		b, err := hex.DecodeString(strings.TrimSpace(rest))
		if err != nil {
			c.t.Fatalf("child answered %q: %v", l, err)
		}
		return b, nil
	case <-time.After(60 * time.Second):
		c.mu.Lock()
		defer c.mu.Unlock()
		c.t.Fatalf("child did not answer within 60 s; stderr:\n%s", c.stderr.String())
	}
	return nil, nil
}

// do sends a command and returns its answer, failing the test on "err".
func (c *child) do(format string, args ...any) []byte {
	c.t.Helper()
	c.send(format, args...)
	b, err := c.answer()
	if err != nil {
		c.t.Fatalf("%s: %v", strings.Fields(format)[0], err)
	}
	return b
}
