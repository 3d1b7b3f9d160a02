package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sm-supervisor/sm/internal/natstest"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/manager"
	"github.com/sm-supervisor/sm/mesh"
)

// The shared identify gate, budget and resume store with real managers:
// identify_spacing is 300 ms (so the shared gate keeps a bucket's grant
// 400 ms: the spacing plus the 100 ms grant window), with 2 buckets.
const meshSpacing = 300 * time.Millisecond

// startDiscordHost starts sm-manager for host id, its 24 shards in 12
// clusters of the simulated bot logging JSON (the test reads its grants
// from it). With apiURL set, it has the test's Discord token and asks the
// fake Discord at apiURL.
func startDiscordHost(t *testing.T, url, id string, maxClusters int, apiURL, discordExtra string) *meshHost {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "sm.sock")
	token := ""
	if apiURL != "" {
		token = fmt.Sprintf("token_env = \"SM_TEST_DISCORD_TOKEN\"\napi_base_url = %q\n", apiURL+"/api/v10")
	}
	doc := fmt.Sprintf(`socket = %q
[topology]
total_shards = 24
shards_per_cluster = 2
[cluster]
command = [%q, "--simulate", "--connect-delay=1ms", "--event-interval=0", "--log-format=json"]
[heartbeat]
interval = "50ms"
timeout = "1s"
[restart]
stop_grace = "500ms"
[shutdown]
timeout = "3s"
[status]
listen = ""
[admin]
listen = ""
[discord]
identify_spacing = %q
%s%s[mesh]
nats_url = %q
host_id = %q
max_clusters = %d
lease = "2s"
`, sock, testenv.Bin("cluster-harness"), meshSpacing.String(), token, discordExtra, url, id, maxClusters)
	path := filepath.Join(dir, "sm.toml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	h := &meshHost{id: id, sock: sock, out: &testenv.Buffer{}, done: make(chan struct{})}
	h.cmd = exec.Command(testenv.Bin("sm-manager"), "-config", path)
	h.cmd.Env = append(os.Environ(), "SM_TEST_DISCORD_TOKEN="+testToken)
	h.cmd.Stdout, h.cmd.Stderr = h.out, h.out
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = h.cmd.Wait(); close(h.done) }()
	t.Cleanup(func() {
		h.stop(t)
		if t.Failed() {
			t.Logf("host %s:\n%s", id, h.out.String())
		}
	})
	return h
}

// identifyGrant is one "identify granted" line of a simulated bot.
type identifyGrant struct {
	host   string
	shard  int
	bucket int
	at     time.Time
}

// identifyGrants reads the grants the simulated bots of hosts logged.
func identifyGrants(t *testing.T, hosts []*meshHost) []identifyGrant {
	t.Helper()
	var out []identifyGrant
	for _, h := range hosts {
		sc := bufio.NewScanner(strings.NewReader(h.out.String()))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var l struct {
				Time   time.Time `json:"time"`
				Msg    string    `json:"msg"`
				Shard  *int      `json:"shard"`
				Bucket int       `json:"bucket"`
			}
			if json.Unmarshal(sc.Bytes(), &l) != nil || l.Msg != "identify granted" || l.Shard == nil {
				continue
			}
			out = append(out, identifyGrant{host: h.id, shard: *l.Shard, bucket: l.Bucket, at: l.Time})
		}
	}
	slices.SortFunc(out, func(a, b identifyGrant) int { return a.at.Compare(b.at) })
	return out
}

// simCounts is what a simulated bot says of its sessions (the stats op).
type simCounts struct {
	Identifies int `json:"identifies"`
	Resumes    int `json:"resumes"`
}

