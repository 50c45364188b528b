// Package loop is the daemon's local engine: one goroutine (Loop.Run) that
// owns every job's state and reads every client. It waits in one epoll set
// (package poll) for the clients' sockets, its mailbox and, across nodes,
// the formation's control links; it decodes the clients' frames, maps their
// regions and checks every buffer before a request goes further; it keeps
// each job in a lane (several jobs per daemon), negotiates one node's
// tensors over a plan.Table (localCoord) or hands them to the formation
// across nodes (package nodes, through package job's seams), dispatches
// what is ready to the executor (package exec) or runs small work inline,
// and answers. It also re-forms elastic jobs from their survivors, and
// keeps what hvdd status, the metrics, the timeline and the autotuner read.
//
// The Server (package daemon) makes it with New, hands it connections with
// Accept, and is reached back only through the Server interface.
package loop
