package bench

import (
	"fmt"
	"slices"
)

// The soak scenario's verdict on a resource it sampled at a steady pace: did
// it grow beyond noise over the run?
//
// The rule: split the samples, in time order, into four quarters; skip the
// first (start-up: caches filling, the heap finding its size); compare the
// median of the last quarter (Q4) with the median of the second (Q2). The
// resource grew if
//
//	median(Q4) > median(Q2) × (1 + Rel) + Abs
//
// Medians ignore the spikes a kill or a deploy causes when a sample lands on
// one (a stopper goroutine, a new connection); Rel and Abs are the noise the
// resource is allowed. A leak of one goroutine, fd or buffer per request,
// kill or deploy grows steadily, and over a run of minutes it clears the
// allowance; what a steady state does, it does not.

// growthRule is the noise a resource is allowed.
type growthRule struct {
	Rel float64 // relative to median(Q2)
	Abs float64 // in the resource's unit
}

// The soak's rules. Goroutines and fds are exact counts: the allowance is for
// the work a sample may land on (a deploy's or a restart's processes, each
// with a connection, a waiter and an exit watcher). RSS moves with the heap's
// GC cycle, hence a wider allowance.
var (
	goroutineRule = growthRule{Rel: 0.10, Abs: 10}
	fdRule        = growthRule{Rel: 0.10, Abs: 5}
	rssRule       = growthRule{Rel: 0.20, Abs: 8 << 10} // KiB
)

// minGrowthSamples is the fewest samples a verdict needs: two per quarter.
const minGrowthSamples = 8

// growthVerdict is the rule's finding for one resource.
type growthVerdict struct {
	Metric   string  `json:"metric"`
	Samples  int     `json:"samples"`
	First    float64 `json:"first"`
	Max      float64 `json:"max"`
	Q2Median float64 `json:"q2_median"`
	Q4Median float64 `json:"q4_median"`
	Limit    float64 `json:"limit"` // what Q4's median may reach
	// SlopePerMin is the least-squares slope over Q2..Q4, per minute of run
	// at the given sample interval: for the report, not the verdict.
	SlopePerMin float64 `json:"slope_per_min"`
	Grew        bool    `json:"grew"`
	// Undecided: too few samples for a verdict (never a loadFailure).
	Undecided bool `json:"undecided,omitempty"`
}

// judgeGrowth applies rule to values, sampled every interval seconds.
func judgeGrowth(metric string, values []float64, rule growthRule, intervalS float64) growthVerdict {
	v := growthVerdict{Metric: metric, Samples: len(values)}
	if len(values) == 0 {
		v.Undecided = true
		return v
	}
	v.First, v.Max = values[0], slices.Max(values)
	if len(values) < minGrowthSamples {
		v.Undecided = true
		return v
	}
	n := len(values)
	q2 := values[n/4 : n/2]
	q4 := values[3*n/4:]
	v.Q2Median, v.Q4Median = median(q2), median(q4)
	v.Limit = v.Q2Median*(1+rule.Rel) + rule.Abs
	v.Grew = v.Q4Median > v.Limit
	if intervalS > 0 {
		v.SlopePerMin = slope(values[n/4:]) / intervalS * 60
	}
	return v
}

// slope is the least-squares slope of values against their index.
func slope(values []float64) float64 {
	n := float64(len(values))
	if n < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for i, y := range values {
		x := float64(i)
		sx += x
		sy += y
		sxx += x * x
		sxy += x * y
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}

// String is the verdict in one line.
func (v growthVerdict) String() string {
	switch {
	case v.Undecided:
		return fmt.Sprintf("%s: %d samples, too few to judge", v.Metric, v.Samples)
	case v.Grew:
		return fmt.Sprintf("%s GREW: median %g in the last quarter > limit %g (second quarter's median %g)", v.Metric, v.Q4Median, v.Limit, v.Q2Median)
	default:
		return fmt.Sprintf("%s steady: median %g in the last quarter ≤ limit %g (second quarter's median %g)", v.Metric, v.Q4Median, v.Limit, v.Q2Median)
	}
}
