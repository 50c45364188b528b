// Package plan is hvdd's negotiation and fusion core: it matches the
// collective requests that ranks submit by (process set, name), decides when a
// tensor is ready, checks that every rank asked for the same thing, and packs
// ready tensors into fused responses in an order every node can reproduce.
//
// It is Horovod's controller (controller.cc: ComputeResponseList,
// ConstructResponse, FuseResponses, the stall inspector and the join
// bookkeeping) without its shape: no global state, no I/O, no goroutines, no
// clock, no logging and no environment reads. Time is a logical clock that the
// caller passes in (any monotonic int64 unit; the daemon uses seconds or
// milliseconds), and the package returns data that the caller acts on, in the
// manner of raft's RawNode/Ready split.
//
// # Driving a Table
//
// One goroutine (the daemon's loop) owns a Table; it is not safe for
// concurrent use. The loop does, in order:
//
//	t, err := plan.New(plan.Config{Size: size, FusionThreshold: 64 << 20})
//	for {
//		select {
//		case req := <-requests: // a client enqueued a collective (or a join)
//			if err := t.Submit(req, now); err != nil {
//				// answer that client's op with err right away
//			}
//		case <-stallTick:
//			if s := t.Stalls(now, warnAfter); len(s) > 0 {
//				log.Warn(plan.StallMessage(s, plan.StallOptions{WarnSeconds: 60}))
//			}
//		case rank := <-lost:
//			for _, a := range t.AbortAll() { /* fail a.Name on every rank */ }
//		}
//		for _, resp := range t.Ready() {
//			// hand resp to the executor; resp.Err != nil means fail every
//			// tensor in resp.Tensors on every rank with resp.Err.
//		}
//	}
//
// Ready returns everything that became ready since the previous call: error
// responses, fused allreduces, allgathers and the rest, barriers, and a JOIN
// response once every rank has joined. In a multi-node job the coordinator
// runs the Table and broadcasts what Ready returned; every node executes it in
// that order.
//
// # What the package does not do
//
// It moves no bytes and knows no buffers: the executor turns a Response into
// backend calls. It does not time anything out: Stalls only reports. It does
// not track a tensor after Ready has returned it, so the daemon must keep its
// own per-rank set of names still executing if it wants to reject a name that
// is resubmitted before its previous collective has finished. Losing a rank is
// the daemon's business too; AbortAll hands back everything pending so the
// daemon can fail it.
package plan
