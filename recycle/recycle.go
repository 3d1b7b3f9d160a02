// Package recycle decides when a cluster process has grown too large or too
// slow and must be replaced by a fresh process of the same generation: its
// memory (RSS, read by the manager from /proc, or the heap it reports) or its
// event-loop lag stayed above a limit for a sustained time. It is pure code:
// the manager feeds it samples and the time, and carries out its verdicts
// through the deploy machinery (docs/deploys.md#recycling).
package recycle

import (
	"fmt"
	"sort"
	"time"
)

// Reason names the limit a cluster went over; it is the label of
// sm_recycles_total.
type Reason string

// The reasons, in the order a cluster over several limits is blamed.
const (
	RSS  Reason = "rss"
	Heap Reason = "heap"
	Lag  Reason = "lag"
)

var reasons = [...]Reason{RSS, Heap, Lag}

// Limits are the [recycle] table's thresholds and pacing. A zero maximum is
// not watched.
type Limits struct {
	MaxRSS  int64         // bytes of resident memory of the process (and its process group)
	MaxHeap int64         // bytes, from the heartbeat's heap_bytes
	MaxLag  time.Duration // from the heartbeat's loop_lag_ms
	// Sustain is how long a value must stay above its limit, sample after
	// sample, before the cluster is recycled: one spike is no reason.
	Sustain time.Duration
	// MaxParallel bounds the recycles in flight at once (at least 1).
	MaxParallel int
	// Cooldown is the least time between the end of a cluster's recycle and
	// the start of its next.
	Cooldown time.Duration
}

// Unknown is a Sample value that was not measured: the process reports no
// heap or lag, or its /proc entry could not be read. It counts as under the
// limit, so a missing reading never recycles anything.
const Unknown = -1

// Sample is one reading of a cluster's process.
type Sample struct {
	Cluster int
	// Proc names the process sampled (the manager's spawn number): a new
	// process of the cluster starts with a clean record.
	Proc uint64
	At   time.Time
	RSS  int64         // bytes, or Unknown
	Heap int64         // bytes, or Unknown
	Lag  time.Duration // or Unknown
}

func (s Sample) value(r Reason) int64 {
	switch r {
	case RSS:
		return s.RSS
	case Heap:
		return s.Heap
	default:
		return int64(s.Lag)
	}
}

// Policy keeps, per cluster, since when each value has been above its limit,
// and whether a recycle of it is in flight. Not safe for concurrent use: the
// manager's event loop owns it.
type Policy struct {
	limits   Limits
	clusters map[int]*record
}

type record struct {
	proc      uint64
	last      Sample
	overSince [len(reasons)]time.Time // zero: not over
	recycling bool
	ended     time.Time // the end of the last recycle, for the cooldown
}

// New returns a policy for l.
func New(l Limits) *Policy {
	l.MaxParallel = max(l.MaxParallel, 1)
	return &Policy{limits: l, clusters: map[int]*record{}}
}

func (p *Policy) limit(r Reason) int64 {
	switch r {
	case RSS:
		return p.limits.MaxRSS
	case Heap:
		return p.limits.MaxHeap
	default:
		return int64(p.limits.MaxLag)
	}
}

func (p *Policy) record(c int) *record {
	rec := p.clusters[c]
	if rec == nil {
		rec = &record{}
		p.clusters[c] = rec
	}
	return rec
}

// Observe takes one sample. A value at or under its limit, or unknown, ends
// that value's time over the limit; a sample of another process than the
// last starts the cluster's record afresh.
func (p *Policy) Observe(s Sample) {
	rec := p.record(s.Cluster)
	if rec.proc != s.Proc {
		rec.proc, rec.overSince = s.Proc, [len(reasons)]time.Time{}
	}
	rec.last = s
	for i, r := range reasons {
		lim, v := p.limit(r), s.value(r)
		switch {
		case lim <= 0 || v == Unknown || v <= lim:
			rec.overSince[i] = time.Time{}
		case rec.overSince[i].IsZero():
			rec.overSince[i] = s.At
		}
	}
}

// Forget drops what is known of cluster c: its process is gone, or the
// topology changed and c names other shards now.
func (p *Policy) Forget(c int) {
	if rec := p.clusters[c]; rec != nil && !rec.recycling {
		delete(p.clusters, c)
	}
}

