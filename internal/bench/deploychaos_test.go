package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/ipc"
)

// TestDeployAndChaosShort is the CI form of the deploy and chaos scenarios
// (about a minute together): small, but every invariant is checked, and the
// timing bounds are generous, since it runs under -race on a loaded machine.
func TestDeployAndChaosShort(t *testing.T) {
	t.Run("deploy", func(t *testing.T) {
		out := runScenario(t, 3*time.Minute, "deploy", "-q", "--clusters=8", "--deploys=2", "--inflight=16", "--settle=500ms")
		var rep deployReport
		jsonLine(t, out, &rep)
		if rep.Scenario != "deploy" || len(rep.Deploys) != 2 || rep.Swaps != 16 || len(rep.Failures) > 0 {
			t.Fatalf("report: %d deploys, %d swaps, failures %v", len(rep.Deploys), rep.Swaps, rep.Failures)
		}
		for _, d := range rep.Deploys {
			if d.State != "succeeded" || d.Swaps != 8 || d.WallS <= 0 || d.UnroutedIntervals != 0 {
				t.Errorf("deploy %+v", d)
			}
		}
		if rep.OK == 0 || rep.OK != rep.Sent || rep.ErrorCount() != 0 || rep.Lost != 0 || rep.Duplicates != 0 || rep.Unknown != 0 {
			t.Errorf("load books: %+v", rep.books)
		}
		if rep.UnroutedIntervals != 0 || !rep.Procs.Clean() || rep.Procs.Live != 8 || rep.FeedDrops != 0 {
			t.Errorf("unrouted %d, procs %+v, feed drops %d", rep.UnroutedIntervals, rep.Procs, rep.FeedDrops)
		}
	})

	t.Run("chaos", func(t *testing.T) {
		out := runScenario(t, 3*time.Minute, "chaos", "-q", "--clusters=6", "--duration=20s", "--kill-every=2s", "--inflight=12")
		var rep chaosReport
		jsonLine(t, out, &rep)
		if rep.Scenario != "chaos" || len(rep.Failures) > 0 {
			t.Fatalf("failures: %v", rep.Failures)
		}
		if rep.Kills == 0 || !rep.SigStop.Replaced || !rep.Crash.CrashLoop || !rep.NoReader.CutOff || !rep.Serving {
			t.Errorf("faults: kills %d, sigstop %+v, crash %+v, non-reader %+v, serving %v", rep.Kills, rep.SigStop, rep.Crash, rep.NoReader, rep.Serving)
		}
		if rep.OK == 0 || rep.Lost != 0 || rep.Duplicates != 0 || rep.Unknown != 0 || rep.ErrorsOutside != 0 {
			t.Errorf("load books: %+v, errors outside windows %d", rep.books, rep.ErrorsOutside)
		}
		if !rep.Procs.Clean() || rep.Procs.Live < 5 {
			t.Errorf("procs %+v", rep.Procs)
		}
	})
}

func TestLoadLanes(t *testing.T) {
	for _, spc := range []int{1, 2} {
		topo := generation.Topology{Total: 5 * spc, PerCluster: spc}
		lanes, err := loadLanes(5, spc, 20, "mix")
		if err != nil {
			t.Fatal(err)
		}
		guilds := 0
		for i, l := range lanes {
			c, err := topo.Resolve(l.Target)
			if err != nil || c != l.Cluster || l.Cluster != i%5 {
				t.Errorf("lane %d: %+v resolves to %d (%v)", i, l, c, err)
			}
			if strings.HasPrefix(l.Target, ipc.TargetGuildPrefix) {
				guilds++
			}
		}
		if guilds != 10 {
			t.Errorf("%d guild lanes of 20, want 10", guilds)
		}
	}
	if _, err := loadLanes(8, 1, 4, "mix"); err == nil {
		t.Error("4 lanes for 8 clusters accepted")
	}
	if _, err := loadLanes(2, 1, 4, "shard"); err == nil {
		t.Error("unknown target mode accepted")
	}
}

