package manager_test

import (
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/manager"
)

// gatewayBot is a /gateway/bot answer recommending shards, with remaining of
// the day's 1000 session starts left and maxConcurrency identify buckets.
func gatewayBot(shards, remaining, maxConcurrency int) *discord.GatewayBot {
	return &discord.GatewayBot{URL: "wss://gateway.example.test", Shards: shards, Fetched: time.Now(), SessionStartLimit: discord.SessionStartLimit{
		Total: 1000, Remaining: remaining, ResetAfter: time.Hour, MaxConcurrency: maxConcurrency,
	}}
}

type simStats struct {
	Identifies int `json:"identifies"`
	Resumes    int `json:"resumes"`
	Shards     []struct {
		ID      int    `json:"id"`
		Status  string `json:"status"`
		Session string `json:"session"`
	} `json:"shards"`
}

func (e *env) simStats(cluster string) simStats {
	e.t.Helper()
	c := e.client("stats")
	defer c.Close()
	r, err := request(e.t, c, "stats", cluster, nil, 3*time.Second)
	if err != nil {
		e.t.Fatal(err)
	}
	var st simStats
	if err := json.Unmarshal(r.Payload, &st); err != nil {
		e.t.Fatal(err)
	}
	return st
}

// Every shard of every cluster identifies through the gate: one per bucket
// per identify_spacing, so 8 shards in one bucket take 7 spacings at least.
func TestIdentifyGateSpacesStartups(t *testing.T) {
	cfg := testConfig(t)
	cfg.Discord.IdentifySpacing = durationOf(120 * time.Millisecond)
	cfg.Heartbeat.StartTimeout = durationOf(10 * time.Second)
	begin := time.Now()
	e := start(t, cfg)
	st := e.WaitReady()
	took := time.Since(begin)
	if took < 7*120*time.Millisecond {
		t.Fatalf("8 shards identified in %v: the gate did not space them", took)
	}
	if st.Discord == nil || st.Discord.IdentifyGranted != 8 {
		t.Fatalf("identify grants: %+v", st.Discord)
	}
	for _, c := range []string{"0", "1", "2", "3"} {
		s := e.simStats(c)
		if s.Identifies != 2 {
			t.Errorf("cluster %s identified %d shards, want 2", c, s.Identifies)
		}
	}
}

// A killed cluster's replacement resumes every shard: no identify spent.
func TestRestartResumes(t *testing.T) {
	e := start(t, testConfig(t))
	st := e.WaitReady()
	granted := st.Discord.IdentifyGranted
	time.Sleep(200 * time.Millisecond) // a few heartbeats carry resume state
	e.killAndRespawn(1, st.Clusters[1].PID)
	s := e.simStats("1")
	if s.Resumes != 2 || s.Identifies != 0 {
		t.Fatalf("replacement: %d resumes, %d identifies; want 2 and 0 (%+v)", s.Resumes, s.Identifies, s.Shards)
	}
	if g := e.MustStatus().Discord.IdentifyGranted; g != granted {
		t.Fatalf("identifies granted went from %d to %d", granted, g)
	}
}

// At the budget floor a crash-looping cluster gets no identify, while a
// deploy still proceeds; the state shows in STATUS.
func TestBudgetGovernorStopsCrashLoopsNotDeploys(t *testing.T) {
	cfg := deployConfig(t)
	cfg.Discord.BudgetFloor = 100
	cfg.Discord.ResumeMaxAge = durationOf(time.Millisecond) // restarts must identify
	testenv.WriteConfig(t, cfg)
	loaded, err := config.Load(cfg.Path)
	if err != nil {
		t.Fatal(err)
	}
	// 8 first-start identifies leave 102: one 2-shard restart reaches the floor.
	gw := &discord.GatewayBot{Shards: 8, Fetched: time.Now(), SessionStartLimit: discord.SessionStartLimit{
		Total: 1000, Remaining: 110, ResetAfter: time.Hour, MaxConcurrency: 1,
	}}
	e := startWith(t, loaded, manager.Options{Gateway: gw})
	st := e.WaitReady()
	if st.Discord.Budget.Remaining != 102 {
		t.Fatalf("budget after start: %+v", st.Discord.Budget)
	}
	kill := func() int {
		pid := e.MustStatus().Clusters[1].PID
		syscall.Kill(pid, syscall.SIGKILL)
		return pid
	}
	old := kill()
	testenv.WaitFor(t, 10*time.Second, "first restart identified", func() bool {
		cs := e.MustStatus().Clusters[1]
		return cs.PID != old && cs.State == "ready"
	})
	if b := e.MustStatus().Discord.Budget; b.Remaining != 100 || !b.Blocking {
		t.Fatalf("budget after a restart: %+v", b)
	}
	old = kill()
	// Not ready, so not routed: its heartbeat (in STATUS) tells how it fares.
	testenv.WaitFor(t, 10*time.Second, "second restart held at the floor", func() bool {
		cs := e.MustStatus().Clusters[1]
		var s simStats
		if cs.PID == old || cs.PID == 0 || json.Unmarshal(cs.Heartbeat, &s) != nil {
			return false
		}
		return len(s.Shards) > 0 && s.Shards[0].Status == "waiting_budget" && cs.State == "registered"
	})
	if b := e.MustStatus().Discord.Budget; b.Remaining != 100 {
		t.Fatalf("a refused restart spent: %+v", b)
	}
	// A deploy still gets its identifies.
	c := e.client("deployer")
	if _, err := e.redeploy(c, nil, []int{2}, 1); err != nil {
		t.Fatal(err)
	}
	dst := e.waitDeploy(20 * time.Second)
	if dst.Deploy.State != "succeeded" {
		t.Fatalf("deploy at the floor: %s %s", dst.Deploy.State, dst.Deploy.Reason)
	}
	if b := e.MustStatus().Discord.Budget; b.Remaining != 98 {
		t.Fatalf("deploy identifies not spent: %+v", b)
	}
}
