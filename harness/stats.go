package harness

import (
	"runtime"
	"time"
)

// Shard statuses in Stats, as a gateway library reports them.
const (
	ShardConnecting = "connecting"
	ShardReady      = "ready"
)

// Stats is the simulated bot's view of itself: the HEARTBEAT payload and the
// answer to the stats op. The manager passes it to the status feed unread.
type Stats struct {
	Shards           []ShardStats `json:"shards"`
	Guilds           int          `json:"guilds"`
	MemoryBytes      uint64       `json:"memory_bytes"`
	UptimeMS         int64        `json:"uptime_ms"`
	EventsBuffered   int64        `json:"events_buffered"`
	EventsDispatched int64        `json:"events_dispatched"`
	EventsDropped    int64        `json:"events_dropped"`
	Active           bool         `json:"active"`
	Quiescing        bool         `json:"quiescing"`
	RequestsHandled  int64        `json:"requests_handled"`
	RequestsInFlight int          `json:"requests_in_flight"`
}

// ShardStats is one shard's line in Stats. PingMS is -1 until the shard is
// connected, as discord.js reports it.
type ShardStats struct {
	ID     int    `json:"id"`
	Status string `json:"status"`
	PingMS int    `json:"ping_ms"`
	Guilds int    `json:"guilds"`
}

// simState is the simulated bot's mutable state.
type simState struct {
	connected        int // shards connected so far, in order from the first
	active           bool
	quiescing        bool
	hung             bool
	eventsBuffered   int64
	eventsDispatched int64
	eventsDropped    int64
	requestsHandled  int64
	inFlight         int
}

// buildStats renders st for a cluster of env that has been up for uptime and
// uses mem bytes of memory. Guild counts and pings are made up, but stable for
// a shard, so the status page shows plausible numbers.
func buildStats(env Env, st simState, uptime time.Duration, mem uint64) Stats {
	s := Stats{
		Shards:           make([]ShardStats, 0, env.Shards()),
		MemoryBytes:      mem,
		UptimeMS:         uptime.Milliseconds(),
		EventsBuffered:   st.eventsBuffered,
		EventsDispatched: st.eventsDispatched,
		EventsDropped:    st.eventsDropped,
		Active:           st.active,
		Quiescing:        st.quiescing,
		RequestsHandled:  st.requestsHandled,
		RequestsInFlight: st.inFlight,
	}
	for i := range env.Shards() {
		id := env.ShardFirst + i
		sh := ShardStats{ID: id, Status: ShardConnecting, PingMS: -1}
		if i < st.connected {
			sh.Status = ShardReady
			sh.PingMS = simPing(id, uptime)
			sh.Guilds = simGuilds(id)
			s.Guilds += sh.Guilds
		}
		s.Shards = append(s.Shards, sh)
	}
	return s
}

// simGuilds is the made-up guild count of a shard: 900..1149, fixed per shard.
func simGuilds(shard int) int { return 900 + (shard*7919)%250 }

// simPing is a made-up gateway latency of 35..59ms that drifts every second.
func simPing(shard int, uptime time.Duration) int {
	return 35 + (shard*13+int(uptime/time.Second)*7)%25
}

// memoryBytes is the Go heap in use, the figure a bot's own stats would report.
func memoryBytes() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Alloc
}

// isReady reports whether a cluster of n shards with connected of them up may
// say ready: all of them, and at least one.
func isReady(connected, n int) bool { return n > 0 && connected >= n }

// connectGoal is how many shards will ever connect: all, or with --fail-ready
// all but the last, so the cluster never becomes ready.
func connectGoal(n int, failReady bool) int {
	if failReady {
		return n - 1
	}
	return n
}

// gatewayEvent records one dispatch from a connected shard: handled at once by
// an active process, buffered (at most bufferCap, dropping the oldest) by one
// that awaits ACTIVATE. With no shard connected there is no event.
func (st *simState) gatewayEvent(bufferCap int) {
	switch {
	case st.connected == 0:
	case st.active:
		st.eventsDispatched++
	case st.eventsBuffered < int64(bufferCap):
		st.eventsBuffered++
	default:
		st.eventsDropped++
	}
}

// activate makes the process the one that handles dispatches: the buffer is
// flushed and counts as dispatched. It reports how many events were flushed, or
// -1 if the process was already active.
func (st *simState) activate() int64 {
	if st.active {
		return -1
	}
	st.active = true
	n := st.eventsBuffered
	st.eventsDispatched += n
	st.eventsBuffered = 0
	return n
}