func TestSwapOverheads(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	st := generation.Status{
		Started: ms(0),
		Clusters: []generation.ClusterStatus{
			// 0: routed 2ms after ready, activated 1ms after the exit, spawned at the start.
			{New: &generation.ProcRef{Cluster: 0, Generation: 2}, SpawnedAt: ms(0), ReadyAt: ms(100), RoutedAt: ms(102), QuiesceSentAt: ms(102), ExitedAt: ms(110), ActivatedAt: ms(111)},
			// 1: spawned 5ms after 0's activation.
			{New: &generation.ProcRef{Cluster: 1, Generation: 2}, SpawnedAt: ms(116), ReadyAt: ms(200), RoutedAt: ms(200), QuiesceSentAt: ms(200), ExitedAt: ms(210), ActivatedAt: ms(210)},
			// 2: failed, never activated: no swap.
			{SpawnedAt: ms(210), ReadyAt: ms(300)},
		},
	}
	got := swapOverheads(st)
	want := []time.Duration{3 * time.Millisecond, 5 * time.Millisecond}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("overheads %v, want %v", got, want)
	}
	r := deployRun(st, ms(-5), ms(215), func(c int, _ int64) (readyBeat, bool) {
		return readyBeat{At: ms(100*c + 99), Uptime: 90 * time.Millisecond}, true
	})
	// Ready heartbeats received 1 ms before ready_at, after 90 ms of uptime:
	// cluster 0 (ready 100 ms after its spawn) spent 10 ms outside the
	// harness, cluster 1 (84 ms) none.
	if r.Swaps != 2 || r.OverheadMaxMS != 5 || r.NewReadyMaxMS != 100 || r.OldDrainP50MS != 8 || r.StartOutsideMaxMS != 10 || r.ReadyLagMaxMS != 1 {
		t.Fatalf("run %+v", r)
	}
}

// A resume-handoff deploy's steps run quiesce, exit, spawn, ready, route:
// its overhead counts the manager's parts of that order, and its gap is
// quiesce_sent_at → routed_at.
func TestResumeOverheadsAndGap(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	st := generation.Status{
		Started: ms(0), Mode: "resume",
		Clusters: []generation.ClusterStatus{
			// 0: quiesced at the start, spawned 1ms after the exit, routed 2ms after ready.
			{New: &generation.ProcRef{Cluster: 0, Generation: 2}, QuiesceSentAt: ms(0), ExitedAt: ms(10), SpawnedAt: ms(11), ReadyAt: ms(100), RoutedAt: ms(102), ActivatedAt: ms(102)},
			// 1: quiesced 3ms after 0's activation.
			{New: &generation.ProcRef{Cluster: 1, Generation: 2}, QuiesceSentAt: ms(105), ExitedAt: ms(110), SpawnedAt: ms(110), ReadyAt: ms(200), RoutedAt: ms(200), ActivatedAt: ms(201)},
		},
	}
	got := swapOverheads(st)
	want := []time.Duration{3 * time.Millisecond, 4 * time.Millisecond}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("overheads %v, want %v", got, want)
	}
	if r := deployRun(st, ms(-5), ms(215), nil); r.GapP50MS != 95 || r.GapMaxMS != 102 {
		t.Fatalf("gap p50 %v max %v, want 95 and 102", r.GapP50MS, r.GapMaxMS)
	}
}

