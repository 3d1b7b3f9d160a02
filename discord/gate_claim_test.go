package discord_test

import (
	"testing"
	"time"

	"github.com/sm-supervisor/sm/discord"
)

// A shared gate (a mesh) claims a due bucket's slot instead of granting it:
// the bucket waits on the claim, Won grants its head, Lost retries later.
func TestGateClaims(t *testing.T) {
	g := discord.NewGate[int](2, 5*time.Second)
	for _, s := range []int{3, 1, 0, 2} {
		mustAsk(t, g, s, at(0))
	}
	cs := g.Claims(at(0))
	if len(cs) != 2 || cs[0].Bucket != 0 || cs[0].Head.Shard != 0 || cs[1].Bucket != 1 || cs[1].Head.Shard != 1 {
		t.Fatalf("claims %+v, want buckets 0 and 1 headed by shards 0 and 1", cs)
	}
	if again := g.Claims(at(0)); len(again) != 0 {
		t.Fatalf("claimed again while claims are out: %+v", again)
	}
	if gs := g.Due(at(0)); len(gs) != 0 {
		t.Fatalf("Due granted %v while the claims are out", view(gs))
	}
	if _, ok := g.Next(); ok {
		t.Fatal("Next reports a slot while every bucket waits on a claim")
	}

	// Bucket 0's slot is won: shard 0 is granted, and the bucket is free
	// again at the time the caller says (here the grant + Spacing).
	if h, ok := g.ClaimHead(cs[0].ID); !ok || h.Shard != 0 {
		t.Fatalf("ClaimHead = %+v %v", h, ok)
	}
	gr, ok := g.Won(cs[0].ID, at(0.1), at(5.1))
	if !ok || gr.Shard != 0 || !gr.At.Equal(at(0.1)) || gr.Bucket != 0 {
		t.Fatalf("Won = %+v %v", gr, ok)
	}
	if _, ok := g.Won(cs[0].ID, at(0.1), at(5.1)); ok {
		t.Fatal("a claim won twice")
	}
	// Bucket 1's went to another host: it claims again at the retry time.
	if !g.Lost(cs[1].ID, at(2)) || g.Lost(cs[1].ID, at(2)) {
		t.Fatal("Lost: want true once, then false")
	}
	if next, ok := g.Next(); !ok || !next.Equal(at(2)) {
		t.Fatalf("Next = %v %v, want 2s (bucket 1's retry)", next.Sub(t0), ok)
	}
	if cs := g.Claims(at(1.9)); len(cs) != 0 {
		t.Fatalf("claimed before the retry time: %+v", cs)
	}
	cs = g.Claims(at(2))
	if len(cs) != 1 || cs[0].Bucket != 1 || cs[0].Head.Shard != 1 {
		t.Fatalf("claims at 2s: %+v", cs)
	}
	// Bucket 0 is free at 5.1s, as Won was told.
	if cs := g.Claims(at(5.09)); len(cs) != 0 {
		t.Fatalf("bucket 0 claimed before 5.1s: %+v", cs)
	}
	if cs := g.Claims(at(5.1)); len(cs) != 1 || cs[0].Bucket != 0 || cs[0].Head.Shard != 2 {
		t.Fatalf("claims at 5.1s: %+v", cs)
	}
}

// The head of a claimed bucket can change while the claim is out: Won grants
// whoever is first when it ends, and nothing if nobody waits any more.
func TestGateClaimHeadChanges(t *testing.T) {
	g := discord.NewGate[int](1, time.Second)
	tk := mustAsk(t, g, 5, at(0))
	cs := g.Claims(at(0))
	mustAsk(t, g, 2, at(0.01)) // a lower shard asks meanwhile
	if h, _ := g.ClaimHead(cs[0].ID); h.Shard != 2 {
		t.Fatalf("head %d, want 2", h.Shard)
	}
	gr, ok := g.Won(cs[0].ID, at(0.02), at(1.02))
	if !ok || gr.Shard != 2 {
		t.Fatalf("Won = %+v %v, want shard 2", gr, ok)
	}
	// Shard 5 waits for bucket 0's next slot; cancelled during its claim,
	// the claim grants nothing and the bucket stays as it was.
	cs = g.Claims(at(1.02))
	g.Cancel(tk)
	if _, ok := g.ClaimHead(cs[0].ID); ok {
		t.Fatal("ClaimHead of an emptied bucket")
	}
	if _, ok := g.Won(cs[0].ID, at(1.03), at(2.03)); ok {
		t.Fatal("Won granted in an emptied bucket")
	}
	if !g.Lost(cs[0].ID, at(1.03)) {
		t.Fatal("the claim of an emptied bucket is still out until Lost")
	}
	if g.Len() != 0 {
		t.Fatalf("Len = %d", g.Len())
	}
}

// Re-bucketing drops the claims out: ending them afterwards does nothing.
func TestGateClaimsDroppedBySetMaxConcurrency(t *testing.T) {
	g := discord.NewGate[int](1, time.Second)
	mustAsk(t, g, 0, at(0))
	mustAsk(t, g, 1, at(0))
	cs := g.Claims(at(0))
	g.SetMaxConcurrency(2)
	if _, ok := g.Won(cs[0].ID, at(0.1), at(1.1)); ok {
		t.Fatal("a dropped claim granted")
	}
	if g.Lost(cs[0].ID, at(5)) {
		t.Fatal("a dropped claim ended")
	}
	if cs := g.Claims(at(0.1)); len(cs) != 2 {
		t.Fatalf("claims after re-bucketing: %+v, want both buckets", cs)
	}
	var none discord.ClaimID
	if _, ok := g.ClaimHead(none); ok {
		t.Fatal("ClaimHead(0)")
	}
}
