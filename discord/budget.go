package discord

import (
	"fmt"
	"time"
)

// Reason says why an identify is wanted; the budget governor treats them
// differently. The manager knows it from the process that asks: a first
// spawn, a respawn after a crash, or a deploy's new generation.
type Reason int

// Reasons for an identify (or, for ReasonResume, a resume).
const (
	// ReasonStart is the first start of a cluster when the manager starts
	// cold (clusters it re-adopts after a restart identify nothing).
	ReasonStart Reason = iota + 1
	// ReasonRestart is the respawn of a cluster that died: what a crash loop does.
	ReasonRestart
	// ReasonDeploy is a shard of a running deploy's new generation, including
	// the clusters a re-clustering deploy adds.
	ReasonDeploy
	// ReasonResume is a RESUME, which Discord does not count against the budget.
	ReasonResume
)

var reasonNames = [...]string{ReasonStart: "start", ReasonRestart: "restart", ReasonDeploy: "deploy", ReasonResume: "resume"}

// String is the reason's name: start, restart, deploy or resume.
func (r Reason) String() string {
	if r > 0 && int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", int(r))
}

// Budget is the session-start governor. It follows Discord's count of
// remaining session starts (Observe, from /gateway/bot) minus the identifies
// granted since (Spend), restores the total when the window resets, and says
// which identifies may still be granted (Allow):
//
//   - ReasonResume: always. A RESUME spends nothing.
//   - ReasonStart, ReasonDeploy: while anything remains (Remaining > 0). These
//     are an operator's actions; the floor exists to keep budget for them.
//   - ReasonRestart: only above the floor (Remaining > Floor), so a crash loop
//     can spend down to the floor and never past it.
//
// At zero nothing that spends is allowed, whatever the reason: Discord resets
// the token of a bot that goes past its limit.
//
// Before the first Observe the budget is unknown (no token, or /gateway/bot
// not asked yet) and Allow grants everything: the governor is off, which
// State reports. A Budget is not safe for concurrent use; its zero value is an
// unknown budget with floor 0.
type Budget struct {
	// Floor is the number of session starts that restarts may not touch.
	// Negative counts as 0. A Floor at or above Total blocks every restart.
	Floor int

	known      bool
	total      int
	remaining  int
	resetAt    time.Time // zero: not known (after a reset, until the next Observe)
	observedAt time.Time
	spent      int // identifies granted since observedAt
}

// BudgetState is a Budget as status, metrics and the feed show it.
type BudgetState struct {
	// Known is false until the first /gateway/bot answer; then nothing is refused.
	Known     bool `json:"known"`
	Remaining int  `json:"remaining"`
	Total     int  `json:"total"`
	// ResetAt is when Remaining goes back to Total; zero when unknown (after
	// a reset passed, until the next /gateway/bot answer).
	ResetAt time.Time `json:"reset_at,omitzero"`
	Floor   int       `json:"floor"`
	// Blocking: restarts are refused (Remaining ≤ Floor).
	Blocking bool `json:"blocking"`
	// Exhausted: every identify is refused (Remaining is 0).
	Exhausted bool `json:"exhausted"`
	// ObservedAt is when the last /gateway/bot answer came; Spent is how many
	// identifies were granted since (or since the reset, if one passed).
	ObservedAt time.Time `json:"observed_at,omitzero"`
	Spent      int       `json:"spent"`
}

// Observe records a /gateway/bot answer received at now (GatewayBot.Fetched):
// Discord's count replaces sm's, since other hosts or tools may share the
// token. A non-positive ResetAfter leaves the reset time unknown rather than
// restoring the total at once.
func (b *Budget) Observe(l SessionStartLimit, now time.Time) {
	b.known = true
	b.total = max(l.Total, 0)
	b.remaining = min(max(l.Remaining, 0), b.total)
	b.resetAt = time.Time{}
	if l.ResetAfter > 0 {
		b.resetAt = now.Add(l.ResetAfter)
	}
	b.observedAt = now
	b.spent = 0
}

