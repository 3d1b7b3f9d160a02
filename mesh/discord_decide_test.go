package mesh

import (
	"testing"
	"time"

	"github.com/sm-supervisor/sm/discord"
)

func TestGrantWindowAndHold(t *testing.T) {
	for _, tc := range []struct{ spacing, window, hold time.Duration }{
		{discord.DefaultSpacing, 275 * time.Millisecond, 5775 * time.Millisecond},
		{300 * time.Millisecond, 100 * time.Millisecond, 400 * time.Millisecond},
		{time.Millisecond, 100 * time.Millisecond, 101 * time.Millisecond}, // the server keeps nothing for under 100 ms
	} {
		if w, h := GrantWindow(tc.spacing), IdentifyHold(tc.spacing); w != tc.window || h != tc.hold {
			t.Errorf("spacing %v: window %v, hold %v; want %v, %v", tc.spacing, w, h, tc.window, tc.hold)
		}
		// What the gate's guarantee rests on: a grant made within the
		// window of its claim's send, and the next claim stored a hold after
		// the first's store, are the spacing apart at least.
		if IdentifyHold(tc.spacing)-GrantWindow(tc.spacing) < tc.spacing {
			t.Errorf("spacing %v: hold - window < spacing", tc.spacing)
		}
	}
}

func TestIdentifyRetry(t *testing.T) {
	now := time.Unix(1000, 0)
	hold := 5 * time.Second // poll 100 ms
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, tc := range []struct {
		name    string
		created time.Time
		found   bool
		want    time.Duration // after now
	}{
		{"gone between the create and the read: at once", time.Time{}, false, 0},
		{"stored 1s ago: when it expires", now.Add(-time.Second), true, 4 * time.Second},
		{"stored just now", now, true, hold},
		{"due already (the server expires late): poll", now.Add(-hold), true, ms(100)},
		{"long overdue: poll", now.Add(-time.Hour), true, ms(100)},
		{"nearly due: no sooner than a poll", now.Add(-hold + ms(30)), true, ms(100)},
		{"the server's clock ahead of ours: a hold at the most", now.Add(time.Minute), true, hold},
	} {
		if got := IdentifyRetry(now, tc.created, tc.found, hold).Sub(now); got != tc.want {
			t.Errorf("%s: retry in %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := IdentifyRetry(now, now.Add(-time.Hour), true, 101*time.Millisecond).Sub(now); got != 10*time.Millisecond {
		t.Errorf("short hold: poll %v, want the 10 ms floor", got)
	}
}

func TestDecideSpend(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rec := BudgetRecord{Total: 1000, Remaining: 101, ResetAt: t0.Add(time.Hour), ObservedAt: t0, Spent: 3, MaxConcurrency: 16}

	// No budget in the mesh: allowed, nothing written.
	if s, write := decideSpend(BudgetRecord{}, false, discord.ReasonRestart, 100, t0); !s.Allowed || s.Known || write {
		t.Fatalf("no record: %+v write=%v", s, write)
	}
	// A restart above the floor spends one.
	s, write := decideSpend(rec, true, discord.ReasonRestart, 100, t0)
	if !s.Allowed || !s.Known || !write || s.After.Remaining != 100 || s.After.Spent != 4 || s.Before.Remaining != 101 ||
		s.After.MaxConcurrency != 16 || s.Before.MaxConcurrency != 16 {
		t.Fatalf("restart at 101, floor 100: %+v write=%v", s, write)
	}
	// At the floor a restart is refused and nothing is written; a start
	// still spends.
	at := s.After
	if s, write := decideSpend(at, true, discord.ReasonRestart, 100, t0); s.Allowed || write || s.Why == "" || s.After.Remaining != 100 {
		t.Fatalf("restart at the floor: %+v write=%v", s, write)
	}
	if s, write := decideSpend(at, true, discord.ReasonStart, 100, t0); !s.Allowed || !write || s.After.Remaining != 99 {
		t.Fatalf("start at the floor: %+v write=%v", s, write)
	}
	// At zero nothing spends.
	zero := BudgetRecord{Total: 1000, Remaining: 0, ResetAt: t0.Add(time.Hour), ObservedAt: t0}
	if s, write := decideSpend(zero, true, discord.ReasonDeploy, 100, t0); s.Allowed || write {
		t.Fatalf("deploy at zero: %+v write=%v", s, write)
	}
	// Past the reset the total is back: a refusal that rolled the reset in
	// writes the roll, so every host sees it.
	s, write = decideSpend(zero, true, discord.ReasonRestart, 2000, t0.Add(2*time.Hour))
	if s.Allowed || !write || s.After.Remaining != 1000 || !s.After.ResetAt.IsZero() {
		t.Fatalf("refusal after the reset: %+v write=%v", s, write)
	}
	s, _ = decideSpend(zero, true, discord.ReasonRestart, 100, t0.Add(2*time.Hour))
	if !s.Allowed || s.After.Remaining != 999 || s.After.Spent != 1 {
		t.Fatalf("restart after the reset: %+v", s)
	}
}

func TestDecideRefundAndObserve(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rec := BudgetRecord{Total: 1000, Remaining: 500, ResetAt: t0.Add(time.Hour), ObservedAt: t0, Spent: 0}
	s, _ := decideSpend(rec, true, discord.ReasonStart, 100, t0)
	// Another host spent one after us: the refund still gives ours back.
	other, _ := decideSpend(s.After, true, discord.ReasonStart, 100, t0)
	back, write := decideRefund(other.After, true, s)
	if !write || back.Remaining != 499 || back.Spent != 1 {
		t.Fatalf("refund: %+v write=%v", back, write)
	}
	// A newer observation replaced the count: nothing to give back.
	newer := rec
	newer.ObservedAt, newer.Remaining = t0.Add(time.Minute), 480
	if _, write := decideRefund(newer, true, s); write {
		t.Fatal("refund into a newer observation")
	}
	// Nor into a refused spend, an unknown budget, or no record.
	refused := s
	refused.Allowed = false
	for _, x := range []Spend{refused, {Allowed: true}} {
		if _, write := decideRefund(s.After, true, x); write {
			t.Fatalf("refund of %+v", x)
		}
	}
	if _, write := decideRefund(BudgetRecord{}, false, s); write {
		t.Fatal("refund with no record")
	}
	// The count never goes above the total.
	full := BudgetRecord{Total: 10, Remaining: 10, ResetAt: s.After.ResetAt, ObservedAt: s.After.ObservedAt, Spent: 1}
	if got, _ := decideRefund(full, true, s); got.Remaining != 10 {
		t.Fatalf("refund above the total: %+v", got)
	}

	// The newest /gateway/bot answer wins.
	if got, write := decideObserve(BudgetRecord{}, false, rec); !write || got != rec {
		t.Fatal("first observation not written")
	}
	if _, write := decideObserve(newer, true, rec); write {
		t.Fatal("an older observation replaced a newer one")
	}
	if got, write := decideObserve(rec, true, newer); !write || got != newer {
		t.Fatal("a newer observation was not written")
	}
}

func TestResumeDue(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	maxAge := 2 * time.Minute
	st := discord.ResumeState{Shard: 3, ShardCount: 16, SessionID: "s", Seq: 10, ResumeURL: "wss://g.example", UpdatedAt: t0}
	last := ResumePushed{State: st, At: t0}
	later := func(f func(*discord.ResumeState)) discord.ResumeState {
		c := st
		c.UpdatedAt = t0.Add(time.Second)
		f(&c)
		return c
	}
	same := later(func(*discord.ResumeState) {})
	for _, tc := range []struct {
		name string
		last ResumePushed
		ok   bool
		cur  discord.ResumeState
		now  time.Time
		want bool
	}{
		{"never written", ResumePushed{}, false, st, t0, true},
		{"sequence moved on", last, true, later(func(c *discord.ResumeState) { c.Seq = 11 }), t0.Add(time.Second), true},
		{"new session", last, true, later(func(c *discord.ResumeState) { c.SessionID = "t" }), t0.Add(time.Second), true},
		{"new URL", last, true, later(func(c *discord.ResumeState) { c.ResumeURL = "wss://h.example" }), t0.Add(time.Second), true},
		{"new shard count", last, true, later(func(c *discord.ResumeState) { c.ShardCount = 32 }), t0.Add(time.Second), true},
		{"reported again, unchanged, soon after", last, true, same, t0.Add(29 * time.Second), false},
		{"reported again, unchanged, a quarter max age after", last, true, same, t0.Add(30 * time.Second), true},
		{"not reported again", last, true, st, t0.Add(time.Hour), false},
	} {
		if got := ResumeDue(tc.last, tc.ok, tc.cur, tc.now, maxAge); got != tc.want {
			t.Errorf("%s: ResumeDue = %v, want %v", tc.name, got, tc.want)
		}
	}
}
