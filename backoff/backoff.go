// Package backoff computes jittered exponential delays, for restarts of crashed
// clusters and for clients reconnecting to the manager.
package backoff

import (
	"math"
	"time"
)

// Policy is a jittered exponential backoff: attempt n waits Min·2ⁿ, capped at Max,
// then spread by ±Jitter (a fraction, 0.2 = ±20%) so that many processes that
// failed together do not retry together. A Max below Min (an unset Max, say) is
// taken as Min: a constant delay rather than none at all.
type Policy struct {
	Min    time.Duration
	Max    time.Duration
	Jitter float64
}

// Delay returns the wait before retry number attempt (0 for the first retry).
// rnd is a uniform random number in [0, 1), injected so the decision is pure.
func (p Policy) Delay(attempt int, rnd float64) time.Duration {
	if attempt < 0 {
		attempt = 0
	}
	if p.Min <= 0 {
		return 0 // and not 0·2ⁿ, which is NaN once 2ⁿ overflows
	}
	d := float64(p.Min) * math.Pow(2, float64(attempt))
	if ceiling := p.ceiling(); d > ceiling {
		d = ceiling
	}
	return p.spread(d, rnd)
}

// Ceiling returns Max spread by the jitter: the delay used once a cluster is in
// a crash loop.
func (p Policy) Ceiling(rnd float64) time.Duration { return p.spread(p.ceiling(), rnd) }

func (p Policy) ceiling() float64 { return float64(max(p.Max, p.Min)) }

// maxDelay is the largest float64 below 2⁶³: converting anything larger to a
// Duration overflows (to a negative delay on amd64).
var maxDelay = math.Nextafter(math.MaxInt64, 0)

func (p Policy) spread(d, rnd float64) time.Duration {
	if p.Jitter > 0 {
		d *= 1 + p.Jitter*(2*rnd-1)
	}
	if d < 0 || math.IsNaN(d) {
		d = 0
	}
	if d > maxDelay {
		d = maxDelay
	}
	return time.Duration(d)
}
