// Package launch starts an hvdd job on one node: it is the engine of
// `hvdd run`, hvdd's equivalent of horovodrun or mpirun for a single host.
//
// Run makes sure an hvdd daemon listens on the node's Unix socket (starting
// one from Config.DaemonCommand if none does, and stopping it again at the
// end), starts Config.NP copies of the worker command with their rank in the
// environment (HVDD_RANK, HVDD_LOCAL_RANK, ... and Horovod's HOROVOD_*
// names), tags every line of their output with the rank in mpirun's
// --tag-output format, and supervises them: the first rank that fails stops
// the others, and SIGINT, SIGTERM and SIGHUP are forwarded to every rank.
//
// The package does not launch across hosts (there is no hostfile, ssh or
// cross-node rendezvous), does not restart failed ranks (no elastic mode), and
// does not talk the daemon's protocol: it only checks that something accepts
// connections on the socket.
//
// Ranks stay in hvdd run's process group, as the terminal's job control
// expects; a Ctrl-C typed at the terminal therefore reaches each rank twice,
// once from the terminal and once forwarded. Children a rank leaves behind are
// not killed; Run stops waiting for their output one second after the last
// rank exits.
//
// Lifecycle of Run:
//
//  1. Validate the Config and resolve the socket (Config.Socket, else
//     $HVDD_SOCKET, else DefaultSocket()).
//  2. Dial the socket. If nothing accepts, take <socket>.lock, remove a stale
//     socket file, start Config.DaemonCommand and poll the socket until it
//     accepts or Config.StartTimeout passes.
//  3. Start the NP workers in our process group (so a terminal's Ctrl-C reaches
//     them directly), each with its stdout and stderr line-tagged.
//  4. Wait. On the first failure, signal or ctx cancellation, SIGTERM (or the
//     received signal) goes to the ranks still running and SIGKILL follows
//     after Config.KillGrace; a second SIGINT sends SIGKILL at once.
//  5. Stop the daemon if this Run started it, and return the job's exit code.
package launch
