package manager_test

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/manager"
)

// A resume-handoff deploy under load: each cluster's old process quiesces
// and exits, its new one RESUMEs every shard's session (no IDENTIFY: the
// session-start budget is not touched), and requests wait out the gap: none
// fails, none is answered twice. The gap per cluster (QUIESCE sent to the new
// process routed) is reported.
func TestDeployResumeUnderLoad(t *testing.T) {
	cfg := deployConfig(t)
	testenv.WriteConfig(t, cfg)
	loaded, err := config.Load(cfg.Path)
	if err != nil {
		t.Fatal(err)
	}
	e := startWith(t, loaded, manager.Options{Gateway: gatewayBot(8, 1000, 1)})
	before := e.WaitReady()
	budget := before.Discord.Budget.Remaining
	c := e.client("deployer")
	l := startLoad(t, e, 8, clusterTarget(4))
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := c.Request(ctx, &ipc.Frame{Op: ipc.OpDeploy, Mode: "resume"})
	if err != nil {
		t.Fatalf("DEPLOY: %v", err)
	}
	var reply struct {
		Mode string `json:"mode"`
	}
	json.Unmarshal(r.Payload, &reply)
	if reply.Mode != "resume" {
		t.Fatalf("DEPLOY reply %s", r.Payload)
	}
	st := e.waitDeploy(30 * time.Second)
	time.Sleep(100 * time.Millisecond)
	l.finish(t)
	if st.Deploy.State != generation.StateSucceeded || st.Deploy.Mode != "resume" {
		t.Fatalf("deploy %s (mode %q): %s", st.Deploy.State, st.Deploy.Mode, st.Deploy.Reason)
	}
	var gaps []time.Duration
	for i, dc := range st.Deploy.Clusters {
		if dc.Phase != generation.PhaseActivated || dc.SpawnedAt.Before(dc.ExitedAt) || dc.RoutedAt.Before(dc.ReadyAt) {
			t.Errorf("cluster %d out of order: %+v", i, dc)
		}
		gaps = append(gaps, dc.RoutedAt.Sub(dc.QuiesceSentAt))
	}
	slices.Sort(gaps)
	t.Logf("gap per cluster (QUIESCE sent → new process routed), sorted: %v", gaps)
	now := e.WaitReady()
	for i, cs := range now.Clusters {
		if cs.Generation != 2 || cs.PID == before.Clusters[i].PID || alive(before.Clusters[i].PID) {
			t.Errorf("cluster %d: %+v (old pid %d)", i, cs, before.Clusters[i].PID)
		}
		s := e.simStats(strconv.Itoa(i))
		if s.Identifies != 0 || s.Resumes != 2 {
			t.Errorf("cluster %d's new process: %d identifies, %d resumes; want 0 and 2", i, s.Identifies, s.Resumes)
		}
	}
	if got := now.Discord.Budget.Remaining; got != budget {
		t.Errorf("session starts %d after the deploy, %d before: a resume spends none", got, budget)
	}
}

// A resume-handoff deploy cannot re-cluster, and a mode it does not know is
// refused; either way nothing changes.
func TestDeployResumeRefusals(t *testing.T) {
	e := startFromFile(t, deployConfig(t))
	before := e.WaitReady()
	c := e.client("deployer")
	for _, tc := range []struct {
		mode   string
		change func(*config.Config)
	}{
		{"resume", func(n *config.Config) { n.Topology.ShardsPerCluster = 4 }},
		{"sideways", nil},
	} {
		next := *e.cfg
		if tc.change != nil {
			tc.change(&next)
		}
		testenv.WriteConfig(t, &next)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.Request(ctx, &ipc.Frame{Op: ipc.OpDeploy, Mode: tc.mode})
		cancel()
		if ipc.CodeOf(err) != ipc.CodeBadFrame {
			t.Errorf("DEPLOY mode %q: %v, want bad_frame", tc.mode, err)
		}
	}
	if st := e.MustStatus(); st.Deploy != nil || st.Clusters[0].PID != before.Clusters[0].PID {
		t.Fatalf("a refused DEPLOY changed something: %+v", st)
	}
}
