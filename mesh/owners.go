package mesh

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Owners is who holds each cluster's lease, as a watch of the leases bucket
// last saw it: what a router asks for every request bound for a cluster
// another host runs, so it is read without a lock. It follows the bucket's
// own updates (a renewal, a take, a release, an expiry's marker) rather than
// reading the whole bucket now and then: a read of every key raced renewals
// and could miss a lease being rewritten.
//
// An entry counts for one lease after the watch last heard of it (a renewal
// comes every lease / 4), so a holder whose lease the watch missed the end
// of is not believed for ever.
type Owners struct {
	slots []ownerSlot
	lease time.Duration
	base  time.Time // the monotonic origin of the expiries
	// ready is closed once the watch has delivered the bucket's initial values.
	ready chan struct{}
	done  chan struct{} // closed when the watch has stopped
}

// ownerSlot is one cluster's holder: written by the watch, read by anyone.
type ownerSlot struct {
	h   atomic.Pointer[Holder]
	exp atomic.Int64 // nanoseconds after Owners.base
}

// WatchOwners starts watching the leases bucket for the holders of clusters
// 0 to clusters−1, until ctx ends. The watch restarts by itself if it
// stops (the connection's ordered consumer recovers from most of that on
// its own); log hears why.
func (s *Store) WatchOwners(ctx context.Context, clusters int, log *slog.Logger) *Owners {
	o := &Owners{slots: make([]ownerSlot, clusters), lease: s.Timing.Lease, base: time.Now(), ready: make(chan struct{}), done: make(chan struct{})}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	go o.run(ctx, s.leases, log)
	return o
}

// Done is closed once the watch has stopped, after its context ended.
func (o *Owners) Done() <-chan struct{} { return o.done }

// Ready is closed once the watch has read the bucket's initial values.
func (o *Owners) Ready() <-chan struct{} { return o.ready }

// Owner returns who holds cluster c's lease, if anyone does as far as the
// watch knows.
func (o *Owners) Owner(c int) (Holder, bool) {
	if c < 0 || c >= len(o.slots) {
		return Holder{}, false
	}
	s := &o.slots[c]
	h := s.h.Load()
	if h == nil || time.Since(o.base) > time.Duration(s.exp.Load()) {
		return Holder{}, false
	}
	return *h, true
}

// Hosts returns the distinct holders of the clusters, each once, in cluster
// order of their first cluster.
func (o *Owners) Hosts() []Holder {
	var out []Holder
	for c := range o.slots {
		h, ok := o.Owner(c)
		if !ok {
			continue
		}
		seen := false
		for _, x := range out {
			seen = seen || x == h
		}
		if !seen {
			out = append(out, h)
		}
	}
	return out
}

func (o *Owners) run(ctx context.Context, kv jetstream.KeyValue, log *slog.Logger) {
	defer close(o.done)
	first := true
	for ctx.Err() == nil {
		w, err := kv.WatchAll(ctx)
		if err == nil {
			err = o.follow(ctx, w, &first)
			w.Stop()
		}
		if ctx.Err() != nil {
			return
		}
		log.Warn("mesh: the watch of the leases stopped; watching again", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(o.lease / 16):
		}
	}
}

// follow applies w's entries until it stops or ctx ends.
func (o *Owners) follow(ctx context.Context, w jetstream.KeyWatcher, first *bool) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errWatchClosed
			}
			if e == nil {
				if *first {
					*first = false
					close(o.ready)
				}
				continue
			}
			o.apply(e)
		}
	}
}

type watchError string

func (e watchError) Error() string { return string(e) }

const errWatchClosed = watchError("watcher closed")

func (o *Owners) apply(e jetstream.KeyValueEntry) {
	c, l, ok := leaseEntry(entryOf(e))
	if !ok || c >= len(o.slots) {
		return
	}
	s := &o.slots[c]
	if l.Gone {
		s.h.Store(nil)
		return
	}
	// The expiry first: a reader that sees the new holder sees its expiry.
	s.exp.Store(int64(time.Since(o.base) + o.lease))
	if cur := s.h.Load(); cur == nil || *cur != l.Holder {
		h := l.Holder
		s.h.Store(&h)
	}
}
