package mesh_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/mesh"
)

// A short spacing keeps the tests short: grants are kept 400 ms (the spacing
// plus the 100 ms grant window).
const spacing = 300 * time.Millisecond

func discordSettings() mesh.DiscordSettings {
	return mesh.DiscordSettings{Spacing: spacing, ResumeMaxAge: 2 * time.Second}
}

// openDiscord joins host to srv's mesh and opens its Discord buckets.
func openDiscord(t *testing.T, url, host string, set mesh.DiscordSettings) *mesh.DiscordStore {
	t.Helper()
	cfg := meshConfig(url, host)
	_, st := open(t, cfg)
	d, err := mesh.OpenDiscord(context.Background(), st, cfg.Name, set)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestOpenDiscordChecksSettings: every host of a mesh must space identifies
// and keep resume state alike.
func TestOpenDiscordChecksSettings(t *testing.T) {
	srv := startServer(t, "")
	openDiscord(t, srv.URL, "a", discordSettings())
	_, st := open(t, meshConfig(srv.URL, "b"))
	for _, tc := range []struct {
		set  mesh.DiscordSettings
		name string
	}{
		{mesh.DiscordSettings{Spacing: 5 * spacing, ResumeMaxAge: 2 * time.Second}, "discord.identify_spacing"},
		{mesh.DiscordSettings{Spacing: spacing, ResumeMaxAge: time.Minute}, "discord.resume_max_age"},
	} {
		_, err := mesh.OpenDiscord(context.Background(), st, "sm", tc.set)
		if !errors.Is(err, mesh.ErrDiscordMismatch) || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("OpenDiscord with %+v: err = %v, want ErrDiscordMismatch naming %s", tc.set, err, tc.name)
		}
	}
	if _, err := mesh.OpenDiscord(context.Background(), st, "sm", discordSettings()); err != nil {
		t.Fatalf("the same settings: %v", err)
	}
	if _, err := mesh.OpenDiscord(context.Background(), st, "sm", mesh.DiscordSettings{}); err == nil {
		t.Fatal("zero settings accepted")
	}
}

