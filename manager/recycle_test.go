package manager_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/manager"
)

const mib = 1 << 20

// recycleConfig is deployConfig with recycling on at maxRSS, sampled every
// 50ms and sustained 300ms: quick, but still several samples in a row.
func recycleConfig(t *testing.T, maxRSS int64) *config.Config {
	cfg := deployConfig(t)
	cfg.Recycle = config.Recycle{
		Enabled: true, MaxRSS: maxRSS,
		Sustain: durationOf(300 * time.Millisecond), Interval: durationOf(50 * time.Millisecond),
		MaxParallel: 1, Cooldown: durationOf(time.Minute), Mode: "overlap",
	}
	return cfg
}

// grow has cluster's simulated bot allocate and touch n more bytes.
func (e *env) grow(cluster string, n int) {
	e.t.Helper()
	c := e.client("grow")
	defer c.Close()
	if _, err := request(e.t, c, "sim.grow", cluster, map[string]int{"bytes": n}, 10*time.Second); err != nil {
		e.t.Fatalf("sim.grow on %s: %v", cluster, err)
	}
}

// recycleOf is cluster's recycling in STATUS, never nil.
func recycleOf(cs manager.ClusterStatus) manager.RecycleStatus {
	if cs.Recycle == nil {
		return manager.RecycleStatus{}
	}
	return *cs.Recycle
}

// feedWatcher keeps every recycle event of the state feed.
type feedWatcher struct {
	mu     sync.Mutex
	events []json.RawMessage
}

