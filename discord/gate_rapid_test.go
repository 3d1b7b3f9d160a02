package discord_test

import (
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sm-supervisor/sm/discord"
)

// gateModel is what the randomized test knows about a Gate: the requests it
// made and what became of them.
type gateModel struct {
	t       *rapid.T
	g       *discord.Gate[int]
	spacing time.Duration
	now     time.Time
	nc      int // max_concurrency as last set
	epoch   int // bumped when nc really changes
	issued  []discord.Ticket
	waiting map[discord.Ticket]int // ticket → shard
	dropped map[discord.Ticket]bool
	grants  []modelGrant
}

type modelGrant struct {
	ticket discord.Ticket
	shard  int
	bucket int
	epoch  int
	at     time.Time
}

// TestGateRandomized drives random asks, cancels (single and by predicate),
// clock steps, Due calls and max_concurrency changes through a Gate, checking
// after every step that:
//   - no two grants of one bucket are less than Spacing apart, nor any grant
//     made after a max_concurrency change and any grant made before it;
//   - each grant goes to the lowest waiting shard of its bucket (ties in ask
//     order), and is for a ticket that was waiting: never a cancelled one,
//     never twice;
//   - Next is exact: Due grants nothing before it and something at it;
//
// and at the end, that every request not cancelled was granted.
func TestGateRandomized(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		spacing := rapid.SampledFrom([]time.Duration{time.Second, 5 * time.Second, 5500 * time.Millisecond}).Draw(rt, "spacing")
		nc := rapid.IntRange(1, 5).Draw(rt, "max_concurrency")
		shards := rapid.IntRange(1, 40).Draw(rt, "shards")
		m := &gateModel{
			t: rt, g: discord.NewGate[int](nc, spacing), spacing: spacing, now: t0, nc: nc,
			waiting: map[discord.Ticket]int{}, dropped: map[discord.Ticket]bool{},
		}
		steps := rapid.IntRange(1, 200).Draw(rt, "steps")
		for range steps {
			switch rapid.IntRange(0, 9).Draw(rt, "action") {
			case 0, 1, 2:
				shard := rapid.IntRange(0, shards-1).Draw(rt, "shard")
				tk, err := m.g.Ask(shard, m.now, shard)
				if err != nil {
					rt.Fatal(err)
				}
				if slices.Contains(m.issued, tk) || tk == 0 {
					rt.Fatalf("ticket %d issued twice or zero", tk)
				}
				m.issued = append(m.issued, tk)
				m.waiting[tk] = shard
			case 3:
				if len(m.issued) == 0 {
					continue
				}
				tk := rapid.SampledFrom(m.issued).Draw(rt, "cancel")
				_, was := m.waiting[tk]
				if got := m.g.Cancel(tk); got != was {
					rt.Fatalf("Cancel(%d) = %v, waiting %v", tk, got, was)
				}
				if was {
					delete(m.waiting, tk)
					m.dropped[tk] = true
				}
			case 4:
				// A cluster holding shards ≡ r (mod 3) dies.
				r := rapid.IntRange(0, 2).Draw(rt, "dies")
				gone := m.g.CancelIf(func(gr discord.Grant[int]) bool { return gr.Meta%3 == r })
				for _, gr := range gone {
					if _, ok := m.waiting[gr.Ticket]; !ok || gr.Shard%3 != r {
						rt.Fatalf("CancelIf took %+v", gr)
					}
					delete(m.waiting, gr.Ticket)
					m.dropped[gr.Ticket] = true
				}
				for tk, s := range m.waiting {
					if s%3 == r {
						rt.Fatalf("CancelIf left ticket %d of shard %d", tk, s)
					}
				}
			case 5:
				n := rapid.IntRange(1, 5).Draw(rt, "new_max_concurrency")
				m.g.SetMaxConcurrency(n)
				if n != m.nc {
					m.nc, m.epoch = n, m.epoch+1
				}
			default:
				d := time.Duration(rapid.IntRange(0, 7000).Draw(rt, "advance_ms")) * time.Millisecond
				m.now = m.now.Add(d)
				m.due()
			}
			if m.g.Len() != len(m.waiting) {
				rt.Fatalf("Len = %d, model has %d waiting", m.g.Len(), len(m.waiting))
			}
		}
		// Drain: everything still waiting is granted, as the manager's
		// timer would see to.
		for i := 0; len(m.waiting) > 0; i++ {
			if i > 10000 {
				rt.Fatalf("%d requests never granted", len(m.waiting))
			}
			next, ok := m.g.Next()
			if !ok {
				rt.Fatalf("Next reports nothing with %d waiting", len(m.waiting))
			}
			if next.After(m.now) {
				m.now = next
			}
			m.due()
		}
		if _, ok := m.g.Next(); ok {
			rt.Fatal("Next reports something on an empty gate")
		}
		granted := map[discord.Ticket]bool{}
		for _, gr := range m.grants {
			granted[gr.ticket] = true
		}
		for _, tk := range m.issued {
			if granted[tk] == m.dropped[tk] {
				rt.Fatalf("ticket %d: granted %v, cancelled %v", tk, granted[tk], m.dropped[tk])
			}
		}
	})
}

