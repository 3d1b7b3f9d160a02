package recycle

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain is the recycle package's: every test in it runs under goleak.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

const mb = 1 << 20

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

// rss is a sample of cluster c's process proc at second s with only RSS known.
func rss(c int, proc uint64, s int, bytes int64) Sample {
	return Sample{Cluster: c, Proc: proc, At: at(s), RSS: bytes, Heap: Unknown, Lag: Unknown}
}

func limits() Limits {
	return Limits{MaxRSS: 100 * mb, MaxHeap: 50 * mb, MaxLag: 200 * time.Millisecond, Sustain: 60 * time.Second, MaxParallel: 1, Cooldown: 5 * time.Minute}
}

func serving(c int) bool { return true }

func TestDecide(t *testing.T) {
	type want struct {
		cluster int
		reason  Reason
		start   bool
		held    string // a substring of Held
	}
	for _, tc := range []struct {
		name    string
		limits  Limits
		samples []Sample
		setup   func(*Policy)
		gate    Gate
		now     int
		want    []want
	}{
		{name: "under the limit: nothing", samples: []Sample{rss(0, 1, 0, 99*mb), rss(0, 1, 70, 100*mb)}, now: 70},
		{name: "over, not for long enough", samples: []Sample{rss(0, 1, 0, 101*mb), rss(0, 1, 59, 200*mb)}, now: 59},
		{name: "over for sustain: recycle", samples: []Sample{rss(0, 1, 0, 101*mb), rss(0, 1, 60, 200*mb)}, now: 60,
			want: []want{{0, RSS, true, ""}}},
		{name: "a dip under the limit restarts the count",
			samples: []Sample{rss(0, 1, 0, 101*mb), rss(0, 1, 30, 90*mb), rss(0, 1, 40, 101*mb), rss(0, 1, 90, 101*mb)}, now: 90},
		{name: "an unknown reading counts as under",
			samples: []Sample{rss(0, 1, 0, 101*mb), rss(0, 1, 30, Unknown), rss(0, 1, 40, 101*mb)}, now: 70},
		{name: "a new process starts afresh",
			samples: []Sample{rss(0, 1, 0, 101*mb), rss(0, 2, 30, 101*mb)}, now: 70},
		{name: "a zero limit is not watched", limits: Limits{Sustain: time.Second},
			samples: []Sample{rss(0, 1, 0, 1<<40), rss(0, 1, 70, 1<<40)}, now: 70},
		{name: "heap from the heartbeat",
			samples: []Sample{{Cluster: 3, Proc: 1, At: at(0), RSS: 10 * mb, Heap: 51 * mb, Lag: Unknown}}, now: 60,
			want: []want{{3, Heap, true, ""}}},
		{name: "lag from the heartbeat",
			samples: []Sample{{Cluster: 1, Proc: 1, At: at(0), RSS: Unknown, Heap: Unknown, Lag: 250 * time.Millisecond}}, now: 60,
			want: []want{{1, Lag, true, ""}}},
		{name: "rss is blamed before heap and lag",
			samples: []Sample{{Cluster: 0, Proc: 1, At: at(0), RSS: 101 * mb, Heap: 51 * mb, Lag: time.Second}}, now: 60,
			want: []want{{0, RSS, true, ""}}},
		{name: "a deploy holds it", samples: []Sample{rss(0, 1, 0, 101*mb)}, gate: Gate{Deploying: true}, now: 60,
			want: []want{{0, RSS, false, "deploy is running"}}},
		{name: "the budget holds it", samples: []Sample{rss(0, 1, 0, 101*mb)}, now: 60,
			gate: Gate{Budget: func(int) (bool, string) { return false, "at its floor" }},
			want: []want{{0, RSS, false, "budget refuses: at its floor"}}},
		{name: "max_parallel: one at a time, in cluster order",
			samples: []Sample{rss(2, 1, 0, 101*mb), rss(0, 1, 0, 101*mb), rss(1, 1, 0, 101*mb)}, now: 60,
			want: []want{{0, RSS, true, ""}, {1, RSS, false, "max_parallel"}, {2, RSS, false, "max_parallel"}}},
		{name: "max_parallel 2", limits: func() Limits { l := limits(); l.MaxParallel = 2; return l }(),
			samples: []Sample{rss(0, 1, 0, 101*mb), rss(1, 1, 0, 101*mb), rss(2, 1, 0, 101*mb)}, now: 60,
			want: []want{{0, RSS, true, ""}, {1, RSS, true, ""}, {2, RSS, false, "max_parallel"}}},
		{name: "a recycle in flight counts and gets no verdict",
			samples: []Sample{rss(0, 1, 0, 101*mb), rss(1, 1, 0, 101*mb)}, now: 60,
			setup: func(p *Policy) { p.Started(0); p.Observe(rss(0, 1, 0, 101*mb)) },
			want:  []want{{1, RSS, false, "1 recycles in flight"}}},
		{name: "cooldown after the last recycle",
			samples: []Sample{rss(0, 7, 0, 101*mb)}, now: 100,
			setup: func(p *Policy) { p.Started(0); p.Finished(0, at(-100)) },
			want:  []want{{0, RSS, false, "cooldown"}}},
		{name: "cooldown over",
			samples: []Sample{rss(0, 7, 0, 101*mb)}, now: 300,
			setup: func(p *Policy) { p.Started(0); p.Finished(0, at(-1)) },
			want:  []want{{0, RSS, true, ""}}},
		{name: "a cluster not serving gets no verdict", samples: []Sample{rss(0, 1, 0, 101*mb)}, now: 60,
			gate: Gate{Serving: func(int) bool { return false }}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := tc.limits
			if l == (Limits{}) {
				l = limits()
			}
			p := New(l)
			if tc.setup != nil {
				tc.setup(p)
			}
			for _, s := range tc.samples {
				p.Observe(s)
			}
			if tc.gate.Serving == nil {
				tc.gate.Serving = serving
			}
			got := p.Decide(at(tc.now), tc.gate)
			if len(got) != len(tc.want) {
				t.Fatalf("verdicts %+v, want %+v", got, tc.want)
			}
			for i, w := range tc.want {
				g := got[i]
				if g.Cluster != w.cluster || g.Reason != w.reason || g.Start != w.start || !strings.Contains(g.Held, w.held) || (w.start && g.Held != "") {
					t.Errorf("verdict %d = %+v, want %+v", i, g, w)
				}
				if g.Detail == "" {
					t.Errorf("verdict %d has no detail", i)
				}
			}
		})
	}
}

