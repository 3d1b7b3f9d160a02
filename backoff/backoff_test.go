package backoff_test

import (
	"math"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sm-supervisor/sm/backoff"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDelay(t *testing.T) {
	exact := backoff.Policy{Min: 100 * time.Millisecond, Max: 2 * time.Second}
	jit := backoff.Policy{Min: 100 * time.Millisecond, Max: 2 * time.Second, Jitter: 0.2}
	tests := []struct {
		name    string
		p       backoff.Policy
		attempt int
		rnd     float64
		want    time.Duration
	}{
		{"first retry waits Min", exact, 0, 0.5, 100 * time.Millisecond},
		{"doubles", exact, 1, 0.5, 200 * time.Millisecond},
		{"doubles again", exact, 2, 0.5, 400 * time.Millisecond},
		{"below the cap", exact, 4, 0.5, 1600 * time.Millisecond},
		{"capped at Max", exact, 5, 0.5, 2 * time.Second},
		{"stays capped", exact, 1000, 0.5, 2 * time.Second},
		{"no overflow at huge attempts", exact, math.MaxInt, 0.5, 2 * time.Second},
		{"negative attempt is the first", exact, -3, 0.5, 100 * time.Millisecond},
		{"no jitter ignores rnd", exact, 1, 0.999, 200 * time.Millisecond},

		{"jitter: middle rnd is exact", jit, 0, 0.5, 100 * time.Millisecond},
		{"jitter: rnd 0 is -20%", jit, 0, 0, 80 * time.Millisecond},
		{"jitter: rnd 0.999 is just under +20%", jit, 0, 0.999, 119_960_000},
		{"jitter: spread around the cap", jit, 10, 0, 1600 * time.Millisecond},
		{"jitter: can pass Max by the spread", jit, 10, 0.999, 2_399_200_000},

		{"Max below Min means constant Min", backoff.Policy{Min: time.Second}, 3, 0.5, time.Second},
		{"zero policy is no wait", backoff.Policy{}, 3, 0.5, 0},
		{"zero Min at huge attempts", backoff.Policy{Max: time.Second}, math.MaxInt, 0.5, 0},
		{"jitter over 1 never goes negative", backoff.Policy{Min: time.Second, Max: time.Second, Jitter: 2}, 0, 0, 0},
		{"largest Max does not overflow", backoff.Policy{Min: time.Second, Max: math.MaxInt64}, 1000, 0.5,
			time.Duration(math.Nextafter(math.MaxInt64, 0))},
		{"jitter at the largest Max does not overflow", backoff.Policy{Min: time.Second, Max: math.MaxInt64, Jitter: 0.5}, 1000, 0.999,
			time.Duration(math.Nextafter(math.MaxInt64, 0))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.Delay(tt.attempt, tt.rnd); got != tt.want {
				t.Errorf("Delay(%d, %v) = %v, want %v", tt.attempt, tt.rnd, got, tt.want)
			}
		})
	}
}

// TestDelayBounds sweeps attempts and random numbers and checks every delay
// against the bounds the policy promises.
func TestDelayBounds(t *testing.T) {
	policies := []backoff.Policy{
		{Min: 500 * time.Millisecond, Max: 30 * time.Second, Jitter: 0.2},
		{Min: time.Millisecond, Max: time.Minute, Jitter: 0.5},
		{Min: 50 * time.Millisecond, Max: 5 * time.Second},
	}
	for _, p := range policies {
		prev := time.Duration(0)
		for attempt := -1; attempt < 80; attempt++ {
			base := min(float64(p.Min)*math.Pow(2, float64(max(attempt, 0))), float64(p.Max))
			lo, hi := time.Duration(base*(1-p.Jitter)), time.Duration(base*(1+p.Jitter))
			for _, rnd := range []float64{0, 0.001, 0.25, 0.5, 0.75, 0.999, 0.999999} {
				d := p.Delay(attempt, rnd)
				if d < lo || d > hi {
					t.Fatalf("%+v: Delay(%d, %v) = %v, outside [%v, %v]", p, attempt, rnd, d, lo, hi)
				}
			}
			// With rnd fixed, delays never shrink as attempts go up.
			if d := p.Delay(attempt, 0.5); d < prev {
				t.Fatalf("%+v: Delay(%d) = %v < previous %v", p, attempt, d, prev)
			} else {
				prev = d
			}
		}
	}
}

func TestCeiling(t *testing.T) {
	tests := []struct {
		p    backoff.Policy
		rnd  float64
		want time.Duration
	}{
		{backoff.Policy{Min: time.Second, Max: 30 * time.Second}, 0.7, 30 * time.Second},
		{backoff.Policy{Min: time.Second, Max: 30 * time.Second, Jitter: 0.2}, 0, 24 * time.Second},
		{backoff.Policy{Min: time.Second, Max: 30 * time.Second, Jitter: 0.2}, 0.5, 30 * time.Second},
		{backoff.Policy{Min: time.Second, Max: 30 * time.Second, Jitter: 0.2}, 0.999, 35_988_000_000},
		{backoff.Policy{Min: time.Second}, 0.5, time.Second}, // unset Max: Min, not zero
		{backoff.Policy{}, 0.5, 0},
	}
	for _, tt := range tests {
		if got := tt.p.Ceiling(tt.rnd); got != tt.want {
			t.Errorf("%+v.Ceiling(%v) = %v, want %v", tt.p, tt.rnd, got, tt.want)
		}
		// The ceiling is where Delay ends up.
		if got, want := tt.p.Delay(1<<20, tt.rnd), tt.p.Ceiling(tt.rnd); got != want {
			t.Errorf("%+v: Delay at a huge attempt = %v, Ceiling = %v", tt.p, got, want)
		}
	}
}
