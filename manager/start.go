package manager

import "github.com/sm-supervisor/sm/discord"

// How a process was started, as its REGISTER reply's "start" names it
// (docs/protocol.md). The kind is the process's identify reason under another
// name: fixed at spawn, written to the state file, and read back for a
// survivor, so that a restarted manager treats it as the one that spawned it
// did (its reply says the same, and its identifies count the same).
const (
	// startFirst: the cluster's first process under this manager's
	// lineage, a cold start (discord.ReasonStart).
	startFirst = "first"
	// startRespawn: a replacement of a process of the same cluster and
	// generation, and every spawn of a manager restarted after its own
	// crash (discord.ReasonRestart).
	startRespawn = "respawn"
	// startCandidate: spawned by a DEPLOY; it buffers dispatches until
	// ACTIVATE and is handed no resume state (discord.ReasonDeploy).
	startCandidate = "candidate"
)

// startOf is the start kind of a process spawned for reason.
func startOf(r discord.Reason) string {
	switch r {
	case discord.ReasonStart:
		return startFirst
	case discord.ReasonDeploy:
		return startCandidate
	default:
		return startRespawn
	}
}

// reasonOfStart is the identify reason of a survivor the state file records
// with start kind s. A file written before the kind was recorded has none:
// such a survivor counts as a respawn, what every survivor counted as then.
func reasonOfStart(s string) discord.Reason {
	switch s {
	case startFirst:
		return discord.ReasonStart
	case startCandidate:
		return discord.ReasonDeploy
	default:
		return discord.ReasonRestart
	}
}