func TestUnroutedIntervalsAndDownWindows(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := func(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Second))) }
	changes := []routeChange{
		{Cluster: 0, At: s(0), Routed: true, PID: 10},
		{Cluster: 1, At: s(0), Routed: true, PID: 20},
		{Cluster: 2, At: s(0), Routed: false},         // crash-looping from the start
		{Cluster: 0, At: s(1), Routed: true, PID: 11}, // a swap: no gap
		{Cluster: 1, At: s(5.1), Routed: false},
		{Cluster: 1, At: s(6), Routed: true, PID: 21},
		{Cluster: 2, At: s(7), Routed: true, PID: 30},
		{Cluster: 2, At: s(7.3), Routed: false},
	}
	ivs := unroutedIntervals(changes, s(10))
	if len(ivs) != 3 {
		t.Fatalf("intervals %+v", ivs)
	}
	if got := overlapping(ivs, s(0.5), s(4)); len(got) != 1 || got[0].Cluster != 2 {
		t.Fatalf("overlapping 0.5-4: %+v", got)
	}
	if d := longest(overlapping(ivs, s(5), s(6.5))); d != 7*time.Second {
		t.Fatalf("longest %v", d) // cluster 2's first interval, 0..7
	}

	// Cluster 1 was killed at 5.0; the feed showed it at 5.1.
	actions := []chaosAction{{Kind: "kill", Cluster: 1, PID: 20, At: s(5)}, {Kind: "stop", Cluster: 0, PID: 11, At: s(8)}}
	w := downWindows(changes, actions, 500*time.Millisecond, s(10))
	errs := []errorReply{
		{Cluster: 1, Code: "unavailable", Sent: s(4.9), Replied: s(5.05)}, // in flight at the kill
		{Cluster: 1, Code: "unavailable", Sent: s(5.5), Replied: s(5.9)},  // waited, deadline passed
		{Cluster: 1, Code: "unavailable", Sent: s(6.1), Replied: s(6.2)},  // after it was back: a failure
		{Cluster: 2, Code: "timeout", Sent: s(7.1), Replied: s(7.25)},     // died at 7.3, feed slack
		{Cluster: 0, Code: "unavailable", Sent: s(7.9), Replied: s(9)},    // stopped at 8, never unrouted on the feed: slack only
		{Cluster: 0, Code: "bad_payload", Sent: s(8.1), Replied: s(8.2)},  // never allowed
		{Cluster: 0, Code: "unavailable", Sent: s(2), Replied: s(2.1)},    // cluster 0 was fine then
	}
	in, outside := classifyErrors(errs, w)
	if in["unavailable"] != 3 || in["timeout"] != 1 || len(outside) != 3 {
		t.Fatalf("in %v, outside %+v", in, outside)
	}
	if outside[0].Sent != s(6.1) || outside[1].Code != "bad_payload" || outside[2].Sent != s(2) {
		t.Fatalf("outside %+v", outside)
	}
}

func TestBooksSince(t *testing.T) {
	before := books{Sent: 10, OK: 8, Errors: map[string]uint64{"unavailable": 2}}
	after := books{Sent: 25, OK: 20, Errors: map[string]uint64{"unavailable": 2, "timeout": 3}, Duplicates: 1}
	d := booksSince(after, before)
	if d.Sent != 15 || d.OK != 12 || d.Duplicates != 1 || len(d.Errors) != 1 || d.Errors["timeout"] != 3 {
		t.Fatalf("%+v", d)
	}
}

func TestDeployAndChaosFlags(t *testing.T) {
	for _, sc := range []string{"deploy", "chaos"} {
		var out, errw bytes.Buffer
		if err := Main(context.Background(), []string{sc, "-h"}, &out, &errw); err != nil {
			t.Errorf("%s -h: %v", sc, err)
		}
		if !strings.Contains(errw.String(), "-inflight") {
			t.Errorf("%s -h printed no flags: %q", sc, &errw)
		}
		if err := Main(context.Background(), []string{sc, "extra"}, &out, &errw); err == nil {
			t.Errorf("%s with an argument accepted", sc)
		}
	}
	_, err := runChaos(context.Background(), chaosOptions{ManagerBin: "x", HarnessBin: "y", Duration: 3 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "--duration") {
		t.Errorf("a 3s chaos run with a 4s SIGSTOP: %v", err)
	}
}
