package main

import (
	"strings"
	"testing"

	"github.com/hvdd/hvdd/backends/mpi"
)

func TestOnlineCPUs(t *testing.T) {
	for _, c := range []struct {
		list string
		want int
	}{
		{"0\n", 1},
		{"0-1\n", 2},
		{"0-3,8,10-11", 7},
		{"", 0},
		{"3-1", 0},
		{"a-b", 0},
	} {
		if got := onlineCPUs(c.list); got != c.want {
			t.Errorf("onlineCPUs(%q) = %d, want %d", c.list, got, c.want)
		}
	}
}

// TestBoundWarning: only a daemon bound to one CPU of several is warned,
// and the warning says what to do.
func TestBoundWarning(t *testing.T) {
	for _, c := range []struct {
		allowed, online int
		warn            bool
	}{
		{1, 2, true},
		{1, 64, true},
		{1, 1, false},
		{2, 2, false},
		{8, 64, false}, // a cpuset or --bind-to socket: deliberate
		{1, 0, false},  // online CPUs unknown
	} {
		w := boundWarning(c.allowed, c.online)
		if (w != "") != c.warn {
			t.Errorf("boundWarning(%d, %d) = %q, want a warning: %v", c.allowed, c.online, w, c.warn)
		}
		if w != "" && !strings.Contains(w, "--bind-to none") {
			t.Errorf("the warning does not say what to do: %q", w)
		}
	}
}

func TestResolveControl(t *testing.T) {
	for _, c := range []struct {
		control, backend, rendezvous string
		want, err                    string
	}{
		{"auto", "mpi", "", "mpi", ""},               // a bare mpirun: MPI is all the daemons share
		{"auto", "mpi", "10.0.0.1:29500", "tcp", ""}, // hvdd run --backend mpi gives a rendezvous
		{"auto", "tcp", "10.0.0.1:29500", "tcp", ""},
		{"auto", "tcp", "", "tcp", ""}, // the daemon then asks for --rendezvous
		{"tcp", "mpi", "", "tcp", ""},
		{"mpi", "mpi", "10.0.0.1:29500", "mpi", ""},
		{"mpi", "tcp", "", "", "needs --backend mpi"},
		{"udp", "mpi", "", "", `unknown --control "udp"`},
	} {
		got, err := resolveControl(c.control, c.backend, c.rendezvous)
		if got != c.want || (err == nil) != (c.err == "") || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("resolveControl(%q, %q, %q) = %q, %v; want %q, error %q", c.control, c.backend, c.rendezvous, got, err, c.want, c.err)
		}
	}
}

// TestWithoutMPI: a build without the mpi tag refuses --backend mpi and
// --control mpi with what to do about it.
func TestWithoutMPI(t *testing.T) {
	if mpi.Available() {
		t.Skip("built with MPI (-tags mpi)")
	}
	_, err := backendFactory("mpi", tcpSettings{streams: 8})
	if want := "--backend mpi: this hvdd was built without MPI; rebuild with `go build -tags mpi ./cmd/hvdd` (needs libopenmpi-dev)"; err == nil || err.Error() != want {
		t.Errorf("backendFactory(mpi) = %v, want %q", err, want)
	}
	_, err = mpiControl(0, 2)
	if want := "this hvdd was built without MPI; rebuild with `go build -tags mpi ./cmd/hvdd`"; err == nil || err.Error() != want {
		t.Errorf("mpiControl = %v, want %q", err, want)
	}
}
