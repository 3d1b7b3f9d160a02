package supervise_test

import (
	"testing"
	"time"

	"github.com/sm-supervisor/sm/backoff"
	"github.com/sm-supervisor/sm/supervise"
)

// t0 is the injected clock's origin: every time in these tests is t0 plus an offset.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// policy: 1s doubling to 1m, ±20% jitter, more than 3 restarts in a minute is a crash loop.
var policy = supervise.RestartPolicy{
	Backoff:   backoff.Policy{Min: time.Second, Max: time.Minute, Jitter: 0.2},
	Intensity: 3,
	Period:    time.Minute,
}

// step is one event in a cluster's life: a death at an offset (Next), or, with
// recover set, a check that it has stayed up since spawned (Recovered).
type step struct {
	at  time.Duration
	rnd float64

	recover bool          // call Recovered instead of Next
	spawned time.Duration // for Recovered: when the living process was spawned

	wantDelay     time.Duration // Next only
	wantCrashLoop bool          // History.CrashLoop afterwards (and Decision.CrashLoop for Next)
	wantRecovered bool          // Recovered only
	wantRestarts  int           // len(History.Restarts) afterwards
	wantTotal     int
}

func TestRestartPolicy(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{"delays grow over restarts within Period", []step{
			{at: 0, rnd: 0.5, wantDelay: 1 * time.Second, wantRestarts: 1, wantTotal: 1},
			{at: 10 * time.Second, rnd: 0.5, wantDelay: 2 * time.Second, wantRestarts: 2, wantTotal: 2},
			{at: 20 * time.Second, rnd: 0.5, wantDelay: 4 * time.Second, wantRestarts: 3, wantTotal: 3},
		}},
		{"jitter spreads each delay", []step{
			{at: 0, rnd: 0, wantDelay: 800 * time.Millisecond, wantRestarts: 1, wantTotal: 1},
			{at: time.Second, rnd: 0.75, wantDelay: 2200 * time.Millisecond, wantRestarts: 2, wantTotal: 2},
		}},
		{"restarts older than Period are pruned and the backoff starts over", []step{
			{at: 0, rnd: 0.5, wantDelay: 1 * time.Second, wantRestarts: 1, wantTotal: 1},
			{at: 30 * time.Second, rnd: 0.5, wantDelay: 2 * time.Second, wantRestarts: 2, wantTotal: 2},
			// t0 is now more than a Period old; t0+30s is not.
			{at: 61 * time.Second, rnd: 0.5, wantDelay: 2 * time.Second, wantRestarts: 2, wantTotal: 3},
			// Everything is old: a fresh first restart.
			{at: 10 * time.Minute, rnd: 0.5, wantDelay: 1 * time.Second, wantRestarts: 1, wantTotal: 4},
		}},
		{"a restart exactly Period old is pruned", []step{
			{at: 0, rnd: 0.5, wantDelay: 1 * time.Second, wantRestarts: 1, wantTotal: 1},
			{at: time.Minute, rnd: 0.5, wantDelay: 1 * time.Second, wantRestarts: 1, wantTotal: 2},
		}},
		{"past Intensity within Period is a crash loop at the jittered ceiling", []step{
			{at: 0, rnd: 0.5, wantDelay: 1 * time.Second, wantRestarts: 1, wantTotal: 1},
			{at: 1 * time.Second, rnd: 0.5, wantDelay: 2 * time.Second, wantRestarts: 2, wantTotal: 2},
			{at: 2 * time.Second, rnd: 0.5, wantDelay: 4 * time.Second, wantRestarts: 3, wantTotal: 3},
			{at: 3 * time.Second, rnd: 0, wantDelay: 48 * time.Second, wantCrashLoop: true, wantRestarts: 4, wantTotal: 4},
			{at: 4 * time.Second, rnd: 0.5, wantDelay: time.Minute, wantCrashLoop: true, wantRestarts: 5, wantTotal: 5},
		}},
		{"a crash loop lasts after its restarts are pruned", []step{
			{at: 0, rnd: 0.5, wantDelay: 1 * time.Second, wantRestarts: 1, wantTotal: 1},
			{at: 0, rnd: 0.5, wantDelay: 2 * time.Second, wantRestarts: 2, wantTotal: 2},
			{at: 0, rnd: 0.5, wantDelay: 4 * time.Second, wantRestarts: 3, wantTotal: 3},
			{at: 0, rnd: 0.5, wantDelay: time.Minute, wantCrashLoop: true, wantRestarts: 4, wantTotal: 4},
			{at: time.Hour, rnd: 0.5, wantDelay: time.Minute, wantCrashLoop: true, wantRestarts: 1, wantTotal: 5},
		}},
		{"Recovered only after a whole Period since spawn", []step{
			{at: 0, rnd: 0.5, wantDelay: 1 * time.Second, wantRestarts: 1, wantTotal: 1},
			{at: 1 * time.Second, rnd: 0.5, wantDelay: 2 * time.Second, wantRestarts: 2, wantTotal: 2},
			{at: 2 * time.Second, rnd: 0.5, wantDelay: 4 * time.Second, wantRestarts: 3, wantTotal: 3},
			{at: 3 * time.Second, rnd: 0.5, wantDelay: time.Minute, wantCrashLoop: true, wantRestarts: 4, wantTotal: 4},
			// Respawned at 1m3s: not yet up a whole Period.
			{recover: true, spawned: 63 * time.Second, at: 63 * time.Second, wantCrashLoop: true, wantRestarts: 4, wantTotal: 4},
			{recover: true, spawned: 63 * time.Second, at: 63*time.Second + time.Minute - time.Nanosecond, wantCrashLoop: true, wantRestarts: 4, wantTotal: 4},
			// Up a whole Period: the loop is over, and the old restarts are pruned.
			{recover: true, spawned: 63 * time.Second, at: 63*time.Second + time.Minute, wantRecovered: true, wantRestarts: 0, wantTotal: 4},
			// Already recovered: nothing changes.
			{recover: true, spawned: 63 * time.Second, at: time.Hour, wantRestarts: 0, wantTotal: 4},
			// The next death is a first restart again.
			{at: 2 * time.Hour, rnd: 0.5, wantDelay: 1 * time.Second, wantRestarts: 1, wantTotal: 5},
		}},
		{"Recovered keeps restarts still within Period", []step{
			{at: 0, rnd: 0.5, wantDelay: 1 * time.Second, wantRestarts: 1, wantTotal: 1},
			{at: 0, rnd: 0.5, wantDelay: 2 * time.Second, wantRestarts: 2, wantTotal: 2},
			{at: 0, rnd: 0.5, wantDelay: 4 * time.Second, wantRestarts: 3, wantTotal: 3},
			{at: 0, rnd: 0.5, wantDelay: time.Minute, wantCrashLoop: true, wantRestarts: 4, wantTotal: 4},
			{at: 50 * time.Second, rnd: 0.5, wantDelay: time.Minute, wantCrashLoop: true, wantRestarts: 5, wantTotal: 5},
			// Spawned at 0 (an old process, say) and checked at 1m: the restart at 50s stays.
			{recover: true, spawned: 0, at: time.Minute, wantRecovered: true, wantRestarts: 1, wantTotal: 5},
			{at: 70 * time.Second, rnd: 0.5, wantDelay: 2 * time.Second, wantRestarts: 2, wantTotal: 6},
		}},
		{"Recovered without a crash loop does nothing", []step{
			{at: 0, rnd: 0.5, wantDelay: 1 * time.Second, wantRestarts: 1, wantTotal: 1},
			{recover: true, spawned: 0, at: time.Hour, wantRestarts: 1, wantTotal: 1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h supervise.History
			for i, s := range tt.steps {
				if s.recover {
					if got := policy.Recovered(&h, at(s.spawned), at(s.at)); got != s.wantRecovered {
						t.Errorf("step %d: Recovered(spawned %v, now %v) = %v, want %v", i, s.spawned, s.at, got, s.wantRecovered)
					}
				} else {
					d := policy.Next(&h, at(s.at), s.rnd)
					want := supervise.Decision{Delay: s.wantDelay, CrashLoop: s.wantCrashLoop}
					if d != want {
						t.Errorf("step %d: Next(%v, %v) = %+v, want %+v", i, s.at, s.rnd, d, want)
					}
				}
				if h.CrashLoop != s.wantCrashLoop || len(h.Restarts) != s.wantRestarts || h.Total != s.wantTotal {
					t.Errorf("step %d: history is crash loop %v, %d restarts, total %d; want %v, %d, %d",
						i, h.CrashLoop, len(h.Restarts), h.Total, s.wantCrashLoop, s.wantRestarts, s.wantTotal)
				}
			}
		})
	}
}

// TestRestartPolicyIntensityZero: with Intensity 0 every death is a crash loop,
// the policy for a cluster that must never restart quickly.
func TestRestartPolicyIntensityZero(t *testing.T) {
	p := policy
	p.Intensity = 0
	var h supervise.History
	if d := p.Next(&h, t0, 0.5); d != (supervise.Decision{Delay: time.Minute, CrashLoop: true}) {
		t.Errorf("Next = %+v, want the ceiling in a crash loop", d)
	}
}

// TestRestartPolicyRestartsAreTimes checks the history keeps the times it was
// given, oldest first, so a caller can show them.
func TestRestartPolicyRestartsAreTimes(t *testing.T) {
	var h supervise.History
	for _, d := range []time.Duration{0, 30 * time.Second, 70 * time.Second} {
		policy.Next(&h, at(d), 0.5)
	}
	want := []time.Time{at(30 * time.Second), at(70 * time.Second)}
	if len(h.Restarts) != len(want) {
		t.Fatalf("Restarts = %v, want %v", h.Restarts, want)
	}
	for i := range want {
		if !h.Restarts[i].Equal(want[i]) {
			t.Errorf("Restarts[%d] = %v, want %v", i, h.Restarts[i], want[i])
		}
	}
}
