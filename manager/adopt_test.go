package manager_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/manager"
)

// managerProcess runs sm-manager as a child process, so it can be SIGKILLed.
type managerProcess struct {
	t    *testing.T
	cmd  *exec.Cmd
	done chan struct{}
}

func runManager(t *testing.T, cfgPath, logName string) *managerProcess {
	t.Helper()
	logf, err := os.Create(filepath.Join(t.TempDir(), logName))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testenv.Bin("sm-manager"), "-config", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	mp := &managerProcess{t: t, cmd: cmd, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		logf.Close()
		close(mp.done)
	}()
	t.Cleanup(func() {
		mp.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-mp.done:
		case <-time.After(20 * time.Second):
			mp.cmd.Process.Kill()
			t.Error("manager did not stop on SIGTERM")
		}
		if t.Failed() {
			b, err := os.ReadFile(logf.Name())
			t.Logf("%s (%v):\n%s", logName, err, b)
		}
	})
	return mp
}

func (mp *managerProcess) kill() {
	mp.cmd.Process.Signal(syscall.SIGKILL)
	<-mp.done
}

// watch dials the manager at socket, once it is up, as a reconnecting client
// named name, and waits until it routes every cluster; it returns the client
// (closed when the test ends, if not before) and the status that showed it.
func watch(t *testing.T, socket, name string) (*ipc.Client, manager.Status) {
	t.Helper()
	var c *ipc.Client
	testenv.WaitFor(t, 10*time.Second, "manager up", func() bool {
		var err error
		c, err = ipc.Dial(t.Context(), ipc.ClientConfig{Path: socket, Register: ipc.Frame{Role: ipc.RoleClient, Name: name}, Reconnect: true})
		return err == nil
	})
	t.Cleanup(func() { c.Close() })
	var st manager.Status
	testenv.WaitFor(t, 10*time.Second, "manager ready", func() bool {
		var ok bool
		st, ok = statusVia(t, c)
		return ok && allRouted(st)
	})
	return c, st
}

// statusVia asks a manager for its status over the socket.
func statusVia(t *testing.T, c *ipc.Client) (manager.Status, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, err := c.Request(ctx, &ipc.Frame{Op: ipc.OpStatus})
	if err != nil {
		return manager.Status{}, false
	}
	var st manager.Status
	if err := json.Unmarshal(r.Payload, &st); err != nil {
		t.Fatal(err)
	}
	return st, true
}

func allRouted(st manager.Status) bool {
	for _, c := range st.Clusters {
		if !c.Routed || c.State != "ready" {
			return false
		}
	}
	return len(st.Clusters) > 0
}

// A SIGKILLed manager's clusters keep running; the next manager re-adopts
// them all, routes as before, and refuses an impostor meanwhile.
func TestManagerKillReadoption(t *testing.T) {
	cfg := deployConfig(t)
	cfg.State.AdoptWindow = durationOf(5 * time.Second)
	testenv.WriteConfig(t, cfg)
	m1 := runManager(t, cfg.Path, "manager-1.log")
	c, before := watch(t, cfg.Socket, "watch")
	defer c.Close()
	l := startLoadAt(t, cfg.Socket, 8, clusterTarget(4))
	time.Sleep(200 * time.Millisecond)

	m1.kill()
	for _, cs := range before.Clusters {
		if !alive(cs.PID) {
			t.Fatalf("cluster %d died with the manager", cs.ID)
		}
	}
	start := time.Now()
	runManager(t, cfg.Path, "manager-2.log")

	// An impostor claiming cluster 0 during the adopt window is refused.
	testenv.WaitFor(t, 5*time.Second, "new manager listening", func() bool {
		rc, err := ipc.Dial(t.Context(), ipc.ClientConfig{Path: cfg.Socket, Register: ipc.Frame{Role: ipc.RoleClient, Name: "probe"}})
		if err == nil {
			rc.Close()
		}
		return err == nil
	})
	_, err := ipc.Dial(t.Context(), ipc.ClientConfig{Path: cfg.Socket, Register: ipc.Frame{
		Role: ipc.RoleCluster, Cluster: ipc.Int(0), Generation: ipc.Int64(1), Token: "forged", PID: os.Getpid(),
	}})
	if ipc.CodeOf(err) != ipc.CodeForbidden {
		t.Fatalf("forged REGISTER: got %v, want forbidden", err)
	}

	var after manager.Status
	testenv.WaitFor(t, 10*time.Second, "clusters re-adopted", func() bool {
		st, ok := statusVia(t, c)
		after = st
		return ok && allRouted(st)
	})
	adoptTime := time.Since(start)
	time.Sleep(200 * time.Millisecond)
	l.end(t)
	for i, cs := range after.Clusters {
		if cs.PID != before.Clusters[i].PID {
			t.Errorf("cluster %d restarted: pid %d → %d", i, before.Clusters[i].PID, cs.PID)
		}
		if cs.Restarts != 0 {
			t.Errorf("cluster %d counts %d restarts", i, cs.Restarts)
		}
	}
	// Only requests in flight at the kill may fail (8 workers, one each), and
	// only with unavailable; nothing is duplicated.
	failed := 0
	for code, n := range l.errs {
		if code != ipc.CodeUnavailable {
			t.Errorf("%d requests failed with %s", n, code)
		}
		failed += n
	}
	if failed > 8 || l.dup.Load() > 0 || l.badEcho > 0 {
		t.Fatalf("failed %d (max 8 in flight), duplicates %d, bad echoes %d", failed, l.dup.Load(), l.badEcho)
	}
	t.Logf("re-adopted 4 clusters %v after the new manager started; %d requests failed at the kill", adoptTime.Round(time.Millisecond), failed)
}

