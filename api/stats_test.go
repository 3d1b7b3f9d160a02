package api_test

import (
	"encoding/json"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/api"
	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/manager"
)

// statsDoc is GET /v1/stats with the counters decoded: the manager's, passed through.
type statsDoc struct {
	api.FleetStats
	Counters manager.Counters `json:"counters"`
}

func (a *apiServer) stats() statsDoc {
	a.t.Helper()
	r := a.get("/v1/stats")
	want(a.t, "stats", r, 200, "")
	var st statsDoc
	if err := json.Unmarshal(r.body, &st); err != nil {
		a.t.Fatalf("stats %s: %v", r.body, err)
	}
	return st
}

// payloadSums adds up guilds and users over the heartbeat payloads of
// GET /v1/status: what /v1/stats must agree with.
func (a *apiServer) payloadSums() (guilds, users float64, reporting int) {
	a.t.Helper()
	var st struct {
		Clusters []struct {
			Heartbeat struct {
				Guilds *float64 `json:"guilds"`
				Users  *float64 `json:"users"`
			} `json:"heartbeat"`
		} `json:"clusters"`
	}
	if err := json.Unmarshal(a.get("/v1/status").body, &st); err != nil {
		a.t.Fatal(err)
	}
	for _, c := range st.Clusters {
		if c.Heartbeat.Guilds != nil && c.Heartbeat.Users != nil {
			guilds += *c.Heartbeat.Guilds
			users += *c.Heartbeat.Users
			reporting++
		}
	}
	return guilds, users, reporting
}

// checkTotals fails unless every total of st is its per-cluster values'
// sum, min, max and mean.
func checkTotals(t *testing.T, st statsDoc) {
	t.Helper()
	for name, tot := range st.Totals {
		var sum, n float64
		lo, hi := tot.Max, tot.Min
		for _, c := range st.PerCluster {
			if v, ok := c.Values[name]; ok {
				sum += v
				n++
				lo, hi = min(lo, v), max(hi, v)
			}
		}
		if sum != tot.Sum || int(n) != tot.Clusters || lo != tot.Min || hi != tot.Max || tot.Mean != sum/n {
			t.Errorf("%s: total %+v, per cluster sum %v of %v clusters, min %v, max %v", name, tot, sum, n, lo, hi)
		}
	}
}

