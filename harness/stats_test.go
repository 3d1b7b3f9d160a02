package harness

import (
	"encoding/json"
	"testing"
	"time"
)

func TestBuildStats(t *testing.T) {
	env := Env{Cluster: 1, ShardFirst: 4, ShardLast: 6, TotalShards: 8}
	st := simState{connected: 2, active: true, eventsBuffered: 1, eventsDispatched: 10, eventsDropped: 2, requestsHandled: 5, inFlight: 1}
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
	if s.UptimeMS != 2500 || s.MemoryBytes != 1234 || !s.Active || s.EventsBuffered != 1 || s.EventsDispatched != 10 ||
		s.EventsDropped != 2 || s.RequestsHandled != 5 || s.RequestsInFlight != 1 {
		t.Errorf("stats %+v", s)
	}

	b, _ := json.Marshal(s)
	var keys map[string]json.RawMessage
	json.Unmarshal(b, &keys)
	for _, k := range []string{"shards", "guilds", "memory_bytes", "uptime_ms", "events_buffered", "events_dispatched", "active", "requests_handled"} {
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
	if st != (simState{}) {
		t.Fatalf("an event with no shard connected: %+v", st)
	}
	st.connected = 1
	for range 3 {
		st.gatewayEvent(2)
	}
	if st.eventsBuffered != 2 || st.eventsDropped != 1 || st.eventsDispatched != 0 {
		t.Fatalf("before ACTIVATE: %+v", st)
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