// TestIdentifyClaimsRace: two hosts race for the slots of one bucket, each
// claiming again when told to, and grant whenever they win within the grant
// window: every two grants, whichever host made them, are a spacing apart.
// Another bucket is independent, and a released slot is free at once.
func TestIdentifyClaimsRace(t *testing.T) {
	srv := startServer(t, "")
	hosts := []*mesh.DiscordStore{
		openDiscord(t, srv.URL, "a", discordSettings()),
		openDiscord(t, srv.URL, "b", discordSettings()),
	}
	window := mesh.GrantWindow(spacing)
	const want = 10
	var (
		mu     sync.Mutex
		grants []time.Time
		by     = map[string]int{}
		busy   int
	)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i, d := range hosts {
		h := mesh.Holder{Host: string(rune('a' + i)), Boot: "1"}
		wg.Go(func() {
			for ctx.Err() == nil {
				c, err := d.ClaimIdentify(ctx, 0, h, i)
				var be *mesh.BusyError
				switch {
				case errors.As(err, &be):
					mu.Lock()
					busy++
					mu.Unlock()
					time.Sleep(time.Until(be.Retry))
					continue
				case err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
					// One request's bound passed on a loaded machine: the
					// manager retries such a claim, and so does this host (a
					// create stored with its answer lost is a slot unused).
					continue
				case err != nil:
					if ctx.Err() == nil {
						t.Error(err)
					}
					return
				}
				now := time.Now()
				if now.Sub(c.Sent) > window {
					continue // too late to grant: the slot goes unused
				}
				mu.Lock()
				grants = append(grants, now)
				by[h.Host]++
				if len(grants) >= want {
					cancel()
				}
				mu.Unlock()
			}
		})
	}
	// Meanwhile bucket 1 is free, and a released slot is free at once.
	c, err := hosts[0].ClaimIdentify(context.Background(), 1, mesh.Holder{Host: "a", Boot: "1"}, 1)
	if err != nil {
		t.Fatalf("bucket 1 while bucket 0 is raced for: %v", err)
	}
	if err := hosts[0].ReleaseIdentify(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if _, err := hosts[1].ClaimIdentify(context.Background(), 1, mesh.Holder{Host: "b", Boot: "1"}, 1); err != nil {
		t.Fatalf("bucket 1 after its slot was released: %v", err)
	}
	wg.Wait()

	slices.SortFunc(grants, func(a, b time.Time) int { return a.Compare(b) })
	if len(grants) < want {
		t.Fatalf("%d grants in 30 s, want %d", len(grants), want)
	}
	var gaps []time.Duration
	for i := 1; i < len(grants); i++ {
		gap := grants[i].Sub(grants[i-1])
		if gap < spacing {
			t.Errorf("grants %d and %d are %v apart, under the spacing %v", i-1, i, gap, spacing)
		}
		gaps = append(gaps, gap.Round(time.Millisecond))
	}
	if busy == 0 {
		t.Error("no claim ever found the other host's grant: the hosts did not race")
	}
	t.Logf("%d grants (by host %v), %d claims found the slot busy; gaps %v (hold %v)", len(grants), by, busy, gaps, mesh.IdentifyHold(spacing))
}

// TestBudgetSharedSpends: two hosts spending concurrently through the shared
// budget never spend one start twice, and lose none; the floor holds across
// them; refunds and observations follow the record in force.
func TestBudgetSharedSpends(t *testing.T) {
	srv := startServer(t, "")
	a := openDiscord(t, srv.URL, "a", discordSettings())
	b := openDiscord(t, srv.URL, "b", discordSettings())
	ctx := context.Background()
	if _, found, err := a.Budget(ctx); err != nil || found {
		t.Fatalf("budget before any observation: found=%v err=%v", found, err)
	}
	if s, err := a.SpendBudget(ctx, discord.ReasonRestart, 100); err != nil || !s.Allowed || s.Known {
		t.Fatalf("spend with no budget: %+v %v (want allowed, uncounted)", s, err)
	}
	now := time.Now()
	obs := mesh.BudgetRecord{Total: 1000, Remaining: 1000, ResetAt: now.Add(time.Hour), ObservedAt: now, MaxConcurrency: 16}
	if got, err := a.ObserveBudget(ctx, obs); err != nil || got.Remaining != 1000 {
		t.Fatalf("observe: %+v %v", got, err)
	}
	older := obs
	older.ObservedAt, older.Remaining = now.Add(-time.Minute), 5
	if got, err := b.ObserveBudget(ctx, older); err != nil || got.Remaining != 1000 {
		t.Fatalf("an older observation: %+v %v, want the newer one kept", got, err)
	}

	// 2 hosts x 4 goroutines x 25 spends, all at once.
	const per, workers = 25, 4
	var mu sync.Mutex
	var seen []int // every spend's count after it
	var wg sync.WaitGroup
	for _, d := range []*mesh.DiscordStore{a, b} {
		for range workers {
			wg.Go(func() {
				for range per {
					s, err := d.SpendBudget(ctx, discord.ReasonStart, 100)
					if err != nil || !s.Allowed || s.After.Remaining != s.Before.Remaining-1 {
						t.Errorf("spend: %+v %v", s, err)
						return
					}
					mu.Lock()
					seen = append(seen, s.After.Remaining)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	n := 2 * workers * per
	slices.Sort(seen)
	for i, r := range seen {
		if r != 1000-n+i {
			t.Fatalf("spends left counts %v..., want each of %d..999 once: a start spent twice or lost", seen[:min(len(seen), 10)], 1000-n)
		}
	}
	rec, _, err := b.Budget(ctx)
	if err != nil || rec.Remaining != 1000-n || rec.Spent != n || rec.MaxConcurrency != 16 {
		t.Fatalf("after %d spends: %+v %v", n, rec, err)
	}

	// The floor holds across hosts: with 800 left and a floor of 797, of 6
	// concurrent restarts 3 are granted.
	var granted, refused int
	for _, d := range []*mesh.DiscordStore{a, b, a, b, a, b} {
		wg.Go(func() {
			s, err := d.SpendBudget(ctx, discord.ReasonRestart, 797)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Error(err)
			case s.Allowed:
				granted++
			case strings.Contains(s.Why, "floor"):
				refused++
			}
		})
	}
	wg.Wait()
	if granted != 3 || refused != 3 {
		t.Fatalf("restarts at 800 left, floor 797: %d granted, %d refused; want 3 and 3", granted, refused)
	}

	// A start spent for an identify that was not granted is given back.
	s, err := a.SpendBudget(ctx, discord.ReasonStart, 100)
	if err != nil || s.After.Remaining != 796 {
		t.Fatalf("spend: %+v %v", s, err)
	}
	if err := b.RefundBudget(ctx, s); err != nil {
		t.Fatal(err)
	}
	if rec, _, _ := a.Budget(ctx); rec.Remaining != 797 || rec.Spent != n+3 {
		t.Fatalf("after the refund: %+v", rec)
	}
	// A newer /gateway/bot answer replaces the count, spends and all.
	newer := mesh.BudgetRecord{Total: 1000, Remaining: 640, ResetAt: now.Add(time.Hour), ObservedAt: time.Now()}
	if got, err := b.ObserveBudget(ctx, newer); err != nil || got.Remaining != 640 || got.Spent != 0 {
		t.Fatalf("a newer observation: %+v %v", got, err)
	}
	if err := a.RefundBudget(ctx, s); err != nil {
		t.Fatal(err)
	}
	if rec, _, _ := a.Budget(ctx); rec.Remaining != 640 {
		t.Fatalf("a refund into a newer observation changed it: %+v", rec)
	}
}

// TestResumeStoreShared: a host writes its shards' resume state behind;
// another that takes the cluster over reads it, and from then on the first
// host's writes, at its old revisions, are refused. Entries expire a
// resume_max_age after their last write, and are then made anew.
func TestResumeStoreShared(t *testing.T) {
	srv := startServer(t, "")
	set := mesh.DiscordSettings{Spacing: spacing, ResumeMaxAge: time.Second}
	a := openDiscord(t, srv.URL, "a", set)
	b := openDiscord(t, srv.URL, "b", set)
	ctx := context.Background()
	state := func(shard int, seq int64) discord.ResumeState {
		return discord.ResumeState{Shard: shard, ShardCount: 8, SessionID: fmt.Sprintf("sess-%d", shard), Seq: seq,
			ResumeURL: "wss://gateway.example.test", UpdatedAt: time.Now().UTC()}
	}
	revs := map[int]uint64{}
	for shard := 4; shard <= 6; shard++ { // a runs shards 4-7; 7 never reported
		rev, err := a.PutResume(ctx, state(shard, 10), 0)
		if err != nil {
			t.Fatal(err)
		}
		if revs[shard], err = a.PutResume(ctx, state(shard, 20), rev); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.PutResume(ctx, state(4, 30), 0); !errors.Is(err, mesh.ErrConflict) {
		t.Fatalf("a create over a live entry: %v, want ErrConflict", err)
	}

	got, err := b.Resume(ctx, 4, 7)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[4].State.Seq != 20 || got[6].State.SessionID != "sess-6" || got[5].Rev != revs[5] {
		t.Fatalf("b read %+v", got)
	}
	if _, ok := got[7]; ok {
		t.Fatal("shard 7 has an entry")
	}
	// b runs the cluster now and writes; a's late write is refused.
	if _, err := b.PutResume(ctx, state(4, 21), got[4].Rev); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PutResume(ctx, state(4, 25), revs[4]); !errors.Is(err, mesh.ErrConflict) {
		t.Fatalf("the old holder's write: %v, want ErrConflict", err)
	}
	if got, _ := b.Resume(ctx, 4, 4); got[4].State.Seq != 21 {
		t.Fatalf("shard 4 is %+v, want b's seq 21", got[4])
	}

	// Unwritten for a max age, the entries go; an update at the last
	// revision then makes the entry anew.
	testenv.WaitFor(t, 5*time.Second, "resume entries expired", func() bool {
		got, err := b.Resume(ctx, 4, 7)
		return err == nil && len(got) == 0
	})
	if _, err := a.PutResume(ctx, state(5, 40), revs[5]); err != nil {
		t.Fatalf("a write after the entry expired: %v", err)
	}
	if got, _ := b.Resume(ctx, 5, 5); got[5].State.Seq != 40 {
		t.Fatalf("shard 5 after it was made anew: %+v", got)
	}
}