// Gate is what the rest of the manager says about starting a recycle now.
type Gate struct {
	// Deploying: a deploy is running; no recycle starts during one.
	Deploying bool
	// Serving reports whether cluster c has one ready, routed process that
	// no deploy owns: only such a process can be handed off without a gap.
	Serving func(c int) bool
	// Budget reports whether the session-start budget consents to cluster c's
	// new process identifying its shards, and if not why.
	Budget func(c int) (ok bool, why string)
}

// Verdict is the policy's answer for one cluster over a limit.
type Verdict struct {
	Cluster int
	Reason  Reason
	// Detail says what was measured, for the log and the feed:
	// "rss 301 MiB over 256 MiB for 1m0s".
	Detail string
	// Start: recycle it now (call Started). Otherwise Held says why not.
	Start bool
	Held  string
}

// Decide returns a verdict for every cluster whose value has stayed over its
// limit for Sustain at now, in cluster order; at most MaxParallel recycles are
// in flight, counting those it starts. Clusters being recycled, or not
// Serving, get no verdict.
func (p *Policy) Decide(now time.Time, g Gate) []Verdict {
	ids := make([]int, 0, len(p.clusters))
	inFlight := 0
	for c, rec := range p.clusters {
		ids = append(ids, c)
		if rec.recycling {
			inFlight++
		}
	}
	sort.Ints(ids)
	var out []Verdict
	for _, c := range ids {
		rec := p.clusters[c]
		if rec.recycling {
			continue
		}
		r, over, ok := p.breach(rec, now)
		if !ok || (g.Serving != nil && !g.Serving(c)) {
			continue
		}
		v := Verdict{Cluster: c, Reason: r, Detail: p.detail(r, rec.last.value(r), over)}
		switch {
		case !rec.ended.IsZero() && now.Sub(rec.ended) < p.limits.Cooldown:
			// A time, not a countdown: the text changes only when the hold does.
			v.Held = fmt.Sprintf("in cooldown until %s (recycle.cooldown)", rec.ended.Add(p.limits.Cooldown).UTC().Format(time.DateTime+" UTC"))
		case g.Deploying:
			v.Held = "a deploy is running"
		case inFlight >= p.limits.MaxParallel:
			v.Held = fmt.Sprintf("%d recycles in flight (recycle.max_parallel)", inFlight)
		default:
			if g.Budget != nil {
				if ok, why := g.Budget(c); !ok {
					v.Held = "the session-start budget refuses: " + why
					break
				}
			}
			v.Start = true
			inFlight++
		}
		out = append(out, v)
	}
	return out
}

// breach is the first reason cluster rec has been over for Sustain, and for how long.
func (p *Policy) breach(rec *record, now time.Time) (Reason, time.Duration, bool) {
	for i, r := range reasons {
		since := rec.overSince[i]
		if !since.IsZero() && now.Sub(since) >= p.limits.Sustain {
			return r, now.Sub(since), true
		}
	}
	return "", 0, false
}

func (p *Policy) detail(r Reason, v int64, over time.Duration) string {
	if over < time.Minute {
		over = over.Round(100 * time.Millisecond)
	} else {
		over = over.Round(time.Second)
	}
	if r == Lag {
		return fmt.Sprintf("lag %v over %v for %v", time.Duration(v).Round(time.Millisecond), p.limits.MaxLag, over)
	}
	return fmt.Sprintf("%s %s over %s for %v", r, mib(v), mib(p.limit(r)), over)
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// Started records that cluster c's recycle started: no other starts for it
// until Finished, and its record starts afresh.
func (p *Policy) Started(c int) {
	rec := p.record(c)
	rec.recycling, rec.overSince = true, [len(reasons)]time.Time{}
}

// Finished records the end of cluster c's recycle, succeeded or not, at now:
// the cooldown starts.
func (p *Policy) Finished(c int, now time.Time) {
	rec := p.record(c)
	rec.recycling, rec.ended = false, now
}

// Recycling reports whether a recycle of cluster c is in flight.
func (p *Policy) Recycling(c int) bool {
	rec := p.clusters[c]
	return rec != nil && rec.recycling
}