func watchRecycles(t *testing.T, e *env) *feedWatcher {
	w := &feedWatcher{}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ipc.Dial(ctx, ipc.ClientConfig{
		Path: e.cfg.Socket, Register: ipc.Frame{Role: ipc.RoleClient, Name: "watch"},
		Handler: func(_ *ipc.Client, f *ipc.Frame) {
			if f.Op == ipc.OpEvent && bytes.Contains(f.Payload, []byte(`"type":"recycle"`)) {
				w.mu.Lock()
				w.events = append(w.events, f.Payload)
				w.mu.Unlock()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Request(ctx, &ipc.Frame{Op: ipc.OpWatch}); err != nil {
		t.Fatal(err)
	}
	return w
}

func (w *feedWatcher) list() []json.RawMessage {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]json.RawMessage(nil), w.events...)
}

// A cluster whose RSS, read from /proc, stays over recycle.max_rss is
// replaced by a fresh process of its generation while requests flow to every
// cluster: none fails, none is answered twice; the reason is in STATUS, the
// feed and sm_recycles_total; the other clusters are untouched.
func TestRecycleRSSUnderLoad(t *testing.T) {
	e := start(t, recycleConfig(t, 96*mib))
	before := e.WaitReady()
	w := watchRecycles(t, e)
	l := startLoad(t, e, 8, clusterTarget(4))
	time.Sleep(100 * time.Millisecond)
	e.grow("1", 128*mib)

	var cs manager.ClusterStatus
	testenv.WaitFor(t, 20*time.Second, "cluster 1 recycled", func() bool {
		cs = e.MustStatus().Clusters[1]
		r := recycleOf(cs)
		return r.State == "succeeded" && cs.State == "ready" && cs.Activated
	})
	time.Sleep(200 * time.Millisecond) // requests on the new process too
	l.finish(t)

	r := recycleOf(cs)
	t.Logf("recycle: %+v", r)
	if r.Reason != "rss" || !strings.Contains(r.Detail, "over 96 MiB") || r.Recycling {
		t.Errorf("recycle status %+v", r)
	}
	if cs.PID == before.Clusters[1].PID || r.OldPID != before.Clusters[1].PID || r.NewPID != cs.PID {
		t.Errorf("pid %d (recycle says %d → %d), was %d", cs.PID, r.OldPID, r.NewPID, before.Clusters[1].PID)
	}
	if alive(before.Clusters[1].PID) {
		t.Errorf("the recycled process %d is still alive", before.Clusters[1].PID)
	}
	if cs.Generation != 1 {
		t.Errorf("recycled into generation %d", cs.Generation)
	}
	now := e.MustStatus()
	for _, i := range []int{0, 2, 3} {
		if now.Clusters[i].PID != before.Clusters[i].PID || now.Clusters[i].Recycle != nil {
			t.Errorf("cluster %d touched: %+v", i, now.Clusters[i])
		}
	}
	if now.Deploy != nil {
		t.Errorf("a recycle shows as a deploy: %+v", now.Deploy)
	}
	if got := counterValue(t, e, "sm_recycles_total", "reason", "rss"); got != 1 {
		t.Errorf("sm_recycles_total{reason=rss} = %v", got)
	}
	var states []string
	for _, ev := range w.list() {
		var v struct {
			Cluster int    `json:"cluster"`
			State   string `json:"state"`
			Reason  string `json:"reason"`
		}
		json.Unmarshal(ev, &v)
		if v.Cluster != 1 || v.Reason != "rss" {
			t.Errorf("feed event %s", ev)
		}
		states = append(states, v.State)
	}
	if strings.Join(states, ",") != "running,succeeded" {
		t.Errorf("feed recycle events %q", states)
	}
	// The new process starts with a clean record: no second recycle.
	time.Sleep(500 * time.Millisecond)
	if n := e.MustStatus().Clusters[1]; n.PID != cs.PID {
		t.Errorf("recycled again: pid %d → %d", cs.PID, n.PID)
	}
}

// A deploy holds a due recycle (and says so in STATUS) until it is done; a
// DEPLOY sent during a recycle is refused with deploy_in_progress.
func TestRecycleWaitsForDeploy(t *testing.T) {
	cfg := recycleConfig(t, 96*mib)
	// Cluster 3's processes take a second per shard to connect: its recycle
	// lasts long enough to send a DEPLOY into it.
	cfg.Cluster.Env = map[string]string{"SM_HARNESS_FLAGS_3": "--connect-delay=1s"}
	e := startFromFile(t, cfg)
	before := e.WaitReady()
	c := e.client("deployer")
	// Cluster 0's new generation takes 2 × 1.5s to be ready.
	if _, err := e.redeploy(c, func(n *config.Config) {
		n.Cluster.Env = map[string]string{"SM_HARNESS_FLAGS_0": "--connect-delay=1500ms", "SM_HARNESS_FLAGS_3": "--connect-delay=1s"}
	}, []int{0}, 1); err != nil {
		t.Fatal(err)
	}
	l := startLoad(t, e, 4, clusterTarget(4))
	e.grow("3", 128*mib)
	testenv.WaitFor(t, 10*time.Second, "cluster 3's recycle held by the deploy", func() bool {
		return strings.Contains(recycleOf(e.MustStatus().Clusters[3]).Held, "deploy is running")
	})
	st := e.MustStatus()
	if st.Deploy == nil || !st.Deploy.Finished.IsZero() || st.Clusters[3].PID != before.Clusters[3].PID {
		t.Fatalf("held, but the deploy is over or cluster 3 replaced: %+v", st.Clusters[3])
	}
	testenv.WaitFor(t, 20*time.Second, "cluster 3 recycling after the deploy", func() bool {
		return recycleOf(e.MustStatus().Clusters[3]).Recycling
	})
	if st := e.MustStatus(); st.Deploy.Finished.IsZero() || st.Deploy.State != "succeeded" {
		t.Fatalf("recycling while the deploy is %s", st.Deploy.State)
	}
	_, err := e.redeploy(c, nil, []int{1}, 1)
	if ipc.CodeOf(err) != ipc.CodeDeployInProgress || !strings.Contains(err.Error(), "recycled") {
		t.Fatalf("DEPLOY during a recycle: %v", err)
	}
	testenv.WaitFor(t, 20*time.Second, "cluster 3 recycled", func() bool {
		return recycleOf(e.MustStatus().Clusters[3]).State == "succeeded"
	})
	l.finish(t)
	if cs := e.MustStatus().Clusters[3]; cs.PID == before.Clusters[3].PID || cs.Generation != 1 {
		t.Errorf("cluster 3 after its recycle: %+v", cs)
	}
}

// With the session-start budget too low for the cluster's shards above
// discord.budget_floor, a cluster over its limit stays as it is, and STATUS
// says why.
func TestRecycleHeldByBudget(t *testing.T) {
	cfg := recycleConfig(t, 96*mib)
	cfg.Discord.BudgetFloor = 100
	// 8 first-start identifies leave 101: one above the floor, and a
	// cluster has 2 shards.
	gw := &discord.GatewayBot{Shards: 8, Fetched: time.Now(), SessionStartLimit: discord.SessionStartLimit{
		Total: 1000, Remaining: 109, ResetAfter: time.Hour, MaxConcurrency: 1,
	}}
	e := startWith(t, cfg, manager.Options{Gateway: gw})
	before := e.WaitReady()
	e.grow("2", 128*mib)
	var r manager.RecycleStatus
	testenv.WaitFor(t, 10*time.Second, "cluster 2's recycle held by the budget", func() bool {
		r = recycleOf(e.MustStatus().Clusters[2])
		return r.Held != ""
	})
	if !strings.Contains(r.Held, "budget refuses") || !strings.Contains(r.HeldDetail, "rss") {
		t.Fatalf("held %+v", r)
	}
	time.Sleep(time.Second) // 20 sampling rounds
	st := e.MustStatus()
	if cs := st.Clusters[2]; cs.PID != before.Clusters[2].PID || recycleOf(cs).State != "" {
		t.Fatalf("recycled against the budget: %+v", cs)
	}
	if st.Discord.Budget.Remaining != 101 {
		t.Fatalf("budget %+v", st.Discord.Budget)
	}
}

// counterValue is the value of the counter name{label=value} e's registry
// gathers, 0 if it has no such series.
func counterValue(t *testing.T, e *env, name, label, value string) float64 {
	t.Helper()
	fams, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// The lag a bot reports in its heartbeat (loop_lag_ms) recycles it too.
func TestRecycleLag(t *testing.T) {
	cfg := recycleConfig(t, 0)
	cfg.Recycle.MaxLag = durationOf(200 * time.Millisecond)
	e := start(t, cfg)
	before := e.WaitReady()
	l := startLoad(t, e, 4, clusterTarget(4))
	c := e.client("lag")
	if _, err := request(t, c, "sim.lag", "0", map[string]int{"ms": 450}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var cs manager.ClusterStatus
	testenv.WaitFor(t, 20*time.Second, "cluster 0 recycled", func() bool {
		cs = e.MustStatus().Clusters[0]
		return recycleOf(cs).State == "succeeded" && cs.State == "ready"
	})
	l.finish(t)
	if r := recycleOf(cs); r.Reason != "lag" || !strings.Contains(r.Detail, "lag 450ms over 200ms") || cs.PID == before.Clusters[0].PID {
		t.Fatalf("recycle %+v, pid %d (was %d)", r, cs.PID, before.Clusters[0].PID)
	}
	if got := counterValue(t, e, "sm_recycles_total", "reason", "lag"); got != 1 {
		t.Errorf("sm_recycles_total{reason=lag} = %v", got)
	}
}

// recycle.mode = "resume": the fresh process starts once the old one is gone
// and RESUMEs its sessions, so the budget that holds an overlapping recycle
// (one start above the floor, TestRecycleHeldByBudget) is neither asked nor
// spent; requests wait out the gap and none fails.
func TestRecycleResume(t *testing.T) {
	cfg := recycleConfig(t, 96*mib)
	cfg.Recycle.Mode = "resume"
	cfg.Discord.BudgetFloor = 100
	gw := &discord.GatewayBot{Shards: 8, Fetched: time.Now(), SessionStartLimit: discord.SessionStartLimit{
		Total: 1000, Remaining: 109, ResetAfter: time.Hour, MaxConcurrency: 1,
	}}
	e := startWith(t, cfg, manager.Options{Gateway: gw})
	before := e.WaitReady()
	l := startLoad(t, e, 8, clusterTarget(4))
	e.grow("2", 128*mib)
	var cs manager.ClusterStatus
	testenv.WaitFor(t, 20*time.Second, "cluster 2 recycled", func() bool {
		cs = e.MustStatus().Clusters[2]
		return recycleOf(cs).State == "succeeded" && cs.State == "ready" && cs.Activated
	})
	time.Sleep(100 * time.Millisecond)
	l.finish(t)
	r := recycleOf(cs)
	if r.Reason != "rss" || cs.PID == before.Clusters[2].PID || alive(before.Clusters[2].PID) || cs.Generation != 1 {
		t.Fatalf("recycle %+v, cluster %+v", r, cs)
	}
	t.Logf("resume recycle: %v from start to finish", r.Finished.Sub(r.Started))
	if s := e.simStats("2"); s.Identifies != 0 || s.Resumes != 2 {
		t.Errorf("the fresh process: %d identifies, %d resumes; want 0 and 2", s.Identifies, s.Resumes)
	}
	if b := e.MustStatus().Discord.Budget; b.Remaining != 101 {
		t.Errorf("budget %+v: a resume spends nothing", b)
	}
}

// A fresh process that never gets ready fails the recycle: it is stopped,
// the old process, never unrouted, keeps serving every request, and the
// cooldown holds the next try.
func TestRecycleFailsOldKeepsServing(t *testing.T) {
	cfg := recycleConfig(t, 96*mib)
	cfg.Deploy.ReadyTimeout = durationOf(time.Second)
	marker := filepath.Join(t.TempDir(), "fail-ready")
	// Cluster 1's processes started once the marker exists never get ready.
	runFirst(t, cfg, 1, "if [ -e '"+marker+"' ]; then exec '"+testenv.Bin("cluster-harness")+"' \"$@\" --fail-ready; fi")
	e := start(t, cfg)
	before := e.WaitReady()
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	l := startLoad(t, e, 4, clusterTarget(4))
	e.grow("1", 128*mib)
	var r manager.RecycleStatus
	testenv.WaitFor(t, 20*time.Second, "cluster 1's recycle failed", func() bool {
		r = recycleOf(e.MustStatus().Clusters[1])
		return r.State == "failed"
	})
	time.Sleep(300 * time.Millisecond) // sampling rounds after the failure
	l.finish(t)
	cs := e.MustStatus().Clusters[1]
	if cs.PID != before.Clusters[1].PID || !cs.Routed || !strings.Contains(r.Detail, "not ready within") {
		t.Fatalf("after a failed recycle: %+v, recycle %+v", cs, r)
	}
	if rs := recycleOf(cs); !strings.Contains(rs.Held, "cooldown") {
		t.Errorf("no cooldown after the failure: %+v", rs)
	}
	if r.NewPID == 0 || r.NewPID == before.Clusters[1].PID || alive(r.NewPID) {
		t.Errorf("the failed fresh process %d is still alive", r.NewPID)
	}
}
