package api_test

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/testenv"
)

// A feed that drops sm-api (it fell limits.feed_buffer events behind) is
// watched again: the state copy resyncs on the same connection.
func TestFeedDroppedResync(t *testing.T) {
	cfg := testConfig(t, nil)
	cfg.Limits.FeedBuffer = 1
	m := startManager(t, cfg)
	a := startAPI(t, cfg)
	st := m.WaitReady(0, 1, 2, 3)
	a.waitSynced()
	lost := func() string {
		r := a.do("GET", "/metrics", "-", nil)
		for _, l := range strings.Split(string(r.body), "\n") {
			if strings.HasPrefix(l, "sm_api_state_feed_lost_total ") {
				return strings.TrimPrefix(l, "sm_api_state_feed_lost_total ")
			}
		}
		return ""
	}
	// Kill every cluster at once: a burst of cluster events overruns a buffer of 2.
	for i := 0; lost() == "0" && i < 20; i++ {
		killed := map[int]bool{}
		for _, c := range st.Clusters {
			syscall.Kill(c.PID, syscall.SIGKILL)
			killed[c.PID] = true
		}
		testenv.WaitFor(t, 10*time.Second, "all clusters respawned", func() bool {
			st = m.WaitReady(0, 1, 2, 3)
			for _, c := range st.Clusters {
				if killed[c.PID] {
					return false
				}
			}
			return true
		})
	}
	t.Logf("feed lost %s times", lost())
	if lost() == "0" {
		t.Fatal("the feed never dropped sm-api: the test did not test anything")
	}
	a.waitSynced()
	testenv.WaitFor(t, 5*time.Second, "guild from the resynced watch", func() bool {
		r := a.get(fmt.Sprintf("/v1/guilds/%d", guildOn(0, 8)))
		return r.code == 200 && strings.Contains(string(r.body), fmt.Sprintf(`"pid":%d,`, st.Clusters[0].PID)) &&
			strings.Contains(string(r.body), `"source":"watch"`)
	})
}