func (h *meshHost) simCounts(t *testing.T, cluster int) simCounts {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	r, err := h.client.Request(ctx, &ipc.Frame{Op: "stats", Target: strconv.Itoa(cluster)})
	if err != nil {
		t.Fatalf("stats of cluster %d on %s: %v", cluster, h.id, err)
	}
	var s simCounts
	if err := json.Unmarshal(r.Payload, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// budgetRecord reads the mesh's shared budget.
func budgetRecord(t *testing.T, js jetstream.JetStream) mesh.BudgetRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, "sm_budget")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "budget")
	if err != nil {
		t.Fatal(err)
	}
	var r mesh.BudgetRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestMeshSharedIdentifyBudgetResume: three managers share one identify
// gate, one budget and one resume store. Every two grants of one bucket,
// whichever hosts made them, are a spacing apart; every grant spends one
// start of the shared budget, none twice, including on the two hosts that
// have no token of their own; and a cluster moved to another host after
// its host was SIGKILLed RESUMEs its shards' sessions instead of
// identifying.
func TestMeshSharedIdentifyBudgetResume(t *testing.T) {
	fake := httptest.NewServer(&fakeDiscord{shards: 24, maxConc: 2})
	defer fake.Close()
	srv := natstest.Start(t, natstest.Options{Bin: testenv.Bin("nats-server")})
	// a asks Discord (990 of 1000 left, 2 buckets) and writes the mesh's
	// budget before it makes its socket, so the others, without a token,
	// spend from it and take its bucket count.
	a := startDiscordHost(t, srv.URL, "a", 4, fake.URL, "")
	a.dial(t)
	b := startDiscordHost(t, srv.URL, "b", 6, "", "")
	c := startDiscordHost(t, srv.URL, "c", 6, "", "")
	b.dial(t)
	c.dial(t)
	hosts := []*meshHost{a, b, c}
	by := placed(t, hosts, 60*time.Second, "12 clusters ready across 3 hosts")
	t.Logf("placed: %v", by)

	grants := identifyGrants(t, hosts)
	if len(grants) != 24 {
		t.Fatalf("%d grants logged, want one per shard (24): %+v", len(grants), grants)
	}
	shards := map[int]bool{}
	for _, g := range grants {
		if shards[g.shard] || g.bucket != g.shard%2 {
			t.Fatalf("grant %+v: a shard twice, or in the wrong bucket", g)
		}
		shards[g.shard] = true
	}
	for bucket := range 2 {
		var last *identifyGrant
		var gaps []time.Duration
		hostsIn := map[string]bool{}
		for i := range grants {
			g := &grants[i]
			if g.bucket != bucket {
				continue
			}
			hostsIn[g.host] = true
			if last != nil {
				gap := g.at.Sub(last.at)
				if gap < meshSpacing {
					t.Errorf("bucket %d: shard %d on %s granted %v after shard %d on %s, under the spacing %v",
						bucket, g.shard, g.host, gap, last.shard, last.host, meshSpacing)
				}
				gaps = append(gaps, gap.Round(time.Millisecond))
			}
			last = g
		}
		if len(hostsIn) < 2 {
			t.Errorf("bucket %d was granted on %v only: the test shows nothing across hosts", bucket, hostsIn)
		}
		t.Logf("bucket %d: grants on %d hosts, gaps %v", bucket, len(hostsIn), gaps)
	}

	js := jetStream(t, srv.URL)
	granted := uint64(0)
	for _, h := range hosts {
		st := h.status(t)
		if st.Discord == nil || !st.Discord.Budget.Known || st.Discord.MaxConcurrency != 2 || st.Discord.Mesh == nil || !st.Discord.Mesh.Reachable {
			t.Fatalf("host %s's discord status: %+v", h.id, st.Discord)
		}
		granted += st.Discord.IdentifyGranted
		t.Logf("host %s: %d granted, shared gate %+v", h.id, st.Discord.IdentifyGranted, *st.Discord.Mesh)
	}
	rec := budgetRecord(t, js)
	if granted != 24 || rec.Spent != 24 || rec.Remaining != 990-24 {
		t.Fatalf("24 identifies on 3 hosts: %d granted, the shared budget %+v (want 966 left, 24 spent)", granted, rec)
	}

	// Every shard's session is in the resume store (written behind within
	// a second), then a dies with its clusters.
	kv, err := js.KeyValue(t.Context(), "sm_resume")
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "24 resume entries in the mesh", func() bool {
		keys, _ := kv.Keys(t.Context())
		return len(keys) == 24
	})
	var pids []int
	for _, cs := range a.status(t).Clusters {
		if cs.HostID == "a" && cs.PID > 0 {
			pids = append(pids, cs.PID)
		}
	}
	if len(pids) != len(by["a"]) {
		t.Fatalf("a's cluster pids %v, clusters %v", pids, by["a"])
	}
	a.client.Close()
	a.client = nil
	killed := time.Now()
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
			t.Fatalf("killing cluster group %d: %v", pid, err)
		}
	}
	<-a.done
	moved := placed(t, hosts[1:], 30*time.Second, "a's clusters taken over by b and c")
	t.Logf("all 12 ready on b and c %v after a was killed: %v", time.Since(killed).Round(time.Millisecond), moved)
	for _, cl := range by["a"] {
		h := b
		if slices.Contains(moved["c"], cl) {
			h = c
		}
		if s := h.simCounts(t, cl); s.Resumes != 2 || s.Identifies != 0 {
			t.Errorf("cluster %d moved to %s: %d resumes, %d identifies; want 2 and 0", cl, h.id, s.Resumes, s.Identifies)
		}
	}
	if rec := budgetRecord(t, js); rec.Spent != 24 {
		t.Errorf("the moved clusters spent session starts: %+v", rec)
	}
}

