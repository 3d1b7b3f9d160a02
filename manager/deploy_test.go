package manager_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/manager"
)

// startFromFile starts a manager from cfg saved to a file.
func startFromFile(t *testing.T, cfg *config.Config) *env {
	t.Helper()
	return startFromFileWith(t, cfg, manager.Options{})
}

// startFromFileWith is startFromFile with extra options.
func startFromFileWith(t *testing.T, cfg *config.Config, opts manager.Options) *env {
	t.Helper()
	testenv.WriteConfig(t, cfg)
	loaded, err := config.Load(cfg.Path)
	if err != nil {
		t.Fatal(err)
	}
	return startWith(t, loaded, opts)
}

// redeploy rewrites the config with change applied and sends DEPLOY.
func (e *env) redeploy(c *ipc.Client, change func(*config.Config), clusters []int, maxParallel int) (*ipc.Frame, error) {
	e.t.Helper()
	next := *e.cfg
	next.Cluster.Env = map[string]string{}
	if change != nil {
		change(&next)
	}
	testenv.WriteConfig(e.t, &next)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Request(ctx, &ipc.Frame{Op: ipc.OpDeploy, Clusters: clusters, MaxParallel: maxParallel})
}

// waitDeploy waits until the running deploy has finished and returns the status.
func (e *env) waitDeploy(timeout time.Duration) manager.Status {
	e.t.Helper()
	var st manager.Status
	testenv.WaitFor(e.t, timeout, "deploy finished", func() bool {
		st = e.MustStatus()
		return st.Deploy != nil && !st.Deploy.Finished.IsZero()
	})
	return st
}

// load keeps requests flowing to every cluster and books every outcome.
type load struct {
	sent, ok  atomic.Int64
	dup       atomic.Int64
	mu        sync.Mutex
	errs      map[string]int
	badEcho   int
	stop      chan struct{}
	wg        sync.WaitGroup
	lastError string
	client    *ipc.Client
}

// startLoad runs workers that each send echo requests round-robin over the
// targets, one at a time, until stopped.
func startLoad(t *testing.T, e *env, workers int, targets func(i int) string) *load {
	return startLoadAt(t, e.cfg.Socket, workers, targets)
}

