package discord_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/discord"
)

func limit(total, remaining int, resetAfter time.Duration) discord.SessionStartLimit {
	return discord.SessionStartLimit{Total: total, Remaining: remaining, ResetAfter: resetAfter, MaxConcurrency: 1}
}

func TestBudgetAllow(t *testing.T) {
	type check struct {
		reason discord.Reason
		ok     bool
		why    []string // substrings of the refusal
	}
	all := func(start, restart, deploy bool) []check {
		return []check{
			{discord.ReasonStart, start, nil},
			{discord.ReasonRestart, restart, nil},
			{discord.ReasonDeploy, deploy, nil},
			{discord.ReasonResume, true, nil},
		}
	}
	tests := []struct {
		name   string
		floor  int
		limit  *discord.SessionStartLimit // nil: never observed
		spend  int
		at     time.Duration // after the observation
		checks []check
		state  discord.BudgetState // Known, Remaining, Blocking, Exhausted are compared
	}{
		{name: "unknown budget allows everything", floor: 100, checks: all(true, true, true),
			state: discord.BudgetState{Known: false}},
		{name: "plenty left", floor: 100, limit: ptr(limit(1000, 999, time.Hour)), checks: all(true, true, true),
			state: discord.BudgetState{Known: true, Remaining: 999}},
		{name: "one above the floor", floor: 100, limit: ptr(limit(1000, 101, time.Hour)), checks: all(true, true, true),
			state: discord.BudgetState{Known: true, Remaining: 101}},
		{name: "at the floor: restarts refused", floor: 100, limit: ptr(limit(1000, 100, time.Hour)),
			checks: []check{
				{discord.ReasonStart, true, nil},
				{discord.ReasonRestart, false, []string{"floor", "100 of 1000 left", "floor 100", "resets in 1h0m0s", "deploys still proceed"}},
				{discord.ReasonDeploy, true, nil},
				{discord.ReasonResume, true, nil},
			},
			state: discord.BudgetState{Known: true, Remaining: 100, Blocking: true}},
		{name: "spent down to the floor", floor: 100, limit: ptr(limit(1000, 103, time.Hour)), spend: 3,
			checks: all(true, false, true), state: discord.BudgetState{Known: true, Remaining: 100, Blocking: true}},
		{name: "one left: a deploy may take it", floor: 100, limit: ptr(limit(1000, 1, time.Hour)), checks: all(true, false, true),
			state: discord.BudgetState{Known: true, Remaining: 1, Blocking: true}},
		{name: "exhausted: only resumes", floor: 100, limit: ptr(limit(1000, 0, time.Hour)),
			checks: []check{
				{discord.ReasonStart, false, []string{"exhausted", "0 of 1000", "resumes still are"}},
				{discord.ReasonRestart, false, []string{"exhausted"}},
				{discord.ReasonDeploy, false, []string{"exhausted"}},
				{discord.ReasonResume, true, nil},
			},
			state: discord.BudgetState{Known: true, Remaining: 0, Blocking: true, Exhausted: true}},
		{name: "spending past zero stays at zero", floor: 0, limit: ptr(limit(1000, 2, time.Hour)), spend: 5,
			checks: all(false, false, false), state: discord.BudgetState{Known: true, Remaining: 0, Blocking: true, Exhausted: true}},
		{name: "floor 0: restarts until the last one", floor: 0, limit: ptr(limit(1000, 1, time.Hour)), checks: all(true, true, true),
			state: discord.BudgetState{Known: true, Remaining: 1}},
		{name: "negative floor is 0", floor: -5, limit: ptr(limit(1000, 1, time.Hour)), checks: all(true, true, true),
			state: discord.BudgetState{Known: true, Remaining: 1}},
		{name: "floor above total blocks restarts", floor: 2000, limit: ptr(limit(1000, 1000, time.Hour)), checks: all(true, false, true),
			state: discord.BudgetState{Known: true, Remaining: 1000, Blocking: true}},
		{name: "after the reset: full again", floor: 100, limit: ptr(limit(1000, 0, time.Hour)), at: time.Hour,
			checks: all(true, true, true), state: discord.BudgetState{Known: true, Remaining: 1000}},
		{name: "just before the reset: still empty", floor: 100, limit: ptr(limit(1000, 0, time.Hour)), at: time.Hour - time.Nanosecond,
			checks: all(false, false, false), state: discord.BudgetState{Known: true, Remaining: 0, Blocking: true, Exhausted: true}},
		{name: "no reset time: no reset", floor: 100, limit: ptr(limit(1000, 50, 0)), at: 48 * time.Hour,
			checks: []check{{discord.ReasonRestart, false, []string{"reset time unknown"}}},
			state:  discord.BudgetState{Known: true, Remaining: 50, Blocking: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &discord.Budget{Floor: tt.floor}
			if tt.limit != nil {
				b.Observe(*tt.limit, t0)
			}
			for range tt.spend {
				b.Spend(t0)
			}
			now := t0.Add(tt.at)
			for _, c := range tt.checks {
				ok, why := b.Allow(c.reason, now)
				if ok != c.ok {
					t.Errorf("Allow(%v) = %v (%s), want %v", c.reason, ok, why, c.ok)
				}
				if ok && why != "" {
					t.Errorf("Allow(%v) allowed with a reason: %q", c.reason, why)
				}
				if !ok && why == "" {
					t.Errorf("Allow(%v) refused without saying why", c.reason)
				}
				for _, s := range c.why {
					if !strings.Contains(why, s) {
						t.Errorf("Allow(%v): %q does not contain %q", c.reason, why, s)
					}
				}
			}
			st := b.State(now)
			if st.Known != tt.state.Known || st.Remaining != tt.state.Remaining ||
				st.Blocking != tt.state.Blocking || st.Exhausted != tt.state.Exhausted {
				t.Errorf("State = %+v, want %+v", st, tt.state)
			}
			if got := b.Remaining(now); got != st.Remaining {
				t.Errorf("Remaining = %d, State says %d", got, st.Remaining)
			}
		})
	}
}