// TestMeshIdentifyWaitsForNATS: a host whose shared identify gate cannot be
// asked (the NATS server died) grants no identify, and says so in STATUS
// and its log; once the server is back it grants again.
func TestMeshIdentifyWaitsForNATS(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{Bin: testenv.Bin("nats-server")})
	h := startDiscordHost(t, srv.URL, "a", 0, "", "max_concurrency = 2\n")
	h.dial(t)
	// 24 shards in 2 buckets take about 12 holds: kill the server midway.
	testenv.WaitFor(t, 30*time.Second, "a few identifies granted", func() bool {
		st := h.status(t)
		return st.Discord != nil && st.Discord.IdentifyGranted >= 4
	})
	srv.Kill()
	killed := time.Now()
	testenv.WaitFor(t, 5*time.Second, "STATUS says the shared gate cannot be asked", func() bool {
		m := h.status(t).Discord.Mesh
		return m != nil && !m.Reachable && m.ClaimsFailed > 0
	})
	if !strings.Contains(h.out.String(), "the shared identify gate cannot be asked") {
		t.Fatalf("no log line for the unreachable gate:\n%s", h.out.String())
	}
	// The fence follows (1.5 s after the last renewal); no grant was made
	// after the server died but for a claim answered just before (each is
	// granted within 100 ms of its send, or not at all).
	var fenced manager.Status
	testenv.WaitFor(t, 10*time.Second, "every cluster fenced", func() bool {
		fenced = h.status(t)
		for _, cs := range fenced.Clusters {
			if cs.PID != 0 {
				return false
			}
		}
		return true
	})
	for _, g := range identifyGrants(t, []*meshHost{h}) {
		if g.at.After(killed.Add(200 * time.Millisecond)) {
			t.Errorf("shard %d granted %v after the NATS server died", g.shard, g.at.Sub(killed))
		}
	}
	t.Logf("before the fence: %d granted, %d waiting; shared gate %+v", fenced.Discord.IdentifyGranted, fenced.Discord.IdentifyWaiting, *fenced.Discord.Mesh)

	srv.Restart()
	placed(t, []*meshHost{h}, 60*time.Second, "12 clusters ready again after the server came back")
	if m := h.status(t).Discord.Mesh; !m.Reachable {
		t.Fatalf("the shared gate after the server came back: %+v", m)
	}
}
