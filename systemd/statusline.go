package systemd

import (
	"fmt"

	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/manager"
)

// Started reports whether every cluster of st has been started: it has a live
// process, or it has failed to start at least once and its restart policy now
// owns it. READY=1 waits for this, not for every cluster to be ready: a bot's
// shards can take minutes to connect, and one crashing cluster must not turn
// into a manager that never finishes starting.
func Started(st manager.Status) bool {
	if len(st.Clusters) == 0 {
		return false
	}
	for _, c := range st.Clusters {
		if c.PID <= 0 && c.LastExit == "" && !c.CrashLoop {
			return false
		}
	}
	return true
}

// StatusLine is the one-line STATUS= for st, such as
//
//	12/12 clusters ready, generation 5
//	deploy 3/12 (deploy-6), 12/12 clusters ready, generations 5-6
//	11/12 clusters ready, generation 5, 1 in crash loop; deploy-6 failed
func StatusLine(st manager.Status) string {
	ready, crash := 0, 0
	for _, c := range st.Clusters {
		if c.State == "ready" && c.Routed {
			ready++
		}
		if c.CrashLoop {
			crash++
		}
	}
	line := fmt.Sprintf("%d/%d clusters ready, %s", ready, len(st.Clusters), generations(st))
	if crash > 0 {
		line += fmt.Sprintf(", %d in crash loop", crash)
	}
	d := st.Deploy
	switch {
	case d == nil:
	case d.Finished.IsZero() && (d.State == generation.StatePending || d.State == generation.StateRunning):
		line = fmt.Sprintf("deploy %d/%d (%s), %s", moved(d), len(d.Clusters), d.ID, line)
	case d.State == generation.StateFailed || d.State == generation.StateAborted:
		line += fmt.Sprintf("; %s %s", d.ID, d.State)
	}
	return line
}

// StoppingLine is the STATUS= while the manager quiesces and stops its
// clusters: how many still have a process.
func StoppingLine(st manager.Status) string {
	left := 0
	for _, c := range st.Clusters {
		if c.PID > 0 {
			left++
		}
	}
	return fmt.Sprintf("stopping: %d/%d clusters still running", left, len(st.Clusters))
}

// generations names the generation the clusters run, or the range of them
// while a deploy has some on each side.
func generations(st manager.Status) string {
	lo, hi := int64(0), int64(0)
	for _, c := range st.Clusters {
		if c.Generation <= 0 {
			continue
		}
		if lo == 0 || c.Generation < lo {
			lo = c.Generation
		}
		hi = max(hi, c.Generation)
	}
	switch {
	case lo == 0:
		return fmt.Sprintf("generation %d", st.Generation)
	case lo == hi:
		return fmt.Sprintf("generation %d", lo)
	default:
		return fmt.Sprintf("generations %d-%d", lo, hi)
	}
}

// moved counts the clusters a deploy has finished moving: the new process is
// active, or (re-clustering) the old cluster has no successor and is gone.
func moved(d *generation.Status) int {
	n := 0
	for _, c := range d.Clusters {
		if c.Phase == generation.PhaseActivated || (c.Phase == generation.PhaseOldExited && c.New == nil) {
			n++
		}
	}
	return n
}
