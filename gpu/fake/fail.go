package fake

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hvdd/hvdd/gpu"
)

// CUresult and ncclResult_t codes the fake returns, with CUDA's and NCCL's
// values.
const (
	errInvalidValue   = 1   // CUDA_ERROR_INVALID_VALUE
	errOutOfMemory    = 2   // CUDA_ERROR_OUT_OF_MEMORY
	errInvalidDevice  = 101 // CUDA_ERROR_INVALID_DEVICE
	errInvalidImage   = 200 // CUDA_ERROR_INVALID_IMAGE
	errInvalidContext = 201 // CUDA_ERROR_INVALID_CONTEXT
	errMapFailed      = 205 // CUDA_ERROR_MAP_FAILED
	errInvalidHandle  = 400 // CUDA_ERROR_INVALID_HANDLE
	errNotFound       = 500 // CUDA_ERROR_NOT_FOUND
	errNotReady       = 600 // CUDA_ERROR_NOT_READY (Query's "not yet", never returned as an error)
	errUnknown        = 999 // CUDA_ERROR_UNKNOWN

	ncclUnhandledCudaError = 1
	ncclSystemError        = 2
	ncclInternalError      = 3
	ncclInvalidArgument    = 4
	ncclInvalidUsage       = 5
	ncclRemoteError        = 6
)

var cuNames = map[int]string{
	errInvalidValue:   "CUDA_ERROR_INVALID_VALUE",
	errOutOfMemory:    "CUDA_ERROR_OUT_OF_MEMORY",
	errInvalidDevice:  "CUDA_ERROR_INVALID_DEVICE",
	errInvalidImage:   "CUDA_ERROR_INVALID_IMAGE",
	errInvalidContext: "CUDA_ERROR_INVALID_CONTEXT",
	errMapFailed:      "CUDA_ERROR_MAP_FAILED",
	errInvalidHandle:  "CUDA_ERROR_INVALID_HANDLE",
	errNotFound:       "CUDA_ERROR_NOT_FOUND",
	errNotReady:       "CUDA_ERROR_NOT_READY",
	errUnknown:        "CUDA_ERROR_UNKNOWN",
	700:               "CUDA_ERROR_ILLEGAL_ADDRESS",
	719:               "CUDA_ERROR_LAUNCH_FAILED",
}

var ncclNames = map[int]string{
	ncclUnhandledCudaError: "ncclUnhandledCudaError",
	ncclSystemError:        "ncclSystemError",
	ncclInternalError:      "ncclInternalError",
	ncclInvalidArgument:    "ncclInvalidArgument",
	ncclInvalidUsage:       "ncclInvalidUsage",
	ncclRemoteError:        "ncclRemoteError",
}

func isNCCL(call string) bool { return strings.HasPrefix(call, "nccl") }

// newErr returns the *gpu.Error of call failing with code; desc says why,
// prefixed "fake: ".
func newErr(call string, code int, format string, args ...any) *gpu.Error {
	names := cuNames
	if isNCCL(call) {
		names = ncclNames
	}
	name, ok := names[code]
	if !ok {
		name = fmt.Sprintf("error %d", code)
	}
	return &gpu.Error{Call: call, Code: code, Name: name, Desc: "fake: " + fmt.Sprintf(format, args...)}
}

// inject holds the failures to inject. mu guards the fields that follow.
var inject struct {
	mu     sync.Mutex
	next   map[string][]int // call -> codes of its next failures, in order
	loseAt map[string]int   // call -> calls left until the device is lost
	holds  map[string][]*Hold
}

// Hold is a call held until Release (HoldNext): a driver call as slow as
// a test wants, with no timing in the test.
type Hold struct {
	reached chan struct{}
	release chan struct{}
	once    sync.Once
}

// HoldNext makes the next call of the named function (as FailNext names
// them) block, once it is made, until Release. Holds add up: each holds
// one call, in order.
func HoldNext(call string) *Hold {
	h := &Hold{reached: make(chan struct{}), release: make(chan struct{})}
	inject.mu.Lock()
	defer inject.mu.Unlock()
	if inject.holds == nil {
		inject.holds = map[string][]*Hold{}
	}
	inject.holds[call] = append(inject.holds[call], h)
	return h
}

// Reached is closed once the held call has been made (and is blocked).
func (h *Hold) Reached() <-chan struct{} { return h.reached }

// Release lets the held call go on (or, if it was not made yet, lets it
// pass at once). Safe to call more than once.
func (h *Hold) Release() { h.once.Do(func() { close(h.release) }) }

// lost is set once the device is lost: every later call fails.
var lost atomic.Bool

// FailNext makes the next count calls of the named function (a CUDA or NCCL
// function name as listed in the package doc) fail with code; code 0 means
// CUDA_ERROR_UNKNOWN (999) for cu* calls and ncclSystemError (2) for nccl*
// calls. Failures add up with those already pending.
func FailNext(call string, count, code int) {
	if code == 0 {
		code = errUnknown
		if isNCCL(call) {
			code = ncclSystemError
		}
	}
	inject.mu.Lock()
	defer inject.mu.Unlock()
	if inject.next == nil {
		inject.next = map[string][]int{}
	}
	for range count {
		inject.next[call] = append(inject.next[call], code)
	}
}

