package manager_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/supervise"
)

// TestStateFileNamingAnotherProcess: a state file that names a process which
// is not a cluster (here a child of the test in the test's own process group,
// with its real start time) must not make the manager adopt it, and so never
// signal it or its group when it does not register: the manager starts the
// cluster afresh and the process is untouched.
func TestStateFileNamingAnotherProcess(t *testing.T) {
	t.Parallel()
	pid := testenv.Sleeper(t, false).Process.Pid
	startTime, err := supervise.StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}

	cfg := testConfig(t)
	cfg.Topology.TotalShards, cfg.Topology.ShardsPerCluster = 2, 2
	cfg.State.AdoptWindow = durationOf(200 * time.Millisecond)
	writeState(t, cfg.State.Dir, map[string]any{
		"version": 1, "manager_pid": 1, "written": time.Now(), "generation": 1,
		"topology": map[string]int{"total_shards": 2, "shards_per_cluster": 2}, "slot_generations": []int64{1},
		"specs": map[string]any{"1": map[string]any{"argv": cfg.Cluster.Command}},
		"procs": []map[string]any{{
			"cluster": 0, "generation": 1, "pid": pid, "start_time": startTime, "token_sha256": strings.Repeat("0", 64),
			"topology": map[string]int{"total_shards": 2, "shards_per_cluster": 2}, "shard_first": 0, "shard_last": 1,
			"routed": true, "activated": true,
		}},
	})
	e := start(t, cfg)
	st := e.WaitReady(0)
	if got := st.Clusters[0].PID; got == pid {
		t.Fatalf("cluster 0 is served by the bystander %d", pid)
	}
	// The window has closed and cluster 0 runs a process of its own: had the
	// bystander been adopted, it would have been stopped by now.
	if state := procState(pid); state == "Z" || state == "" {
		t.Errorf("bystander %d was signalled (state %q)", pid, state)
	}
}

// writeState writes v as the manager's state file in dir.
func writeState(t *testing.T, dir string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "manager-state.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// procState is pid's state letter ("Z" for a zombie), or "" if it is gone.
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	if f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]); len(f) > 0 {
		return f[0]
	}
	return ""
}