func TestDetail(t *testing.T) {
	p := New(limits())
	p.Observe(rss(0, 1, 0, 301*mb))
	p.Observe(Sample{Cluster: 1, Proc: 1, At: at(0), RSS: Unknown, Heap: Unknown, Lag: 1500 * time.Millisecond})
	got := p.Decide(at(61), Gate{Serving: serving})
	if len(got) != 2 {
		t.Fatalf("%+v", got)
	}
	if got[0].Detail != "rss 301 MiB over 100 MiB for 1m1s" || got[1].Detail != "lag 1.5s over 200ms for 1m1s" {
		t.Errorf("details %q, %q", got[0].Detail, got[1].Detail)
	}
}

// Started resets the record: the same process's readings must be over for
// Sustain again before a second recycle; Forget keeps a recycle in flight.
func TestStartedFinishedForget(t *testing.T) {
	p := New(limits())
	p.Observe(rss(0, 1, 0, 101*mb))
	p.Started(0)
	if !p.Recycling(0) {
		t.Fatal("not recycling after Started")
	}
	p.Forget(0)
	if !p.Recycling(0) {
		t.Fatal("Forget dropped a recycle in flight")
	}
	p.Observe(rss(0, 1, 60, 101*mb))
	if v := p.Decide(at(60), Gate{}); len(v) != 0 {
		t.Fatalf("verdict during the recycle: %+v", v)
	}
	p.Finished(0, at(61))
	if p.Recycling(0) {
		t.Fatal("recycling after Finished")
	}
	p.Observe(rss(0, 2, 400, 101*mb))
	if v := p.Decide(at(459), Gate{}); len(v) != 0 {
		t.Fatalf("verdict before sustain: %+v", v)
	}
	if v := p.Decide(at(460), Gate{}); len(v) != 1 || !v[0].Start {
		t.Fatalf("verdict after sustain: %+v", v)
	}
	p.Forget(0)
	if v := p.Decide(at(460), Gate{}); len(v) != 0 {
		t.Fatalf("verdict after Forget: %+v", v)
	}
}

// The hold's text changes only when the hold does, so the manager's log of
// it (once per change) stays quiet through a cooldown.
func TestHeldTextStable(t *testing.T) {
	p := New(limits())
	p.Started(0)
	p.Finished(0, at(0))
	p.Observe(rss(0, 2, 0, 101*mb))
	a, b := p.Decide(at(60), Gate{}), p.Decide(at(200), Gate{})
	if len(a) != 1 || len(b) != 1 || a[0].Held != b[0].Held || !strings.Contains(a[0].Held, "2026-01-02 03:09:05 UTC") {
		t.Fatalf("holds %+v then %+v", a, b)
	}
}
