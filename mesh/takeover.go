package mesh

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A successor on the same host: a manager restarted with the state file of
// its previous boot (which names that boot) re-adopts the processes the
// previous boot ran, so it takes over that boot's host record and leases at
// their revisions instead of waiting them out. The compare-and-set keeps it
// safe: a lease that expired or that another host took meanwhile is not
// taken over, and its processes are fenced. Only a boot that is gone may be
// succeeded; the manager knows it is, since it holds the previous boot's
// socket and state directory.

// TakeOverHost replaces prev's host record with r, at its revision; it
// returns the new revision. A record that is not prev's (expired, or
// another boot's) is ErrConflict.
func (s *Store) TakeOverHost(ctx context.Context, r HostRecord, prev Holder) (uint64, error) {
	ctx, cancel := s.op(ctx)
	defer cancel()
	cur, err := s.hosts.Get(ctx, r.Host)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, fmt.Errorf("mesh: taking over host %s: no record: %w", r.Host, ErrConflict)
	}
	if err != nil {
		return 0, fmt.Errorf("mesh: taking over host %s: %w", r.Host, err)
	}
	old, err := decodeHost(cur.Value())
	if err != nil || old.Holder != prev {
		return 0, fmt.Errorf("mesh: taking over host %s: the record is not boot %s's: %w", r.Host, prev.Boot, ErrConflict)
	}
	n, err := s.hosts.Update(ctx, r.Host, encode(r), cur.Revision())
	if err != nil {
		return 0, fmt.Errorf("mesh: taking over host %s: %w", r.Host, leaseErr("taking over", -1, err))
	}
	return n, nil
}

// TakeOver makes this agent the successor of prev, a previous boot of this
// host that is gone: before Run, it takes over prev's host record and every
// lease the bucket shows prev holding, each at its revision, and returns the
// clusters it now holds (their renewals and fences then run as for any
// lease). A lease that could not be taken over is not held; neither is
// anything if the leases cannot be read. It must be called before Run.
func (a *Agent) TakeOver(ctx context.Context, prev Holder) ([]int, error) {
	if prev.Host != a.Me.Host || prev.Boot == "" || prev.Boot == a.Me.Boot {
		return nil, fmt.Errorf("mesh: %v is no previous boot of %v", prev, a.Me)
	}
	a.init()
	leases, err := a.Store.Leases(ctx, a.Topology.Clusters())
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, c := range slices.Sorted(maps.Keys(leases)) {
		l := leases[c]
		if l.Gone || l.Holder != prev {
			continue
		}
		h, err := a.Store.Take(ctx, c, a.Me, l.Rev)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		a.mu.Lock()
		a.held[c] = h
		a.mu.Unlock()
	}
	rev, err := a.Store.TakeOverHost(ctx, a.record(), prev)
	if err == nil {
		a.setHostRev(rev)
	} else if !errors.Is(err, ErrConflict) {
		errs = append(errs, err)
	}
	a.mu.Lock()
	held := slices.Sorted(maps.Keys(a.held))
	a.mu.Unlock()
	return held, errors.Join(errs...)
}

// init sets up the agent's state once, for TakeOver or Run.
func (a *Agent) init() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.held == nil {
		a.held, a.stopping, a.start = map[int]Held{}, map[int]time.Time{}, a.now()
	}
}
