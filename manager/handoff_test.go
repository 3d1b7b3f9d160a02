package manager_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
)

// botActivations is the ACTIVATE frames pid got, as it got them.
func botActivations(t *testing.T, dir string, pid int) []string {
	t.Helper()
	var out []string
	for _, r := range botRecords(t, dir, ".act") {
		if r.PID == pid {
			out = append(out, string(r.Raw))
		}
	}
	return out
}

// waitActivations waits until pid has been sent an ACTIVATE and returns them.
func waitActivations(t *testing.T, dir string, pid int) []string {
	t.Helper()
	var acts []string
	testenv.WaitFor(t, 10*time.Second, "ACTIVATE recorded", func() bool {
		acts = botActivations(t, dir, pid)
		return len(acts) > 0
	})
	return acts
}

// A deploy's old process leaves a handoff in its QUIESCED; the new process
// gets it on its ACTIVATE, byte for byte, once. ACTIVATEs that follow no
// handoff (a first start, a respawn after a crash) carry none, and a handoff
// over limits.max_handoff_bytes, or not an object, is dropped.
func TestDeployHandoff(t *testing.T) {
	cfg, dir := testbotConfig(t, nil)
	cfg.Limits.MaxHandoffBytes = 200
	e := startFromFile(t, cfg)
	st := e.WaitReady()
	for i, cs := range st.Clusters {
		if acts := waitActivations(t, dir, cs.PID); len(acts) != 1 || acts[0] != `{"op":"ACTIVATE"}` {
			t.Fatalf("cluster %d's first start was activated with %q", i, acts)
		}
	}
	c := e.client("deployer")
	setHandoff := func(cluster, h string) {
		t.Helper()
		if r, err := request(t, c, "handoff", cluster, []byte(h), 5*time.Second); err != nil || string(r.Payload) != `{"ok":true}` {
			t.Fatalf("handoff to %s: %v %v", cluster, r, err)
		}
	}
	deploy := func(clusters ...int) {
		t.Helper()
		if _, err := e.redeploy(c, func(n *config.Config) { n.Cluster.Env = map[string]string{testbotDirEnv: dir} }, clusters, len(clusters)); err != nil {
			t.Fatal(err)
		}
		if dst := e.waitDeploy(20 * time.Second); dst.Deploy.State != "succeeded" {
			t.Fatalf("deploy of %v: %s %s", clusters, dst.Deploy.State, dst.Deploy.Reason)
		}
	}

	// Odd spacing and an escape: the manager must not re-encode it.
	handoff := `{"v":1, "shards":{"2":{"last":["9f1c0a", "00aa"]}} ,"n":"\u00e9"}`
	setHandoff("1", handoff)
	deploy(1)
	next := e.MustStatus().Clusters[1]
	if next.Generation != 2 || !next.Activated {
		t.Fatalf("cluster 1 after the deploy: %+v", next)
	}
	if acts := waitActivations(t, dir, next.PID); len(acts) != 1 || acts[0] != `{"op":"ACTIVATE","handoff":`+handoff+`}` {
		t.Fatalf("the new process was activated with %q, want the old one's handoff byte for byte", acts)
	}

	// Consumed once: the respawn after a crash gets none.
	syscall.Kill(next.PID, syscall.SIGKILL)
	var respawn int
	testenv.WaitFor(t, 10*time.Second, "cluster 1 respawned and activated", func() bool {
		cs := e.MustStatus().Clusters[1]
		respawn = cs.PID
		return cs.PID != next.PID && cs.Activated
	})
	if acts := waitActivations(t, dir, respawn); len(acts) != 1 || acts[0] != `{"op":"ACTIVATE"}` {
		t.Fatalf("the respawn was activated with %q, want no handoff", acts)
	}

	// Too large, and not an object: dropped; the deploy goes on.
	setHandoff("2", `{"big":"`+strings.Repeat("x", 200)+`"}`)
	setHandoff("3", `["not","an","object"]`)
	deploy(2, 3)
	after := e.MustStatus()
	for _, i := range []int{2, 3} {
		if acts := waitActivations(t, dir, after.Clusters[i].PID); len(acts) != 1 || acts[0] != `{"op":"ACTIVATE"}` {
			t.Errorf("cluster %d's new process was activated with %q, want no handoff", i, acts)
		}
	}
}

