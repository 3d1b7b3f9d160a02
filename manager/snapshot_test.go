package manager_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/manager"
)

// A fleet whose snapshot would not fit in limits.max_frame_bytes still gets
// STATUS and WATCH: without the heartbeat payloads, which the heartbeat
// events then carry.
func TestSnapshotFitsTheFrameLimit(t *testing.T) {
	for _, tc := range []struct {
		name     string
		limit    int
		omitted  bool
		payloads bool
	}{
		{"room for everything", 1 << 20, false, true},
		{"too small for the payloads", 2048, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Limits.MaxFrameBytes = tc.limit
			e := start(t, cfg)
			e.WaitReady()
			time.Sleep(3 * cfg.Heartbeat.Interval.Duration) // heartbeats with payloads
			c := e.client("watcher")
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			r, err := c.Request(ctx, &ipc.Frame{Op: ipc.OpStatus})
			if err != nil {
				t.Fatalf("STATUS with max_frame_bytes %d: %v", tc.limit, err)
			}
			var st manager.Status
			if err := json.Unmarshal(r.Payload, &st); err != nil {
				t.Fatal(err)
			}
			check := func(what string, st manager.Status) {
				t.Helper()
				withPayload := 0
				for _, cs := range st.Clusters {
					if len(cs.Heartbeat) > 0 {
						withPayload++
					}
				}
				if st.HeartbeatsOmitted != tc.omitted || (withPayload == len(st.Clusters)) != tc.payloads || len(st.Clusters) != 4 {
					t.Errorf("%s: heartbeats_omitted %v, %d of %d clusters with a payload; want omitted %v, payloads %v",
						what, st.HeartbeatsOmitted, withPayload, len(st.Clusters), tc.omitted, tc.payloads)
				}
			}
			check("STATUS", st)

			rc := e.rawClient("watcher")
			rc.send(`{"op":"WATCH","id":"w"}`)
			if f := rc.read(t, 3*time.Second); f.ID != "w" || f.Error != nil {
				t.Fatalf("WATCH reply %+v", f)
			}
			f := rc.read(t, 3*time.Second)
			var ev struct {
				Type   string         `json:"type"`
				Status manager.Status `json:"status"`
			}
			if err := json.Unmarshal(f.Payload, &ev); err != nil || f.Op != ipc.OpEvent || ev.Type != manager.EventSnapshot {
				t.Fatalf("first frame after WATCH %s: %v", ipc.Encode(f), err)
			}
			check("WATCH snapshot", ev.Status)
		})
	}
}