// due calls Due at m.now and checks what it grants.
func (m *gateModel) due() {
	next, hasNext := m.g.Next()
	if hasNext != (len(m.waiting) > 0) {
		m.t.Fatalf("Next reports %v with %d waiting", hasNext, len(m.waiting))
	}
	gs := m.g.Due(m.now)
	switch {
	case hasNext && m.now.Before(next) && len(gs) > 0:
		m.t.Fatalf("Due granted %d before Next (%v early)", len(gs), next.Sub(m.now))
	case hasNext && !m.now.Before(next) && len(gs) == 0:
		m.t.Fatalf("Due granted nothing at or after Next (%v late)", m.now.Sub(next))
	}
	// Order is judged against the waiters present before this Due; the other
	// grants of this call are in other buckets.
	before := make(map[discord.Ticket]int, len(m.waiting))
	for tk, s := range m.waiting {
		before[tk] = s
	}
	seen := map[int]bool{}
	for _, gr := range gs {
		shard, ok := before[gr.Ticket]
		if !ok || shard != gr.Shard || gr.Meta != shard {
			m.t.Fatalf("grant %+v is not for a waiting request (cancelled %v)", gr, m.dropped[gr.Ticket])
		}
		bucket := shard % m.nc
		if gr.Bucket != bucket || !gr.At.Equal(m.now) {
			m.t.Fatalf("grant %+v: want bucket %d at %v", gr, bucket, m.now)
		}
		if seen[bucket] {
			m.t.Fatalf("two grants in bucket %d at once", bucket)
		}
		seen[bucket] = true
		for tk, s := range before {
			if s%m.nc == bucket && (s < shard || s == shard && tk < gr.Ticket) {
				m.t.Fatalf("shard %d (ticket %d) granted while shard %d (ticket %d) waited in bucket %d",
					shard, gr.Ticket, s, tk, bucket)
			}
		}
		for _, p := range m.grants {
			if (p.epoch != m.epoch || p.bucket == bucket) && m.now.Sub(p.at) < m.spacing {
				m.t.Fatalf("shard %d granted %v after shard %d (buckets %d/%d, epochs %d/%d), spacing %v",
					shard, m.now.Sub(p.at), p.shard, bucket, p.bucket, m.epoch, p.epoch, m.spacing)
			}
		}
		delete(m.waiting, gr.Ticket)
		m.grants = append(m.grants, modelGrant{gr.Ticket, shard, bucket, m.epoch, m.now})
	}
	if len(gs) > 0 && len(gs) > m.nc {
		m.t.Fatalf("%d grants at once with %d buckets", len(gs), m.nc)
	}
}
