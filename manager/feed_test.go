package manager_test

import (
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

type feedEvent struct {
	Type    string          `json:"type"`
	Cluster json.RawMessage `json:"cluster"`
	Payload json.RawMessage `json:"payload"`
	Status  json.RawMessage `json:"status"`
}

// The WATCH feed starts with a snapshot, then passes heartbeats through and
// reports state changes.
func TestWatchFeed(t *testing.T) {
	e := start(t, testConfig(t))
	st := e.WaitReady()
	rc := e.rawClient("watcher")
	rc.send(`{"op":"WATCH","id":"w"}`)
	if f := rc.read(t, 3*time.Second); f.ID != "w" || f.Error != nil {
		t.Fatalf("WATCH reply %+v", f)
	}
	next := func() feedEvent {
		t.Helper()
		f := rc.read(t, 3*time.Second)
		if f.Op != ipc.OpEvent {
			t.Fatalf("got %s, want EVENT", ipc.Encode(f))
		}
		var ev feedEvent
		if err := json.Unmarshal(f.Payload, &ev); err != nil {
			t.Fatal(err)
		}
		return ev
	}
	if ev := next(); ev.Type != "snapshot" || len(ev.Status) == 0 {
		t.Fatalf("first event %+v, want snapshot", ev)
	}
	sawBeat := false
	for !sawBeat {
		ev := next()
		if ev.Type == "heartbeat" {
			var stats struct {
				Shards []json.RawMessage `json:"shards"`
			}
			if err := json.Unmarshal(ev.Payload, &stats); err != nil || len(stats.Shards) != 2 {
				t.Fatalf("heartbeat payload %s", ev.Payload)
			}
			sawBeat = true
		}
	}
	syscall.Kill(st.Clusters[1].PID, syscall.SIGKILL)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		ev := next()
		if ev.Type != "cluster" {
			continue
		}
		var cs struct {
			ID    int    `json:"id"`
			State string `json:"state"`
		}
		json.Unmarshal(ev.Cluster, &cs)
		if cs.ID == 1 && cs.State == "restarting" {
			return
		}
	}
	t.Fatal("no cluster event for the killed cluster")
}

func TestStatusOp(t *testing.T) {
	e := start(t, testConfig(t))
	e.WaitReady()
	c := e.client("s")
	r, err := c.Request(t.Context(), &ipc.Frame{Op: ipc.OpStatus})
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Clusters []struct {
			State string `json:"state"`
		} `json:"clusters"`
	}
	if err := json.Unmarshal(r.Payload, &st); err != nil || len(st.Clusters) != 4 {
		t.Fatalf("STATUS payload %s: %v", r.Payload, err)
	}
}
