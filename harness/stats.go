package harness

import (
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/sm-supervisor/sm/discord"
)

// Shard statuses in Stats, as a gateway library reports them.
const (
	ShardConnecting = "connecting"
	ShardReady      = "ready"
	// ShardWaitingBudget: the manager's budget governor refused the shard's
	// IDENTIFY (budget_refused; forbidden from an older manager); it stays
	// down and asks again every --identify-retry.
	ShardWaitingBudget = "waiting_budget"
)

// How a connected shard got its gateway session, in ShardStats.Session.
const (
	SessionIdentified = "identified" // a new session: IDENTIFY, one session start spent
	SessionResumed    = "resumed"    // RESUME of the session the REGISTER reply handed over
)

// simResumeURL is the resume_gateway_url the simulated gateway hands a shard
// in READY (.invalid: it is never dialled).
func simResumeURL(shard int) string {
	return fmt.Sprintf("wss://gateway.sim.invalid/?shard=%d", shard)
}

// Stats is the simulated bot's view of itself: the HEARTBEAT payload and the
// answer to the stats op. The manager passes it to the status feed unread.
type Stats struct {
	Shards []ShardStats `json:"shards"`
	Guilds int          `json:"guilds"`
	Users  int          `json:"users"`
	// PingMS is the mean gateway heartbeat latency of the connected shards,
	// left out while none is.
	PingMS      int    `json:"ping_ms,omitempty"`
	MemoryBytes uint64 `json:"memory_bytes"`
	// HeapBytes and LoopLagMS are the optional fields the manager's
	// recycling reads (docs/protocol.md#heartbeat): the Go heap in use, as
	// memory_bytes, and the lag sim.lag asked for.
	HeapBytes        uint64 `json:"heap_bytes"`
	LoopLagMS        int64  `json:"loop_lag_ms"`
	UptimeMS         int64  `json:"uptime_ms"`
	EventsBuffered   int64  `json:"events_buffered"`
	EventsDispatched int64  `json:"events_dispatched"`
	EventsDropped    int64  `json:"events_dropped"`
	Active           bool   `json:"active"`
	Quiescing        bool   `json:"quiescing"`
	RequestsHandled  int64  `json:"requests_handled"`
	RequestsInFlight int    `json:"requests_in_flight"`
	// Identifies and Resumes count the sessions this process opened each way.
	Identifies int `json:"identifies"`
	Resumes    int `json:"resumes"`
}

// ShardStats is one shard's line in Stats. PingMS is -1 until the shard is
// connected, as discord.js reports it.
type ShardStats struct {
	ID     int    `json:"id"`
	Status string `json:"status"`
	PingMS int    `json:"ping_ms"`
	Guilds int    `json:"guilds"`
	// Session is SessionIdentified or SessionResumed once the shard is
	// connected, and left out before.
	Session string `json:"session,omitempty"`
}

// shardSession is one connected shard's gateway session: what a RESUME needs.
type shardSession struct {
	resumed   bool
	sessionID string
	seq       int64 // the last sequence number received
	resumeURL string
}

// simState is the simulated bot's mutable state. It holds a slice: copy it
// with snapshot, not by assignment.
type simState struct {
	connected int // shards connected so far, in order from the first
	// sessions[i] is the session of shard ShardFirst+i, for i < connected.
	sessions []shardSession
	// budgetHeld: the next shard to connect (the one at index connected) is
	// held down by the manager's budget governor.
	budgetHeld       bool
	identifies       int
	resumes          int
	active           bool
	quiescing        bool
	hung             bool
	eventsBuffered   int64
	eventsDispatched int64
	eventsDropped    int64
	requestsHandled  int64
	inFlight         int
	lagMS            int64 // what sim.lag set
}

// buildStats renders st for a cluster of env that has been up for uptime and
// uses mem bytes of memory. Guild counts and pings are made up, but stable for
// a shard, so the status page shows plausible numbers.
func buildStats(env Env, st simState, uptime time.Duration, mem uint64) Stats {
	s := Stats{
		Shards:           make([]ShardStats, 0, env.Shards()),
		MemoryBytes:      mem,
		HeapBytes:        mem,
		LoopLagMS:        st.lagMS,
		UptimeMS:         uptime.Milliseconds(),
		EventsBuffered:   st.eventsBuffered,
		EventsDispatched: st.eventsDispatched,
		EventsDropped:    st.eventsDropped,
		Active:           st.active,
		Quiescing:        st.quiescing,
		RequestsHandled:  st.requestsHandled,
		RequestsInFlight: st.inFlight,
		Identifies:       st.identifies,
		Resumes:          st.resumes,
	}
	pings := 0
	for i := range env.Shards() {
		id := env.ShardFirst + i
		sh := ShardStats{ID: id, Status: ShardConnecting, PingMS: -1}
		switch {
		case i < st.connected:
			sh.Status = ShardReady
			sh.PingMS = simPing(id, uptime)
			sh.Guilds = simGuilds(id)
			s.Guilds += sh.Guilds
			s.Users += simUsers(id)
			s.PingMS += sh.PingMS
			pings++
			sh.Session = SessionIdentified
			if i < len(st.sessions) && st.sessions[i].resumed {
				sh.Session = SessionResumed
			}
		case i == st.connected && st.budgetHeld:
			sh.Status = ShardWaitingBudget
		}
		s.Shards = append(s.Shards, sh)
	}
	if pings > 0 {
		s.PingMS /= pings
	}
	return s
}

// snapshot copies st, sessions included, for use after the lock is released.
func (st *simState) snapshot() simState {
	c := *st
	c.sessions = slices.Clone(st.sessions)
	return c
}

// shardUp records that the next shard has connected with session sess.
func (st *simState) shardUp(sess shardSession) {
	st.sessions = append(st.sessions[:st.connected], sess)
	st.connected++
	st.budgetHeld = false
	if sess.resumed {
		st.resumes++
	} else {
		st.identifies++
	}
}

// resumeStates is what a RESUME of each connected shard of env needs: the
// "resume" field of HEARTBEAT and QUIESCED. It is nil with no shard connected.
func (st *simState) resumeStates(env Env) []discord.ResumeState {
	var out []discord.ResumeState
	for i, sess := range st.sessions[:min(st.connected, len(st.sessions))] {
		out = append(out, discord.ResumeState{
			Shard:     env.ShardFirst + i,
			SessionID: sess.sessionID,
			Seq:       sess.seq,
			ResumeURL: sess.resumeURL,
		})
	}
	return out
}

// simGuilds is the made-up guild count of a shard: 900..1149, fixed per shard.
func simGuilds(shard int) int { return 900 + (shard*7919)%250 }

// simUsers is the made-up member count of a shard's guilds: 40..59 a guild.
func simUsers(shard int) int { return simGuilds(shard) * (40 + shard%20) }

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
//
// Every connected shard receives the dispatch, so each one's sequence number
// goes up.
func (st *simState) gatewayEvent(bufferCap int) {
	for i := range st.sessions[:min(st.connected, len(st.sessions))] {
		st.sessions[i].seq++
	}
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
