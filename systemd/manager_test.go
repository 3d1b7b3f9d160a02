package systemd_test

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/manager"
	"github.com/sm-supervisor/sm/supervise"
	"github.com/sm-supervisor/sm/systemd"
)

// gatedSpawner spawns real processes, but can be made to block in Spawn. The
// manager spawns on its event loop, so a blocked Spawn wedges the loop exactly
// as a bug would: nothing else it owns moves until Spawn returns.
type gatedSpawner struct {
	supervise.ExecSpawner
	mu      sync.Mutex
	gate    chan struct{} // nil: spawn at once
	blocked chan struct{} // gets a value when a Spawn starts waiting
}

func (g *gatedSpawner) Spawn(spec supervise.Spec) (supervise.Process, error) {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		g.blocked <- struct{}{}
		<-gate
	}
	return g.ExecSpawner.Spawn(spec)
}

func (g *gatedSpawner) close() {
	g.mu.Lock()
	g.gate = make(chan struct{})
	g.mu.Unlock()
}

func (g *gatedSpawner) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gate != nil {
		close(g.gate)
		g.gate = nil
	}
}

// TestReportOnRealManager runs a real manager over real cluster processes and
// checks what a service manager hears: READY=1 once the socket serves, STATUS
// as the clusters come up, pings at half the watchdog timeout, none while the
// event loop is wedged, and STOPPING=1 at shutdown.
func TestReportOnRealManager(t *testing.T) {
	sd := newFakeSD(t)
	cfg := testConfig(shortDir(t))
	sp := &gatedSpawner{blocked: make(chan struct{}, 1)}
	m, err := manager.New(manager.Options{Config: cfg, Logger: testLogger(t), Spawner: sp})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := systemd.ListenIPC(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	// WATCHDOG_USEC=1s: a real manager under -race on a shared 2-core machine
	// must not miss a tighter rate for reasons that are not the test's.
	n := systemd.NewNotifier(sd.path, time.Second, testLogger(t))
	n.StatusEvery = 50 * time.Millisecond
	stopping, stop := context.WithCancel(context.Background()) // SIGTERM
	end := n.Start(stopping, m)
	runDone := make(chan error, 1)
	go func() { runDone <- m.Run(stopping, ln) }()
	stopped := false
	shutdown := func() {
		if stopped {
			return
		}
		stopped = true
		sp.open()
		stop()
		select {
		case err := <-runDone:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("manager did not stop")
		}
		end()
	}
	t.Cleanup(shutdown)

	// READY=1: the socket serves as soon as it is said.
	i, ready := sd.waitMsg(0, 10*time.Second, "READY=1", func(m sdMsg) bool { return m.has("READY=1") })
	echoAll(t, cfg.Socket, 4)
	t.Logf("READY=1 with STATUS=%q", ready.vars["STATUS"])
	sd.waitMsg(i, 10*time.Second, "STATUS 4/4 ready", func(m sdMsg) bool {
		return m.has("STATUS=4/4 clusters ready, generation 1")
	})

	// Pings every 500ms while the loop turns.
	from := time.Now()
	time.Sleep(3 * time.Second)
	pings := sd.pings(from, time.Now())
	if len(pings) < 5 || len(pings) > 7 {
		t.Errorf("%d pings in 3s at a 500ms period", len(pings))
	}
	checkPingRate(t, from, pings, 500*time.Millisecond, time.Second)

	// Wedge the loop: kill a cluster; the loop respawns it, and Spawn blocks.
	st, err := m.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sp.close()
	if err := syscall.Kill(st.Clusters[1].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sp.blocked:
	case <-time.After(5 * time.Second):
		t.Fatal("the manager never respawned the killed cluster")
	}
	wedgedAt := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	if _, err := m.Status(ctx); err == nil {
		t.Fatal("Status answered while the loop was in Spawn: the loop is not wedged")
	}
	cancel()
	time.Sleep(3500 * time.Millisecond) // 3.5 watchdog timeouts
	if p := sd.pings(wedgedAt.Add(50*time.Millisecond), time.Now()); len(p) > 0 {
		t.Fatalf("%d pings while the loop was wedged", len(p))
	}

	sp.open()
	unwedgedAt := time.Now()
	_, m1 := sd.waitMsg(0, 2*time.Second, "a ping once the loop turns again", func(m sdMsg) bool {
		return m.has("WATCHDOG=1") && m.at.After(unwedgedAt)
	})
	if d := m1.at.Sub(unwedgedAt); d > 750*time.Millisecond {
		t.Errorf("pings resumed %v after the loop did", d)
	}
	sd.waitMsg(0, 10*time.Second, "STATUS 4/4 ready after the respawn", func(m sdMsg) bool {
		return m.has("STATUS=4/4 clusters ready, generation 1") && m.at.After(unwedgedAt)
	})

	// SIGTERM: STOPPING=1, and the manager stops every cluster.
	stopAt := time.Now()
	shutdown()
	j, _ := sd.waitMsg(0, time.Second, "STOPPING=1", func(m sdMsg) bool { return m.has("STOPPING=1") })
	if sd.all()[j].at.Before(stopAt) {
		t.Fatal("STOPPING=1 before the stop")
	}
	readies := 0
	for _, m := range sd.all() {
		if m.has("READY=1") {
			readies++
		}
	}
	if readies != 1 {
		t.Errorf("%d READY=1, want 1", readies)
	}
	time.Sleep(300 * time.Millisecond)
	if p := sd.pings(time.Now().Add(-250*time.Millisecond), time.Now()); len(p) > 0 {
		t.Errorf("%d pings after the notifier was ended", len(p))
	}
}
