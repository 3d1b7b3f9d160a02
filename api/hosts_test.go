package api_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/api"
	"github.com/sm-supervisor/sm/internal/natstest"
	"github.com/sm-supervisor/sm/internal/testenv"
)

// TestHosts: GET /v1/hosts on a single host says so; in a mesh of two real
// managers (on one real nats-server) it lists both, their capacity and
// clusters, and every guild lookup names the host running its cluster,
// whether sm-api's manager runs it or the other.
func TestHosts(t *testing.T) {
	single := testConfig(t, nil)
	startManager(t, single)
	sa := startAPI(t, single)
	sa.waitSynced()
	r := sa.get("/v1/hosts")
	want(t, "hosts, single host", r, 200, "")
	if string(r.body) != `{"mesh":false,"hosts":[]}`+"\n" && string(r.body) != `{"mesh":false,"hosts":[]}` {
		t.Fatalf("GET /v1/hosts on a single host: %s", r.body)
	}
	r = sa.get(fmt.Sprintf("/v1/guilds/%d", guildOn(0, 8)))
	var g0 map[string]any
	json.Unmarshal(r.body, &g0)
	if _, ok := g0["host_id"]; ok {
		t.Fatalf("guild on a single host has a host_id: %s", r.body)
	}

	srv := natstest.Start(t, natstest.Options{Bin: testenv.Bin("nats-server")})
	var apiOn *apiServer
	for _, id := range []string{"a", "b"} { // 4 clusters, room for 2 each
		cfg := testConfig(t, nil)
		cfg.Mesh.NATSURL, cfg.Mesh.HostID, cfg.Mesh.MaxClusters = srv.URL, id, 2
		cfg.Mesh.Lease = dur(2 * time.Second)
		startManager(t, cfg)
		if id == "a" {
			apiOn = startAPI(t, cfg)
		}
	}
	apiOn.waitSynced()
	var hosts api.HostsInfo
	testenv.WaitFor(t, 30*time.Second, "GET /v1/hosts: a and b with 2 clusters each", func() bool {
		r := apiOn.get("/v1/hosts")
		if r.code != 200 {
			return false
		}
		hosts = api.HostsInfo{}
		json.Unmarshal(r.body, &hosts)
		return hosts.Mesh && len(hosts.Hosts) == 2 && len(hosts.Hosts[0].Clusters) == 2 && len(hosts.Hosts[1].Clusters) == 2
	})
	if a, b := hosts.Hosts[0], hosts.Hosts[1]; a.ID != "a" || !a.Self || b.ID != "b" || b.Self || a.Capacity != 2 || b.Capacity != 2 ||
		a.LeaseAgeMS < 0 || b.LeaseAgeMS < 0 {
		t.Fatalf("GET /v1/hosts: %+v", hosts)
	}
	t.Logf("GET /v1/hosts: %+v", hosts)
	holder := map[int]string{}
	for _, h := range hosts.Hosts {
		for _, c := range h.Clusters {
			holder[c] = h.ID
		}
	}
	// Every guild names its cluster's host, from the feed's copy.
	testenv.WaitFor(t, 10*time.Second, "every guild names its cluster's host", func() bool {
		for shard := range 8 {
			r := apiOn.get(fmt.Sprintf("/v1/guilds/%d", guildOn(shard, 8)))
			var info api.GuildInfo
			if r.code != 200 || json.Unmarshal(r.body, &info) != nil {
				return false
			}
			if info.HostID != holder[info.Cluster] || info.Source != "watch" {
				return false
			}
		}
		return true
	})
	want(t, "POST /v1/hosts", apiOn.post("/v1/hosts", ""), 405, "method_not_allowed")
}
