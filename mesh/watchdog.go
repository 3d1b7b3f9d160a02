package mesh

import (
	"context"
	"slices"
	"time"
)

// The watchdog fences for a host whose owner cannot. The agent's Stop goes
// through its owner (the manager's loop), which kills the cluster's processes
// and confirms their exit; a loop that is wedged confirms nothing, and the
// agent, waiting in Stop, would leave the processes running past the lease.
// So beside the agent a watchdog kills a cluster's processes itself (Kill)
// when its Stop has not been confirmed by StopBy: Op after the fence, which
// leaves Margin − Op (an eighth of the lease) before the server can let
// another host take the cluster.

// StopBy is when the Stop of a lease last written at sent, begun at began,
// must have been confirmed: Op after the fence or after the Stop began,
// whichever comes first (a lease lost to another host is stopped at once,
// and given no longer for it).
func (t Timing) StopBy(sent, began time.Time) time.Time {
	f := t.FenceAt(sent)
	if began.Before(f) {
		f = began
	}
	return f.Add(t.Op)
}

// Overdue is the watchdog's decision at now: the clusters whose processes
// the host must kill itself, in cluster order. stopping are the Stops begun
// and not confirmed, each with its StopBy; held are the leases the agent
// still holds, whose Stop it has not even begun: one past its fence by Op
// means the agent itself is stuck.
func Overdue(t Timing, now time.Time, held map[int]Held, stopping map[int]time.Time) []int {
	var out []int
	for c, by := range stopping {
		if !now.Before(by) {
			out = append(out, c)
		}
	}
	for c, h := range held {
		if _, ok := stopping[c]; !ok && !now.Before(t.FenceAt(h.Sent).Add(t.Op)) {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}

// nextOverdue is when Overdue may next name a cluster that it does not at
// now, or now + def if none is sooner.
func nextOverdue(t Timing, now time.Time, held map[int]Held, stopping map[int]time.Time, def time.Duration) time.Time {
	next := now.Add(def)
	for _, by := range stopping {
		if by.After(now) && by.Before(next) {
			next = by
		}
	}
	for c, h := range held {
		if _, ok := stopping[c]; !ok {
			if by := t.FenceAt(h.Sent).Add(t.Op); by.After(now) && by.Before(next) {
				next = by
			}
		}
	}
	return next
}

// watch runs the watchdog until ctx ends: at every deadline, and every Op / 4
// while a cluster stays overdue (its processes may not all be gone), it
// calls Kill for each overdue cluster. Kill runs under the agent's lock, so
// that no Take of the cluster can come between the decision and the kill.
func (a *Agent) watch(ctx context.Context) {
	t := a.Store.Timing
	for {
		a.mu.Lock()
		now := a.now()
		due := Overdue(t, now, a.held, a.stopping)
		for _, c := range due {
			a.Kill(c)
		}
		next := nextOverdue(t, now, a.held, a.stopping, t.Op/4)
		a.mu.Unlock()
		if len(due) > 0 {
			a.Log.Debug("mesh: watchdog: Stops not confirmed in time", "clusters", due)
		}
		timer := time.NewTimer(max(next.Sub(now), time.Millisecond))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
	}
}

// stopOne calls Stop for cluster c, whose lease was last written at sent,
// with the watchdog watching it.
func (a *Agent) stopOne(c int, sent time.Time) {
	a.mu.Lock()
	a.stopping[c] = a.Store.Timing.StopBy(sent, a.now())
	a.mu.Unlock()
	a.Stop(c)
	a.stopped(c)
}

// stopped forgets the Stop of c: its owner confirmed it.
func (a *Agent) stopped(c int) {
	a.mu.Lock()
	delete(a.stopping, c)
	a.mu.Unlock()
}
