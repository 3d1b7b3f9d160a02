package api

import (
	"fmt"
	"testing"
	"time"
)

// The state copy follows the feed: snapshot, then heartbeats and cluster
// events; it stops answering when the feed drops it or goes quiet.
func TestStateCache(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	now := t0
	c := &stateCache{now: func() time.Time { return now }, maxQuiet: time.Second}
	guild := uint64(5) << 22 // shard 5 of 8: cluster 2
	ask := func() (GuildInfo, bool) { return c.guild(guild) }

	if _, ok := ask(); ok {
		t.Fatal("answers before a snapshot")
	}
	if c.apply([]byte(`{"type":"heartbeat","cluster":2,"pid":12,"at":"2026-01-02T03:04:05Z"}`)) {
		t.Fatal("a heartbeat before the snapshot asked for a resync")
	}
	snap := fmt.Sprintf(`{"type":"snapshot","status":{"topology":{"total_shards":8,"shards_per_cluster":2},"generation":1,"at":%q,"clusters":[`+
		`{"id":0,"shard_first":0,"shard_last":1,"generation":1,"state":"ready","pid":10,"routed":true,"heartbeat_age_ms":10},`+
		`{"id":1,"shard_first":2,"shard_last":3,"generation":1,"state":"ready","pid":11,"routed":true,"heartbeat_age_ms":10},`+
		`{"id":2,"shard_first":4,"shard_last":5,"generation":1,"state":"ready","pid":12,"routed":true,"heartbeat_age_ms":300,"heartbeat":{"x":1}},`+
		`{"id":3,"shard_first":6,"shard_last":7,"generation":1,"state":"ready","pid":13,"routed":true,"heartbeat_age_ms":10}]}}`,
		t0.Format(time.RFC3339Nano))
	if c.apply([]byte(snap)) {
		t.Fatal("snapshot asked for a resync")
	}
	g, ok := ask()
	if !ok || g.Cluster != 2 || g.Shard != 5 || g.PID != 12 || !g.Ready || !g.Alive || g.HeartbeatMS != 300 || g.Source != "watch" {
		t.Fatalf("after snapshot: %+v %v", g, ok)
	}

	now = t0.Add(200 * time.Millisecond)
	c.apply([]byte(`{"type":"heartbeat","cluster":2,"generation":1,"pid":12,"ready":true,"at":"2026-01-02T03:04:05.1Z","payload":{"a":[1,2]}}`))
	if g, _ := ask(); g.HeartbeatMS != 100 {
		t.Fatalf("heartbeat age %d, want 100", g.HeartbeatMS)
	}
	// A deploy's new process heartbeats too; it does not move cluster 2's age.
	c.apply([]byte(`{"type":"heartbeat","cluster":2,"generation":2,"pid":99,"ready":false,"at":"2026-01-02T03:04:05.2Z"}`))
	if g, _ := ask(); g.HeartbeatMS != 100 {
		t.Fatalf("heartbeat of another process moved the age: %d", g.HeartbeatMS)
	}

	// The cluster dies: no process, not alive, not ready.
	c.apply([]byte(`{"type":"cluster","cluster":{"id":2,"shard_first":4,"shard_last":5,"generation":1,"state":"restarting","routed":false,"restarts":1,"heartbeat_age_ms":-1}}`))
	if g, _ := ask(); g.Alive || g.Ready || g.PID != 0 || g.HeartbeatMS != -1 || g.Restarts != 1 || g.State != "restarting" {
		t.Fatalf("after death: %+v", g)
	}
	// Respawned and registered: alive, not ready yet.
	c.apply([]byte(`{"type":"cluster","cluster":{"id":2,"shard_first":4,"shard_last":5,"generation":1,"state":"registered","pid":21,"routed":false,"restarts":1,"heartbeat_age_ms":5}}`))
	if g, _ := ask(); !g.Alive || g.Ready || g.PID != 21 || g.HeartbeatMS != 5 {
		t.Fatalf("after respawn: %+v", g)
	}
	c.apply([]byte(`{"type":"deploy","deploy":{"id":"deploy-2","state":"running"}}`))

	// Quiet for longer than maxQuiet: not trusted.
	now = now.Add(1500 * time.Millisecond)
	if _, ok := ask(); ok {
		t.Fatal("answers from a silent feed")
	}
	now = now.Add(time.Millisecond)
	c.apply([]byte(`{"type":"heartbeat","cluster":2,"generation":1,"pid":21,"ready":false,"at":"2026-01-02T03:04:06Z"}`))
	if _, ok := ask(); !ok {
		t.Fatal("no answer after the feed spoke again")
	}

	// Nonsense and drops ask for a new snapshot, and stop the answers until it comes.
	for _, ev := range []string{`{"type":"dropped"}`, `not json`, `{"type":"cluster","cluster":{"id":7}}`,
		`{"type":"snapshot","status":{"topology":{"total_shards":8,"shards_per_cluster":2},"clusters":[]}}`} {
		c.apply([]byte(snap))
		if !c.apply([]byte(ev)) {
			t.Errorf("%s did not ask for a resync", ev)
		}
		if _, ok := ask(); ok {
			t.Errorf("answers after %s", ev)
		}
	}

	// A new connection forgets everything.
	c.apply([]byte(snap))
	c.reset()
	if _, ok := ask(); ok || c.isSynced() {
		t.Fatal("answers after reset")
	}
}

func TestCheckOp(t *testing.T) {
	for op, ok := range map[string]bool{
		"ping": true, "guild.sync": true, "Deploy": true, "cache-clear": true, "a:b": true, "x_Y": true, "PING.now": true,
		"": false, "DEPLOY": false, "REGISTER": false, "WATCH": false, "STATUS": false, "FUTURE_OP2": false,
		"bad op": false, "a/b": false, "é": false, "a\n": false,
	} {
		if err := checkOp(op); (err == nil) != ok {
			t.Errorf("checkOp(%q) = %v, want ok=%v", op, err, ok)
		}
	}
}

func TestStatusOf(t *testing.T) {
	for code, status := range map[string]int{
		"unknown_target": 404, "timeout": 504, "unavailable": 503, "busy": 429, "forbidden": 403,
		"deploy_in_progress": 409, "bad_config": 422, "bad_frame": 400, "frame_too_large": 413,
		"shutting_down": 503, "unknown_op": 404, "internal": 500, "the_bots_own": 422,
	} {
		if got := statusOf(code); got != status {
			t.Errorf("statusOf(%q) = %d, want %d", code, got, status)
		}
	}
}
