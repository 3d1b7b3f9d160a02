package mesh

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sm-supervisor/sm/discord"
)

// The shared session-start budget: one key, "budget" in NAME_budget, holding
// Discord's last count minus every identify any host granted since. Every
// change is a compare-and-set on the key's revision, retried on conflict, so
// two hosts never spend the same start and no spend is lost.

const budgetKey = "budget"

// BudgetRecord is the budget as the hosts share it. Times are wall-clock
// times (ResetAt is Discord's reset, which every host compares with its own
// NTP-disciplined clock).
type BudgetRecord struct {
	Total      int       `json:"total"`
	Remaining  int       `json:"remaining"`
	ResetAt    time.Time `json:"reset_at,omitzero"`
	ObservedAt time.Time `json:"observed_at"`
	Spent      int       `json:"spent"`
	// MaxConcurrency is the bucket count of the host that observed the
	// budget: hosts of a mesh must agree on it (a shard's bucket is
	// shard % max_concurrency), and one with no count of its own (no token,
	// no discord.max_concurrency) takes this one.
	MaxConcurrency int `json:"max_concurrency,omitempty"`
}

// State is the record as a discord.Budget takes it (Restore).
func (r BudgetRecord) State() discord.BudgetState {
	return discord.BudgetState{Known: true, Total: r.Total, Remaining: r.Remaining, ResetAt: r.ResetAt, ObservedAt: r.ObservedAt, Spent: r.Spent}
}

func (r BudgetRecord) equal(o BudgetRecord) bool {
	return r.Total == o.Total && r.Remaining == o.Remaining && r.Spent == o.Spent && r.MaxConcurrency == o.MaxConcurrency &&
		r.ResetAt.Equal(o.ResetAt) && r.ObservedAt.Equal(o.ObservedAt)
}

// RecordOf is a known budget's state as the hosts share it (with no
// MaxConcurrency: the caller adds its own).
func RecordOf(st discord.BudgetState) BudgetRecord {
	return BudgetRecord{Total: st.Total, Remaining: st.Remaining, ResetAt: st.ResetAt, ObservedAt: st.ObservedAt, Spent: st.Spent}
}

// Spend is the outcome of one SpendBudget.
type Spend struct {
	// Known: the mesh has a budget (some host had a /gateway/bot answer).
	// Without one nothing is counted and everything is allowed, as by a
	// single host without a token.
	Known bool
	// Allowed: the identify may be granted, and (if Known) one start was
	// spent. Else Why says why not, as discord.Budget.Allow does.
	Allowed bool
	Why     string
	// Before and After are the record as the spend found and left it.
	Before, After BudgetRecord
}

// decideSpend is SpendBudget's decision on the record found (if found): the
// governor's rule (discord.Budget, with this host's floor) applied to the
// shared count, the reset rolled in at now.
func decideSpend(cur BudgetRecord, found bool, reason discord.Reason, floor int, now time.Time) (s Spend, write bool) {
	if !found {
		return Spend{Allowed: true}, false
	}
	b := discord.Budget{Floor: floor}
	b.Restore(cur.State())
	s = Spend{Known: true, Before: RecordOf(b.State(now))} // a reset passed is rolled in
	s.Before.MaxConcurrency = cur.MaxConcurrency
	s.Allowed, s.Why = b.Allow(reason, now)
	if !s.Allowed {
		s.After = s.Before
		return s, !s.Before.equal(cur) // write a reset rolled in, not a refusal
	}
	b.Spend(now)
	s.After = RecordOf(b.State(now))
	s.After.MaxConcurrency = cur.MaxConcurrency
	return s, true
}

// decideRefund gives back the start s spent, if the record is still the one
// s spent from: the same observation and reset (a newer /gateway/bot answer
// or a reset replaced the count, and with it the spend).
func decideRefund(cur BudgetRecord, found bool, s Spend) (BudgetRecord, bool) {
	if !found || !s.Known || !s.Allowed || cur.Spent <= 0 ||
		!cur.ObservedAt.Equal(s.After.ObservedAt) || !cur.ResetAt.Equal(s.After.ResetAt) {
		return cur, false
	}
	cur.Spent--
	cur.Remaining = min(cur.Remaining+1, cur.Total)
	return cur, true
}

