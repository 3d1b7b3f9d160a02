package api_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/testenv"
)

// The manager goes away and comes back on the same socket: meanwhile sm-api
// answers 503 at once and hangs nothing; then it reconnects by itself.
func TestManagerRestart(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SM_HARNESS_FLAGS_1": "--op-delay=300ms"})
	m1 := startManager(t, cfg)
	a := startAPI(t, cfg)
	m1.WaitReady(0, 1, 2, 3)
	a.waitSynced()
	want(t, "ping before", a.post("/v1/clusters/0/ops/ping", ""), 200, "")

	// Requests in flight while the manager stops get an answer, whichever.
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			r := a.post(fmt.Sprintf("/v1/clusters/%d/ops/ping", i%4), "")
			if r.code != 200 && r.code != 503 {
				t.Errorf("request in flight at manager stop: %v", r)
			}
			if r.took > 5*time.Second {
				t.Errorf("request in flight at manager stop took %v", r.took)
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	m1.Stop()
	wg.Wait()

	// Down: sm-api sees its connection end within moments, and from then on
	// every endpoint that needs the manager answers 503 at once.
	stopped := time.Now()
	testenv.WaitFor(t, time.Second, "readyz 503 after the manager stopped", func() bool {
		return a.do("GET", "/readyz", "-", nil).code == 503
	})
	t.Logf("readyz 503 %v after the manager's Run returned", time.Since(stopped).Round(time.Millisecond))
	want(t, "readyz while down", a.do("GET", "/readyz", "-", nil), 503, "unavailable")
	want(t, "healthz while down", a.do("GET", "/healthz", "-", nil), 200, "")
	for _, rq := range []struct{ method, path string }{
		{"GET", "/v1/status"},
		{"GET", "/v1/stats"},
		{"GET", fmt.Sprintf("/v1/guilds/%d", guildOn(2, 8))},
		{"POST", "/v1/deploy"},
		{"GET", "/v1/deploys/latest"},
		{"POST", "/v1/clusters/0/ops/ping"},
		{"POST", fmt.Sprintf("/v1/guilds/%d/ops/ping", guildOn(2, 8))},
		{"POST", "/v1/broadcast/ping"},
	} {
		r := a.do(rq.method, rq.path, "", nil)
		want(t, rq.method+" "+rq.path+" while down", r, 503, "unavailable")
		if r.took > time.Second {
			t.Errorf("%s %s while down took %v", rq.method, rq.path, r.took)
		}
	}

	// Back: a new manager on the same socket path; sm-api finds it.
	start := time.Now()
	m2 := startManager(t, cfg)
	testenv.WaitFor(t, 5*time.Second, "readyz after restart", func() bool {
		return a.do("GET", "/readyz", "-", nil).code == 200
	})
	t.Logf("sm-api registered again %v after the new manager started", time.Since(start).Round(time.Millisecond))
	st := m2.WaitReady(0, 1, 2, 3)
	a.waitSynced()
	want(t, "ping after", a.post("/v1/clusters/0/ops/ping", ""), 200, "")
	want(t, "status after", a.get("/v1/status"), 200, "")
	testenv.WaitFor(t, 5*time.Second, "guild view of the new manager", func() bool {
		r := a.get(fmt.Sprintf("/v1/guilds/%d", guildOn(2, 8)))
		return r.code == 200 && strings.Contains(string(r.body), fmt.Sprintf(`"pid":%d,`, st.Clusters[1].PID))
	})
}
