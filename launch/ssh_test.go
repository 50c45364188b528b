package launch

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMultiHostSSH runs a job whose second host is reached through a real
// OpenSSH server: sshd on 127.0.0.32 (a loopback address, but this test
// tells hvdd run that only 127.0.0.31 is this machine), logged into with a
// key made for the test. The daemon and the ranks of host 1 start through
// ssh, report back through it, and are stopped through it.
func TestMultiHostSSH(t *testing.T) {
	dir := testDir(t)
	port := startSSHD(t, dir, "127.0.0.32")
	agent := fmt.Sprintf("ssh -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -p %d -i %s",
		port, filepath.Join(dir, "id_ed25519"))
	r := multiRun(t, Config{
		NP:        4,
		Command:   helperCmd("allreduce"),
		Hosts:     []Host{{"127.0.0.31", 2}, {"127.0.0.32", 2}},
		Agent:     agent,
		localHost: func(h string) bool { return h == "127.0.0.31" },
	})
	ranks := checkJob(t, r, 4, []int{2, 2})
	checkCleanedUp(t, ranks)
	// Host 1's daemon and ranks really came through sshd: its log shows the
	// logins (sshd -E).
	log, _ := os.ReadFile(filepath.Join(dir, "sshd.log"))
	if n := strings.Count(string(log), "Accepted publickey"); n < 3 {
		t.Errorf("sshd accepted %d logins, want at least 3 (the daemon and two ranks):\n%s", n, log)
	}
}

// startSSHD runs an sshd on addr (a free port) for the test, accepting the
// key dir/id_ed25519 that it makes, and returns the port.
func startSSHD(t *testing.T, dir, addr string) int {
	t.Helper()
	sshd, err := exec.LookPath("sshd")
	if err != nil {
		sshd = "/usr/sbin/sshd"
	}
	if _, err := os.Stat(sshd); err != nil {
		t.Fatal("sshd missing: apt-get install openssh-server (scripts/setup.sh does)")
	}
	for _, k := range []string{"host_ed25519", "id_ed25519"} {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", filepath.Join(dir, k)).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen: %v\n%s", err, out)
		}
	}
	pub, err := os.ReadFile(filepath.Join(dir, "id_ed25519.pub"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "authorized_keys"), pub, 0o600)
	l, err := net.Listen("tcp", addr+":0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	conf := fmt.Sprintf(`ListenAddress %s:%d
HostKey %s
AuthorizedKeysFile %s
PidFile %s
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
LogLevel VERBOSE
`, addr, port, filepath.Join(dir, "host_ed25519"), filepath.Join(dir, "authorized_keys"), filepath.Join(dir, "sshd.pid"))
	cf := filepath.Join(dir, "sshd_config")
	os.WriteFile(cf, []byte(conf), 0o600)
	// sshd wants its privilege-separation directory.
	os.MkdirAll("/run/sshd", 0o755)
	cmd := exec.Command(sshd, "-D", "-f", cf, "-E", filepath.Join(dir, "sshd.log"))
	if out, err := exec.Command(sshd, "-t", "-f", cf).CombinedOutput(); err != nil {
		t.Fatalf("sshd -t: %v\n%s", err, out)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c, err := net.Dial("tcp", net.JoinHostPort(addr, strconv.Itoa(port)))
		if err == nil {
			c.Close()
			return port
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "sshd.log"))
			t.Fatalf("sshd did not listen on %s:%d: %v\n%s", addr, port, err, log)
		}
	}
}

// TestDriverSSH: an elastic job whose discovery script first lists one
// host, this machine (127.0.0.87), then a second one reached through a
// real OpenSSH server (sshd on 127.0.0.88, which this test tells hvdd run
// is not this machine). The second host's daemon and its two ranks start
// through ssh; the job grows to three ranks, which all reach an epoch of
// three with real daemons, finishes, and Run returns 0 with nothing left
// behind.
func TestDriverSSH(t *testing.T) {
	bin := buildHvdd(t)
	dir := testDir(t)
	port := startSSHD(t, dir, "127.0.0.88")
	agent := fmt.Sprintf("ssh -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -p %d -i %s",
		port, filepath.Join(dir, "id_ed25519"))
	rj := startReal(t, dir, bin, Config{
		NP:                  1,
		HostDiscoveryScript: discoveryScript(t, dir, "127.0.0.87:1\n"),
		Agent:               agent,
		localHost:           func(h string) bool { return h == "127.0.0.87" },
		// Remote ranks get only Config.Env: the race detector's exit
		// delay off, as TestMain sets it here.
		Env: []string{"GORACE=" + os.Getenv("GORACE")},
	})
	rj.epoch(1, 0)
	setHosts(t, dir, "127.0.0.87:1\n127.0.0.88:2\n")
	rj.stderr.waitFor(t, "hvdd run: host 127.0.0.88 joins the elastic job: starting its hvdd daemon (node 1) for 2 ranks (reset 1)\n", 10*time.Second)
	rj.stderr.waitFor(t, "hvdd run: started 2 ranks on 127.0.0.88: [1] [2]\n", 30*time.Second)
	rj.epoch(3, 0, 1, 2)
	for _, tag := range []int{1, 2} {
		if s := rj.socketOf(tag); !strings.HasSuffix(filepath.Dir(s), "-1") {
			t.Errorf("rank [%d] is on %s, want node 1's socket", tag, s)
		}
	}
	rj.finish()
	rj.checkCleanedUp()
	// Host 1's daemon and ranks really came through sshd: its log shows
	// the logins (sshd -E).
	log, _ := os.ReadFile(filepath.Join(dir, "sshd.log"))
	if n := strings.Count(string(log), "Accepted publickey"); n < 3 {
		t.Errorf("sshd accepted %d logins, want at least 3 (the daemon and two ranks):\n%s", n, log)
	}
}
