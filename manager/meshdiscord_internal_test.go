package manager

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/mesh"
)

// What a host does with the shared gate's answer to a claim: grant only
// within the grant window, never without the gate, and give back whatever
// it won and did not use.
func TestDecideClaim(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	const floor = 100
	spacing, hold, window := 300*time.Millisecond, 400*time.Millisecond, 100*time.Millisecond
	budget := func(remaining int) mesh.BudgetRecord {
		return mesh.BudgetRecord{Total: 1000, Remaining: remaining, ResetAt: now.Add(time.Hour), ObservedAt: now.Add(-time.Hour)}
	}
	won := func(sent time.Duration, reason discord.Reason, remaining int) claimResult {
		r := claimResult{reason: reason, claimed: true, claim: mesh.IdentifyClaim{Rev: 7, Sent: now.Add(-sent)}, spent: true}
		b := discord.Budget{Floor: floor}
		b.Restore(budget(remaining).State())
		r.spend.Known, r.spend.Before = true, budget(remaining)
		r.spend.Allowed, r.spend.Why = b.Allow(reason, now)
		r.spend.After = r.spend.Before
		if r.spend.Allowed {
			r.spend.After.Remaining--
		}
		return r
	}
	head := func(reason discord.Reason) claimHead { return claimHead{ok: true, reason: reason} }
	start, restart := discord.ReasonStart, discord.ReasonRestart

	for _, tc := range []struct {
		name string
		r    claimResult
		h    claimHead
		want claimOutcome
	}{
		{"won in time: grant, free again a hold after the claim's send", won(5*time.Millisecond, start, 500), head(start),
			claimOutcome{action: claimGrant, free: now.Add(-5 * time.Millisecond).Add(hold)}},
		{"another host's grant: claim again when it expires", claimResult{busy: &mesh.BusyError{Retry: now.Add(time.Second)}}, head(start),
			claimOutcome{action: claimRetry, retry: now.Add(time.Second)}},
		{"the gate did not answer: no grant, ask again soon", claimResult{err: errors.New("nats: connection closed")}, head(start),
			claimOutcome{action: claimRetry, retry: now.Add(claimRetryOnError)}},
		{"the gate answered the claim, not the spend: the slot given back", claimResult{claimed: true, err: errors.New("timeout")}, head(start),
			claimOutcome{action: claimRetry, retry: now.Add(claimRetryOnError), release: true}},
		{"won past the grant window: given back, claimed again", won(window+time.Millisecond, start, 500), head(start),
			claimOutcome{action: claimRetry, retry: now, release: true, refund: true, late: true}},
		{"nobody waits any more: given back", won(time.Millisecond, start, 500), claimHead{},
			claimOutcome{action: claimRetry, retry: now, release: true, refund: true}},
		{"the head is being stopped: forbidden, given back", won(time.Millisecond, start, 500), claimHead{ok: true, reason: start, stopping: true},
			claimOutcome{action: claimForbid, free: now, release: true, refund: true}},
		{"a restart at the floor: refused, the slot given back", won(time.Millisecond, restart, floor), head(restart),
			claimOutcome{action: claimRefuse, free: now, why: "floor", release: true}},
		{"claimed for a start, a restart heads now, at the floor: refused, all given back", won(time.Millisecond, start, floor), head(restart),
			claimOutcome{action: claimRefuse, free: now, why: "floor", release: true, refund: true}},
		{"claimed for a restart at the floor, a start heads now: claimed again for it", won(time.Millisecond, restart, floor), head(start),
			claimOutcome{action: claimRetry, retry: now, release: true}},
		{"no budget in the mesh: granted", claimResult{claimed: true, claim: mesh.IdentifyClaim{Sent: now}, spent: true, spend: mesh.Spend{Allowed: true}}, head(restart),
			claimOutcome{action: claimGrant, free: now.Add(hold)}},
	} {
		got := decideClaim(tc.r, tc.h, now, floor, spacing, hold, window)
		if tc.want.why != "" {
			if !strings.Contains(got.why, tc.want.why) {
				t.Errorf("%s: why %q, want it to say %q", tc.name, got.why, tc.want.why)
			}
			got.why = tc.want.why
		}
		if got != tc.want {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
	}

	// A grant is free again after the spacing at least, even when the claim
	// was sent long before (a slow answer still inside the window).
	r := won(0, start, 500)
	if o := decideClaim(r, head(start), now, floor, spacing, 50*time.Millisecond, window); !o.free.Equal(now.Add(spacing)) {
		t.Errorf("free %v after now, want the spacing", o.free.Sub(now))
	}
}
