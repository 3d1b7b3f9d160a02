package manager_test

import (
	"encoding/json"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/testenv"
)

func alive(pid int) bool {
	// A zombie still answers kill(0); only a reaped process is gone.
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	return err == nil && !containsState(stat, 'Z')
}

func containsState(stat []byte, state byte) bool {
	for i := len(stat) - 1; i > 0; i-- {
		if stat[i] == ')' {
			return i+2 < len(stat) && stat[i+2] == state
		}
	}
	return false
}

func TestKilledClusterIsRespawnedAndActivated(t *testing.T) {
	e := start(t, testConfig(t))
	st := e.WaitReady()
	c := e.client("t")
	old := st.Clusters[3].PID
	now := e.killAndRespawn(3, old)
	if r := e.MustStatus().Clusters[3].Restarts; r != 1 {
		t.Fatalf("%d restarts counted for one respawn", r)
	}
	if alive(old) {
		t.Fatalf("old pid %d still alive", old)
	}
	r, err := request(t, c, "stats", "3", nil, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var stats struct {
		Active bool `json:"active"`
	}
	json.Unmarshal(r.Payload, &stats)
	if !stats.Active {
		t.Fatalf("respawned cluster (pid %d) was not ACTIVATEd: %s", now, r.Payload)
	}
	// A respawn keeps the cluster's generation.
	if g := e.MustStatus().Clusters[3].Generation; g != st.Clusters[3].Generation {
		t.Fatalf("generation changed on respawn: %d → %d", st.Clusters[3].Generation, g)
	}
}

// A crash loop is visible in STATUS while it retries. How long each retry
// waits, and when it is a crash loop, are supervise.Cluster's decisions,
// tested there without processes or sleeps.
func TestCrashLoopIsVisible(t *testing.T) {
	cfg := testConfig(t)
	cfg.Restart.Intensity = 3
	cfg.Restart.Period = durationOf(time.Minute)
	cfg.Restart.BackoffMin = durationOf(20 * time.Millisecond)
	cfg.Restart.BackoffMax = durationOf(400 * time.Millisecond)
	cfg.Restart.Jitter = 0
	cfg.Cluster.Env = map[string]string{"SM_HARNESS_FLAGS_1": "--exit-on-start=3"}
	e := start(t, cfg)
	testenv.WaitFor(t, 15*time.Second, "cluster 1 in crash loop", func() bool {
		cs := e.MustStatus().Clusters[1]
		return cs.CrashLoop && cs.State == "crash_loop" && cs.Restarts > 3 && cs.RestartInMS > 0
	})
	if cs := e.MustStatus().Clusters[1]; cs.LastExit == "" {
		t.Error("last exit not reported")
	}
	// The other clusters are untouched.
	for _, i := range []int{0, 2, 3} {
		if c := e.MustStatus().Clusters[i]; c.Restarts != 0 || c.State != "ready" {
			t.Errorf("cluster %d disturbed: %+v", i, c)
		}
	}
}

func TestHungClusterIsKilledAndReplaced(t *testing.T) {
	cfg := testConfig(t)
	cfg.Cluster.Env = map[string]string{"SM_HARNESS_FLAGS_2": "--hang-after=300ms"}
	e := start(t, cfg)
	var first int
	testenv.WaitFor(t, 10*time.Second, "cluster 2 started", func() bool {
		first = e.MustStatus().Clusters[2].PID
		return first != 0
	})
	testenv.WaitFor(t, 10*time.Second, "hung cluster 2 replaced", func() bool {
		cs := e.MustStatus().Clusters[2]
		return cs.PID != 0 && cs.PID != first && cs.Restarts >= 1
	})
	testenv.WaitFor(t, 5*time.Second, "hung process reaped", func() bool { return !alive(first) })
}

func TestShutdownStopsEveryCluster(t *testing.T) {
	cfg := testConfig(t)
	// One cluster ignores QUIESCE and SIGTERM: shutdown must still end it.
	cfg.Cluster.Env = map[string]string{"SM_HARNESS_FLAGS_0": "--ignore-quiesce"}
	cfg.Shutdown.Timeout = durationOf(500 * time.Millisecond)
	cfg.Restart.StopGrace = durationOf(200 * time.Millisecond)
	e := start(t, cfg)
	st := e.WaitReady()
	e.Stop()
	for _, c := range st.Clusters {
		if alive(c.PID) {
			t.Errorf("cluster %d pid %d alive after shutdown", c.ID, c.PID)
		}
	}
	if _, err := os.Stat(cfg.Socket); err != nil {
		t.Logf("socket removed by caller: %v", err)
	}
}
