package discord_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/discord"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// at is t0 plus s seconds.
func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// drain drives g the way the manager's loop does, from now, jumping the clock
// to each Next, until nothing waits; it returns every grant.
func drain[M any](t *testing.T, g *discord.Gate[M], now time.Time) []discord.Grant[M] {
	t.Helper()
	var out []discord.Grant[M]
	for range 10000 {
		out = append(out, g.Due(now)...)
		next, ok := g.Next()
		if !ok {
			return out
		}
		if next.After(now) {
			now = next
		}
	}
	t.Fatal("the gate never emptied")
	return nil
}

type grantView struct {
	shard int
	at    float64 // seconds after t0
}

func view[M any](gs []discord.Grant[M]) []grantView {
	out := make([]grantView, len(gs))
	for i, g := range gs {
		out[i] = grantView{g.Shard, g.At.Sub(t0).Seconds()}
	}
	return out
}

func TestGateOneBucketSixteenShards(t *testing.T) {
	g := discord.NewGate[string](1, 5*time.Second)
	// Asked out of order, as clusters starting together would.
	for _, s := range []int{7, 3, 15, 0, 12, 1, 9, 4, 14, 2, 11, 6, 13, 8, 10, 5} {
		if _, err := g.Ask(s, t0, fmt.Sprint("shard ", s)); err != nil {
			t.Fatal(err)
		}
	}
	gs := drain(t, g, t0)
	if len(gs) != 16 {
		t.Fatalf("%d grants, want 16", len(gs))
	}
	for i, gr := range gs {
		if gr.Shard != i || !gr.At.Equal(at(float64(5*i))) || gr.Meta != fmt.Sprint("shard ", i) || gr.Bucket != 0 {
			t.Errorf("grant %d = %+v, want shard %d at %ds", i, gr, i, 5*i)
		}
		if i > 0 && gr.At.Sub(gs[i-1].At) < 5*time.Second {
			t.Errorf("grants %d and %d are %v apart", i-1, i, gr.At.Sub(gs[i-1].At))
		}
	}
}

func TestGateFourBucketsInParallel(t *testing.T) {
	g := discord.NewGate[int](4, 5*time.Second)
	for s := 15; s >= 0; s-- {
		if _, err := g.Ask(s, t0, s); err != nil {
			t.Fatal(err)
		}
	}
	// At each slot, one shard of every bucket, lowest first.
	want := [][]grantView{
		{{0, 0}, {1, 0}, {2, 0}, {3, 0}},
		{{4, 5}, {5, 5}, {6, 5}, {7, 5}},
		{{8, 10}, {9, 10}, {10, 10}, {11, 10}},
		{{12, 15}, {13, 15}, {14, 15}, {15, 15}},
	}
	now := t0
	for i, w := range want {
		got := view(g.Due(now))
		if !slices.Equal(got, w) {
			t.Errorf("slot %d: grants %v, want %v", i, got, w)
		}
		if more := g.Due(now); len(more) != 0 {
			t.Errorf("slot %d: a second Due at the same instant granted %v", i, view(more))
		}
		next, ok := g.Next()
		if i < len(want)-1 && (!ok || !next.Equal(now.Add(5*time.Second))) {
			t.Errorf("slot %d: Next = %v, %v; want %v", i, next, ok, now.Add(5*time.Second))
		}
		if i == len(want)-1 && ok {
			t.Errorf("Next = %v with nothing waiting", next)
		}
		now = now.Add(5 * time.Second)
	}
}

func TestGateBucketsAreIndependent(t *testing.T) {
	g := discord.NewGate[int](2, 5*time.Second)
	mustAsk(t, g, 0, at(0))
	if gs := view(g.Due(at(0))); !slices.Equal(gs, []grantView{{0, 0}}) {
		t.Fatalf("grants %v", gs)
	}
	// Bucket 1 has never granted: shard 1 goes at once, while bucket 0 waits.
	mustAsk(t, g, 2, at(1))
	mustAsk(t, g, 1, at(1))
	if gs := view(g.Due(at(1))); !slices.Equal(gs, []grantView{{1, 1}}) {
		t.Fatalf("grants %v, want only shard 1", gs)
	}
	if next, _ := g.Next(); !next.Equal(at(5)) {
		t.Errorf("Next = %v, want bucket 0's slot at 5s", next)
	}
	if gs := view(drain(t, g, at(1))); !slices.Equal(gs, []grantView{{2, 5}}) {
		t.Errorf("grants %v", gs)
	}
}

