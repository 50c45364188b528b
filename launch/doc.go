// Package launch starts an hvdd job: it is the engine of `hvdd run`, hvdd's
// equivalent of horovodrun or mpirun, on one host or across several.
//
// Run has one path for every job: it plans the job's nodes, makes sure each
// node has a daemon, starts Config.NP copies of the worker command with
// their rank in the environment (HVDD_RANK, HVDD_LOCAL_RANK, ... and
// Horovod's HOROVOD_* names), tags every line of their output with the rank
// in mpirun's --tag-output format, and supervises them: the first rank that
// fails stops the others, and SIGINT, SIGTERM and SIGHUP are forwarded to
// every rank.
//
// A job on this machine only (no Config.Hosts, or every rank on one host
// that is this machine) is one node, the shared one: its daemon is the
// machine's daemon on the node's Unix socket (Config.Socket), used if one
// listens, else started from Config.DaemonCommand and stopped again at the
// end. Otherwise the ranks are placed node-major on the hosts and every node
// gets a daemon of its own for the job (hvdd serve --nodes H --node-rank I,
// a per-job socket under /tmp, a fresh random secret on the daemon's
// standard input; node 0 serves the rendezvous, or hvdd run in an elastic
// job, below), or with --backend mpi the
// daemons are the ranks of one mpirun. Hosts that are this machine get their
// daemon and ranks as child processes, the others through the agent (ssh -o
// BatchMode=yes -o StrictHostKeyChecking=accept-new, or Config.Agent run as
// "AGENT HOST 'sh -c ...'", as mpirun's plm_rsh_agent). Every remote command
// line runs its process in the background under a watcher that sends it
// SIGTERM, then SIGKILL after the kill grace, when the agent's standard
// input closes; Run stops remote daemons and ranks by closing it (so ssh
// needs no tty, and a dead hvdd run or agent also stops them). Signals
// forwarded to the job therefore reach remote ranks as SIGTERM. Remote ranks
// get only the rank variables and Config.Env, and run in the same working
// directory as here; a remote daemon is ready when its wrapper sees the
// socket appear and prints a marker line.
//
// With Config.MinNP (hvdd run --min-np) a job is elastic: its ranks get
// HOROVOD_ELASTIC=1, and a failed rank does not stop the others while at
// least MinNP run (up to ResetLimit such resets); the daemons re-form the
// job from the survivors. On this machine alone (no hosts) that is all: the
// shared daemon, no rank restarted. With hosts (-H) or a host discovery
// script (--host-discovery-script) the elastic driver runs the job
// (elastic.go, elastic_loop.go, elastic_hosts.go), as horovodrun's
// ElasticDriver: every host gets a daemon of its own started with
// --elastic, even a single one that is this machine. The driver serves the
// job's rendezvous store in process for the life of the job
// (elastic_rendezvous.go), and every daemon is its client
// (--rendezvous-external), so that the store outlives any host and the
// daemons can move the job's coordination off node 0. It waits for NP
// slots, starts a rank on every available slot up to MaxNP, and every
// second takes in what discovery reports: new hosts get a daemon and ranks,
// grown hosts more ranks, shrunk hosts have ranks stopped. A host gone is
// removed as Horovod removes one: the driver sets elastic/removed/K (K:
// the host's node, the value its name) in its store, the node's daemon
// tells global rank 0, every rank resets at the same commit and the
// daemon refuses its own ranks' re-initialisation ("HOST[LOCAL_RANK] has
// been removed from elastic job"), so that they exit (an expected exit,
// whatever its status) and the others re-form without a lost rank; ranks
// still running ElasticTimeout after the notice are stopped. Its rule for
// failures: when a rank fails (a non-zero status, by an exception or a
// signal, or it cannot start) or a host's daemon (or its agent) dies, the
// host is blacklisted as Horovod blacklists the host of a failed worker:
// its other ranks are stopped, and it comes back after the cooldown of
// BlacklistCooldown (never without one), with a new daemon. A host added
// later whose daemon does not start (it exits, or is not ready within
// StartTimeout) is blacklisted the same way.
// Host 0 follows the same rules as the others: its daemon dying, its host
// leaving or losing its last rank does not end the job. The package does
// not talk the daemon's protocol: it only checks that something accepts
// connections on the socket.
//
// ParseArgs takes horovodrun's command line: Horovod's tuneable parameters
// (and its YAML --config-file) become Config.Knobs, which Run passes to the
// ranks as HOROVOD_* variables and to the daemons it starts as hvdd serve
// flags (Config.ServeFlags); horovodrun's flags that mean nothing here are
// refused with the reason (refused.go).
//
// Ranks stay in hvdd run's process group, as the terminal's job control
// expects; a Ctrl-C typed at the terminal therefore reaches each rank twice,
// once from the terminal and once forwarded. Children a rank leaves behind are
// not killed; Run stops waiting for their output one second after the last
// rank exits.
//
// Lifecycle of Run, and the files that hold each step:
//
//  1. Validate the Config (config.go) and resolve the socket (Config.Socket,
//     else $HVDD_SOCKET, else ipc.DefaultSocket()).
//  2. Plan the nodes (job.go, placement in hosts.go): the shared node, or one
//     node per host that gets ranks, with a job id, secret and rendezvous.
//  3. Make sure every node's daemon is ready (daemon.go), giving up on a
//     signal. The shared node (shared.go): dial the socket; if nothing
//     accepts, take <socket>.lock, remove a stale socket file, start
//     Config.DaemonCommand and poll the socket until it accepts or
//     Config.StartTimeout passes. Other nodes: start every daemon (here, or
//     through the agent, agent.go; under mpirun, mpi.go) and wait until all
//     are ready.
//  4. Start the NP ranks (ranks.go), node by node: local ones in our process
//     group (so a terminal's Ctrl-C reaches them directly), remote ones
//     through the agent, each with its stdout and stderr line-tagged
//     (output.go).
//  5. Wait (supervise.go; elastic_loop.go for the jobs the elastic driver
//     runs). On the first failure (in an elastic job: one it cannot go on
//     from), signal or ctx cancellation, SIGTERM (or the received signal)
//     goes to the ranks still running and SIGKILL follows after
//     Config.KillGrace; a second SIGINT sends SIGKILL at once.
//  6. Stop the daemons this Run started, and return the job's exit code
//     (exitcode.go).
package launch
