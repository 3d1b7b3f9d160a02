// Package bench is sm-bench: load scenarios that start real sm-manager and
// cluster-harness processes, drive requests at them, keep exact books (sent,
// replied, errors by code, duplicates, lost) and report throughput, latency
// and the manager's CPU and memory.
//
// Each scenario runs alone, bounded in time, and fails when an invariant
// breaks (a lost request, a duplicate reply, an error reply where none is
// allowed). Main lists them (cli.go), one file each. What they share: the
// manager and its simulated clusters (fleet.go, rollfleet.go), their loads
// (pipe.go, laneload.go, clientload.go), the temp dir and log of a run
// (workdir.go), and the command around each: flags, a table, JSON lines and
// the invariant check (cli.go).
package bench