// startLoadAt is startLoad against any socket. Its client reconnects, and
// each request waits for a connection first, so only requests in flight when
// a manager dies can fail.
func startLoadAt(t *testing.T, socket string, workers int, targets func(i int) string) *load {
	l := &load{errs: map[string]int{}, stop: make(chan struct{})}
	c, err := ipc.Dial(t.Context(), ipc.ClientConfig{
		Path:      socket,
		Reconnect: true,
		Register:  ipc.Frame{Role: ipc.RoleClient, Name: "load"},
		// A REPLY the client could not match is a duplicate (or a stray): count it.
		Handler: func(_ *ipc.Client, f *ipc.Frame) {
			if f.Op == ipc.OpReply {
				l.dup.Add(1)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				payload := fmt.Appendf(nil, `{"w":%d,"i":%d}`, w, i)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if c.WaitConnected(ctx) != nil {
					cancel()
					continue
				}
				l.sent.Add(1)
				r, err := c.Request(ctx, &ipc.Frame{Op: "echo", Target: targets(w*1000 + i), Payload: payload})
				cancel()
				switch {
				case err != nil:
					l.mu.Lock()
					l.errs[ipc.CodeOf(err)]++
					l.lastError = err.Error()
					l.mu.Unlock()
				case !bytes.Equal(r.Payload, payload):
					l.mu.Lock()
					l.badEcho++
					l.mu.Unlock()
				default:
					l.ok.Add(1)
				}
			}
		}()
	}
	t.Cleanup(func() { c.Close() })
	l.client = c
	return l
}

// finish stops the load and checks that every request got exactly one good reply.
func (l *load) finish(t *testing.T) {
	t.Helper()
	l.end(t)
	if len(l.errs) > 0 || l.badEcho > 0 || l.dup.Load() > 0 || l.ok.Load() != l.sent.Load() {
		t.Fatalf("load broke: sent %d ok %d errors %v (last %q) bad echoes %d duplicates %d",
			l.sent.Load(), l.ok.Load(), l.errs, l.lastError, l.badEcho, l.dup.Load())
	}
}

// end stops the load and logs its books.
func (l *load) end(t *testing.T) {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	time.Sleep(50 * time.Millisecond) // let any duplicate arrive
	l.client.Close()
	t.Logf("load: sent %d, ok %d, errors %v, duplicates %d", l.sent.Load(), l.ok.Load(), l.errs, l.dup.Load())
	if l.ok.Load() == 0 {
		t.Fatal("load sent nothing")
	}
}

func deployConfig(t *testing.T) *config.Config {
	cfg := testConfig(t)
	cfg.Deploy.ReadyTimeout = durationOf(5 * time.Second)
	cfg.Deploy.QuiesceTimeout = durationOf(2 * time.Second)
	return cfg
}

func clusterTarget(n int) func(int) string {
	return func(i int) string { return strconv.Itoa(i % n) }
}

func TestDeployUnderLoad(t *testing.T) {
	for _, par := range []int{1, 4} {
		t.Run(fmt.Sprintf("max_parallel=%d", par), func(t *testing.T) {
			e := startFromFile(t, deployConfig(t))
			before := e.WaitReady()
			c := e.client("deployer")
			l := startLoad(t, e, 8, clusterTarget(4))
			time.Sleep(100 * time.Millisecond)
			r, err := e.redeploy(c, nil, nil, par)
			if err != nil {
				t.Fatalf("DEPLOY: %v", err)
			}
			var reply struct {
				DeployID   string `json:"deploy_id"`
				Generation int64  `json:"generation"`
			}
			json.Unmarshal(r.Payload, &reply)
			if reply.Generation != 2 || reply.DeployID == "" {
				t.Fatalf("DEPLOY reply %s", r.Payload)
			}
			st := e.waitDeploy(20 * time.Second)
			time.Sleep(100 * time.Millisecond)
			l.finish(t)
			if st.Deploy.State != generation.StateSucceeded {
				t.Fatalf("deploy %s: %s", st.Deploy.State, st.Deploy.Reason)
			}
			for i, cs := range e.WaitReady().Clusters {
				if cs.Generation != 2 || !cs.Activated {
					t.Errorf("cluster %d: %+v", i, cs)
				}
				if alive(before.Clusters[i].PID) {
					t.Errorf("cluster %d old pid %d still alive", i, before.Clusters[i].PID)
				}
				dc := st.Deploy.Clusters[i]
				if dc.Phase != generation.PhaseActivated || dc.ActivatedAt.Before(dc.ExitedAt) || dc.ExitedAt.Before(dc.RoutedAt) {
					t.Errorf("cluster %d deploy record out of order: %+v", i, dc)
				}
			}
		})
	}
}

func TestDeployNewGenerationFailsReadiness(t *testing.T) {
	cfg := deployConfig(t)
	cfg.Deploy.ReadyTimeout = durationOf(time.Second)
	e := startFromFile(t, cfg)
	before := e.WaitReady()
	c := e.client("deployer")
	l := startLoad(t, e, 4, clusterTarget(4))
	_, err := e.redeploy(c, func(n *config.Config) {
		n.Cluster.Env = map[string]string{"SM_HARNESS_FLAGS_1": "--fail-ready"}
	}, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	st := e.waitDeploy(15 * time.Second)
	l.finish(t)
	if st.Deploy.State != generation.StateFailed || st.Deploy.Reason == "" {
		t.Fatalf("deploy = %s %q, want failed with a reason", st.Deploy.State, st.Deploy.Reason)
	}
	now := e.WaitReady()
	// Cluster 0 moved and stays on 2; cluster 1's old process serves untouched; 2 and 3 never started.
	wantGen := []int64{2, 1, 1, 1}
	for i, cs := range now.Clusters {
		if cs.Generation != wantGen[i] {
			t.Errorf("cluster %d on generation %d, want %d", i, cs.Generation, wantGen[i])
		}
	}
	if now.Clusters[1].PID != before.Clusters[1].PID {
		t.Errorf("cluster 1's old process was replaced")
	}
	if p := st.Deploy.Clusters[1].Phase; p != generation.PhaseFailed {
		t.Errorf("cluster 1 phase %s", p)
	}
}

func TestDeployNewGenerationCrashes(t *testing.T) {
	e := startFromFile(t, deployConfig(t))
	before := e.WaitReady()
	c := e.client("deployer")
	_, err := e.redeploy(c, func(n *config.Config) {
		n.Cluster.Env = map[string]string{"SM_HARNESS_FLAGS": "--exit-on-start=3"}
	}, []int{2}, 1)
	if err != nil {
		t.Fatal(err)
	}
	st := e.waitDeploy(10 * time.Second)
	if st.Deploy.State != generation.StateFailed {
		t.Fatalf("deploy %s", st.Deploy.State)
	}
	now := e.WaitReady()
	for i := range now.Clusters {
		if now.Clusters[i].PID != before.Clusters[i].PID || now.Clusters[i].Generation != 1 {
			t.Errorf("cluster %d changed: %+v", i, now.Clusters[i])
		}
	}
}

func TestDeployOldIgnoresQuiesce(t *testing.T) {
	cfg := deployConfig(t)
	cfg.Deploy.QuiesceTimeout = durationOf(500 * time.Millisecond)
	cfg.Restart.StopGrace = durationOf(300 * time.Millisecond)
	cfg.Cluster.Env = map[string]string{"SM_HARNESS_FLAGS_3": "--ignore-quiesce"}
	e := startFromFile(t, cfg)
	before := e.WaitReady()
	c := e.client("deployer")
	if _, err := e.redeploy(c, nil, []int{3}, 1); err != nil {
		t.Fatal(err)
	}
	st := e.waitDeploy(10 * time.Second)
	if st.Deploy.State != generation.StateSucceeded {
		t.Fatalf("deploy %s: %s", st.Deploy.State, st.Deploy.Reason)
	}
	dc := st.Deploy.Clusters[0]
	if dc.StopSentAt.IsZero() || !dc.QuiescedAt.IsZero() || dc.ActivatedAt.Before(dc.ExitedAt) {
		t.Fatalf("want kill after quiesce timeout, then ACTIVATE: %+v", dc)
	}
	if alive(before.Clusters[3].PID) {
		t.Fatal("old process still alive")
	}
	if g := e.WaitReady().Clusters[3].Generation; g != 2 {
		t.Fatalf("cluster 3 on generation %d", g)
	}
}

func TestDeployRefusals(t *testing.T) {
	cfg := deployConfig(t)
	e := startFromFile(t, cfg)
	before := e.WaitReady()
	c := e.client("deployer")

	// An invalid file refuses the deploy and changes nothing.
	if err := os.WriteFile(cfg.Path, []byte("[topology]\ntotal_shards = -3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := c.Request(t.Context(), &ipc.Frame{Op: ipc.OpDeploy})
	if ipc.CodeOf(err) != ipc.CodeBadConfig {
		t.Fatalf("invalid config: got %v, want bad_config", err)
	}
	if st := e.MustStatus(); st.Deploy != nil || st.Generation != 1 {
		t.Fatalf("a refused deploy left a trace: %+v", st.Deploy)
	}

	// One deploy at a time.
	if _, err := e.redeploy(c, func(n *config.Config) {
		n.Cluster.Env = map[string]string{"SM_HARNESS_FLAGS": "--connect-delay=300ms"}
	}, nil, 1); err != nil {
		t.Fatal(err)
	}
	_, err = c.Request(t.Context(), &ipc.Frame{Op: ipc.OpDeploy})
	if ipc.CodeOf(err) != ipc.CodeDeployInProgress {
		t.Fatalf("second deploy: got %v, want deploy_in_progress", err)
	}
	// A cluster cannot deploy; a bad cluster list is refused.
	e.waitDeploy(20 * time.Second)
	_, err = c.Request(t.Context(), &ipc.Frame{Op: ipc.OpDeploy, Clusters: []int{9}})
	if ipc.CodeOf(err) != ipc.CodeBadFrame {
		t.Fatalf("cluster 9: got %v", err)
	}
	_ = before
}

func TestReclusteringUnderLoad(t *testing.T) {
	cfg := deployConfig(t)
	cfg.Topology = config.Topology{TotalShards: 16, ShardsPerCluster: 4}
	e := startFromFile(t, cfg)
	before := e.WaitReady()
	c := e.client("deployer")
	// Guild targets: they must follow the new shard count from the switch on.
	l := startLoad(t, e, 8, func(i int) string { return "guild:" + strconv.FormatUint(uint64(i%97)<<22|uint64(i), 10) })
	time.Sleep(100 * time.Millisecond)
	if _, err := e.redeploy(c, func(n *config.Config) {
		n.Topology = config.Topology{TotalShards: 24, ShardsPerCluster: 8}
	}, nil, 0); err != nil {
		t.Fatal(err)
	}
	st := e.waitDeploy(20 * time.Second)
	time.Sleep(100 * time.Millisecond)
	l.finish(t)
	if st.Deploy.State != generation.StateSucceeded {
		t.Fatalf("deploy %s: %s", st.Deploy.State, st.Deploy.Reason)
	}
	now := e.WaitReady()
	if now.Topology != (generation.Topology{Total: 24, PerCluster: 8}) || len(now.Clusters) != 3 {
		t.Fatalf("topology after re-clustering: %+v with %d clusters", now.Topology, len(now.Clusters))
	}
	for _, cs := range before.Clusters {
		if alive(cs.PID) {
			t.Errorf("old cluster %d pid %d alive", cs.ID, cs.PID)
		}
	}
	// guild:(5<<22) is shard 5 of 24 → cluster 0; shard 20 → cluster 2.
	for guild, want := range map[uint64]int{5 << 22: 0, 20 << 22: 2} {
		r, err := request(t, c, "guild.info", "guild:"+strconv.FormatUint(guild, 10), map[string]string{"guild_id": strconv.FormatUint(guild, 10)}, 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var gi struct {
			Shard   int  `json:"shard"`
			Cluster int  `json:"cluster"`
			Owned   bool `json:"owned"`
		}
		json.Unmarshal(r.Payload, &gi)
		if gi.Cluster != want || !gi.Owned {
			t.Errorf("guild %d: %s, want cluster %d owning it", guild, r.Payload, want)
		}
	}
}

// A manager stopped in the middle of a deploy aborts it and still stops every
// process, old and new, within its shutdown bound.
func TestShutdownMidDeploy(t *testing.T) {
	cfg := deployConfig(t)
	e := startFromFile(t, cfg)
	before := e.WaitReady()
	c := e.client("deployer")
	if _, err := e.redeploy(c, func(n *config.Config) {
		n.Cluster.Env = map[string]string{"SM_HARNESS_FLAGS": "--connect-delay=200ms"}
	}, nil, 2); err != nil {
		t.Fatal(err)
	}
	var mid manager.Status
	testenv.WaitFor(t, 10*time.Second, "deploy under way", func() bool {
		mid = e.MustStatus()
		return mid.Deploy != nil && mid.Deploy.Clusters[0].Phase != generation.PhasePending
	})
	var pids []int
	for _, cs := range mid.Deploy.Clusters {
		if cs.New != nil {
			for _, p := range before.Clusters {
				pids = append(pids, p.PID)
			}
		}
	}
	start := time.Now()
	e.Stop()
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("shutdown mid-deploy took %v", took)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("pid %d alive after shutdown", pid)
		}
	}
}
