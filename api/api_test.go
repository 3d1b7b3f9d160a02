package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
)

func TestHealthReadyAndStatus(t *testing.T) {
	cfg := testConfig(t, nil)
	a := startAPI(t, cfg)
	// No manager yet: up, not ready, and /v1 answers 503 at once.
	want(t, "healthz", a.do("GET", "/healthz", "-", nil), 200, "")
	want(t, "readyz without manager", a.do("GET", "/readyz", "-", nil), 503, "unavailable")
	if r := a.get("/v1/status"); r.code != 503 || r.errorCode() != "unavailable" || r.hdr.Get("Retry-After") == "" {
		t.Fatalf("status without manager: %v %v", r, r.hdr)
	}

	m := startManager(t, cfg)
	m.WaitReady(0, 1, 2, 3)
	a.waitSynced()
	r := a.get("/v1/status")
	want(t, "status", r, 200, "")
	var st struct {
		Topology generation.Topology `json:"topology"`
		Clusters []struct {
			ID          int    `json:"id"`
			State       string `json:"state"`
			PID         int    `json:"pid"`
			ShardFirst  int    `json:"shard_first"`
			ShardLast   int    `json:"shard_last"`
			HeartbeatMS int64  `json:"heartbeat_age_ms"`
		} `json:"clusters"`
		Generation int64 `json:"generation"`
	}
	if err := json.Unmarshal(r.body, &st); err != nil {
		t.Fatal(err)
	}
	if st.Topology.Total != 8 || len(st.Clusters) != 4 || st.Generation != 1 {
		t.Fatalf("status %s", r.body)
	}
	for i, c := range st.Clusters {
		if c.ID != i || c.State != "ready" || c.PID == 0 || c.ShardFirst != 2*i || c.ShardLast != 2*i+1 || c.HeartbeatMS < 0 {
			t.Errorf("cluster %d: %+v", i, c)
		}
	}
	if r.hdr.Get("Cache-Control") != "no-store" {
		t.Errorf("status Cache-Control %q", r.hdr.Get("Cache-Control"))
	}
	want(t, "unknown path", a.get("/v1/nope"), 404, "not_found")
	r = a.do("DELETE", "/v1/status", "", nil)
	want(t, "wrong method", r, 405, "method_not_allowed")
	if r.hdr.Get("Allow") != "GET, HEAD" {
		t.Errorf("Allow %q", r.hdr.Get("Allow"))
	}
}

func TestAuth(t *testing.T) {
	cfg := testConfig(t, nil)
	startManager(t, cfg)
	a := startAPI(t, cfg)
	a.waitSynced()
	endpoints := []struct{ method, path string }{
		{"GET", "/v1/status"},
		{"GET", "/v1/stats"},
		{"GET", "/v1/guilds/81384788765712384"},
		{"POST", "/v1/deploy"},
		{"GET", "/v1/deploys/deploy-2"},
		{"POST", "/v1/clusters/0/ops/ping"},
		{"POST", "/v1/guilds/81384788765712384/ops/ping"},
		{"POST", "/v1/broadcast/ping"},
	}
	for _, ep := range endpoints {
		for _, auth := range []string{"-", "Bearer wrong-token-0123456789abcdef", "Basic " + testToken, "Bearer", "Bearer " + testToken + "x", testToken} {
			r := a.do(ep.method, ep.path, auth, nil)
			if r.code != 401 || r.errorCode() != "unauthorized" || !strings.HasPrefix(r.hdr.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s %s with %q: %v %q", ep.method, ep.path, auth, r, r.hdr.Get("WWW-Authenticate"))
			}
		}
	}
	// The scheme is case-insensitive; health, readiness and metrics are open.
	want(t, "lower-case bearer", a.do("GET", "/v1/status", "bearer "+testToken, nil), 200, "")
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		if r := a.do("GET", p, "-", nil); r.code != 200 {
			t.Errorf("%s without token: %v", p, r)
		}
	}
}

