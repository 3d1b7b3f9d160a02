package mesh_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sm-supervisor/sm/internal/natstest"
	"github.com/sm-supervisor/sm/internal/netns"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/mesh"
)

// TestCutLinkFencesBeforeTakeover runs the NATS server on one network
// namespace and two hosts on two others. Host a's link is cut: a fences each
// of its clusters before b can take it over, b takes them all, and once the
// link is healed a rejoins and no cluster runs twice.
func TestCutLinkFencesBeforeTakeover(t *testing.T) {
	hs := netns.New(t, 3)
	srv := natstest.Start(t, natstest.Options{Bin: testenv.Bin("nats-server"), Host: hs[0].Addr, Port: 4222, Exec: hs[0].Exec()})
	topo := mesh.Topology{TotalShards: 8, ShardsPerCluster: 2}
	rec := newRecord()
	cfgA, cfgB := meshConfig(srv.URL, "a"), meshConfig(srv.URL, "b")
	a := startAgent(t, cfgA, topo, rec, nats.SetCustomDialer(hs[1]))
	b := startAgent(t, cfgB, topo, rec, nats.SetCustomDialer(hs[2]))
	testenv.WaitFor(t, 20*time.Second, "4 clusters placed", func() bool { return len(rec.running()) == 4 })
	var onA []int
	for c, h := range rec.running() {
		if h[0] == "a" {
			onA = append(onA, c)
		}
	}
	if len(onA) != 2 {
		t.Fatalf("placement %v, want 2 clusters on each host", rec.running())
	}

	cut := time.Now()
	hs[1].Cut()
	held := a.a.Snapshot().Held // its last successful writes: none succeeds after the cut
	tm := mesh.TimingFor(lease)
	testenv.WaitFor(t, 20*time.Second, "b runs every cluster", func() bool {
		run := rec.running()
		for c := range 4 {
			if len(run[c]) != 1 || run[c][0] != "b" {
				return false
			}
		}
		return true
	})
	rec.mu.Lock()
	for _, c := range onA {
		var fenced, taken time.Time
		for _, r := range rec.runs[c] {
			switch {
			case r.host == "a" && !r.stop.IsZero():
				fenced = r.stop
			case r.host == "b":
				taken = r.start
			}
		}
		fenceAt := tm.FenceAt(held[c].Sent)
		if fenced.IsZero() || !fenced.Before(taken) {
			t.Errorf("cluster %d: a fenced at %v, b took it at %v after the cut", c, fenced.Sub(cut), taken.Sub(cut))
		}
		t.Logf("cluster %d: last renewal %v before the cut; a's fence due %v and done %v after it, b took it %v after it (%v after the fence)",
			c, cut.Sub(held[c].Sent).Round(time.Millisecond), fenceAt.Sub(cut).Round(time.Millisecond),
			fenced.Sub(cut).Round(time.Millisecond), taken.Sub(cut).Round(time.Millisecond), taken.Sub(fenced).Round(time.Millisecond))
	}
	rec.mu.Unlock()

	hs[1].Heal()
	testenv.WaitFor(t, 20*time.Second, "a listed again", func() bool {
		for _, h := range b.a.Snapshot().Hosts {
			if h.Host == "a" {
				return true
			}
		}
		return false
	})
	time.Sleep(2 * tm.Renew) // a few passes of both: nothing may move now
	if o := rec.overlaps(); len(o) > 0 {
		t.Fatalf("clusters ran twice: %v", o)
	}
	for c, h := range rec.running() {
		if len(h) != 1 || h[0] != "b" {
			t.Fatalf("after the heal cluster %d runs on %v, want b alone (placement moves nothing)", c, h)
		}
	}
}