// A manager killed in the middle of a deploy, after cluster 1's routing moved
// to generation 2 but before the old process exited, comes back routing
// generation 2, stops the old process, and only then ACTIVATEs the new one.
func TestManagerKillMidDeploy(t *testing.T) {
	cfg := deployConfig(t)
	cfg.State.AdoptWindow = durationOf(3 * time.Second)
	cfg.Deploy.QuiesceTimeout = durationOf(30 * time.Second) // the old one lingers
	cfg.Restart.StopGrace = durationOf(300 * time.Millisecond)
	cfg.Cluster.Env = map[string]string{"SM_HARNESS_FLAGS_1": "--ignore-quiesce"}
	testenv.WriteConfig(t, cfg)
	m1 := runManager(t, cfg.Path, "manager-1.log")
	c, before := watch(t, cfg.Socket, "d")
	defer c.Close()
	// Generation 2 keeps no per-cluster flags: it quiesces normally.
	next := *cfg
	next.Cluster.Env = map[string]string{}
	testenv.WriteConfig(t, &next)
	if _, err := c.Request(t.Context(), &ipc.Frame{Op: ipc.OpDeploy, Clusters: []int{1}}); err != nil {
		t.Fatal(err)
	}
	var mid manager.Status
	testenv.WaitFor(t, 10*time.Second, "cluster 1 switched to generation 2", func() bool {
		st, ok := statusVia(t, c)
		mid = st
		return ok && st.Clusters[1].Generation == 2 && st.Clusters[1].Routed
	})
	newPID := mid.Clusters[1].PID
	oldPID := before.Clusters[1].PID
	if !alive(oldPID) {
		t.Fatal("old process already gone; the test needs it lingering")
	}
	m1.kill()
	// The next manager bounds the quiesce it sends the stale survivor.
	next.Deploy.QuiesceTimeout = durationOf(500 * time.Millisecond)
	testenv.WriteConfig(t, &next)
	runManager(t, cfg.Path, "manager-2.log")
	var after manager.Status
	defer func() {
		if t.Failed() {
			for _, cs := range after.Clusters {
				cs.Heartbeat = nil
				b, _ := json.Marshal(cs)
				t.Logf("at the end: %s", b)
			}
		}
	}()
	testenv.WaitFor(t, 15*time.Second, "generation 2 routed and activated, old gone", func() bool {
		st, ok := statusVia(t, c)
		after = st
		return ok && allRouted(st) && st.Clusters[1].Activated && !alive(oldPID)
	})
	if after.Clusters[1].PID != newPID || after.Clusters[1].Generation != 2 {
		t.Fatalf("cluster 1 is %+v, want the generation 2 process %d", after.Clusters[1], newPID)
	}
	for _, i := range []int{0, 2, 3} {
		if after.Clusters[i].PID != before.Clusters[i].PID {
			t.Errorf("cluster %d restarted", i)
		}
	}
}