func TestGateShardOrderAmongCurrentWaiters(t *testing.T) {
	g := discord.NewGate[int](1, 5*time.Second)
	mustAsk(t, g, 5, at(0))
	got := view(g.Due(at(0)))
	// A higher shard waiting does not keep a lower one that comes later back.
	mustAsk(t, g, 9, at(1))
	mustAsk(t, g, 3, at(2))
	got = append(got, view(drain(t, g, at(2)))...)
	want := []grantView{{5, 0}, {3, 5}, {9, 10}}
	if !slices.Equal(got, want) {
		t.Errorf("grants %v, want %v", got, want)
	}
}

func TestGateSameShardTwiceInAskOrder(t *testing.T) {
	// A deploy: the new generation asks for a shard the old one still waits for.
	g := discord.NewGate[string](1, 5*time.Second)
	mustAskMeta(t, g, 4, at(0), "gen 5")
	mustAskMeta(t, g, 4, at(0), "gen 6")
	mustAskMeta(t, g, 2, at(0), "gen 6")
	var got []string
	for _, gr := range drain(t, g, at(0)) {
		got = append(got, fmt.Sprint(gr.Shard, " ", gr.Meta))
	}
	if want := []string{"2 gen 6", "4 gen 5", "4 gen 6"}; !slices.Equal(got, want) {
		t.Errorf("grants %q, want %q", got, want)
	}
}

func TestGateSpacingFromTheActualGrant(t *testing.T) {
	g := discord.NewGate[int](1, 5*time.Second)
	mustAsk(t, g, 0, at(0))
	mustAsk(t, g, 1, at(0))
	mustAsk(t, g, 2, at(0))
	g.Due(at(0))
	// The manager's timer fires late: the grant happens at 7s, and the next
	// slot is 5s after that, not 5s after the slot it should have had.
	if gs := view(g.Due(at(7))); !slices.Equal(gs, []grantView{{1, 7}}) {
		t.Fatalf("grants %v", gs)
	}
	if gs := g.Due(at(11.9)); len(gs) != 0 {
		t.Errorf("granted %v 4.9s after the previous grant", view(gs))
	}
	if next, _ := g.Next(); !next.Equal(at(12)) {
		t.Errorf("Next = %v, want 12s", next.Sub(t0))
	}
}

func TestGateCancel(t *testing.T) {
	// A cluster dies mid-wait: its requests go, nobody else waits longer.
	g := discord.NewGate[string](1, 5*time.Second)
	mustAskMeta(t, g, 0, at(0), "c0")
	t1 := mustAskMeta(t, g, 1, at(0), "c0")
	mustAskMeta(t, g, 2, at(0), "c1")
	mustAskMeta(t, g, 3, at(0), "c1")
	mustAskMeta(t, g, 4, at(0), "c2")
	first := g.Due(at(0))
	if !g.Cancel(t1) {
		t.Error("Cancel of a waiting ticket returned false")
	}
	if g.Cancel(t1) {
		t.Error("Cancel twice returned true")
	}
	if g.Cancel(first[0].Ticket) {
		t.Error("Cancel of a granted ticket returned true")
	}
	if g.Cancel(0) || g.Cancel(12345) {
		t.Error("Cancel of an unknown ticket returned true")
	}
	gone := g.CancelIf(func(gr discord.Grant[string]) bool { return gr.Meta == "c2" })
	if len(gone) != 1 || gone[0].Shard != 4 {
		t.Errorf("CancelIf took %v, want shard 4", gone)
	}
	if n := g.Len(); n != 2 {
		t.Errorf("Len = %d, want 2", n)
	}
	got := view(drain(t, g, at(0)))
	if want := []grantView{{2, 5}, {3, 10}}; !slices.Equal(got, want) {
		t.Errorf("grants %v, want %v", got, want)
	}
}

