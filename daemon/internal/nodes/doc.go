// Package nodes is the coordination of jobs across nodes: the formation
// that joins a daemon's job with the other nodes' daemons (rendezvous,
// control links, the layout of ranks over nodes, the engine's bootstrap),
// the coordination of a formed job (the coordinator's plan table, the
// followers' Ready messages and the coordinator's Plans, process sets,
// the timeline's phases of other nodes), elastic epochs (re-forming after
// a lost node, joining nodes, removal by hvdd run's driver) and the
// election of a new coordinator.
//
// It implements package job's Formation and Coordination with their parts
// across nodes (FormationAcross, CoordinationAcross) and reaches the loop
// only through job.LoopHooksAcross and the poller's mailbox; it imports
// neither the loop nor the executor.
package nodes