func TestNoToken(t *testing.T) {
	cfg := testConfig(t, nil)
	for name, mutate := range map[string]func(){
		"empty file":   func() { os.WriteFile(cfg.API.TokenFile, []byte(" \n"), 0o600) },
		"short token":  func() { os.WriteFile(cfg.API.TokenFile, []byte("abc\n"), 0o600) },
		"missing file": func() { os.Remove(cfg.API.TokenFile) },
		"unset env":    func() { cfg.API.TokenFile, cfg.API.TokenEnv = "", "SM_API_TEST_TOKEN_UNSET" },
	} {
		t.Run(name, func(t *testing.T) {
			mutate()
			if _, err := newServer(cfg); err == nil || !strings.Contains(err.Error(), "no API token") {
				t.Fatalf("New without a token: %v", err)
			}
		})
	}
}

func TestGuild(t *testing.T) {
	cfg := testConfig(t, nil)
	m := startManager(t, cfg)
	a := startAPI(t, cfg)
	before := m.WaitReady(0, 1, 2, 3)
	a.waitSynced()
	for shard := range 8 {
		g := guildOn(shard, 8)
		r := a.get(fmt.Sprintf("/v1/guilds/%d", g))
		want(t, "guild", r, 200, "")
		var info struct {
			GuildID     string `json:"guild_id"`
			Shard       int    `json:"shard"`
			Cluster     int    `json:"cluster"`
			Generation  int64  `json:"generation"`
			Alive       bool   `json:"alive"`
			Ready       bool   `json:"ready"`
			PID         int    `json:"pid"`
			HeartbeatMS int64  `json:"heartbeat_age_ms"`
			Source      string `json:"source"`
		}
		json.Unmarshal(r.body, &info)
		wantShard := int((g >> 22) % 8)
		if info.GuildID != strconv.FormatUint(g, 10) || info.Shard != wantShard || info.Cluster != wantShard/2 ||
			info.Generation != 1 || !info.Alive || !info.Ready || info.PID != before.Clusters[wantShard/2].PID ||
			info.HeartbeatMS < 0 || info.HeartbeatMS > 1000 || info.Source != "watch" {
			t.Fatalf("guild %d (shard %d): %s", g, wantShard, r.body)
		}
	}
	for _, bad := range []string{"abc", "-1", "%2B5", "18446744073709551616", "1.5", "0x10"} {
		want(t, "guild "+bad, a.get("/v1/guilds/"+bad), 400, "bad_request")
	}

	// Kill cluster 1: the state copy follows the feed to its new process.
	g := guildOn(3, 8)
	old := before.Clusters[1].PID
	syscall.Kill(old, syscall.SIGKILL)
	var info struct {
		PID      int    `json:"pid"`
		Ready    bool   `json:"ready"`
		Restarts int    `json:"restarts"`
		Source   string `json:"source"`
	}
	testenv.WaitFor(t, 10*time.Second, "guild on a respawned cluster", func() bool {
		r := a.get(fmt.Sprintf("/v1/guilds/%d", g))
		json.Unmarshal(r.body, &info)
		return r.code == 200 && info.PID != old && info.PID != 0 && info.Ready
	})
	if info.Restarts < 1 || info.Source != "watch" {
		t.Fatalf("after respawn: %+v", info)
	}
	if got := m.MustStatus().Clusters[1].PID; got != info.PID {
		t.Fatalf("sm-api says pid %d, manager %d", info.PID, got)
	}
}

