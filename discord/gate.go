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
	claims  uint64 // the last ClaimID issued
	waiting map[Ticket]*waiter[M]
	buckets map[int]*bucket[M]
	// floor is when a bucket created from now on may first grant: after
	// SetMaxConcurrency, no earlier than the latest slot of the old buckets.
	floor time.Time
}

type bucket[M any] struct {
	free  time.Time // it may grant at or after this (zero: at once)
	since time.Time // when its oldest current waiter arrived
	claim ClaimID   // the shared slot it waits on; 0: none (see Claims)
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
		if len(b.q) == 0 || now.Before(b.free) || b.claim != 0 {
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
// before now, meaning Due would grant at once. Cancels only make it later. A
// bucket waiting on a claim (Claims) does not count until the claim ends.
func (g *Gate[M]) Next() (time.Time, bool) {
	var at time.Time
	found := false
	for _, b := range g.buckets {
		if len(b.q) == 0 || b.claim != 0 {
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
// Waiting requests keep their tickets and their place in shard order. Claims
// out are dropped: their Won and Lost do nothing.
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

// ClaimID names one claim of a bucket's shared slot; 0 is never issued.
type ClaimID uint64

// Claim is a bucket whose slot is due while the gate shares its buckets with
// the gates of other hosts (a mesh, docs/multihost.md): before it grants, the
// owner must win the slot from the shared store, then call Won, or Lost if
// it did not.
type Claim[M any] struct {
	ID     ClaimID
	Bucket int
	// Head is the request Won would grant now. Requests may come and go
	// while the claim is out, so Won's may be another: see ClaimHead.
	Head Grant[M]
}

// Claims is Due for a shared gate: it grants nothing, but returns each
// bucket whose slot is due at now (it has waiters, Spacing has passed since
// its previous grant) and that waits on no claim yet, and marks it as
// waiting on the returned claim. Due and Next pass over such a bucket until
// Won or Lost ends its claim. Claims are in bucket order.
func (g *Gate[M]) Claims(now time.Time) []Claim[M] {
	var out []Claim[M]
	for n, b := range g.buckets {
		if len(b.q) == 0 || now.Before(b.free) || b.claim != 0 {
			continue
		}
		g.claims++
		b.claim = ClaimID(g.claims)
		out = append(out, Claim[M]{ID: b.claim, Bucket: n, Head: b.q[0].g})
	}
	slices.SortFunc(out, func(a, b Claim[M]) int { return a.Bucket - b.Bucket })
	return out
}

// claimed is the bucket waiting on claim id, if any: none once the claim
// ended, or after SetMaxConcurrency re-bucketed the gate.
func (g *Gate[M]) claimed(id ClaimID) *bucket[M] {
	if id == 0 {
		return nil
	}
	for _, b := range g.buckets {
		if b.claim == id {
			return b
		}
	}
	return nil
}

// ClaimHead is the request that Won(id) would grant: the lowest shard now
// waiting in the claimed bucket. It is false if nobody waits there any more
// or the claim is not out (ended, or dropped by SetMaxConcurrency).
func (g *Gate[M]) ClaimHead(id ClaimID) (Grant[M], bool) {
	b := g.claimed(id)
	if b == nil || len(b.q) == 0 {
		return Grant[M]{}, false
	}
	return b.q[0].g, true
}

// Won ends claim id with the slot won: the bucket's head request is granted
// (removed, At set to now) and the bucket grants again no earlier than free,
// which the caller chooses (the gate cannot know how long the shared slot
// lasts): at least now + Spacing after a grant, or now if it only refused
// the head. It is false, and changes nothing, if the claim
// is not out or nobody waits in its bucket any more.
func (g *Gate[M]) Won(id ClaimID, now, free time.Time) (Grant[M], bool) {
	b := g.claimed(id)
	if b == nil || len(b.q) == 0 {
		return Grant[M]{}, false
	}
	b.claim = 0
	w := heap.Pop(&b.q).(*waiter[M])
	delete(g.waiting, w.g.Ticket)
	if free.After(b.free) {
		b.free = free
	}
	b.since = now
	w.g.At = now
	return w.g, true
}

// Lost ends claim id without a grant: the slot went to another host, or the
// shared store could not be asked. The bucket may claim again at or after
// retry. It reports whether the claim was out.
func (g *Gate[M]) Lost(id ClaimID, retry time.Time) bool {
	b := g.claimed(id)
	if b == nil {
		return false
	}
	b.claim = 0
	if retry.After(b.free) {
		b.free = retry
	}
	return true
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
