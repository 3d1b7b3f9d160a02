package discord

import (
	"cmp"
	"container/heap"
	"errors"
	"slices"
	"time"
)

// DiscordSpacing is Discord's identify rate: one IDENTIFY per bucket per 5 s.
const DiscordSpacing = 5 * time.Second

// DefaultSpacing is the gate's default spacing: Discord's 5 s plus a 500 ms
// margin. Grants measured 5.000 s apart reached a gateway 4.951 to 4.998 s
// apart (up to 49 ms of jitter between the grant and the IDENTIFY on the
// wire), which Discord answers with an invalid session; on a loaded machine
// one IDENTIFY reached it 258 ms after its grant (docs/discord.md).
const DefaultSpacing = DiscordSpacing + 500*time.Millisecond

// Ticket names one request to the Gate. Tickets are never reused; 0 is never
// issued.
type Ticket uint64

// Grant is a request to the Gate: waiting, or (from Due) granted.
type Grant[M any] struct {
	Ticket Ticket
	Shard  int
	// Bucket is Shard % max_concurrency, as it was when the request was
	// granted (or, while waiting, as it is now).
	Bucket int
	// Meta is the caller's own data, handed back untouched (the manager's
	// pending request: connection, frame id, deadline).
	Meta M
	// Asked is the time passed to Ask.
	Asked time.Time
	// At is the time passed to Due that granted it; zero while waiting.
	At time.Time
}

// ErrBadShard is returned by Ask for a negative shard id.
var ErrBadShard = errors.New("identify gate: shard id must not be negative")

// Gate spaces IDENTIFYs the way Discord requires: shard s is in bucket
// s % maxConcurrency, and each bucket grants at most one identify per Spacing,
// measured from its previous grant. Buckets are independent, so with
// max_concurrency n up to n shards identify at once. Within a bucket the
// waiting request with the lowest shard id goes first, ties in ask order.
// One Gate serves every cluster and generation of a bot.
//
// Gate is pure and event-driven: it starts no goroutines and reads no clock.
// The owner (the manager's event loop) drives it:
//
//	t, _ := g.Ask(shard, now, req)   // an IDENTIFY request arrived
//	g.Cancel(t)                      // its asker went away or its deadline passed
//	for _, gr := range g.Due(now) {  // after every event and when the timer fires:
//		reply granted to gr.Meta
//	}
//	if at, ok := g.Next(); ok {      // then arm the timer for the next slot
//		timer.Reset(at.Sub(now))
//	}
//
// Times passed in must not go backwards (time.Now's monotonic reading is fine).
// A Gate is not safe for concurrent use. M is the type of the caller's Meta.
type Gate[M any] struct {
	spacing time.Duration
	maxConc int
	last    Ticket
	waiting map[Ticket]*waiter[M]
	buckets map[int]*bucket[M]
	// floor is when a bucket created from now on may first grant: after
	// SetMaxConcurrency, no earlier than the latest slot of the old buckets.
	floor time.Time
}

type bucket[M any] struct {
	free  time.Time // it may grant at or after this (zero: at once)
	since time.Time // when its oldest current waiter arrived
	q     waitQueue[M]
}

type waiter[M any] struct {
	g     Grant[M]
	b     *bucket[M]
	index int // in b.q
}

// NewGate returns a Gate with maxConcurrency buckets (below 1 counts as 1)
// that spaces each bucket's grants by spacing (0 or less means DefaultSpacing:
// a missing setting must never turn the gate off).
func NewGate[M any](maxConcurrency int, spacing time.Duration) *Gate[M] {
	if spacing <= 0 {
		spacing = DefaultSpacing
	}
	return &Gate[M]{
		spacing: spacing,
		maxConc: max(maxConcurrency, 1),
		waiting: map[Ticket]*waiter[M]{},
		buckets: map[int]*bucket[M]{},
	}
}

// Spacing is the minimum time between two grants of one bucket.
func (g *Gate[M]) Spacing() time.Duration { return g.spacing }

// MaxConcurrency is the number of buckets.
func (g *Gate[M]) MaxConcurrency() int { return g.maxConc }

// Len is the number of waiting requests.
func (g *Gate[M]) Len() int { return len(g.waiting) }

// Ask queues a request for an identify slot for shard at time now and returns
// its ticket. It never grants by itself: call Due next.
func (g *Gate[M]) Ask(shard int, now time.Time, meta M) (Ticket, error) {
	if shard < 0 {
		return 0, ErrBadShard
	}
	g.last++
	w := &waiter[M]{g: Grant[M]{Ticket: g.last, Shard: shard, Meta: meta, Asked: now}}
	g.enqueue(w)
	g.waiting[w.g.Ticket] = w
	return w.g.Ticket, nil
}

func (g *Gate[M]) enqueue(w *waiter[M]) {
	w.g.Bucket = w.g.Shard % g.maxConc
	b := g.buckets[w.g.Bucket]
	if b == nil {
		b = &bucket[M]{free: g.floor}
		g.buckets[w.g.Bucket] = b
	}
	if len(b.q) == 0 || w.g.Asked.Before(b.since) {
		b.since = w.g.Asked
	}
	w.b = b
	heap.Push(&b.q, w)
}

