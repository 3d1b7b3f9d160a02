package manager_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/manager"
)

// A steady cluster's heartbeats do not wake the event loop: the loop takes
// them on its tick (manager/heartbeat.go). Four clusters beating every 50 ms
// send about 80 heartbeats a second; before this, each was a loop event.
func TestSteadyHeartbeatsDoNotWakeTheLoop(t *testing.T) {
	e := start(t, testConfig(t))
	e.WaitReady()
	time.Sleep(200 * time.Millisecond) // past the ready heartbeats
	before := e.scrape()["sm_loop_events_total"]
	const window = time.Second
	time.Sleep(window)
	st := e.MustStatus() // drains the boxes: heartbeats are not lost, only deferred
	events := e.scrape()["sm_loop_events_total"] - before
	beats := float64(len(st.Clusters)) * float64(window/e.cfg.Heartbeat.Interval.Duration)
	// The scrapes and the STATUS are events themselves; a few more are fine.
	if events > beats/4 {
		t.Errorf("%v loop events in %v with %v heartbeats: steady heartbeats wake the loop", events, window, beats)
	}
	for _, cs := range st.Clusters {
		if cs.HeartbeatMS < 0 || cs.HeartbeatMS > 3*e.cfg.Heartbeat.Interval.Milliseconds() {
			t.Errorf("cluster %d: last heartbeat %d ms ago in STATUS", cs.ID, cs.HeartbeatMS)
		}
		if len(cs.Heartbeat) == 0 {
			t.Errorf("cluster %d: no heartbeat payload in STATUS", cs.ID)
		}
	}
}

// A subscriber's first event is the snapshot even while heartbeats wait in
// their boxes: taking them on subscribe must not send their events ahead of it.
func TestSubscribeSnapshotFirstWithPendingHeartbeats(t *testing.T) {
	e := start(t, testConfig(t))
	e.WaitReady()
	time.Sleep(200 * time.Millisecond) // steady: heartbeats wait for the tick
	for i := range 40 {
		sub, err := e.Subscribe(64)
		if err != nil {
			t.Fatal(err)
		}
		first := <-sub.C
		sub.Cancel()
		var ev struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(first, &ev); err != nil || ev.Type != manager.EventSnapshot {
			t.Fatalf("subscription %d: first event %.80s, want a snapshot", i, first)
		}
		time.Sleep(time.Duration(i%7) * time.Millisecond)
	}
}