// TestBudgetCrashLoop: a crash-looping cluster spends down to the floor and
// stops there, while a deploy still gets its shards and resumes are free.
func TestBudgetCrashLoop(t *testing.T) {
	b := &discord.Budget{Floor: 10}
	b.Observe(limit(1000, 20, 10*time.Hour), t0)
	now := t0
	restarts := 0
	for range 100 {
		now = now.Add(time.Minute)
		if ok, _ := b.Allow(discord.ReasonRestart, now); ok {
			b.Spend(now)
			restarts++
		}
	}
	if restarts != 10 || b.Remaining(now) != 10 {
		t.Fatalf("%d restarts, %d remaining; want 10 and 10", restarts, b.Remaining(now))
	}
	if !b.State(now).Blocking {
		t.Error("not blocking at the floor")
	}
	for range 4 { // a deploy of 4 shards
		if ok, why := b.Allow(discord.ReasonDeploy, now); !ok {
			t.Fatalf("deploy refused: %s", why)
		}
		b.Spend(now)
	}
	for range 50 {
		if ok, _ := b.Allow(discord.ReasonResume, now); !ok {
			t.Fatal("resume refused")
		}
	}
	if got := b.Remaining(now); got != 6 {
		t.Errorf("Remaining = %d, want 6 (resumes spend nothing)", got)
	}
	// The window resets: restarts go on.
	now = t0.Add(10 * time.Hour)
	if ok, why := b.Allow(discord.ReasonRestart, now); !ok {
		t.Errorf("restart refused after the reset: %s", why)
	}
	st := b.State(now)
	if st.Remaining != 1000 || st.Blocking || !st.ResetAt.IsZero() || st.Spent != 0 {
		t.Errorf("State after the reset = %+v", st)
	}
	b.Spend(now)
	if got := b.Remaining(now.Add(time.Hour)); got != 999 {
		t.Errorf("Remaining = %d after a spend past the reset, want 999", got)
	}
}

func TestBudgetObserveReplaces(t *testing.T) {
	b := &discord.Budget{Floor: 5}
	b.Observe(limit(1000, 500, time.Hour), t0)
	b.Spend(t0)
	b.Spend(t0)
	if st := b.State(t0); st.Remaining != 498 || st.Spent != 2 || !st.ObservedAt.Equal(t0) {
		t.Errorf("State = %+v", st)
	}
	// A fresh answer is the truth, even if another host spent meanwhile.
	b.Observe(limit(1000, 300, 2*time.Hour), at(60))
	st := b.State(at(60))
	want := discord.BudgetState{Known: true, Remaining: 300, Total: 1000, ResetAt: at(60).Add(2 * time.Hour),
		Floor: 5, ObservedAt: at(60)}
	if st != want {
		t.Errorf("State = %+v\nwant %+v", st, want)
	}
	// Nonsense from the wire is clamped.
	b.Observe(discord.SessionStartLimit{Total: 10, Remaining: 50}, t0)
	if got := b.Remaining(t0); got != 10 {
		t.Errorf("Remaining = %d, want clamped to 10", got)
	}
}

func TestBudgetUnknownReason(t *testing.T) {
	var b discord.Budget
	if ok, why := b.Allow(discord.Reason(0), t0); ok || why == "" {
		t.Errorf("Allow(0) = %v, %q", ok, why)
	}
	if ok, _ := b.Allow(discord.Reason(99), t0); ok {
		t.Error("Allow(99) allowed")
	}
	for r, want := range map[discord.Reason]string{
		discord.ReasonStart: "start", discord.ReasonRestart: "restart", discord.ReasonDeploy: "deploy",
		discord.ReasonResume: "resume", 0: "Reason(0)", 9: "Reason(9)",
	} {
		if r.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(r), r.String(), want)
		}
	}
}