// Cancel withdraws a waiting request; it reports whether t was waiting (not
// yet granted, cancelled or unknown). A cancelled request is never granted and
// holds up nobody: the next waiter of its bucket takes its place.
func (g *Gate[M]) Cancel(t Ticket) bool {
	w, ok := g.waiting[t]
	if !ok {
		return false
	}
	g.remove(w)
	return true
}

// CancelIf withdraws every waiting request for which match is true (say, all
// those of a connection that closed) and returns them in ticket order.
func (g *Gate[M]) CancelIf(match func(Grant[M]) bool) []Grant[M] {
	var out []Grant[M]
	for _, w := range g.waiting {
		if match(w.g) {
			out = append(out, w.g)
		}
	}
	slices.SortFunc(out, func(a, b Grant[M]) int { return cmp.Compare(a.Ticket, b.Ticket) })
	for _, gr := range out {
		g.remove(g.waiting[gr.Ticket])
	}
	return out
}

func (g *Gate[M]) remove(w *waiter[M]) {
	heap.Remove(&w.b.q, w.index)
	delete(g.waiting, w.g.Ticket)
}

// Waiting returns the waiting requests, by bucket and then in the order they
// will be granted; for status pages and tests.
func (g *Gate[M]) Waiting() []Grant[M] {
	out := make([]Grant[M], 0, len(g.waiting))
	for _, w := range g.waiting {
		out = append(out, w.g)
	}
	slices.SortFunc(out, func(a, b Grant[M]) int {
		if a.Bucket != b.Bucket {
			return a.Bucket - b.Bucket
		}
		return cmpWait(a, b)
	})
	return out
}

// Due grants every slot that is due at now and returns the grants (removed
// from the gate), by bucket: per bucket at most one, to its lowest waiting
// shard, if Spacing has passed since the bucket's previous grant.
func (g *Gate[M]) Due(now time.Time) []Grant[M] {
	var out []Grant[M]
	for _, b := range g.buckets {
		if len(b.q) == 0 || now.Before(b.free) {
			continue
		}
		w := heap.Pop(&b.q).(*waiter[M])
		delete(g.waiting, w.g.Ticket)
		// From now, not from the slot: a late timer must not bring the
		// next grant closer than Spacing.
		b.free = now.Add(g.spacing)
		b.since = now
		w.g.At = now
		out = append(out, w.g)
	}
	slices.SortFunc(out, func(a, b Grant[M]) int { return a.Bucket - b.Bucket })
	return out
}

// Next returns when Due will next grant something, if anything is waiting:
// the earliest moment a bucket with waiters is free. The time may be at or
// before now, meaning Due would grant at once. Cancels only make it later.
func (g *Gate[M]) Next() (time.Time, bool) {
	var at time.Time
	found := false
	for _, b := range g.buckets {
		if len(b.q) == 0 {
			continue
		}
		t := b.free
		if t.Before(b.since) {
			t = b.since
		}
		if !found || t.Before(at) {
			at, found = t, true
		}
	}
	return at, found
}

// SetMaxConcurrency re-buckets the gate after a /gateway/bot answer with a
// different max_concurrency (n below 1 counts as 1). Shards change buckets, so
// no new bucket grants before the latest slot any old bucket had reserved:
// at most one Spacing of delay, never two identifies too close in one bucket.
// Waiting requests keep their tickets and their place in shard order.
func (g *Gate[M]) SetMaxConcurrency(n int) {
	n = max(n, 1)
	if n == g.maxConc {
		return
	}
	for _, b := range g.buckets {
		if b.free.After(g.floor) {
			g.floor = b.free
		}
	}
	g.maxConc = n
	g.buckets = map[int]*bucket[M]{}
	ws := make([]*waiter[M], 0, len(g.waiting))
	for _, w := range g.waiting {
		ws = append(ws, w)
	}
	slices.SortFunc(ws, func(a, b *waiter[M]) int { return cmp.Compare(a.g.Ticket, b.g.Ticket) })
	for _, w := range ws {
		g.enqueue(w)
	}
}

// cmpWait orders waiters of one bucket: lowest shard first, then ask order.
func cmpWait[M any](a, b Grant[M]) int {
	if a.Shard != b.Shard {
		return a.Shard - b.Shard
	}
	return cmp.Compare(a.Ticket, b.Ticket)
}

// waitQueue is a min-heap of one bucket's waiters in cmpWait order.
type waitQueue[M any] []*waiter[M]

func (q waitQueue[M]) Len() int           { return len(q) }
func (q waitQueue[M]) Less(i, j int) bool { return cmpWait(q[i].g, q[j].g) < 0 }
func (q waitQueue[M]) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *waitQueue[M]) Push(x any) {
	w := x.(*waiter[M])
	w.index = len(*q)
	*q = append(*q, w)
}
func (q *waitQueue[M]) Pop() any {
	old := *q
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return w
}
