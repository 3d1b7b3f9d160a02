// Package bench is sm-bench: load scenarios that start real sm-manager and
// cluster-harness processes, drive requests at them, keep exact books (sent,
// replied, errors by code, duplicates, lost) and report throughput, latency
// and the manager's CPU and memory.
//
// Each scenario runs alone, bounded in time, and fails when an invariant
// breaks (a lost request, a duplicate reply, an error reply where none is
// allowed). Today there is one, route; see Main.
package bench
