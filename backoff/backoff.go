// Package backoff computes jittered exponential delays, for restarts of crashed
// clusters and for clients reconnecting to the manager.
package backoff

import (
	"math"
	"time"
)

// Policy is a jittered exponential backoff: attempt n waits Min·2ⁿ, capped at Max,
// then spread by ±Jitter (a fraction, 0.2 = ±20%) so that many processes that
// failed together do not retry together.
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
	d := float64(p.Min) * math.Pow(2, float64(attempt))
	if d > float64(p.Max) || math.IsInf(d, 0) {
		d = float64(p.Max)
	}
	return p.spread(d, rnd)
}

// Ceiling returns Max spread by the jitter: the delay used once a cluster is in
// a crash loop.
func (p Policy) Ceiling(rnd float64) time.Duration { return p.spread(float64(p.Max), rnd) }

func (p Policy) spread(d, rnd float64) time.Duration {
	if p.Jitter > 0 {
		d *= 1 + p.Jitter*(2*rnd-1)
	}
	if d < 0 {
		d = 0
	}
	return time.Duration(d)
}
