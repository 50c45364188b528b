package launch

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// Remote hosts are reached through the agent (ssh), one agent process per
// daemon and per rank, each running one sh command line:
//
//   - The command line runs the daemon or rank in the background and
//     watches its own standard input: when that closes (hvdd run closed it,
//     exited, or the agent died), the watcher sends the process SIGTERM,
//     then SIGKILL after the kill grace. So hvdd run stops a remote process
//     by closing the agent's stdin, needing no tty (ssh -tt) and no remote
//     pid; a signal forwarded to the job reaches remote ranks as SIGTERM.
//   - A remote daemon reads the job's secret from the agent's stdin, and is
//     ready when its wrapper sees the socket appear and prints a marker line.

// sshCommand reaches remote hosts when no agent is given: never a password
// prompt (BatchMode), and, as horovodrun's ssh does, a host not yet in
// known_hosts is taken (accept-new records its key; unlike horovodrun's
// StrictHostKeyChecking=no, a changed key is still refused).
var sshCommand = []string{"ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new"}

// agentArgv is the command that reaches a remote host, before the host and
// its command line: --agent's words, else ssh with --ssh-port and
// --ssh-identity-file.
func (j *job) agentArgv() []string {
	if j.cfg.Agent != "" {
		return strings.Fields(j.cfg.Agent)
	}
	argv := append([]string(nil), sshCommand...)
	if j.cfg.SSHPort != 0 {
		argv = append(argv, "-p", strconv.Itoa(j.cfg.SSHPort))
	}
	if j.cfg.SSHIdentityFile != "" {
		argv = append(argv, "-i", j.cfg.SSHIdentityFile)
	}
	return argv
}

// agent returns the command that runs script on host.
func (j *job) agent(host, script string) *exec.Cmd {
	// The remote login shell may not be sh; it gets one quoted word for sh.
	argv := append(j.agentArgv(), host, "sh -c "+shellQuote(script))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = environ()
	return cmd
}

// agentString is agentArgv as one line, for messages and mpirun's
// plm_rsh_agent.
func (j *job) agentString() string { return strings.Join(j.agentArgv(), " ") }

// watch wraps the sh command line cmd (which must not read its stdin): it
// runs in the background, and when our stdin ends it gets SIGTERM, then
// SIGKILL after the grace. The wrapper exits with cmd's status. pre runs
// first, with stdin still ours; post runs after cmd, before the exit.
func (j *job) watch(pre, cmd, whileRunning, post string) string {
	g := strconv.Itoa(max(j.grace, 1))
	s := pre + "exec 3<&0; " +
		cmd + " 3<&- & p=$!; " +
		// The watcher waits out the grace in steps of 0.1 s (1 s where
		// sleep takes whole seconds only) while the command runs, so that
		// nothing of it outlives the command by more than a step. A single
		// grace sleep, killed by the watcher's trap, could stay behind: a
		// TERM that lands between the sleep's fork and its exec is caught
		// by the copy of the trap and lost at the exec (the fault campaign
		// found such a sleep left after a job).
		"( cat <&3 >/dev/null 2>&1; exec 3<&-; kill -TERM $p; n=0; " +
		"while [ $n -lt " + g + "0 ] && kill -0 $p; do if sleep 0.1; then n=$((n+1)); else sleep 1; n=$((n+10)); fi; done; " +
		"kill -KILL $p ) >/dev/null 2>&1 & w=$!; " +
		"exec 3<&-; " + whileRunning +
		"wait $p; r=$?; kill $w 2>/dev/null; " + post + "exit $r"
	return s
}

// workerScript is the remote command line of a rank with the rank
// variables rankEnv. A remote rank gets only cfg.Env and its rank
// variables, in the same working directory as here.
func (j *job) workerScript(rankEnv []string) string {
	env := append(append([]string{}, j.cfg.Env...), rankEnv...)
	cmd := "( cd " + shellQuote(j.cwd) + " && exec env " + shellJoin(env) + " " + shellJoin(j.cfg.Command) + " )"
	return j.watch("", cmd, "", "")
}

func (j *job) readyMarker(i int) string {
	return "hvdd-run-daemon-ready " + j.id + " " + strconv.Itoa(i)
}

// daemonScript is node i's remote command line: it reads the secret from
// its stdin, starts the daemon with the secret on the daemon's stdin, and
// prints the ready marker once the daemon's socket exists (the daemon binds
// and listens in one step, in a directory made fresh for the job).
func (j *job) daemonScript(i int) string {
	sock := shellQuote(j.nodes[i].Socket)
	dir := shellQuote(filepath.Dir(j.nodes[i].Socket))
	pre := "IFS= read -r s || exit 1; mkdir -m 700 " + dir + " || exit 1; "
	cmd := `printf '%s\n' "$s" | ` + shellJoin(append([]string{j.remoteHvdd}, j.daemonArgs(i)...))
	wait := "s=; while kill -0 $p 2>/dev/null && ! test -S " + sock + "; do sleep 0.05 2>/dev/null || sleep 1; done; " +
		"test -S " + sock + " && echo " + shellQuote(j.readyMarker(i)) + "; "
	return j.watch(pre, cmd, wait, "rm -rf "+dir+"; ")
}
