package main_test

import (
	"maps"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/natstest"
	"github.com/sm-supervisor/sm/internal/netns"
	"github.com/sm-supervisor/sm/internal/testenv"
)

// TestMeshCutLinkManagers: real managers on hosts made of network
// namespaces, the NATS server on a third. Cut host a's veth link: a fences
// (kills) each of its clusters before b starts it, which b does once a's
// leases expire. Heal the link: a rejoins, no cluster runs twice, and every
// cluster runs exactly once (placement moves nothing back).
func TestMeshCutLinkManagers(t *testing.T) {
	hs := netns.New(t, 3) // skips, saying why, when not root
	srv := natstest.Start(t, natstest.Options{Bin: testenv.Bin("nats-server"), Host: hs[0].Addr, Port: 4222, Exec: hs[0].Exec()})
	pathA, sockA := meshConfig(t, srv.URL, "a", 6, "")
	pathB, sockB := meshConfig(t, srv.URL, "b", 0, "")
	a := startMeshHostAt(t, "a", pathA, sockA, hs[1].Exec()...)
	b := startMeshHostAt(t, "b", pathB, sockB, hs[2].Exec()...)
	a.dial(t)
	b.dial(t)
	by := placed(t, []*meshHost{a, b}, 30*time.Second, "12 clusters on a and b")
	if len(by["a"]) != 6 || len(by["b"]) != 6 {
		t.Fatalf("placement %v, want 6 and 6", by)
	}
	onA := map[int]int{} // cluster → a's pid
	for _, cs := range a.status(t).Clusters {
		if cs.HostID == "a" {
			onA[cs.ID] = cs.PID
		}
	}

	cut := time.Now()
	hs[1].Cut()
	// Watch a's processes go (a zombie counts as alive until a reaps it,
	// so each time is no earlier than the death) and b start them.
	fenced := map[int]time.Time{}
	started := map[int]time.Time{} // the kernel's start time of b's process, never later than the start
	testenv.WaitFor(t, 30*time.Second, "a's clusters fenced and running on b", func() bool {
		now := time.Now()
		for c, pid := range onA {
			if _, ok := fenced[c]; !ok && syscall.Kill(pid, 0) != nil {
				fenced[c] = now
			}
		}
		for _, cs := range b.status(t).Clusters {
			if _, mine := onA[cs.ID]; mine && cs.HostID == "b" && cs.PID > 0 {
				if _, ok := started[cs.ID]; !ok {
					started[cs.ID] = processStart(t, cs.PID)
				}
			}
		}
		return len(fenced) == len(onA) && len(started) == len(onA)
	})
	var lastFence, firstTake time.Duration
	for _, c := range slices.Sorted(maps.Keys(onA)) {
		f, s := fenced[c].Sub(cut), started[c].Sub(cut)
		if !started[c].Add(-startSlack).After(fenced[c]) {
			t.Errorf("cluster %d: b started it %v after the cut, before a's process was seen gone (%v)", c, s, f)
		}
		lastFence = max(lastFence, f)
		if firstTake == 0 || s < firstTake {
			firstTake = s
		}
		t.Logf("cluster %d: a's process gone by %v after the cut, b's started %v after it", c, f.Round(10*time.Millisecond), s.Round(10*time.Millisecond))
	}
	t.Logf("lease 2 s (fence at 1.5 s after the last renewal): a fenced all 6 by %v after the cut; b started the first %v after it (%v after the last fence)",
		lastFence.Round(10*time.Millisecond), firstTake.Round(10*time.Millisecond), (firstTake - lastFence).Round(10*time.Millisecond))
	placed(t, []*meshHost{b}, 30*time.Second, "b runs all 12 while a is cut off")

	healed := time.Now()
	hs[1].Heal()
	testenv.WaitFor(t, 30*time.Second, "a back in the mesh", func() bool {
		for _, hs := range b.status(t).Hosts {
			if hs.ID == "a" {
				return true
			}
		}
		return false
	})
	t.Logf("a listed again %v after the heal", time.Since(healed).Round(10*time.Millisecond))
	// Converged: every cluster exactly once (placed fails on any cluster
	// running on both), for several renewals in a row.
	for range 6 {
		by = placed(t, []*meshHost{a, b}, 10*time.Second, "every cluster exactly once after the heal")
		time.Sleep(500 * time.Millisecond)
	}
	if len(by["a"]) != 0 || len(by["b"]) != 12 {
		t.Fatalf("after the heal %v, want b running all 12 (placement moves nothing back)", by)
	}
}
