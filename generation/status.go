package generation

import "time"

// State is where a deploy as a whole stands.
type State string

// States of a deploy. Failed and Aborted are verdicts: they are set the moment
// the deploy stops moving clusters, while clusters already switched still
// finish; Status.Finished is set once nothing is left in flight.
const (
	StatePending   State = "pending"   // built, not started
	StateRunning   State = "running"   // moving clusters
	StateSucceeded State = "succeeded" // every cluster moved
	StateFailed    State = "failed"    // a new process failed; see Reason
	StateAborted   State = "aborted"   // stopped by Abort (manager shutdown)
)

// Phase is how far one cluster has got through the four deploy steps.
type Phase string

// Phases of a cluster, in the order a successful deploy passes through them.
const (
	PhasePending   Phase = "pending"    // not started yet (waiting for a max_parallel slot)
	PhaseSpawned   Phase = "spawned"    // new process started, not ready yet
	PhaseReady     Phase = "ready"      // new process ready, routing not switched yet (re-clustering waits for all)
	PhaseRouted    Phase = "routed"     // business ops go to the new process
	PhaseQuiescing Phase = "quiescing"  // QUIESCE sent to the old process
	PhaseQuiesced  Phase = "quiesced"   // the old process answered QUIESCED
	PhaseOldExited Phase = "old_exited" // the old process is confirmed gone; the new one is not ACTIVE yet (final for a cluster a re-clustering removes)
	PhaseActivated Phase = "activated"  // ACTIVATE sent to the new process: the cluster is done
	PhaseFailed    Phase = "failed"     // the cluster did not move (or its new process died after the switch); see Reason
	PhaseSkipped   Phase = "skipped"    // never started: the deploy stopped first
)

// Status is a snapshot of a deploy for the status feed and sm-api.
type Status struct {
	ID         string    `json:"id"`
	Generation int64     `json:"generation"`
	From       Topology  `json:"from"`
	To         Topology  `json:"to"`
	State      State     `json:"state"`
	Reason     string    `json:"reason,omitempty"`
	Started    time.Time `json:"started,omitzero"`
	Finished   time.Time `json:"finished,omitzero"`
	// Mode is "resume" for a resume-handoff deploy (Plan.Resume), absent for
	// the default overlap.
	Mode     string          `json:"mode,omitempty"`
	Clusters []ClusterStatus `json:"clusters"`
}

// ClusterStatus is one cluster's progress. In a re-clustering deploy, entry i
// pairs cluster i of the new topology (New) with cluster i of the old one
// (Old); they hold different shard ranges, and either may be absent.
type ClusterStatus struct {
	Cluster int      `json:"cluster"`
	Phase   Phase    `json:"phase"`
	New     *ProcRef `json:"new,omitempty"`
	Old     *ProcRef `json:"old,omitempty"`
	Reason  string   `json:"reason,omitempty"`

	SpawnedAt     time.Time `json:"spawned_at,omitzero"`      // new process started
	ReadyAt       time.Time `json:"ready_at,omitzero"`        // new process reported ready
	RoutedAt      time.Time `json:"routed_at,omitzero"`       // routing switched to the new process
	QuiesceSentAt time.Time `json:"quiesce_sent_at,omitzero"` // QUIESCE sent to the old process
	QuiescedAt    time.Time `json:"quiesced_at,omitzero"`     // the old process answered QUIESCED
	StopSentAt    time.Time `json:"stop_sent_at,omitzero"`    // a kill was ordered: of the old after quiesce_timeout or an abort, or of the new on failure
	ExitedAt      time.Time `json:"exited_at,omitzero"`       // the old process was confirmed gone
	ActivatedAt   time.Time `json:"activated_at,omitzero"`    // ACTIVATE sent to the new process

	end    Phase // PhaseFailed or PhaseSkipped once decided; sticks whatever happens after
	resume bool  // a resume-handoff deploy's: the old process leaves before the new one starts
}

// phaseOf derives a cluster's phase from what has happened to it. An old
// process that died before the switch does not change the phase: the new
// process's progress is what matters then.
func phaseOf(c *ClusterStatus) Phase {
	switch {
	case c.end != "":
		return c.end
	case !c.ActivatedAt.IsZero():
		return PhaseActivated
	case c.resume && !c.SpawnedAt.IsZero():
		// The old process is gone already: the new one's steps are what is left.
		switch {
		case !c.RoutedAt.IsZero():
			return PhaseRouted
		case !c.ReadyAt.IsZero():
			return PhaseReady
		default:
			return PhaseSpawned
		}
	case c.resume && !c.ExitedAt.IsZero():
		return PhaseOldExited
	case !c.RoutedAt.IsZero() && !c.ExitedAt.IsZero():
		return PhaseOldExited
	case !c.QuiescedAt.IsZero():
		return PhaseQuiesced
	case !c.QuiesceSentAt.IsZero():
		return PhaseQuiescing
	case !c.RoutedAt.IsZero():
		return PhaseRouted
	case !c.ReadyAt.IsZero():
		return PhaseReady
	case !c.SpawnedAt.IsZero():
		return PhaseSpawned
	default:
		return PhasePending
	}
}
