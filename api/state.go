package api

import (
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/sm-supervisor/sm/generation"
)

// The manager's state as sm-api reads it. These mirror the JSON of the
// manager's Status (the STATUS reply and the feed's snapshot), keeping only
// the fields sm-api answers with: the wire format is the contract between the
// two daemons, not the manager's Go types.
type (
	statusDoc struct {
		Topology   generation.Topology `json:"topology"`
		Clusters   []clusterState      `json:"clusters"`
		Generation int64               `json:"generation"`
		At         time.Time           `json:"at"`
	}
	clusterState struct {
		ID          int    `json:"id"`
		ShardFirst  int    `json:"shard_first"`
		ShardLast   int    `json:"shard_last"`
		Generation  int64  `json:"generation"`
		State       string `json:"state"`
		PID         int    `json:"pid"`
		Routed      bool   `json:"routed"`
		Restarts    int    `json:"restarts"`
		CrashLoop   bool   `json:"crash_loop"`
		HeartbeatMS int64  `json:"heartbeat_age_ms"` // -1 when no process
		Deploying   bool   `json:"deploying"`
		HostID      string `json:"host_id"` // with [mesh]: the host holding its lease
		// Heartbeat is the last payload, in a snapshot (kept in
		// stateCache.beat; cluster events carry none).
		Heartbeat json.RawMessage `json:"heartbeat,omitempty"`
	}
)

// GuildInfo answers "who has this guild, and is it up right now?".
type GuildInfo struct {
	GuildID     string `json:"guild_id"`
	Shard       int    `json:"shard"`
	TotalShards int    `json:"total_shards"`
	Cluster     int    `json:"cluster"`
	ShardFirst  int    `json:"shard_first"`
	ShardLast   int    `json:"shard_last"`
	Generation  int64  `json:"generation"`
	State       string `json:"state"`
	// Alive: the cluster has a process that is not being stopped.
	Alive bool `json:"alive"`
	// Ready: that process is routed and all its shards are up, so the
	// guild's events and ops are being handled now.
	Ready       bool  `json:"ready"`
	Routed      bool  `json:"routed"`
	PID         int   `json:"pid"`
	HeartbeatMS int64 `json:"heartbeat_age_ms"` // -1 when no process
	Restarts    int   `json:"restarts"`
	CrashLoop   bool  `json:"crash_loop"`
	Deploying   bool  `json:"deploying"`
	// HostID is the mesh host running the cluster, with [mesh] set (absent
	// on a single host, and while no host holds the cluster's lease).
	HostID string `json:"host_id,omitempty"`
	// Source says where the answer came from: "watch" (sm-api's copy of the
	// manager's state feed) or "status" (a STATUS request made for it).
	Source string `json:"source"`
}

// guildInfo describes guild g under topo, given its cluster's state and
// heartbeat age.
func guildInfo(g uint64, topo generation.Topology, cs clusterState, ageMS int64, source string) GuildInfo {
	shard := topo.ShardOfGuild(g)
	return GuildInfo{
		GuildID: strconv.FormatUint(g, 10), Shard: shard, TotalShards: topo.Total, Cluster: cs.ID,
		ShardFirst: cs.ShardFirst, ShardLast: cs.ShardLast, Generation: cs.Generation, State: cs.State,
		Alive: alive(cs), Ready: cs.State == "ready" && cs.Routed, Routed: cs.Routed, PID: cs.PID,
		HeartbeatMS: ageMS, Restarts: cs.Restarts, CrashLoop: cs.CrashLoop, Deploying: cs.Deploying,
		HostID: cs.HostID, Source: source,
	}
}

// alive reports whether cs names a process that is up and not on its way out.
func alive(cs clusterState) bool {
	switch cs.State {
	case "starting", "registered", "ready", "quiescing":
		return cs.PID != 0
	}
	return false
}

// guildFromStatus answers for guild g from a full status document.
func guildFromStatus(g uint64, st *statusDoc) (GuildInfo, bool) {
	if st.Topology.Validate() != nil {
		return GuildInfo{}, false
	}
	c := st.Topology.ClusterOfShard(st.Topology.ShardOfGuild(g))
	if c >= len(st.Clusters) {
		return GuildInfo{}, false
	}
	cs := st.Clusters[c]
	return guildInfo(g, st.Topology, cs, cs.HeartbeatMS, "status"), true
}

// stateCache is sm-api's copy of the manager's state, kept by the WATCH feed:
// a snapshot, then events applied in order. It answers GET /v1/guilds/{id}
// without a round trip to the manager. It is trusted only while synced (a
// snapshot arrived on the current connection and no event was dropped) and
// fresh (an event arrived within maxQuiet: heartbeats flow all the time, so
// silence means the feed is stuck or gone); otherwise callers ask STATUS.
type stateCache struct {
	now      func() time.Time
	maxQuiet time.Duration

	mu       sync.Mutex
	synced   bool
	topo     generation.Topology
	clusters []clusterState
	lastBeat []time.Time // per cluster; zero when it has no process
	// beat is each cluster's last heartbeat payload from the process its
	// state describes (nil before one), for GET /v1/stats.
	beat      []json.RawMessage
	lastEvent time.Time
}