// LoseDevice makes every later call of every device, stream, event, module
// and communicator of the process fail (CUDA_ERROR_UNKNOWN, "device lost";
// ncclUnhandledCudaError for NCCL), and work not yet run on a stream fail,
// as after a GPU fell off the bus. Reset undoes it.
func LoseDevice() { lost.Store(true) }

// Reset clears the pending failures and holds (releasing them) and a
// lost device.
func Reset() {
	inject.mu.Lock()
	for _, hs := range inject.holds {
		for _, h := range hs {
			h.Release()
		}
	}
	inject.next, inject.loseAt, inject.holds = nil, nil, nil
	inject.mu.Unlock()
	lost.Store(false)
}

// lostErr is the error of call on a lost device.
func lostErr(call string) *gpu.Error {
	if isNCCL(call) {
		return newErr(call, ncclUnhandledCudaError, "device lost")
	}
	return newErr(call, errUnknown, "device lost")
}

// check is the first thing of every call: it returns the injected failure
// of call, or the lost device's error, or nil.
func check(call string) error {
	loadEnv()
	if lost.Load() {
		return lostErr(call)
	}
	if h := takeHold(call); h != nil {
		close(h.reached)
		<-h.release
	}
	inject.mu.Lock()
	defer inject.mu.Unlock()
	if n, ok := inject.loseAt[call]; ok {
		if n <= 1 {
			delete(inject.loseAt, call)
			lost.Store(true)
			return lostErr(call)
		}
		inject.loseAt[call] = n - 1
	}
	if codes := inject.next[call]; len(codes) > 0 {
		inject.next[call] = codes[1:]
		return newErr(call, codes[0], "injected failure")
	}
	return nil
}

// takeHold returns the next hold of call, if any, and forgets it.
func takeHold(call string) *Hold {
	inject.mu.Lock()
	defer inject.mu.Unlock()
	hs := inject.holds[call]
	if len(hs) == 0 {
		return nil
	}
	inject.holds[call] = hs[1:]
	return hs[0]
}

var envOnce sync.Once

// loadEnv reads HVDD_FAKE_GPU_FAIL and HVDD_FAKE_GPU_LOSE_AT once. Malformed
// entries are reported on stderr and ignored: a test that sets them sees its
// injection not happen.
func loadEnv() {
	envOnce.Do(func() {
		for _, ent := range strings.Split(os.Getenv("HVDD_FAKE_GPU_FAIL"), ",") {
			if ent = strings.TrimSpace(ent); ent == "" {
				continue
			}
			f := strings.Split(ent, ":")
			var count, code int
			var err error
			if len(f) < 2 || len(f) > 3 {
				err = fmt.Errorf("want call:count[:code]")
			} else if count, err = strconv.Atoi(f[1]); err == nil && len(f) == 3 {
				code, err = strconv.Atoi(f[2])
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "gpu/fake: HVDD_FAKE_GPU_FAIL entry %q: %v\n", ent, err)
				continue
			}
			FailNext(f[0], count, code)
		}
		if v := os.Getenv("HVDD_FAKE_GPU_LOSE_AT"); v != "" {
			call, ns, _ := strings.Cut(v, ":")
			n, err := strconv.Atoi(ns)
			if err != nil || n < 1 {
				fmt.Fprintf(os.Stderr, "gpu/fake: HVDD_FAKE_GPU_LOSE_AT=%q: want call:n with n >= 1\n", v)
				return
			}
			LoseAt(call, n)
		}
	})
}

// LoseAt makes the n-th next call (1-based) of the named function lose the
// device, as LoseDevice: that call and every later one fail.
func LoseAt(call string, n int) {
	inject.mu.Lock()
	defer inject.mu.Unlock()
	if inject.loseAt == nil {
		inject.loseAt = map[string]int{}
	}
	inject.loseAt[call] = n
}

// BreakComm makes c, a communicator of this fake, fail in the background as
// one whose network link broke does: its AsyncError reports code
// (ncclSystemError when 0) with why, and its work waiting for peers ends
// without writing results, while its peers are told nothing until c is
// aborted (then they see ncclRemoteError). It is an asynchronous error for
// an engine's watch to find. It returns an error if c is not the fake's or
// was aborted or destroyed.
func BreakComm(c gpu.Comm, code int, why string) error {
	fc, ok := c.(*comm)
	if !ok || fc == nil {
		return fmt.Errorf("gpu/fake: BreakComm of a %T, not a fake communicator", c)
	}
	if code == 0 {
		code = ncclSystemError
	}
	fc.mu.Lock()
	closed := fc.closed
	fc.mu.Unlock()
	if closed {
		return errors.New("gpu/fake: BreakComm of an aborted or destroyed communicator")
	}
	fc.fail(code, fmt.Sprintf("rank %d: %s", fc.rank, why))
	return nil
}