// GET /v1/stats against a real manager and simulated clusters: the fleet's
// heartbeat fields added up and cluster by cluster, and the fleet counters
// moving with requests, a restart and a deploy.
func TestStats(t *testing.T) {
	cfg := testConfig(t, nil)
	m := startManager(t, cfg)
	a := startAPI(t, cfg)
	st0 := m.WaitReady(0, 1, 2, 3)
	a.waitSynced()

	// Every shard up, every cluster heartbeating its stats.
	var st statsDoc
	testenv.WaitFor(t, 10*time.Second, "stats from all 4 clusters", func() bool {
		st = a.stats()
		return st.Reporting == 4 && st.Totals["guilds"].Clusters == 4 && st.Totals["ping_ms"].Clusters == 4
	})
	if st.Clusters != 4 || len(st.PerCluster) != 4 || st.Source != "status" || st.At.IsZero() {
		t.Fatalf("stats %+v", st.FleetStats)
	}
	checkTotals(t, st)
	guilds, users, n := a.payloadSums()
	if n != 4 || st.Totals["guilds"].Sum != guilds || st.Totals["users"].Sum != users || guilds < 8*900 {
		t.Errorf("totals guilds %v users %v; the payloads of /v1/status say %v and %v over %d clusters",
			st.Totals["guilds"].Sum, st.Totals["users"].Sum, guilds, users, n)
	}
	if mem := st.Totals["memory_bytes"]; mem.Sum <= 0 || mem.Clusters != 4 {
		t.Errorf("memory_bytes %+v", mem)
	}
	if p := st.Totals["ping_ms"]; p.Min < 35 || p.Max > 59 {
		t.Errorf("ping_ms %+v: the simulated bot's are 35..59", p)
	}
	for i, c := range st.PerCluster {
		if c.Cluster != i || c.PID != st0.Clusters[i].PID || c.State != "ready" || c.Generation != 1 || c.Values["guilds"] < 1800 {
			t.Errorf("cluster %d: %+v", i, c)
		}
	}
	if _, ok := st.Totals["active"]; ok {
		t.Error("a boolean field was added up")
	}
	t.Logf("totals: %+v", st.Totals)

	// Counters: exactly the requests sent, the error by its code.
	if c := st.Counters; c.Since.IsZero() || c.RequestsForwarded != 0 || c.Restarts != 0 || c.Deploys != 0 || c.IdentifiesGranted < 8 {
		t.Errorf("counters at the start %+v (identifies: one per shard at least)", c)
	}
	for i := range 10 {
		want(t, "ping", a.post(fmt.Sprintf("/v1/clusters/%d/ops/ping", i%4), ""), 200, "")
	}
	want(t, "unknown op", a.post("/v1/clusters/1/ops/no.such.op", ""), 404, "unknown_op")
	c := a.stats().Counters
	if c.RequestsForwarded != 11 || c.RequestsFailed != 1 || len(c.RequestsFailedByCode) != 1 {
		t.Errorf("after 10 pings and an unknown op: %+v", c)
	}

	// A restart.
	if err := syscall.Kill(st0.Clusters[2].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "cluster 2 back", func() bool {
		return m.MustStatus().Clusters[2].PID != st0.Clusters[2].PID && m.MustStatus().Clusters[2].State == "ready"
	})
	if c := a.stats().Counters; c.Restarts != 1 {
		t.Errorf("after a kill: restarts %d, want 1", c.Restarts)
	}

	// A deploy, to the end.
	next := *cfg
	next.Cluster.Command = append(append([]string(nil), cfg.Cluster.Command...), "--connect-delay=20ms")
	testenv.WriteConfig(t, &next)
	want(t, "deploy", a.post("/v1/deploy", `{"max_parallel":4}`), 202, "")
	testenv.WaitFor(t, 20*time.Second, "deploy counted", func() bool { return a.stats().Counters.Deploys == 1 })
	testenv.WaitFor(t, 10*time.Second, "stats of generation 2", func() bool {
		st = a.stats()
		for _, c := range st.PerCluster {
			if c.Generation != 2 || c.Values["guilds"] == 0 {
				return false
			}
		}
		return st.Reporting == 4
	})
	checkTotals(t, st)
	if c := st.Counters; c.DeploysByState["succeeded"] != 1 || c.Restarts != 1 || c.RequestsForwarded != 11 {
		t.Errorf("after the deploy: %+v", c)
	}
	if st.Totals["guilds"].Sum != guilds {
		t.Errorf("guilds after the deploy %v, before %v: the same shards", st.Totals["guilds"].Sum, guilds)
	}
}

// A fleet whose STATUS is too big for one frame with its heartbeats (here a
// small limits.max_frame_bytes): STATUS leaves them out and /v1/stats takes
// them from sm-api's copy of the feed instead; api.stats_max_fields bounds
// the fields.
func TestStatsHeartbeatsOmitted(t *testing.T) {
	cfg := testConfig(t, nil)
	cfg.Limits.MaxFrameBytes = 2560
	cfg.API.StatsMaxFields = 3
	testenv.WriteConfig(t, cfg)
	cfg, err := config.Load(cfg.Path)
	if err != nil {
		t.Fatal(err)
	}
	m := startManager(t, cfg)
	a := startAPI(t, cfg)
	m.WaitReady(0, 1, 2, 3)
	a.waitSynced()
	var st statsDoc
	testenv.WaitFor(t, 10*time.Second, "stats from all 4 clusters through the feed", func() bool {
		st = a.stats()
		return st.Reporting == 4 && st.Totals["guilds"].Clusters == 4
	})
	if st.Source != "status+watch" {
		t.Fatalf("source %q: STATUS was expected to leave the heartbeats out at 2.5 KiB frames", st.Source)
	}
	if len(st.Totals) != 3 || st.FieldsDropped == 0 || st.Totals["users"].Clusters != 4 || st.Totals["memory_bytes"].Clusters != 4 {
		t.Errorf("%d totals, %d dropped: want guilds, users and memory_bytes, the first well-known ones", len(st.Totals), st.FieldsDropped)
	}
	checkTotals(t, st)
	t.Logf("totals %+v, %d fields dropped", st.Totals, st.FieldsDropped)
}