func TestDeployOverHTTP(t *testing.T) {
	cfg := testConfig(t, nil)
	cfg.API.MaxBodyBytes = 256
	testenv.WriteConfig(t, cfg)
	m := startManager(t, cfg)
	a := startAPI(t, cfg)
	before := m.WaitReady(0, 1, 2, 3)
	a.waitSynced()

	want(t, "deploy before any", a.get("/v1/deploys/latest"), 404, "not_found")
	want(t, "deploy bad body", a.post("/v1/deploy", `{"max_parallel":"two"}`), 400, "bad_request")
	want(t, "deploy unknown field", a.post("/v1/deploy", `{"parallel":2}`), 400, "bad_request")
	want(t, "deploy body too large", a.post("/v1/deploy", `{"clusters":[`+strings.Repeat("0,", 200)+`0]}`), 413, "body_too_large")

	// An invalid file on disk refuses the deploy and changes nothing.
	good, _ := os.ReadFile(cfg.Path)
	os.WriteFile(cfg.Path, []byte("[topology]\ntotal_shards = -1\n"), 0o644)
	want(t, "deploy of a bad config", a.post("/v1/deploy", ""), 422, "bad_config")
	os.WriteFile(cfg.Path, good, 0o644)

	// The new generation takes a while to connect, so a second DEPLOY meets this one.
	next := *cfg
	next.Cluster.Command = append(append([]string(nil), cfg.Cluster.Command...), "--connect-delay=60ms")
	testenv.WriteConfig(t, &next)
	r := a.post("/v1/deploy", `{"max_parallel":2}`)
	want(t, "deploy", r, 202, "")
	var started struct {
		DeployID   string `json:"deploy_id"`
		Generation int64  `json:"generation"`
	}
	json.Unmarshal(r.body, &started)
	if started.DeployID == "" || started.Generation != 2 || r.hdr.Get("Location") != "/v1/deploys/"+started.DeployID {
		t.Fatalf("deploy reply %v, Location %q", r, r.hdr.Get("Location"))
	}
	want(t, "second deploy", a.post("/v1/deploy", ""), 409, "deploy_in_progress")
	want(t, "older deploy", a.get("/v1/deploys/deploy-1"), 404, "not_found")

	// Follow it to the end.
	var dep generation.Status
	phases := map[generation.Phase]bool{}
	testenv.WaitFor(t, 20*time.Second, "deploy finished", func() bool {
		r := a.get("/v1/deploys/" + started.DeployID)
		if r.code != 200 {
			t.Fatalf("follow deploy: %v", r)
		}
		dep = generation.Status{}
		if err := json.Unmarshal(r.body, &dep); err != nil {
			t.Fatal(err)
		}
		for _, c := range dep.Clusters {
			phases[c.Phase] = true
		}
		return !dep.Finished.IsZero()
	})
	if dep.ID != started.DeployID || dep.State != generation.StateSucceeded || len(dep.Clusters) != 4 {
		t.Fatalf("deploy ended %s %q: %+v", dep.State, dep.Reason, dep)
	}
	for _, c := range dep.Clusters {
		if c.Phase != generation.PhaseActivated {
			t.Errorf("cluster %d ended in phase %s", c.Cluster, c.Phase)
		}
	}
	if len(phases) < 2 {
		t.Errorf("followed only phases %v: the deploy was not seen in progress", phases)
	}
	want(t, "latest deploy", a.get("/v1/deploys/latest"), 200, "")
	after := m.WaitReady(0, 1, 2, 3)
	for i, c := range after.Clusters {
		if c.Generation != 2 || c.PID == before.Clusters[i].PID {
			t.Errorf("cluster %d after deploy: %+v", i, c)
		}
	}
	// And the guild view follows the new generation.
	testenv.WaitFor(t, 5*time.Second, "guild on generation 2", func() bool {
		r := a.get(fmt.Sprintf("/v1/guilds/%d", guildOn(5, 8)))
		return r.code == 200 && strings.Contains(string(r.body), `"generation":2,`) && strings.Contains(string(r.body), `"ready":true`)
	})
}

// degraded starts a manager whose cluster 2 never gets ready and whose
// cluster 3 takes 600ms per op, with sm-api in front.
func degraded(t *testing.T) *apiServer {
	cfg := testConfig(t, map[string]string{
		"SM_HARNESS_FLAGS_2": "--fail-ready",
		"SM_HARNESS_FLAGS_3": "--op-delay=600ms",
	})
	cfg.Limits.MaxFrameBytes = 16 << 10
	cfg.API.MaxBodyBytes = 64 << 10
	m := startManager(t, cfg)
	a := startAPI(t, cfg)
	m.WaitReady(0, 1, 3)
	a.waitSynced()
	return a
}