// A handoff the manager holds when it dies is in its state file: the next
// manager puts it on the ACTIVATE it sends once the old process is gone.
func TestHandoffSurvivesManagerRestart(t *testing.T) {
	cfg, dir := testbotConfig(t, nil)
	cfg.State.AdoptWindow = durationOf(3 * time.Second)
	cfg.Deploy.QuiesceTimeout = durationOf(time.Minute) // the old process lingers after QUIESCED
	// Cluster 1's first process sends QUIESCED with a handoff and stays.
	cfg.Cluster.Env[testbotLingerEnv] = "1"
	handoff := `{"v":1,"shards":{"2":{"last":["a"]},"3":{"last":[]}}}`
	cfg.Cluster.Env[testbotHandoffEnv] = handoff
	testenv.WriteConfig(t, cfg)
	m1 := runManager(t, cfg.Path, "manager-1.log")
	c, before := watch(t, cfg.Socket, "w")
	next := *cfg
	next.Cluster.Env = map[string]string{testbotDirEnv: dir}
	testenv.WriteConfig(t, &next)
	if _, err := c.Request(t.Context(), &ipc.Frame{Op: ipc.OpDeploy, Clusters: []int{1}}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the handoff in the state file", func() bool {
		b, err := os.ReadFile(filepath.Join(cfg.State.Dir, "manager-state.json"))
		return err == nil && strings.Contains(string(b), `"handoffs"`)
	})
	st, _ := statusVia(t, c)
	newPID := st.Clusters[1].PID
	if st.Clusters[1].Generation != 2 || st.Clusters[1].Activated || !alive(before.Clusters[1].PID) {
		t.Fatalf("cluster 1 before the kill: %+v; want generation 2 routed, not yet activated, the old one alive", st.Clusters[1])
	}
	m1.kill()
	// The next manager quiesces the old process again (it sends no second
	// handoff), stops it at the timeout, then activates generation 2.
	next.Deploy.QuiesceTimeout = durationOf(500 * time.Millisecond)
	testenv.WriteConfig(t, &next)
	runManager(t, cfg.Path, "manager-2.log")
	acts := waitActivations(t, dir, newPID)
	if len(acts) != 1 || acts[0] != `{"op":"ACTIVATE","handoff":`+handoff+`}` {
		t.Fatalf("generation 2 was activated with %q, want the handoff from before the restart", acts)
	}
	if alive(before.Clusters[1].PID) {
		t.Fatal("generation 2 was activated while the old process still ran")
	}
}

// The QUIESCED and the exit that follows reach the manager's loop by
// different paths, and the exit may come first: here it always does (the old
// process exits, and a process it handed its connection to writes the
// QUIESCED 200 ms later). The new process's ACTIVATE waits until the old
// connection has been read to its end, and so carries the handoff.
func TestHandoffThatArrivesAfterTheExit(t *testing.T) {
	handoff := `{"v":1,"late":true}`
	cfg, dir := testbotConfig(t, map[string]string{testbotLateEnv: "1", testbotHandoffEnv: handoff})
	e := startFromFile(t, cfg)
	before := e.WaitReady()
	c := e.client("deployer")
	if _, err := e.redeploy(c, func(n *config.Config) { n.Cluster.Env = map[string]string{testbotDirEnv: dir} }, []int{1}, 1); err != nil {
		t.Fatal(err)
	}
	if dst := e.waitDeploy(20 * time.Second); dst.Deploy.State != "succeeded" {
		t.Fatalf("deploy: %s %s", dst.Deploy.State, dst.Deploy.Reason)
	}
	next := e.MustStatus().Clusters[1]
	if next.PID == before.Clusters[1].PID {
		t.Fatal("cluster 1 was not replaced")
	}
	if acts := waitActivations(t, dir, next.PID); len(acts) != 1 || acts[0] != `{"op":"ACTIVATE","handoff":`+handoff+`}` {
		t.Fatalf("the new process was activated with %q, want the handoff that came after the old one's exit", acts)
	}
}
