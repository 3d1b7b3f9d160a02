package harness

import (
	"encoding/json"
	"reflect"
	"regexp"
	"testing"
	"time"
)

func TestBuildStats(t *testing.T) {
	env := Env{Cluster: 1, ShardFirst: 4, ShardLast: 6, TotalShards: 8}
	st := simState{active: true, eventsBuffered: 1, eventsDispatched: 10, eventsDropped: 2, requestsHandled: 5, inFlight: 1}
	st.shardUp(shardSession{resumed: true, sessionID: "s4", seq: 41, resumeURL: "wss://a.invalid"})
	st.shardUp(newSession(5))
	s := buildStats(env, st, 2500*time.Millisecond, 1234)

	if len(s.Shards) != 3 {
		t.Fatalf("shards = %+v", s.Shards)
	}
	for i, sh := range s.Shards {
		if sh.ID != 4+i {
			t.Errorf("shard %d has id %d", i, sh.ID)
		}
		connected := i < 2
		if connected && (sh.Status != ShardReady || sh.PingMS < 35 || sh.PingMS > 59 || sh.Guilds < 900 || sh.Guilds > 1149) {
			t.Errorf("connected shard %+v", sh)
		}
		if !connected && (sh.Status != ShardConnecting || sh.PingMS != -1 || sh.Guilds != 0) {
			t.Errorf("connecting shard %+v", sh)
		}
	}
	if s.Guilds != s.Shards[0].Guilds+s.Shards[1].Guilds {
		t.Errorf("guilds %d is not the sum of the shards'", s.Guilds)
	}
	if s.Users != simUsers(4)+simUsers(5) || s.Users < 40*s.Guilds || s.Users >= 60*s.Guilds {
		t.Errorf("users %d: want the connected shards' %d, 40..59 a guild", s.Users, simUsers(4)+simUsers(5))
	}
	if s.PingMS != (s.Shards[0].PingMS+s.Shards[1].PingMS)/2 {
		t.Errorf("ping_ms %d is not the connected shards' mean", s.PingMS)
	}
	if n := buildStats(env, simState{}, 0, 0); n.PingMS != 0 || n.Users != 0 {
		t.Errorf("no shard connected: ping_ms %d, users %d, want both 0 (ping_ms left out)", n.PingMS, n.Users)
	}
	if s.UptimeMS != 2500 || s.MemoryBytes != 1234 || !s.Active || s.EventsBuffered != 1 || s.EventsDispatched != 10 ||
		s.EventsDropped != 2 || s.RequestsHandled != 5 || s.RequestsInFlight != 1 || s.Identifies != 1 || s.Resumes != 1 {
		t.Errorf("stats %+v", s)
	}
	if s.Shards[0].Session != SessionResumed || s.Shards[1].Session != SessionIdentified || s.Shards[2].Session != "" {
		t.Errorf("sessions %+v", s.Shards)
	}
	st.budgetHeld = true
	if sh := buildStats(env, st, 0, 0).Shards[2]; sh.Status != ShardWaitingBudget || sh.PingMS != -1 {
		t.Errorf("a shard the governor holds down: %+v", sh)
	}

	b, _ := json.Marshal(s)
	var keys map[string]json.RawMessage
	json.Unmarshal(b, &keys)
	for _, k := range []string{"shards", "guilds", "users", "ping_ms", "memory_bytes", "uptime_ms", "events_buffered", "events_dispatched", "active", "requests_handled", "identifies", "resumes"} {
		if _, ok := keys[k]; !ok {
			t.Errorf("stats JSON lacks %q: %s", k, b)
		}
	}
}

func TestReadiness(t *testing.T) {
	for _, tc := range []struct {
		connected, n int
		want         bool
	}{{0, 1, false}, {1, 1, true}, {2, 3, false}, {3, 3, true}, {0, 0, false}} {
		if got := isReady(tc.connected, tc.n); got != tc.want {
			t.Errorf("isReady(%d, %d) = %v", tc.connected, tc.n, got)
		}
	}
	if connectGoal(3, false) != 3 || connectGoal(3, true) != 2 || connectGoal(1, true) != 0 {
		t.Error("connectGoal wrong")
	}
	if isReady(connectGoal(4, true), 4) {
		t.Error("--fail-ready must never be ready")
	}
}

func TestGatewayEvents(t *testing.T) {
	var st simState
	st.gatewayEvent(2)
	if !reflect.DeepEqual(st, simState{}) {
		t.Fatalf("an event with no shard connected: %+v", st)
	}
	st.shardUp(shardSession{sessionID: "a", seq: 1})
	for range 3 {
		st.gatewayEvent(2)
	}
	if st.eventsBuffered != 2 || st.eventsDropped != 1 || st.eventsDispatched != 0 {
		t.Fatalf("before ACTIVATE: %+v", st)
	}
	if st.sessions[0].seq != 4 {
		t.Fatalf("seq %d after READY and 3 dispatches, want 4", st.sessions[0].seq)
	}
	if n := st.activate(); n != 2 || st.eventsBuffered != 0 || st.eventsDispatched != 2 || !st.active {
		t.Fatalf("activate = %d: %+v", n, st)
	}
	if n := st.activate(); n != -1 {
		t.Fatalf("second activate = %d", n)
	}
	st.gatewayEvent(2)
	if st.eventsDispatched != 3 || st.eventsBuffered != 0 {
		t.Fatalf("after ACTIVATE: %+v", st)
	}
}

func TestResumeStates(t *testing.T) {
	env := Env{Cluster: 1, ShardFirst: 4, ShardLast: 6, TotalShards: 8}
	var st simState
	if got := st.resumeStates(env); got != nil {
		t.Fatalf("no shard connected: %+v", got)
	}
	st.shardUp(shardSession{resumed: true, sessionID: "s4", seq: 41, resumeURL: "wss://a.invalid/x"})
	st.shardUp(newSession(5))
	st.gatewayEvent(10)
	got := st.resumeStates(env)
	if len(got) != 2 || got[0].Shard != 4 || got[0].SessionID != "s4" || got[0].Seq != 42 || got[0].ResumeURL != "wss://a.invalid/x" {
		t.Fatalf("resume states %+v", got)
	}
	if got[1].Shard != 5 || !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(got[1].SessionID) || got[1].Seq != 2 ||
		got[1].ResumeURL != "wss://gateway.sim.invalid/?shard=5" {
		t.Fatalf("resume state of an identified shard %+v", got[1])
	}
	for _, rs := range got {
		if err := rs.Validate(); err != nil {
			t.Errorf("the manager would refuse %+v: %v", rs, err)
		}
	}
	b, _ := json.Marshal(got[1])
	if want := `{"shard":5,"session_id":"` + got[1].SessionID + `","seq":2,"resume_url":"wss://gateway.sim.invalid/?shard=5"}`; string(b) != want {
		t.Errorf("wire form %s, want %s", b, want)
	}
	// A snapshot does not share sessions with the state it was taken from.
	snap := st.snapshot()
	st.gatewayEvent(10)
	if snap.sessions[0].seq != 42 {
		t.Error("snapshot shares its sessions")
	}
	if newSession(5).sessionID == got[1].SessionID {
		t.Error("session ids repeat")
	}
}