// decideObserve replaces the record with a newer /gateway/bot answer: the
// newest observation wins, wherever it was made.
func decideObserve(cur BudgetRecord, found bool, obs BudgetRecord) (BudgetRecord, bool) {
	if found && !obs.ObservedAt.After(cur.ObservedAt) {
		return cur, false
	}
	return obs, true
}

// SpendBudget spends one session start for an identify of reason, if the
// shared budget allows it under this host's floor.
func (d *DiscordStore) SpendBudget(ctx context.Context, reason discord.Reason, floor int) (Spend, error) {
	var s Spend
	_, err := d.updateBudget(ctx, "spending", func(cur BudgetRecord, found bool) (BudgetRecord, bool) {
		var write bool
		s, write = decideSpend(cur, found, reason, floor, time.Now())
		return s.After, write
	})
	return s, err
}

// RefundBudget gives back a start SpendBudget spent for an identify that was
// never granted.
func (d *DiscordStore) RefundBudget(ctx context.Context, s Spend) error {
	if !s.Known || !s.Allowed {
		return nil
	}
	_, err := d.updateBudget(ctx, "refunding", func(cur BudgetRecord, found bool) (BudgetRecord, bool) {
		return decideRefund(cur, found, s)
	})
	return err
}

// ObserveBudget records a /gateway/bot answer unless a newer one is there,
// and returns the record in force.
func (d *DiscordStore) ObserveBudget(ctx context.Context, obs BudgetRecord) (BudgetRecord, error) {
	return d.updateBudget(ctx, "observing", func(cur BudgetRecord, found bool) (BudgetRecord, bool) {
		return decideObserve(cur, found, obs)
	})
}

// Budget reads the shared budget; found is false while no host has had a
// /gateway/bot answer.
func (d *DiscordStore) Budget(ctx context.Context) (r BudgetRecord, found bool, err error) {
	ctx, cancel := d.opCtx(ctx)
	defer cancel()
	r, found, _, err = d.readBudget(ctx)
	return r, found, err
}

func (d *DiscordStore) readBudget(ctx context.Context) (r BudgetRecord, found bool, rev uint64, err error) {
	e, err := d.budget.Get(ctx, budgetKey)
	switch {
	case absent(err):
		return BudgetRecord{}, false, 0, nil // a create makes it (over a delete marker too)
	case err != nil:
		return BudgetRecord{}, false, 0, fmt.Errorf("mesh: reading the budget: %w", err)
	}
	if json.Unmarshal(e.Value(), &r) != nil {
		return BudgetRecord{}, false, e.Revision(), nil // unreadable: replaced by the next write
	}
	return r, true, e.Revision(), nil
}

// updateBudget reads the record, asks fn for the next one and writes it at
// the revision it read, again on a conflict (another host wrote between),
// all within one Op. It returns the record in force afterwards.
func (d *DiscordStore) updateBudget(ctx context.Context, what string, fn func(cur BudgetRecord, found bool) (BudgetRecord, bool)) (BudgetRecord, error) {
	ctx, cancel := d.opCtx(ctx)
	defer cancel()
	for {
		cur, found, rev, err := d.readBudget(ctx)
		if err != nil {
			return BudgetRecord{}, fmt.Errorf("mesh: %s the budget: %w", what, err)
		}
		next, write := fn(cur, found)
		if !write {
			return cur, nil
		}
		v, _ := json.Marshal(next) // a plain struct always encodes
		if rev == 0 {
			_, err = d.budget.Create(ctx, budgetKey, v)
		} else {
			_, err = d.budget.Update(ctx, budgetKey, v, rev)
		}
		switch {
		case err == nil:
			return next, nil
		case !conflict(err):
			return BudgetRecord{}, fmt.Errorf("mesh: %s the budget: %w", what, err)
		}
		// Another host wrote since the read: decide again on its record.
	}
}
