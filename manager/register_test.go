package manager_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/manager"
)

// resumeEntry is an entry of a REGISTER reply's resume.
type resumeEntry struct {
	Shard      int    `json:"shard"`
	ShardCount int    `json:"shard_count"`
	SessionID  string `json:"session_id"`
}

func resumeEntries(t *testing.T, reg botRegistration) []resumeEntry {
	t.Helper()
	out := make([]resumeEntry, len(reg.Resume))
	for i, raw := range reg.Resume {
		if err := json.Unmarshal(raw, &out[i]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// waitRegs waits until pid has recorded n REGISTER replies and returns them.
func waitRegs(t *testing.T, dir string, pid, n int) []botRegistration {
	t.Helper()
	var regs []botRegistration
	testenv.WaitFor(t, 10*time.Second, "REGISTER replies recorded", func() bool {
		regs = botRegs(t, dir, pid)
		return len(regs) >= n
	})
	return regs
}

// The REGISTER reply says how the process was started and, with an answer
// from Discord, carries /gateway/bot's answer for it: the topology's shard
// count, the budget's numbers, and as remaining what the governor would grant
// this process plus the shards it is handed resume state for. Resume entries
// carry the topology's shard count, whatever the cluster reported.
func TestRegisterReplyStartGatewayResume(t *testing.T) {
	cfg, dir := testbotConfig(t, map[string]string{testbotResumeEnv: "1"})
	cfg.Discord.BudgetFloor = 100
	// 90 left, under the floor of 100: first starts and deploys may identify,
	// restarts may not.
	e := startFromFileWith(t, cfg, manager.Options{Gateway: gatewayBot(6, 90, 2)})
	loaded := e.cfg
	st := e.WaitReady()

	first := waitRegs(t, dir, st.Clusters[1].PID, 1)[0]
	if first.Start != "first" || len(first.Resume) != 0 || first.Active || first.MaxFrame != loaded.Limits.MaxFrameBytes {
		t.Fatalf("first start's reply: %+v (max_frame_bytes: want %d)", first, loaded.Limits.MaxFrameBytes)
	}
	g := first.Gateway
	if g == nil || g.URL != "wss://gateway.example.test" || g.Shards != 8 || g.SessionStartLimit.Total != 1000 ||
		g.SessionStartLimit.Remaining != 90 || g.SessionStartLimit.MaxConcurrency != 2 ||
		g.SessionStartLimit.ResetAfter <= 0 || g.SessionStartLimit.ResetAfter > time.Hour.Milliseconds() {
		t.Fatalf("first start's gateway %+v: want Discord's URL, the topology's 8 shards (not the recommended 6), 90 of 1000, 2 buckets", g)
	}
	if first.Identify.MaxConcurrency != 2 || first.Identify.SpacingMS != 1 {
		t.Fatalf("identify %+v", first.Identify)
	}
	c := e.client("register-test")
	if g := botOp(t, c, "identify", "1", map[string]int{"shard": 2}); g.Error != nil {
		t.Fatalf("a first start's IDENTIFY under the floor: %s", ipc.Encode(g))
	}

	// A killed process's replacement is a respawn: handed its shards'
	// sessions (as of the topology's 8 shards, not the 999 the bot claimed),
	// it may spend nothing, and its remaining is just those 2 RESUMEs.
	old := st.Clusters[1].PID
	time.Sleep(200 * time.Millisecond) // a few heartbeats report resume state
	again := waitRegs(t, dir, e.killAndRespawn(1, old), 1)[0]
	rs := resumeEntries(t, again)
	if again.Start != "respawn" || len(rs) != 2 || rs[0].Shard != 2 || rs[1].Shard != 3 ||
		rs[0].ShardCount != 8 || rs[1].ShardCount != 8 || !strings.HasPrefix(rs[0].SessionID, "tb-") {
		t.Fatalf("respawn's reply: start %q, resume %+v", again.Start, rs)
	}
	if again.Gateway == nil || again.Gateway.SessionStartLimit.Remaining != 2 {
		t.Fatalf("respawn's gateway %+v: remaining must be 0 (refused at the floor) + 2 resumed", again.Gateway)
	}
	if g := botOp(t, c, "identify", "1", map[string]int{"shard": 2}); g.Error == nil || g.Error.Code != ipc.CodeBudgetRefused ||
		!strings.Contains(g.Error.Message, "floor") {
		t.Fatalf("a respawn's IDENTIFY at the floor: %s, want budget_refused", ipc.Encode(g))
	}

	// A deploy's new process is a candidate: no resume state, and the
	// governor grants it what remains.
	next := *loaded
	next.Cluster.Env = map[string]string{testbotDirEnv: dir}
	testenv.WriteConfig(t, &next)
	if _, err := c.Request(t.Context(), &ipc.Frame{Op: ipc.OpDeploy, Clusters: []int{2}}); err != nil {
		t.Fatal(err)
	}
	dst := e.waitDeploy(20 * time.Second)
	if dst.Deploy.State != "succeeded" {
		t.Fatalf("deploy: %s %s", dst.Deploy.State, dst.Deploy.Reason)
	}
	cand := waitRegs(t, dir, dst.Clusters[2].PID, 1)[0]
	if cand.Start != "candidate" || len(cand.Resume) != 0 || cand.Gateway == nil || cand.Gateway.SessionStartLimit.Remaining != 89 {
		t.Fatalf("candidate's reply: start %q, resume %d entries, gateway %+v; want 89 remaining (90 less shard 2's identify)", cand.Start, len(cand.Resume), cand.Gateway)
	}

	// The state directory's resume file records the shard count.
	testenv.WaitFor(t, 5*time.Second, "resume state written with shard counts", func() bool {
		b, err := os.ReadFile(filepath.Join(cfg.State.Dir, "resume-state.json"))
		return err == nil && strings.Contains(string(b), `"shard_count":8`) && !strings.Contains(string(b), "999")
	})
}

// Resume state is handed out only under the shard count it was reported
// with: after a re-clustering deploy changes the count, a crashed cluster of
// the new topology is handed none of the old topology's sessions, though
// they are fresh and name its shards.
func TestResumeNotHandedAcrossShardCounts(t *testing.T) {
	cfg, dir := testbotConfig(t, map[string]string{testbotResumeEnv: "1"})
	cfg.Deploy.ReadyTimeout = durationOf(20 * time.Second)
	e := startFromFile(t, cfg)
	e.WaitReady()
	time.Sleep(200 * time.Millisecond) // every shard of 8 reports a session
	c := e.client("recluster")
	// 12 shards, 4 a cluster; the new generation reports nothing.
	if _, err := e.redeploy(c, func(n *config.Config) {
		n.Topology = config.Topology{TotalShards: 12, ShardsPerCluster: 4}
		n.Cluster.Env = map[string]string{testbotDirEnv: dir}
	}, nil, 3); err != nil {
		t.Fatal(err)
	}
	dst := e.waitDeploy(30 * time.Second)
	if dst.Deploy.State != "succeeded" || dst.Topology.Total != 12 {
		t.Fatalf("re-clustering: %s %s, topology %+v", dst.Deploy.State, dst.Deploy.Reason, dst.Topology)
	}
	// Cluster 0's shards 0-3 were all reported under 8 shards.
	reg := waitRegs(t, dir, e.killAndRespawn(0, dst.Clusters[0].PID), 1)[0]
	if reg.Start != "respawn" || reg.Total != 12 || len(reg.Resume) != 0 {
		t.Fatalf("the respawn under 12 shards: start %q, total %d, resume %s; want none of the 8-shard sessions", reg.Start, reg.Total, reg.Resume)
	}
}

// TestClientRegisterReply: a client's REGISTER reply tells it the topology in
// force and the frame limit it must keep to.
func TestClientRegisterReply(t *testing.T) {
	cfg := testConfig(t)
	cfg.Limits.MaxFrameBytes = 200000
	want := cfg.Topology
	e := start(t, cfg)
	rc := e.dialRaw("hello")
	rc.send(`{"op":"REGISTER","id":"r","role":"client","name":"hello"}`)
	f := rc.read(t, 5*time.Second)
	var hello struct {
		Protocol, Clusters, Total, PerCluster, MaxFrame int
	}
	var raw map[string]json.RawMessage
	if f.ID != "r" || f.Error != nil || json.Unmarshal(f.Payload, &raw) != nil {
		t.Fatalf("register: %s", ipc.Encode(f))
	}
	for k, dst := range map[string]*int{"protocol": &hello.Protocol, "clusters": &hello.Clusters, "total_shards": &hello.Total,
		"shards_per_cluster": &hello.PerCluster, "max_frame_bytes": &hello.MaxFrame} {
		if err := json.Unmarshal(raw[k], dst); err != nil {
			t.Fatalf("%s in %s: %v", k, f.Payload, err)
		}
	}
	if hello.Protocol != 1 || hello.Total != want.TotalShards || hello.PerCluster != want.ShardsPerCluster ||
		hello.Clusters != (want.TotalShards+want.ShardsPerCluster-1)/want.ShardsPerCluster || hello.MaxFrame != 200000 {
		t.Fatalf("client hello %+v from %s", hello, f.Payload)
	}
}
