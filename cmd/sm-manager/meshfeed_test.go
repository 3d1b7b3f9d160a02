package main_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/natstest"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/manager"
)

// feedWatcher is a client WATCHing a host's state feed, keeping every event.
type feedWatcher struct {
	mu     sync.Mutex
	events []json.RawMessage
}

func (w *feedWatcher) add(f *ipc.Frame) {
	if f.Op != ipc.OpEvent {
		return
	}
	w.mu.Lock()
	w.events = append(w.events, slices.Clone(f.Payload))
	w.mu.Unlock()
}

// hostsEvents is every "hosts" event so far, decoded.
func (w *feedWatcher) hostsEvents(t *testing.T) [][]manager.HostStatus {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	var out [][]manager.HostStatus
	for _, e := range w.events {
		var ev struct {
			Type  string               `json:"type"`
			Hosts []manager.HostStatus `json:"hosts"`
		}
		if err := json.Unmarshal(e, &ev); err != nil {
			t.Fatalf("event %s: %v", e, err)
		}
		if ev.Type == manager.EventHosts {
			out = append(out, ev.Hosts)
		}
	}
	return out
}

func watchFeed(t *testing.T, h *meshHost) *feedWatcher {
	t.Helper()
	w := &feedWatcher{}
	c, err := ipc.Dial(t.Context(), ipc.ClientConfig{Path: h.sock, Register: ipc.Frame{Role: ipc.RoleClient, Name: "watcher"},
		Handler: func(_ *ipc.Client, f *ipc.Frame) { w.add(f) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Request(ctx, &ipc.Frame{Op: ipc.OpWatch}); err != nil {
		t.Fatal(err)
	}
	return w
}

// TestMeshFeedHosts: the state feed of a mesh host publishes a "hosts" event
// when the hosts change (one joins: its clusters appear; one leaves), none
// for a renewal alone, and cluster events with the host_id of clusters that
// run elsewhere. Nothing in it is a path, an argv or a token.
func TestMeshFeedHosts(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{Bin: testenv.Bin("nats-server")})
	a := startMeshHost(t, srv.URL, "a", 0)
	a.dial(t)
	placed(t, []*meshHost{a}, 30*time.Second, "a runs the 12 clusters")
	w := watchFeed(t, a)
	// a alone, its clusters settled: renewals (every 500 ms) publish nothing.
	time.Sleep(2 * time.Second)
	if evs := w.hostsEvents(t); len(evs) != 0 {
		t.Fatalf("hosts events with the mesh unchanged for 2 s (4 renewals): %v", evs)
	}

	b := startMeshHost(t, srv.URL, "b", 0)
	b.dial(t)
	testenv.WaitFor(t, 20*time.Second, "a hosts event naming a and b", func() bool {
		evs := w.hostsEvents(t)
		if len(evs) == 0 {
			return false
		}
		last := evs[len(evs)-1]
		return len(last) == 2 && last[0].ID == "a" && last[1].ID == "b" && last[0].Self && !last[1].Self
	})
	// b takes nothing (placement moves no running cluster), so a keeps 12.
	evs := w.hostsEvents(t)
	last := evs[len(evs)-1]
	if len(last[0].Clusters) != 12 || len(last[1].Clusters) != 0 || last[0].LeaseAgeMS < 0 {
		t.Fatalf("hosts event %+v, want a with 12 clusters and b with none", last)
	}
	t.Logf("%d hosts events by b's join", len(evs))

	// a leaves: its clusters go to b; b's feed says so, hosts and clusters.
	wb := watchFeed(t, b)
	joinAt := len(wb.hostsEvents(t))
	a.stop(t)
	testenv.WaitFor(t, 30*time.Second, "b's feed: b alone with 12 clusters", func() bool {
		evs := wb.hostsEvents(t)
		if len(evs) <= joinAt {
			return false
		}
		last := evs[len(evs)-1]
		return len(last) == 1 && last[0].ID == "b" && len(last[0].Clusters) == 12
	})
	nHosts := len(wb.hostsEvents(t))
	wb.mu.Lock()
	events := slices.Clone(wb.events)
	wb.mu.Unlock()
	moved := map[int]bool{}
	for _, e := range events {
		s := string(e)
		for _, bad := range []string{testenv.Bin("cluster-harness"), "--simulate", "SM_", "token", "sm.sock"} {
			if strings.Contains(s, bad) {
				t.Fatalf("a feed event holds %q: %s", bad, s)
			}
		}
		var ev struct {
			Type    string                `json:"type"`
			Cluster manager.ClusterStatus `json:"cluster"`
		}
		if json.Unmarshal(e, &ev) == nil && ev.Type == manager.EventCluster && ev.Cluster.HostID == "b" {
			moved[ev.Cluster.ID] = true
		}
	}
	if len(moved) != 12 {
		t.Fatalf("cluster events naming b as holder for %d clusters, want 12", len(moved))
	}
	t.Logf("b's feed since a left: %d events, %d of them hosts events", len(events), nHosts)
}