func TestOps(t *testing.T) {
	a := degraded(t)

	// To a cluster: the reply payload comes back byte for byte.
	body := `{"a": [1, 2, 3],  "s": "héllo"}`
	r := a.post("/v1/clusters/1/ops/echo", "\n"+body+"\n")
	want(t, "echo", r, 200, "")
	if got := string(bytes.TrimSpace(r.body)); got != body {
		t.Fatalf("echo: got %s, want %s", got, body)
	}
	if r := a.post("/v1/clusters/1/ops/echo", ""); r.code != 200 || string(bytes.TrimSpace(r.body)) != "null" {
		t.Fatalf("echo of no body: %v", r)
	}

	// To a guild: the manager finds its cluster.
	r = a.post(fmt.Sprintf("/v1/guilds/%d/ops/ping", guildOn(1, 8)), "")
	want(t, "guild ping", r, 200, "")
	var pong struct {
		Pong    bool `json:"pong"`
		Cluster int  `json:"cluster"`
	}
	if json.Unmarshal(r.body, &pong); !pong.Pong || pong.Cluster != 0 {
		t.Fatalf("guild ping: %s", r.body)
	}
	r = a.post(fmt.Sprintf("/v1/guilds/%d/ops/guild.info", guildOn(7, 8)), fmt.Sprintf(`{"guild_id":"%d"}`, guildOn(7, 8)))
	if want(t, "guild.info", r, 200, ""); !strings.Contains(string(r.body), `"owned":true`) {
		t.Fatalf("guild.info: %s", r.body)
	}

	// To everyone, cluster 2 down: its result says so, the others answer.
	r = a.post("/v1/broadcast/ping?timeout=3s", "")
	want(t, "broadcast", r, 200, "")
	var bc ipc.Broadcast
	if err := json.Unmarshal(r.body, &bc); err != nil || len(bc.Results) != 4 {
		t.Fatalf("broadcast: %s (%v)", r.body, err)
	}
	for i, res := range bc.Results {
		switch {
		case res.Cluster != i:
			t.Errorf("result %d is cluster %d", i, res.Cluster)
		case i == 2 && (res.Error == nil || res.Error.Code != "unavailable"):
			t.Errorf("cluster 2 (never ready): %s", r.body)
		case i != 2 && (res.Error != nil || !bytes.Contains(res.Payload, []byte(`"pong":true`))):
			t.Errorf("cluster %d: %s", i, r.body)
		}
	}

	// The down cluster itself, directly or by guild: 503 once the deadline passes.
	want(t, "op to the down cluster", a.post("/v1/clusters/2/ops/ping?timeout=300ms", ""), 503, "unavailable")
	want(t, "op to a guild of the down cluster", a.post(fmt.Sprintf("/v1/guilds/%d/ops/ping?timeout=300ms", guildOn(4, 8)), ""), 503, "unavailable")

	// Errors from the manager and the bot keep their codes.
	want(t, "no such cluster", a.post("/v1/clusters/9/ops/ping", ""), 404, "unknown_target")
	want(t, "op the bot does not know", a.post("/v1/clusters/0/ops/nope", ""), 404, "unknown_op")
	want(t, "bot's own error", a.post("/v1/clusters/0/ops/guild.info", `{"guild_id":true}`), 422, "bad_request")

	// Refused before anything is sent.
	for _, p := range []string{"/v1/clusters/abc/ops/ping", "/v1/clusters/01/ops/ping", "/v1/clusters/-1/ops/ping",
		"/v1/guilds/x1/ops/ping", "/v1/clusters/0/ops/DEPLOY", "/v1/clusters/0/ops/REGISTER", "/v1/broadcast/QUIESCE",
		"/v1/broadcast/WATCH", "/v1/guilds/1/ops/HEARTBEAT", "/v1/clusters/0/ops/STATUS", "/v1/clusters/0/ops/bad%20op",
		"/v1/clusters/0/ops/ping?timeout=soon", "/v1/clusters/0/ops/ping?timeout=-1s"} {
		want(t, p, a.post(p, ""), 400, "bad_request")
	}
	want(t, "bad JSON body", a.post("/v1/clusters/0/ops/echo", `{"a":`), 400, "bad_request")
	want(t, "two JSON values", a.post("/v1/clusters/0/ops/echo", `{} {}`), 400, "bad_request")
	want(t, "body too large", a.post("/v1/clusters/0/ops/echo", `"`+strings.Repeat("x", 70<<10)+`"`), 413, "body_too_large")
	want(t, "frame too large", a.post("/v1/clusters/0/ops/echo", `"`+strings.Repeat("x", 20<<10)+`"`), 413, "frame_too_large")
	// Still fine afterwards.
	want(t, "echo after refusals", a.post("/v1/clusters/0/ops/echo", `1`), 200, "")
}

