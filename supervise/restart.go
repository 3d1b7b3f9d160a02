package supervise

import (
	"time"

	"github.com/sm-supervisor/sm/backoff"
)

// RestartPolicy decides how long to wait before respawning a dead cluster: a
// jittered exponential backoff over the restarts within Period, and past
// Intensity restarts within Period a crash loop retried at the backoff ceiling.
type RestartPolicy struct {
	Backoff   backoff.Policy
	Intensity int
	Period    time.Duration
}

// History is one cluster's recent restarts, kept by the caller.
type History struct {
	Restarts  []time.Time // times of restarts within the last Period
	CrashLoop bool
	Total     int // restarts since the manager started
}

// Decision is what to do about a cluster that just died.
type Decision struct {
	Delay     time.Duration
	CrashLoop bool
}

// Next records a restart at now and returns its delay. rnd is uniform in [0, 1).
func (p RestartPolicy) Next(h *History, now time.Time, rnd float64) Decision {
	h.prune(now, p.Period)
	h.Restarts = append(h.Restarts, now)
	h.Total++
	if len(h.Restarts) > p.Intensity {
		h.CrashLoop = true
	}
	if h.CrashLoop {
		return Decision{Delay: p.Backoff.Ceiling(rnd), CrashLoop: true}
	}
	return Decision{Delay: p.Backoff.Delay(len(h.Restarts)-1, rnd)}
}

// Recovered clears the crash-loop state once a cluster has stayed up, ready,
// for a whole Period since it was spawned, and reports whether it changed.
func (p RestartPolicy) Recovered(h *History, spawned, now time.Time) bool {
	if !h.CrashLoop || now.Sub(spawned) < p.Period {
		return false
	}
	h.CrashLoop = false
	h.prune(now, p.Period)
	return true
}

func (h *History) prune(now time.Time, period time.Duration) {
	keep := h.Restarts[:0]
	for _, t := range h.Restarts {
		if now.Sub(t) < period {
			keep = append(keep, t)
		}
	}
	h.Restarts = keep
}
