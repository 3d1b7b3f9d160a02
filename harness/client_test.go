package harness

import (
	"encoding/json"
	"testing"
	"time"
)

func TestRegistration(t *testing.T) {
	env := Env{Cluster: 3, Generation: 5, ShardFirst: 12, ShardLast: 15, TotalShards: 16}
	r, err := parseRegistration(json.RawMessage(`{"cluster":3,"generation":5,"shard_first":12,"shard_last":15,"total_shards":16,"active":true,"heartbeat_interval_ms":250,"future":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := r.HeartbeatInterval(time.Second); got != 250*time.Millisecond {
		t.Errorf("interval %v", got)
	}
	if m := r.Mismatches(env); len(m) != 0 {
		t.Errorf("mismatches %q", m)
	}
	if r.Active == nil || !*r.Active {
		t.Error("active not read")
	}

	r, _ = parseRegistration(json.RawMessage(`{"generation":6,"shard_last":14,"heartbeat_interval_ms":0}`))
	if got := r.HeartbeatInterval(time.Second); got != time.Second {
		t.Errorf("a zero interval must fall back, got %v", got)
	}
	if m := r.Mismatches(env); len(m) != 2 {
		t.Errorf("mismatches %q, want generation and shard_last", m)
	}
	for _, p := range []string{``, `null`, `{}`} {
		r, err := parseRegistration(json.RawMessage(p))
		if err != nil || r.HeartbeatInterval(time.Second) != time.Second {
			t.Errorf("payload %q: %v", p, err)
		}
	}
	if _, err := parseRegistration(json.RawMessage(`[1]`)); err == nil {
		t.Error("an array payload was accepted")
	}
}