func TestOpTimeout(t *testing.T) {
	a := degraded(t)
	start := time.Now()
	r := a.post("/v1/clusters/3/ops/ping?timeout=200ms", "")
	want(t, "slow op", r, 504, "timeout")
	if took := time.Since(start); took > time.Second {
		t.Fatalf("504 after %v; the timeout was 200ms", took)
	}
	// Without the parameter the op has api.request_timeout and succeeds.
	want(t, "slow op with time", a.post("/v1/clusters/3/ops/ping", ""), 200, "")
	// A timeout above api.request_timeout (3s) is cut to it: many concurrent
	// ones to the slow cluster all finish, none waits an hour.
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if r := a.post("/v1/clusters/3/ops/ping?timeout=1h", ""); r.code != 200 {
				t.Errorf("ping with timeout=1h: %v", r)
			}
		})
	}
	wg.Wait()
}

func TestMetrics(t *testing.T) {
	cfg := testConfig(t, nil)
	startManager(t, cfg)
	a := startAPI(t, cfg)
	a.waitSynced()
	scrape := func() map[string]float64 {
		r := a.do("GET", "/metrics", "-", nil)
		if r.code != 200 {
			t.Fatalf("scrape: %v", r)
		}
		out, err := testenv.Metrics(bytes.NewReader(r.body))
		if err != nil {
			t.Fatalf("scrape does not parse: %v\n%s", err, r.body)
		}
		return out
	}
	const okStatus = "sm_api_http_requests_total{code=200,method=GET,route=GET /v1/status}"
	const unauth = "sm_api_http_requests_total{code=401,method=GET,route=GET /v1/status}"
	const latency = "sm_api_http_request_duration_seconds_count{method=GET,route=GET /v1/status}"
	before := scrape()
	for range 3 {
		want(t, "status", a.get("/v1/status"), 200, "")
	}
	a.do("GET", "/v1/status", "-", nil)
	after := scrape()
	if d := after[okStatus] - before[okStatus]; d != 3 {
		t.Errorf("%s moved by %v, want 3", okStatus, d)
	}
	if d := after[unauth] - before[unauth]; d != 1 {
		t.Errorf("%s moved by %v, want 1", unauth, d)
	}
	if d := after[latency] - before[latency]; d != 4 {
		t.Errorf("%s moved by %v, want 4", latency, d)
	}
	for _, k := range []string{"sm_api_manager_connected", "sm_api_state_synced", "sm_api_manager_connects_total"} {
		if after[k] != 1 {
			t.Errorf("%s = %v, want 1", k, after[k])
		}
	}
	if v, ok := after["sm_api_http_requests_in_flight"]; !ok || v != 1 { // the scrape itself
		t.Errorf("sm_api_http_requests_in_flight = %v (present %v), want 1", v, ok)
	}
	a.get("/v1/guilds/123/x/y")
	if after := scrape(); after["sm_api_http_requests_total{code=404,method=GET,route=unmatched}"] != 1 {
		t.Errorf("unmatched request not counted under route=unmatched")
	}
}
