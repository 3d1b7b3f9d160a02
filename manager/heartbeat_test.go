package manager_test

import (
	"testing"
	"time"
)

// A steady cluster's heartbeats do not wake the event loop: the loop takes
// them on its tick (manager/heartbeat.go). Four clusters beating every 50 ms
// send about 80 heartbeats a second; before this, each was a loop event.
func TestSteadyHeartbeatsDoNotWakeTheLoop(t *testing.T) {
	e := start(t, testConfig(t))
	e.waitAllReady()
	time.Sleep(200 * time.Millisecond) // past the ready heartbeats
	before := e.scrape()["sm_loop_events_total"]
	const window = time.Second
	time.Sleep(window)
	st := e.status() // drains the boxes: heartbeats are not lost, only deferred
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