func TestBudgetStateJSON(t *testing.T) {
	var b discord.Budget
	b.Floor = 100
	b.Observe(limit(1000, 100, time.Hour), t0)
	out, err := json.Marshal(b.State(t0))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"known":true,"remaining":100,"total":1000,"reset_at":"2026-01-01T01:00:00Z","floor":100,` +
		`"blocking":true,"exhausted":false,"observed_at":"2026-01-01T00:00:00Z","spent":0}`
	if string(out) != want {
		t.Errorf("JSON = %s\nwant %s", out, want)
	}
	var unknown discord.Budget
	out, _ = json.Marshal(unknown.State(t0))
	if want := `{"known":false,"remaining":0,"total":0,"floor":0,"blocking":false,"exhausted":false,"spent":0}`; string(out) != want {
		t.Errorf("unknown JSON = %s\nwant %s", out, want)
	}
}

// Grantable counts what Allow would grant a reason, one identify after
// another: a process's "remaining" in its gateway information.
func TestBudgetGrantable(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var unknown discord.Budget
	if n, known := unknown.Grantable(discord.ReasonStart, t0); n != 0 || known {
		t.Errorf("unknown budget: %d, %v; want 0, false", n, known)
	}
	tests := []struct {
		remaining, floor       int
		start, restart, deploy int
	}{
		{remaining: 999, floor: 100, start: 999, restart: 899, deploy: 999},
		{remaining: 101, floor: 100, start: 101, restart: 1, deploy: 101},
		{remaining: 100, floor: 100, start: 100, restart: 0, deploy: 100},
		{remaining: 5, floor: 100, start: 5, restart: 0, deploy: 5},
		{remaining: 0, floor: 100, start: 0, restart: 0, deploy: 0},
		{remaining: 7, floor: 0, start: 7, restart: 7, deploy: 7},
	}
	for _, tt := range tests {
		b := discord.Budget{Floor: tt.floor}
		b.Observe(limit(1000, tt.remaining, time.Hour), t0)
		for reason, want := range map[discord.Reason]int{discord.ReasonStart: tt.start, discord.ReasonRestart: tt.restart, discord.ReasonDeploy: tt.deploy} {
			n, known := b.Grantable(reason, t0)
			if n != want || !known {
				t.Errorf("remaining %d floor %d, %v: %d (known %v), want %d", tt.remaining, tt.floor, reason, n, known, want)
			}
			// Exactly that many grants in a row are allowed, and no more.
			c := b
			for i := range n {
				if ok, why := c.Allow(reason, t0); !ok {
					t.Fatalf("remaining %d floor %d, %v: grant %d of %d refused: %s", tt.remaining, tt.floor, reason, i+1, n, why)
				}
				c.Spend(t0)
			}
			if ok, _ := c.Allow(reason, t0); ok {
				t.Errorf("remaining %d floor %d, %v: a grant past Grantable's %d allowed", tt.remaining, tt.floor, reason, n)
			}
		}
	}
	// Past the reset the total counts again.
	b := discord.Budget{Floor: 100}
	b.Observe(limit(1000, 3, time.Hour), t0)
	if n, _ := b.Grantable(discord.ReasonRestart, t0.Add(time.Hour)); n != 900 {
		t.Errorf("after the reset: %d restarts grantable, want 900", n)
	}
	if n, _ := b.Grantable(discord.Reason(0), t0); n != 0 {
		t.Errorf("unknown reason: %d grantable", n)
	}
}

// Restore takes a budget as another host's State described it; the floor
// stays this Budget's own, and the counts decide the rest.
func TestBudgetRestore(t *testing.T) {
	a := &discord.Budget{Floor: 100}
	a.Observe(limit(1000, 102, time.Hour), t0)
	a.Spend(t0)
	b := &discord.Budget{Floor: 100}
	b.Restore(a.State(t0))
	if got, want := b.State(t0), a.State(t0); got != want {
		t.Fatalf("restored %+v\nwant     %+v", got, want)
	}
	if ok, _ := b.Allow(discord.ReasonRestart, t0); !ok {
		t.Fatal("101 left, floor 100: a restart is allowed")
	}
	b.Spend(t0)
	if ok, _ := b.Allow(discord.ReasonRestart, t0); ok {
		t.Fatal("100 left, floor 100: a restart is refused")
	}
	// Past the reset the total is back, as on the host that observed it.
	if got := b.Remaining(t0.Add(time.Hour)); got != 1000 {
		t.Fatalf("after the reset: %d left", got)
	}
	// Other floors, unknown budgets and nonsense.
	c := &discord.Budget{Floor: 7}
	c.Restore(discord.BudgetState{Known: true, Total: 10, Remaining: 50, Spent: -3, Floor: 99, Blocking: true})
	if st := c.State(t0); st.Remaining != 10 || st.Floor != 7 || st.Spent != 0 || st.Blocking {
		t.Fatalf("clamped state %+v", st)
	}
	c.Restore(discord.BudgetState{})
	if ok, _ := c.Allow(discord.ReasonRestart, t0); !ok || c.State(t0).Known {
		t.Fatal("an unknown budget restored: everything is allowed")
	}
}