func TestGateCancelLastWaiter(t *testing.T) {
	g := discord.NewGate[int](1, 5*time.Second)
	mustAsk(t, g, 0, at(0))
	tk := mustAsk(t, g, 1, at(0))
	g.Due(at(0))
	g.Cancel(tk)
	if next, ok := g.Next(); ok {
		t.Errorf("Next = %v with nothing waiting", next)
	}
	// The bucket's slot is still kept: a new ask waits for it.
	mustAsk(t, g, 2, at(1))
	if gs := g.Due(at(1)); len(gs) != 0 {
		t.Errorf("granted %v 1s after the previous grant", view(gs))
	}
	if gs := view(drain(t, g, at(1))); !slices.Equal(gs, []grantView{{2, 5}}) {
		t.Errorf("grants %v", gs)
	}
}

func TestGateWaiting(t *testing.T) {
	g := discord.NewGate[int](2, 5*time.Second)
	for _, s := range []int{5, 2, 4, 1, 3} {
		mustAsk(t, g, s, at(0))
	}
	var got []string
	for _, w := range g.Waiting() {
		got = append(got, fmt.Sprintf("b%d s%d", w.Bucket, w.Shard))
	}
	if want := []string{"b0 s2", "b0 s4", "b1 s1", "b1 s3", "b1 s5"}; !slices.Equal(got, want) {
		t.Errorf("Waiting = %v, want %v", got, want)
	}
}

func TestGateSetMaxConcurrency(t *testing.T) {
	g := discord.NewGate[int](1, 5*time.Second)
	for s := range 4 {
		mustAsk(t, g, s, at(0))
	}
	g.Due(at(0)) // shard 0; the bucket is busy until 5s
	g.SetMaxConcurrency(2)
	if g.MaxConcurrency() != 2 {
		t.Fatalf("MaxConcurrency = %d", g.MaxConcurrency())
	}
	// No bucket may grant before the old bucket's slot; then both run, by bucket.
	if gs := g.Due(at(1)); len(gs) != 0 {
		t.Errorf("granted %v right after re-bucketing", view(gs))
	}
	got := view(drain(t, g, at(1)))
	want := []grantView{{2, 5}, {1, 5}, {3, 10}}
	if !slices.Equal(got, want) {
		t.Errorf("grants %v, want %v", got, want)
	}
	// Asking again, and back to one bucket: same rule.
	g.SetMaxConcurrency(2) // unchanged: nothing happens
	mustAsk(t, g, 7, at(10))
	g.SetMaxConcurrency(0) // counts as 1
	if gs := view(drain(t, g, at(10))); !slices.Equal(gs, []grantView{{7, 15}}) {
		t.Errorf("grants %v, want shard 7 at 15s", gs)
	}
}

func TestGateDefaultsAndErrors(t *testing.T) {
	g := discord.NewGate[int](0, 0)
	// A missing setting gets the margin too, never Discord's bare 5 s.
	if g.Spacing() != 5500*time.Millisecond || g.Spacing() != discord.DefaultSpacing || g.MaxConcurrency() != 1 {
		t.Errorf("NewGate(0, 0): spacing %v, max_concurrency %d", g.Spacing(), g.MaxConcurrency())
	}
	if tk, err := g.Ask(-1, t0, 0); !errors.Is(err, discord.ErrBadShard) || tk != 0 {
		t.Errorf("Ask(-1) = %d, %v; want ErrBadShard", tk, err)
	}
	if _, ok := g.Next(); ok {
		t.Error("Next reports something on an empty gate")
	}
	if gs := g.Due(t0); len(gs) != 0 {
		t.Errorf("empty gate granted %v", gs)
	}
	tk := mustAsk(t, g, 0, t0)
	if tk == 0 {
		t.Error("ticket 0 issued")
	}
	if next, ok := g.Next(); !ok || next.After(t0) {
		t.Errorf("Next = %v, %v; want at or before the ask", next, ok)
	}
}

func mustAsk(t *testing.T, g *discord.Gate[int], shard int, now time.Time) discord.Ticket {
	t.Helper()
	tk, err := g.Ask(shard, now, shard)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func mustAskMeta(t *testing.T, g *discord.Gate[string], shard int, now time.Time, meta string) discord.Ticket {
	t.Helper()
	tk, err := g.Ask(shard, now, meta)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}
