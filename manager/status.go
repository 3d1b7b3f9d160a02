package manager

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/supervise"
)

// Status is a consistent snapshot of the manager's clusters. It never holds a
// token, an environment variable or a command line: it is safe to publish.
type Status struct {
	Topology generation.Topology `json:"topology"`
	Clusters []ClusterStatus     `json:"clusters"`
	// Generation is the newest generation: the one the last deploy started.
	Generation int64 `json:"generation"`
	// Deploy is the running or last deploy, if any.
	Deploy *generation.Status `json:"deploy,omitempty"`
	// Discord is the identify gate and session-start budget.
	Discord *DiscordStatus `json:"discord,omitempty"`
	At      time.Time      `json:"at"`
	// HeartbeatsOmitted says the clusters' heartbeat payloads were left out
	// so that the snapshot fits in limits.max_frame_bytes (a fleet of about a
	// thousand clusters with 1 KiB heartbeats); the heartbeat events that
	// follow carry them.
	HeartbeatsOmitted bool `json:"heartbeats_omitted,omitempty"`
	// Hosts are the hosts of the mesh, with [mesh] set (docs/multihost.md).
	Hosts []HostStatus `json:"hosts,omitempty"`
	// Reshard is the [reshard] schedule, when it is on (docs/deploys.md).
	Reshard *ReshardStatus `json:"reshard,omitempty"`
	// Counters are the fleet's totals since the manager started.
	Counters *Counters `json:"counters,omitempty"`
}

// withoutHeartbeats is st with no cluster's heartbeat payload.
func (st Status) withoutHeartbeats() Status {
	cs := make([]ClusterStatus, len(st.Clusters))
	copy(cs, st.Clusters)
	for i := range cs {
		cs[i].Heartbeat = nil
	}
	st.Clusters, st.HeartbeatsOmitted = cs, true
	return st
}

// frameRoom is what a STATUS reply's or a snapshot event's payload may take
// of limits.max_frame_bytes: the rest is the frame around it (op, id).
const frameRoom = 512

// encodeStatus is encode(st), or, if that would not fit in a frame,
// encode(st without heartbeat payloads): a snapshot too large to send would
// fail STATUS and cut off every WATCH.
func (m *Manager) encodeStatus(st Status, encode func(Status) []byte) []byte {
	b := encode(st)
	if len(b) > m.cfg.Limits.MaxFrameBytes-frameRoom {
		b = encode(st.withoutHeartbeats())
	}
	return b
}

// ClusterStatus is one cluster in a Status.
type ClusterStatus struct {
	ID          int             `json:"id"`
	ShardFirst  int             `json:"shard_first"`
	ShardLast   int             `json:"shard_last"`
	Generation  int64           `json:"generation"`
	State       supervise.State `json:"state"` // starting, registered, ready, quiescing, stopping, restarting, crash_loop
	PID         int             `json:"pid,omitempty"`
	Routed      bool            `json:"routed"`
	Activated   bool            `json:"activated"`
	Restarts    int             `json:"restarts"`
	CrashLoop   bool            `json:"crash_loop"`
	HeartbeatMS int64           `json:"heartbeat_age_ms"` // -1 when no process
	// RestartInMS is the wait before the next respawn while restarting.
	RestartInMS int64           `json:"restart_in_ms,omitempty"`
	LastExit    string          `json:"last_exit,omitempty"`
	Waiting     int             `json:"waiting"`   // requests queued for the cluster
	Deploying   bool            `json:"deploying"` // a deploy is moving this cluster
	Heartbeat   json.RawMessage `json:"heartbeat,omitempty"`
	// Recycle is the cluster's recycling ([recycle], docs/deploys.md#recycling):
	// the recycle running or the last one, or why a due one waits.
	Recycle *RecycleStatus `json:"recycle,omitempty"`
	// HostID is the mesh host holding the cluster's lease, with [mesh] set
	// ("" while none does).
	HostID string `json:"host_id,omitempty"`

	publicExit string // LastExit for the public feed (see public)
}

// public is cs as the state feed shows it: LastExit without the path,
// argument or environment a failed spawn's reason names.
func (cs ClusterStatus) public() ClusterStatus {
	cs.LastExit = cs.publicExit
	return cs
}

// public is st as the state feed shows it (see ClusterStatus.public).
func (st Status) public() Status {
	cs := make([]ClusterStatus, len(st.Clusters))
	for i, c := range st.Clusters {
		cs[i] = c.public()
	}
	st.Clusters = cs
	return st
}

// publicSpawnFailure is why a spawn failed, as the public may see it: the
// supervise.SpawnError's Public form; any other error (a Spawner's own, or no
// command known for the generation) is just "spawn failed".
func publicSpawnFailure(err error) string {
	var pub interface{ Public() string }
	if errors.As(err, &pub) {
		return pub.Public()
	}
	return "spawn failed"
}

// Status returns a snapshot taken by the event loop. Once the manager has
// stopped, the error is context.Canceled.
func (m *Manager) Status(ctx context.Context) (Status, error) {
	return ask(m, ctx, func(res chan<- Status) event { return evStatus{res: res} })
}

func (m *Manager) snapshot(now time.Time) Status {
	table := m.table()
	st := Status{Topology: table.topo, At: now, Generation: m.gen, Clusters: make([]ClusterStatus, len(table.slots))}
	if m.dep != nil {
		ds := m.dep.Status()
		st.Deploy = &ds
	}
	st.Discord = m.discordStatus(now)
	st.Counters = m.counters()
	for i, s := range table.slots {
		st.Clusters[i] = m.clusterStatus(table, s, now)
	}
	if m.mesh != nil {
		st.Hosts = m.meshHosts(now)
	}
	if m.reshard != nil {
		r := *m.reshard
		st.Reshard = &r
	}
	return st
}

// clusterStatus describes slot s of table: its routed process if it has one
// (during a deploy, the new generation once switched), else its supervised one.
func (m *Manager) clusterStatus(table *routeTable, s *slot, now time.Time) ClusterStatus {
	v := s.sup.View()
	cs := ClusterStatus{
		ID: s.id, ShardFirst: s.first, ShardLast: s.last, Generation: s.gen,
		Restarts: v.Restarts, CrashLoop: v.CrashLoop, HeartbeatMS: -1, LastExit: v.LastExit, publicExit: v.LastExitPublic,
		Deploying: v.Owned, HostID: m.meshOwner(s.id), Recycle: m.recycleStatus(s),
	}
	s.mu.Lock()
	cs.Waiting = s.waitingLiveLocked()
	s.mu.Unlock()
	p := table.procs[s.id]
	if p == nil && v.HasCurrent {
		p = v.Current
	}
	if p != nil {
		pv := p.view()
		cs.State = pv.State
		cs.PID = p.pid()
		cs.Generation = p.gen
		cs.Routed = table.procs[s.id] == p
		cs.Activated = pv.Activated
		cs.HeartbeatMS = now.Sub(pv.LastBeat).Milliseconds()
		cs.Heartbeat = p.beat
		return cs
	}
	cs.State = supervise.StateRestarting
	if v.CrashLoop {
		cs.State = supervise.StateCrashLoop
	}
	if !v.RestartAt.IsZero() {
		cs.RestartInMS = max(0, v.RestartAt.Sub(now).Milliseconds())
	}
	return cs
}
