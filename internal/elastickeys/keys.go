// Package elastickeys names the keys of an elastic job's rendezvous store by
// which hvdd run's elastic driver (package launch) and the daemons (package
// nodes, driven.go) agree on each epoch's members: the daemons report, the
// driver decides.
package elastickeys

import "strconv"

// Report is node's report of the workers it re-forms into epoch.
func Report(epoch uint64, node int) string {
	return "elastic/" + strconv.FormatUint(epoch, 10) + "/node/" + strconv.Itoa(node)
}

// Joining is the report of a node that joins the running job.
func Joining(node int) string { return "elastic/joining/" + strconv.Itoa(node) }

// Members is the driver's decision version of epoch's members.
func Members(epoch uint64, version int) string {
	return "elastic/" + strconv.FormatUint(epoch, 10) + "/members/" + strconv.Itoa(version)
}

// Formed marks epoch formed (the coordinator); its value is the version of
// the decision it formed with (Members), which need not be the latest: the
// driver may have published another while the epoch formed.
func Formed(epoch uint64) string { return "elastic/" + strconv.FormatUint(epoch, 10) + "/formed" }

// Exiting marks a worker (its HVDD_WORKER name) whose Goodbye said that its
// process exits while the elastic job ran: its daemon saw it leave, so the
// driver waits for its exit status, however long the process takes to end,
// rather than stopping it as a rank left out of an epoch that still runs.
func Exiting(worker string) string { return "elastic/exiting/" + worker }
