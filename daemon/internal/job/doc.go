// Package job is the daemon's vocabulary of a job, shared by the loop, the
// coordination across nodes and the executor: an op (one client request in
// flight), a job (the local ranks that negotiate together), its membership
// across nodes, its process sets and how they lie over the nodes, the work
// rows the executor runs, the autotuner's settings, the timeline's row and
// top-level phase names that the loop and the executor both write
// (timeline.go), and the small interfaces the others meet at: a connection
// to answer on (Conn), a shared-memory mapping (Mapping), a tensor in GPU
// memory (DeviceTensor), how a job forms (Formation), how its tensors are
// negotiated (Coordination) and what those two may ask of the loop
// (LoopHooks).
//
// It imports no other package of the daemon's: the loop, the nodes and the
// executor implement its interfaces.
package job