// A cluster that dies while the manager is down is replaced by the next
// manager, and the replacement resumes its shards from the resume state the
// first manager wrote behind: no identify spent.
func TestResumeAcrossManagerRestart(t *testing.T) {
	cfg := deployConfig(t)
	cfg.State.AdoptWindow = durationOf(time.Second)
	testenv.WriteConfig(t, cfg)
	m1 := runManager(t, cfg.Path, "manager-1.log")
	c, before := watch(t, cfg.Socket, "r")
	defer c.Close()
	time.Sleep(1500 * time.Millisecond) // resume state is written once a second
	m1.kill()
	syscall.Kill(before.Clusters[2].PID, syscall.SIGKILL)
	runManager(t, cfg.Path, "manager-2.log")
	var after manager.Status
	testenv.WaitFor(t, 10*time.Second, "cluster 2 replaced", func() bool {
		st, ok := statusVia(t, c)
		after = st
		return ok && allRouted(st) && st.Clusters[2].PID != before.Clusters[2].PID
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	r, err := c.Request(ctx, &ipc.Frame{Op: "stats", Target: "2"})
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Identifies int `json:"identifies"`
		Resumes    int `json:"resumes"`
	}
	json.Unmarshal(r.Payload, &s)
	if s.Resumes != 2 || s.Identifies != 0 {
		t.Fatalf("replacement after a manager restart: %d resumes, %d identifies; want 2, 0", s.Resumes, s.Identifies)
	}
	if after.Discord.IdentifyGranted != 0 {
		t.Fatalf("the new manager granted %d identifies", after.Discord.IdentifyGranted)
	}
}

// What a process is told at REGISTER about how it was started survives a
// manager restart, and so does what it may claim: every survivor re-registers
// with the start kind it was spawned with (the state file records it), a
// survivor that is no longer its cluster's process (a deploy's new generation
// while the old one still serves) gets no resume state, and neither does a
// deploy's new generation that has become its cluster's process (its old one
// died while no manager ran): it was spawned to open sessions of its own.
func TestSurvivorsKeepStartKindAndClaimNoSessions(t *testing.T) {
	cfg, dir := testbotConfig(t, map[string]string{testbotResumeEnv: "1"})
	cfg.State.AdoptWindow = durationOf(3 * time.Second)
	cfg.Deploy.ReadyTimeout = durationOf(time.Minute)
	testenv.WriteConfig(t, cfg)
	m1 := runManager(t, cfg.Path, "manager-1.log")
	c, before := watch(t, cfg.Socket, "w")

	// Cluster 1's process is replaced once: a respawn.
	syscall.Kill(before.Clusters[1].PID, syscall.SIGKILL)
	var respawn int
	testenv.WaitFor(t, 10*time.Second, "cluster 1 respawned", func() bool {
		st, ok := statusVia(t, c)
		respawn = st.Clusters[1].PID
		return ok && respawn != before.Clusters[1].PID && allRouted(st)
	})
	// A deploy of clusters 2 and 3 whose new processes never get ready.
	next := *cfg
	next.Cluster.Env = map[string]string{testbotDirEnv: dir, testbotResumeEnv: "1", testbotUnreadyEnv: "1"}
	testenv.WriteConfig(t, &next)
	if _, err := c.Request(t.Context(), &ipc.Frame{Op: ipc.OpDeploy, Clusters: []int{2, 3}, MaxParallel: 2}); err != nil {
		t.Fatal(err)
	}
	cand := map[int]int{} // cluster → its candidate's pid
	testenv.WaitFor(t, 10*time.Second, "both candidates registered", func() bool {
		for _, r := range botRecords(t, dir, ".reg") {
			if r.Gen == 2 {
				cand[r.Cluster] = r.PID
			}
		}
		return len(cand) == 2
	})
	time.Sleep(1500 * time.Millisecond) // the resume file is written once a second
	m1.kill()
	// Cluster 3's old process dies while no manager runs: its candidate is
	// all the cluster has left.
	syscall.Kill(before.Clusters[3].PID, syscall.SIGKILL)
	runManager(t, cfg.Path, "manager-2.log")

	second := func(pid int) botRegistration {
		t.Helper()
		return waitRegs(t, dir, pid, 2)[1]
	}
	for pid, want := range map[int]string{
		before.Clusters[0].PID: "first", respawn: "respawn", before.Clusters[2].PID: "first",
		cand[2]: "candidate", cand[3]: "candidate",
	} {
		regs := waitRegs(t, dir, pid, 2)
		if regs[0].Start != want || regs[1].Start != want {
			t.Errorf("pid %d registered as %q, then %q after the restart; want %q both times", pid, regs[0].Start, regs[1].Start, want)
		}
	}
	// The processes that serve are handed their sessions back, under 8 shards.
	for _, pid := range []int{respawn, before.Clusters[2].PID} {
		if rs := resumeEntries(t, second(pid)); len(rs) != 2 || rs[0].ShardCount != 8 {
			t.Errorf("serving survivor %d re-registered with resume %+v, want its 2 sessions", pid, rs)
		}
	}
	// The stale candidate claims nothing and is sent away.
	if r := second(cand[2]); len(r.Resume) != 0 || r.Active {
		t.Errorf("stale candidate of cluster 2 re-registered with resume %s (active %v): state it must not act on", r.Resume, r.Active)
	}
	testenv.WaitFor(t, 10*time.Second, "the stale candidate quiesced and gone", func() bool { return !alive(cand[2]) })
	// Nor does the candidate now in charge of cluster 3 resume the dead
	// process's sessions: it opens its own.
	if r := second(cand[3]); len(r.Resume) != 0 {
		t.Errorf("cluster 3's candidate re-registered with resume %s", r.Resume)
	}
	if !alive(cand[3]) {
		t.Error("cluster 3's candidate, its only process, is gone")
	}
}

// A survivor that was still connecting its shards when the manager died
// finishes them under the next manager: it asks with the reason it was
// spawned with (a first start, recorded in the state file), so even with the
// session-start budget below the floor, where restarts are refused, its last
// shard is granted and it becomes ready, the same process.
func TestSurvivorStillConnectingIdentifiesAfterRestart(t *testing.T) {
	cfg := testConfig(t)
	cfg.Topology = config.Topology{TotalShards: 2, ShardsPerCluster: 1}
	cfg.Discord.IdentifySpacing = durationOf(time.Hour) // shard 1 waits behind shard 0
	cfg.State.AdoptWindow = durationOf(3 * time.Second)
	testenv.WriteConfig(t, cfg)
	m1 := runManager(t, cfg.Path, "manager-1.log")
	var c *ipc.Client
	testenv.WaitFor(t, 10*time.Second, "manager up", func() bool {
		var err error
		c, err = ipc.Dial(t.Context(), ipc.ClientConfig{Path: cfg.Socket, Register: ipc.Frame{Role: ipc.RoleClient, Name: "w"}})
		return err == nil
	})
	var before manager.Status
	waiter := -1 // whichever cluster registered second waits an hour for its slot
	testenv.WaitFor(t, 10*time.Second, "one cluster ready, the other's shard waiting for its slot", func() bool {
		st, ok := statusVia(t, c)
		before = st
		if !ok || st.Discord.IdentifyWaiting != 1 {
			return false
		}
		for i := range 2 {
			if st.Clusters[1-i].Routed && st.Clusters[i].State == "registered" {
				waiter = i
				return true
			}
		}
		return false
	})
	c.Close()
	m1.kill()

	// The next manager has a token: 50 session starts left, floor 100.
	next := *cfg
	next.Discord.IdentifySpacing = durationOf(time.Millisecond)
	e := startFromFileWith(t, &next, manager.Options{Gateway: gatewayBot(2, 50, 1)})
	var after manager.Status
	testenv.WaitFor(t, 15*time.Second, "the survivor's last shard identified: its cluster ready", func() bool {
		after = e.MustStatus()
		return after.Clusters[waiter].Routed && after.Clusters[waiter].State == "ready"
	})
	for i := range 2 {
		if after.Clusters[i].PID != before.Clusters[i].PID {
			t.Errorf("cluster %d was replaced (pid %d → %d), not re-adopted", i, before.Clusters[i].PID, after.Clusters[i].PID)
		}
	}
	if s := e.simStats(strconv.Itoa(waiter)); s.Identifies != 1 || s.Resumes != 0 {
		t.Errorf("cluster %d: %d identifies, %d resumes; want its one shard identified", waiter, s.Identifies, s.Resumes)
	}
	if b := after.Discord.Budget; b.Remaining != 49 || after.Discord.IdentifyGranted != 1 {
		t.Errorf("budget after the survivor's identify: %+v, %d granted", b, after.Discord.IdentifyGranted)
	}
}