// feed event types (see the manager's feed.go).
const (
	evSnapshot  = "snapshot"
	evTopology  = "topology"
	evHeartbeat = "heartbeat"
	evCluster   = "cluster"
	evDeploy    = "deploy"
	evDropped   = "dropped"
)

// reset forgets everything: a new connection needs a new snapshot.
func (c *stateCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.synced = false
	c.clusters, c.lastBeat, c.beat = nil, nil, nil
}

// Synced reports whether the cache holds a snapshot and every event since.
func (c *stateCache) isSynced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.synced
}

// apply applies one feed event. It returns true when the cache lost track of
// the manager (the feed dropped sm-api, or an event made no sense) and a new
// WATCH is needed to get a new snapshot.
func (c *stateCache) apply(payload []byte) (resync bool) {
	var head struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(payload, &head) != nil {
		return c.lose()
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch head.Type {
	case evSnapshot, evTopology:
		var ev struct {
			Status statusDoc `json:"status"`
		}
		if json.Unmarshal(payload, &ev) != nil || ev.Status.Topology.Validate() != nil ||
			len(ev.Status.Clusters) != ev.Status.Topology.Clusters() {
			return c.loseLocked()
		}
		c.topo, c.clusters = ev.Status.Topology, ev.Status.Clusters
		c.lastBeat = make([]time.Time, len(c.clusters))
		c.beat = make([]json.RawMessage, len(c.clusters))
		for i, cs := range c.clusters {
			c.beat[i] = cs.Heartbeat
			if cs.HeartbeatMS >= 0 {
				c.lastBeat[i] = ev.Status.At.Add(-time.Duration(cs.HeartbeatMS) * time.Millisecond)
			}
		}
		c.synced = true
	case evHeartbeat:
		if !c.synced {
			return false
		}
		var ev struct {
			Cluster int             `json:"cluster"`
			PID     int             `json:"pid"`
			At      time.Time       `json:"at"`
			Payload json.RawMessage `json:"payload"`
		}
		if json.Unmarshal(payload, &ev) != nil {
			return c.loseLocked()
		}
		// Heartbeats come from every process, a deploy's new one included;
		// only the one the cluster's state describes moves its age.
		if ev.Cluster >= 0 && ev.Cluster < len(c.clusters) && ev.PID == c.clusters[ev.Cluster].PID &&
			ev.At.After(c.lastBeat[ev.Cluster]) {
			c.lastBeat[ev.Cluster] = ev.At
			c.beat[ev.Cluster] = ev.Payload
		}
	case evCluster:
		if !c.synced {
			return false
		}
		var ev struct {
			Cluster clusterState `json:"cluster"`
		}
		if json.Unmarshal(payload, &ev) != nil || ev.Cluster.ID < 0 || ev.Cluster.ID >= len(c.clusters) {
			return c.loseLocked()
		}
		i, old := ev.Cluster.ID, c.clusters[ev.Cluster.ID]
		c.clusters[i] = ev.Cluster
		if ev.Cluster.PID != old.PID {
			c.beat[i] = nil // the old process's; the new one's next heartbeat fills it
		}
		switch beat := now.Add(-time.Duration(ev.Cluster.HeartbeatMS) * time.Millisecond); {
		case ev.Cluster.HeartbeatMS < 0:
			c.lastBeat[i] = time.Time{}
		case ev.Cluster.PID != old.PID || beat.After(c.lastBeat[i]):
			c.lastBeat[i] = beat
		}
	case evDropped:
		return c.loseLocked()
	case evDeploy:
		// Deploys are read with STATUS, which has them whole.
	}
	c.lastEvent = now
	return false
}

func (c *stateCache) lose() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.loseLocked()
}

func (c *stateCache) loseLocked() bool {
	c.synced = false
	return true
}

// guild answers for guild g from the cache; false if the cache is not to be
// trusted right now.
func (c *stateCache) guild(g uint64) (GuildInfo, bool) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.synced || now.Sub(c.lastEvent) > c.maxQuiet {
		return GuildInfo{}, false
	}
	i := c.topo.ClusterOfShard(c.topo.ShardOfGuild(g))
	if i >= len(c.clusters) {
		return GuildInfo{}, false
	}
	age := int64(-1)
	if !c.lastBeat[i].IsZero() {
		age = max(0, now.Sub(c.lastBeat[i]).Milliseconds())
	}
	return guildInfo(g, c.topo, c.clusters[i], age, "watch"), true
}

// payloads fills payloads[i] with cluster i's last heartbeat payload from the
// cache, where it is in sync and describes the same process as clusters[i].
func (c *stateCache) payloads(clusters []clusterState, payloads []json.RawMessage) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.synced {
		return
	}
	for i, cs := range clusters {
		if i < len(c.clusters) && i < len(payloads) && payloads[i] == nil && c.clusters[i].PID == cs.PID {
			payloads[i] = c.beat[i]
		}
	}
}
