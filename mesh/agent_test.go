package mesh_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/mesh"
)

// record is the bot's own account of which host ran which cluster when,
// kept by the agents' Start and Stop: the ground truth the tests check.
type record struct {
	mu   sync.Mutex
	runs map[int][]run
}

type run struct {
	host        string
	start, stop time.Time // stop is zero while it runs
}

func newRecord() *record { return &record{runs: map[int][]run{}} }

func (r *record) start(host string, c int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs[c] = append(r.runs[c], run{host: host, start: time.Now()})
}

func (r *record) stop(host string, c int) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for i, x := range r.runs[c] {
		if x.host == host && x.stop.IsZero() {
			r.runs[c][i].stop = now
		}
	}
	return now
}

// running maps each cluster to the hosts running it now.
func (r *record) running() map[int][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[int][]string{}
	for c, rs := range r.runs {
		for _, x := range rs {
			if x.stop.IsZero() {
				out[c] = append(out[c], x.host)
			}
		}
	}
	return out
}

// overlaps lists every time one cluster ran on two hosts at once.
func (r *record) overlaps() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for c, rs := range r.runs {
		for i, x := range rs {
			for _, y := range rs[i+1:] {
				xEnd, yEnd := x.stop, y.stop
				if (xEnd.IsZero() || y.start.Before(xEnd)) && (yEnd.IsZero() || x.start.Before(yEnd)) {
					out = append(out, fmt.Sprintf("cluster %d on %s and %s", c, x.host, y.host))
				}
			}
		}
	}
	return out
}

type agentRun struct {
	a      *mesh.Agent
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan struct{}
}

// startAgent runs an agent for host id with its own connection.
func startAgent(t *testing.T, cfg config.Mesh, topo mesh.Topology, rec *record, opts ...nats.Option) *agentRun {
	t.Helper()
	nc, err := mesh.Connect(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	st, err := mesh.Open(context.Background(), nc, cfg.Name, cfg.Lease.Duration)
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	host := cfg.HostID
	a := &mesh.Agent{
		Store: st, Me: mesh.Holder{Host: host, Boot: mesh.NewBootID()}, Capacity: cfg.MaxClusters, Topology: topo,
		Log:   testenv.Logger(t, slog.LevelInfo).With("host", host),
		Start: func(c int) { rec.start(host, c) },
		Stop:  func(c int) { rec.stop(host, c) },
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &agentRun{a: a, nc: nc, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(r.done); _ = a.Run(ctx) }()
	t.Cleanup(r.close)
	return r
}

func (r *agentRun) close() {
	r.cancel()
	<-r.done
	r.nc.Close()
}

// TestAgentsShareAndFailOver: three hosts place twelve clusters evenly; one
// is cut off from the server; it fences its clusters before their leases
// expire, the others take them over, and no cluster ever runs twice.
func TestAgentsShareAndFailOver(t *testing.T) {
	srv := startServer(t, "")
	topo := mesh.Topology{TotalShards: 24, ShardsPerCluster: 2}
	rec := newRecord()
	var agents []*agentRun
	for _, h := range []string{"a", "b", "c"} {
		cfg := meshConfig(srv.URL, h)
		cfg.MaxClusters = 6
		agents = append(agents, startAgent(t, cfg, topo, rec))
	}
	perHost := func() map[string]int {
		n := map[string]int{}
		for _, hs := range rec.running() {
			for _, h := range hs {
				n[h]++
			}
		}
		return n
	}
	testenv.WaitFor(t, 20*time.Second, "12 clusters placed", func() bool { return len(rec.running()) == 12 })
	// Hosts started together settle before they place: an even split.
	for h, n := range perHost() {
		if n != 4 {
			t.Fatalf("host %s runs %d clusters, want 4 each: %v", h, n, perHost())
		}
	}
	t.Logf("placed: %v", perHost())

	cut := time.Now()
	agents[2].nc.Close() // host c is cut off: every request fails from now on
	testenv.WaitFor(t, 20*time.Second, "c's clusters taken over", func() bool {
		run := rec.running()
		if len(run) != 12 {
			return false
		}
		for _, hs := range run {
			if len(hs) != 1 || hs[0] == "c" {
				return false
			}
		}
		return true
	})
	t.Logf("all 12 running on a and b %v after c was cut off: %v", time.Since(cut).Round(time.Millisecond), perHost())
	if o := rec.overlaps(); len(o) > 0 {
		t.Fatalf("clusters ran twice: %v", o)
	}
	for _, r := range agents[:2] {
		r.close()
	}
	if run := rec.running(); len(run) != 0 {
		t.Fatalf("still running after the agents stopped: %v", run)
	}
}