// Restore sets the budget to st, as State described it, maybe on another
// host: the hosts of a mesh share one budget (docs/multihost.md) and each
// keeps a copy. Floor, Blocking and Exhausted are left out: the floor is
// this Budget's own, the rest follows from the counts.
func (b *Budget) Restore(st BudgetState) {
	b.known = st.Known
	b.total = max(st.Total, 0)
	b.remaining = min(max(st.Remaining, 0), b.total)
	b.resetAt = st.ResetAt
	b.observedAt = st.ObservedAt
	b.spent = max(st.Spent, 0)
}

// Spend records one identify granted at now.
func (b *Budget) Spend(now time.Time) {
	b.roll(now)
	b.spent++
	if b.known && b.remaining > 0 {
		b.remaining--
	}
}

// Remaining is the number of session starts left at now: Total again once the
// reset time has passed. It is 0 for an unknown budget.
func (b *Budget) Remaining(now time.Time) int {
	b.roll(now)
	return b.remaining
}

// Allow says whether an identify for reason may be granted at now and, if
// not, why, in a sentence fit for the REPLY's error message and the log.
// It spends nothing: call Spend for each identify actually granted.
func (b *Budget) Allow(reason Reason, now time.Time) (bool, string) {
	switch reason {
	case ReasonResume:
		return true, ""
	case ReasonStart, ReasonRestart, ReasonDeploy:
	default:
		return false, fmt.Sprintf("unknown identify reason %v", reason)
	}
	if !b.known {
		return true, ""
	}
	b.roll(now)
	switch {
	case b.remaining <= 0:
		return false, fmt.Sprintf("session start budget exhausted: 0 of %d left, %s; "+
			"no identify is granted (Discord resets the token of a bot that goes past it), resumes still are",
			b.total, b.untilReset(now))
	case reason == ReasonRestart && b.remaining <= b.floor():
		return false, fmt.Sprintf("session start budget at its floor: %d of %d left, floor %d, %s; "+
			"restarts of crashed clusters must wait (resumes, first starts and deploys still proceed)",
			b.remaining, b.total, b.floor(), b.untilReset(now))
	}
	return true, ""
}

// Grantable is how many identifies for reason the governor would grant at
// now, one after another, if nothing else spent meanwhile: Remaining for a
// start or a deploy, what lies above the floor for a restart, 0 when Allow
// refuses. It is what a process's gateway information reports as its
// remaining session starts. An unknown budget limits nothing (Allow grants
// everything) and has nothing to count: 0, and known false.
func (b *Budget) Grantable(reason Reason, now time.Time) (n int, known bool) {
	if !b.known {
		return 0, false
	}
	if ok, _ := b.Allow(reason, now); !ok {
		return 0, true
	}
	switch reason {
	case ReasonRestart:
		return b.remaining - b.floor(), true
	default:
		return b.remaining, true
	}
}

// State describes the budget at now.
func (b *Budget) State(now time.Time) BudgetState {
	b.roll(now)
	return BudgetState{
		Known:      b.known,
		Remaining:  b.remaining,
		Total:      b.total,
		ResetAt:    b.resetAt,
		Floor:      b.floor(),
		Blocking:   b.known && b.remaining <= b.floor(),
		Exhausted:  b.known && b.remaining <= 0,
		ObservedAt: b.observedAt,
		Spent:      b.spent,
	}
}

func (b *Budget) floor() int { return max(b.Floor, 0) }

// roll restores the total once the reset time has passed. The next reset is
// then unknown until the next Observe.
func (b *Budget) roll(now time.Time) {
	if b.known && !b.resetAt.IsZero() && !now.Before(b.resetAt) {
		b.remaining = b.total
		b.resetAt = time.Time{}
		b.spent = 0
	}
}

func (b *Budget) untilReset(now time.Time) string {
	if b.resetAt.IsZero() {
		return "reset time unknown until the next /gateway/bot answer"
	}
	return fmt.Sprintf("resets in %v", b.resetAt.Sub(now).Round(time.Second))
}
