package manager_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/manager"
)

// gatewayServer is Discord's GET /gateway/bot for tests, recommending shards
// (or answering 503 while fail is set).
type gatewayServer struct {
	shards atomic.Int32
	fail   atomic.Bool
	calls  atomic.Int32
}

func (g *gatewayServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.calls.Add(1)
	if r.URL.Path != "/api/v10/gateway/bot" || r.Header.Get("Authorization") != "Bot tok" {
		http.NotFound(w, r)
		return
	}
	if g.fail.Load() {
		http.Error(w, `{"message":"down"}`, http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintf(w, `{"url":"wss://gateway.example.test","shards":%d,"session_start_limit":{"total":1000,"remaining":990,"reset_after":3600000,"max_concurrency":1}}`, g.shards.Load())
}

// The [reshard] schedule follows Discord's recommendation by itself: a growth
// below growth_ratio changes nothing, a failed ask is reported, and a growth
// past it runs a re-clustering DEPLOY under load with no request failed.
func TestReshardWhenDiscordAsks(t *testing.T) {
	gs := &gatewayServer{}
	gs.shards.Store(4)
	srv := httptest.NewServer(gs)
	t.Cleanup(srv.Close)
	client := &discord.GatewayClient{BaseURL: srv.URL + "/api/v10", Token: "tok", MaxRetries: -1}
	gw, err := client.GatewayBot(t.Context())
	if err != nil {
		t.Fatal(err)
	}

	cfg := deployConfig(t)
	cfg.Topology = config.Topology{Auto: true, ShardsPerCluster: 2}
	cfg.Discord.TokenEnv = "SM_TEST_UNUSED_TOKEN" // "auto" needs a token; the client above carries it
	cfg.Reshard = config.Reshard{Enabled: true, CheckInterval: durationOf(time.Second), GrowthRatio: 1.5, MaxParallel: 2}
	testenv.WriteConfig(t, cfg)
	loaded, err := config.Load(cfg.Path)
	if err != nil {
		t.Fatal(err)
	}
	loaded.Topology.TotalShards = gw.TotalShards() // as sm-manager resolves "auto" at start
	e := startWith(t, loaded, manager.Options{Gateway: &gw, FetchGateway: client.GatewayBot})
	if st := e.WaitReady(); st.Topology != (generation.Topology{Total: 4, PerCluster: 2}) || st.Reshard == nil {
		t.Fatalf("start: topology %+v, reshard %+v", st.Topology, st.Reshard)
	}

	waitCheck := func(what string, ok func(*manager.ReshardStatus) bool) manager.Status {
		t.Helper()
		var st manager.Status
		after := time.Now()
		testenv.WaitFor(t, 15*time.Second, what, func() bool {
			st = e.MustStatus()
			return st.Reshard.LastCheck.After(after) && ok(st.Reshard)
		})
		return st
	}

	gs.fail.Store(true)
	st := waitCheck("a failed check reported", func(r *manager.ReshardStatus) bool { return r.Result == "error" })
	if st.Reshard.Reason != "/gateway/bot answered HTTP 503" {
		t.Fatalf("failed check's reason %q: want the status alone, no URL", st.Reshard.Reason)
	}
	gs.fail.Store(false)

	gs.shards.Store(5) // 1.25 times the 4 running: below growth_ratio 1.5
	st = waitCheck("a check of 5 shards", func(r *manager.ReshardStatus) bool { return r.Recommended == 5 })
	if st.Reshard.Result != "unchanged" || st.Reshard.Reshards != 0 || st.Topology.Total != 4 || st.Deploy != nil {
		t.Fatalf("5 of 4 with ratio 1.5 resharded: %+v, topology %+v", st.Reshard, st.Topology)
	}

	l := startLoad(t, e, 8, func(i int) string { return "guild:" + strconv.FormatUint(uint64(i%97)<<22|uint64(i), 10) })
	time.Sleep(100 * time.Millisecond)
	gs.shards.Store(8)
	waitCheck("the reshard started", func(r *manager.ReshardStatus) bool { return r.Reshards == 1 })
	st = e.waitDeploy(30 * time.Second)
	time.Sleep(100 * time.Millisecond)
	l.finish(t)
	if st.Deploy.State != generation.StateSucceeded || st.Deploy.ID != st.Reshard.LastDeploy {
		t.Fatalf("reshard deploy %s (%s): %s; reshard %+v", st.Deploy.ID, st.Deploy.State, st.Deploy.Reason, st.Reshard)
	}
	now := e.WaitReady()
	if now.Topology != (generation.Topology{Total: 8, PerCluster: 2}) || len(now.Clusters) != 4 {
		t.Fatalf("after the reshard: topology %+v, %d clusters", now.Topology, len(now.Clusters))
	}
	// The next checks see 8 of 8: nothing more.
	st = waitCheck("a check after the reshard", func(r *manager.ReshardStatus) bool { return true })
	if st.Reshard.Result != "unchanged" || st.Reshard.Reshards != 1 {
		t.Fatalf("after the reshard: %+v", st.Reshard)
	}
	checks := map[string]float64{}
	fams, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "sm_reshard_checks_total" {
			for _, m := range f.GetMetric() {
				checks[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if checks["resharded"] != 1 || checks["error"] < 1 || checks["unchanged"] < 2 {
		t.Fatalf("sm_reshard_checks_total by result: %v", checks)
	}
}
