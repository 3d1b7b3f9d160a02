package harness

import (
	"encoding/json"
	"strings"
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

func TestRegistrationGateAndResume(t *testing.T) {
	env := Env{Cluster: 3, Generation: 5, ShardFirst: 12, ShardLast: 15, TotalShards: 16}
	r, err := parseRegistration(json.RawMessage(`{"cluster":3,"identify":{"gate":true,"spacing_ms":5000,"max_concurrency":4},
		"resume":[{"shard":12,"session_id":"abc","seq":42,"resume_url":"wss://r.invalid","updated_at":"2026-01-01T00:00:00Z"},
		          {"shard":13,"session_id":"","seq":1,"resume_url":"wss://r.invalid"},
		          {"shard":2,"session_id":"x","seq":1,"resume_url":"wss://r.invalid"},
		          {"shard":14,"session_id":"y","seq":1,"resume_url":"https://r.invalid"},
		          {"shard":15,"shard_count":32,"session_id":"z","seq":1,"resume_url":"wss://r.invalid"},
		          {"shard":13,"shard_count":16,"session_id":"w","seq":3,"resume_url":"wss://r.invalid"}]}`))
	if err != nil || len(r.Problems) != 0 {
		t.Fatal(err, r.Problems)
	}
	if !r.GateOn() || r.Identify.SpacingMS != 5000 || r.Identify.MaxConcurrency != 4 {
		t.Errorf("identify %+v", r.Identify)
	}
	resume, problems := r.Resumable(env)
	if len(resume) != 2 || resume[12].SessionID != "abc" || resume[12].Seq != 42 || resume[12].ResumeURL != "wss://r.invalid" ||
		resume[13].SessionID != "w" || resume[13].ShardCount != 16 {
		t.Errorf("resumable %+v", resume)
	}
	if len(problems) != 4 || !strings.Contains(strings.Join(problems, "\n"), "a session of 32 shards") {
		t.Errorf("problems %q, want the empty session id, the foreign shard, the https URL and the 32-shard session", problems)
	}

	for payload, gate := range map[string]bool{
		`{"cluster":3}`:                         false, // an older manager
		`{"identify":null}`:                     false,
		`{"identify":{"gate":false}}`:           false,
		`{"identify":{"gate":true}}`:            true,
		`{"identify":"yes please"}`:             true, // unreadable: ask anyway
		`{"identify":{"gate":true},"resume":7}`: true,
	} {
		r, err := parseRegistration(json.RawMessage(payload))
		if err != nil || r.GateOn() != gate {
			t.Errorf("%s: gate %v, %v; want %v", payload, r.GateOn(), err, gate)
		}
	}
	r, _ = parseRegistration(json.RawMessage(`{"identify":{"gate":true},"resume":{"shard":12}}`))
	if len(r.Problems) != 1 || r.Resume != nil || !r.GateOn() {
		t.Errorf("an unreadable resume must be a problem, not an error: %+v", r)
	}
}

func TestParseGrant(t *testing.T) {
	for payload, want := range map[string]bool{
		`{"granted":true,"shard":12,"bucket":0}`: true,
		`{"granted":true}`:                       true,
		`{"granted":true,"shard":13,"bucket":0}`: false,
		`{"granted":false,"shard":12}`:           false,
		`{}`:                                     false,
	} {
		g, err := parseGrant(json.RawMessage(payload))
		if err != nil || g.grants(12) != want {
			t.Errorf("%s grants shard 12: %v, %v", payload, g.grants(12), err)
		}
	}
	if _, err := parseGrant(nil); err == nil {
		t.Error("no payload is no grant")
	}
}
