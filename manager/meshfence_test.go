package manager_test

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sm-supervisor/sm/internal/natstest"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/manager"
	"github.com/sm-supervisor/sm/mesh"
)

// TestMeshWatchdogFencesForWedgedLoop: a manager whose loop is stuck but
// whose mesh agent runs still fences. The loop is wedged, then the NATS
// server dies, so no lease can be renewed: the agent's Stops wait on the
// loop, and the watchdog beside it kills the clusters' process groups
// itself, each before its lease could expire for any other host (its last
// write's store time, as the server reports it, plus the lease). Once the
// loop runs again nothing is respawned while the leases are not held, and
// once the server is back the clusters run again.
func TestMeshWatchdogFencesForWedgedLoop(t *testing.T) {
	const lease = 4 * time.Second // fence at 3 s, Stops confirmed by 3.5 s
	srv := natstest.Start(t, natstest.Options{Bin: testenv.Bin("nats-server")})
	cfg := testConfig(t)
	cfg.Mesh.NATSURL, cfg.Mesh.HostID, cfg.Mesh.Lease = srv.URL, "a", durationOf(lease)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	logs := &testenv.Buffer{}
	logger := slog.New(slog.NewTextHandler(io.MultiWriter(logs, t.Output()), &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := &env{Manager: testenv.StartManager(t, manager.Options{Config: cfg, Logger: logger, Registry: prometheus.NewRegistry()}), t: t, cfg: cfg}
	st := e.WaitReady()
	var pids []int
	for _, c := range st.Clusters {
		pids = append(pids, c.PID)
	}

	// The test's own watch of the leases: the server's store time of each
	// cluster's latest write.
	stored := watchLeases(t, srv.URL)
	testenv.WaitFor(t, 10*time.Second, "a renewal of every lease seen", func() bool { return len(stored()) == len(pids) })

	release := manager.WedgeLoop(e.Manager.Manager)
	defer release()
	srv.Kill()
	cut := time.Now()
	last := stored()
	gone := make([]time.Time, len(pids))
	testenv.WaitFor(t, 3*lease, "every cluster killed with the loop wedged", func() bool {
		all := true
		for i, pid := range pids {
			if gone[i].IsZero() && syscall.Kill(pid, 0) != nil {
				gone[i] = time.Now()
			}
			all = all && !gone[i].IsZero()
		}
		return all
	})
	tm := mesh.TimingFor(lease)
	for c, at := range gone {
		expires := last[c].Add(lease)
		t.Logf("cluster %d: last write stored %v before the server died; gone %v after it, %v before its lease could expire (fence at %v, Stop due by %v after the write)",
			c, cut.Sub(last[c]).Round(time.Millisecond), at.Sub(cut).Round(time.Millisecond), expires.Sub(at).Round(time.Millisecond),
			tm.Lease-tm.Margin, tm.Lease-tm.Margin+tm.Op)
		if !at.Before(expires) {
			t.Errorf("cluster %d was still running %v after its lease could expire", c, at.Sub(expires))
		}
	}
	if !strings.Contains(logs.String(), "killed the cluster's processes itself") {
		t.Fatal("the watchdog did not say it killed the clusters")
	}

	// The loop runs again: it hears of the Stops and the exits, and spawns
	// nothing while it holds no lease.
	release()
	time.Sleep(time.Second)
	for _, c := range e.MustStatus().Clusters {
		if c.PID != 0 || c.State == "ready" {
			t.Fatalf("cluster %d runs with no lease after the loop came back: %+v", c.ID, c)
		}
	}
	srv.Restart()
	e.WaitReady()
}

// watchLeases watches the mesh's leases bucket on url until the test ends;
// the function it returns gives the server's store time of each cluster's
// latest write (puts only) as seen so far.
func watchLeases(t *testing.T, url string) func() map[int]time.Time {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var kv jetstream.KeyValue
	testenv.WaitFor(t, 10*time.Second, "the leases bucket", func() bool {
		kv, err = js.KeyValue(ctx, "sm_leases")
		return err == nil
	})
	w, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[int]time.Time{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil || e.Operation() != jetstream.KeyValuePut {
					continue
				}
				id, _ := strings.CutPrefix(e.Key(), "c.")
				if c, err := strconv.Atoi(id); err == nil {
					mu.Lock()
					seen[c] = e.Created()
					mu.Unlock()
				}
			}
		}
	}()
	t.Cleanup(func() { _ = w.Stop(); cancel(); <-done })
	return func() map[int]time.Time {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(seen)
	}
}
