package mesh

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"
)

// Agent is one host's part in a mesh: it announces the host, takes the leases
// placement gives it, renews them, and fences those it cannot renew in time.
// It runs no process itself: Start and Stop are its owner's (the manager's).
// One goroutine, Run, does all of it; its requests are bounded so that none
// outlasts the next fence.
type Agent struct {
	Store    *Store
	Me       Holder
	Capacity int
	Topology Topology
	// Cluster is the host's [cluster] table (ClusterDigest), carried in its
	// record so that a host with another one is refused (CheckSameConfig).
	Cluster map[string]string
	Log     *slog.Logger
	// Now is the clock (time.Now when nil): monotonic readings, as the
	// lease arithmetic counts from the send of each write.
	Now func() time.Time
	// Start is called once the host holds cluster c's lease: start it.
	Start func(c int)
	// Stop is called when the host must stop cluster c at once: its lease
	// could not be renewed in time, or it ended or was taken. It returns
	// once the process is gone (a fence is a SIGKILL of the process group,
	// confirmed); the margin it has is Timing.Margin.
	Stop func(c int)
	// Viewed, if set, is called after a pass in which the hosts (their ids,
	// boots, capacities, clusters) or the leases' holders changed from what
	// the previous call saw: the owner reads Snapshot for the news. Called
	// on Run's goroutine; it must not block.
	Viewed func()
	// Kill, if set, is the last resort (watchdog.go): kill cluster c's
	// processes at once, without the owner's loop, because a Stop was not
	// confirmed in time. It is called with the agent's lock held, so it must
	// not block nor call the agent; the Stop still waits for the owner.
	Kill func(c int)

	mu       sync.Mutex // guards the fields below
	held     map[int]Held
	stopping map[int]time.Time // Stops not yet confirmed, by when they must be (watchdog.go)
	hosts    []HostRecord
	leases   map[int]Lease
	hostAt   uint64 // revision of our host record; 0 before the first
	start    time.Time
	joined   time.Time // when the first announcement succeeded
}

// Snapshot is what an Agent last knew, for STATUS.
type Snapshot struct {
	Hosts []HostRecord
	// Held are the clusters this host holds, with their last write.
	Held map[int]Held
	// Leases are every cluster's lease as last read.
	Leases map[int]Lease
}

// Snapshot returns a copy of what the agent last knew.
func (a *Agent) Snapshot() Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Snapshot{Hosts: slices.Clone(a.hosts), Held: maps.Clone(a.held), Leases: maps.Clone(a.leases)}
}

// Holder returns who holds cluster c's lease as this agent last knew: this
// host for the leases it holds, else the last read of the bucket.
func (a *Agent) Holder(c int) (Holder, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.held[c]; ok {
		return a.Me, true
	}
	if l, ok := a.leases[c]; ok && !l.Gone {
		return l.Holder, true
	}
	return Holder{}, false
}

func (a *Agent) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// Run takes part in the mesh until ctx ends. It announces the host first,
// waiting, if a previous boot of this host still has a live record, for that
// record to expire (a lease at most), and takes no free lease for a renewal
// interval after, so that hosts started together place clusters together. When ctx ends it stops every cluster it
// holds, releases their leases, so that other hosts need not wait them out,
// and removes its host record.
func (a *Agent) Run(ctx context.Context) error {
	a.init() // TakeOver may have begun it
	if a.Log == nil {
		a.Log = slog.New(slog.DiscardHandler)
	}
	t := a.Store.Timing
	// A successor that took leases over (TakeOver) goes straight to the
	// passes, which renew and fence them; each pass announces the host
	// until its record is there.
	a.mu.Lock()
	succeeded := a.hostAt != 0 || len(a.held) > 0
	a.mu.Unlock()
	if succeeded {
		a.joined = a.now()
	}
	for !succeeded {
		rev, err := a.Store.Announce(ctx, a.record(), 0)
		if err == nil {
			a.setHostRev(rev)
			a.joined = a.now()
			break
		}
		if !errors.Is(err, ErrHostIDInUse) && ctx.Err() == nil {
			a.Log.Warn("mesh: cannot announce this host yet", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(t.Renew / 4):
		}
	}
	a.Log.Info("mesh: joined", "host", a.Me.Host, "boot", a.Me.Boot, "capacity", a.Capacity)
	if a.Kill != nil {
		// Watching until the leases are released (leave), since they are
		// held until then.
		wctx, stopWatch := context.WithCancel(context.Background())
		watched := make(chan struct{})
		go func() { defer close(watched); a.watch(wctx) }()
		defer func() { stopWatch(); <-watched }()
	}
	defer a.leave()
	var seen string
	for {
		a.step(ctx)
		a.noteView(&seen)
		wait := t.Renew / 4
		a.mu.Lock()
		for _, h := range a.held {
			wait = min(wait, time.Until(t.FenceAt(h.Sent)))
		}
		a.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(max(wait, time.Millisecond)):
		}
	}
}

// step is one pass: fence what is due, refresh the view, announce, and carry
// out Decide's actions.
func (a *Agent) step(ctx context.Context) {
	t := a.Store.Timing
	a.fenceDue()
	// Every request is bounded by the earliest fence, so that the I/O of
	// one pass never delays the next fence.
	rctx, cancel := context.WithDeadline(ctx, a.nextFence(a.now().Add(t.Op)))
	defer cancel()
	a.mu.Lock()
	known := make([]string, 0, len(a.hosts))
	for _, h := range a.hosts {
		known = append(known, h.Host)
	}
	a.mu.Unlock()
	hosts, herr := a.Store.Hosts(rctx, known...)
	leases, lerr := a.Store.Leases(rctx, a.Topology.Clusters())
	a.mu.Lock()
	if herr == nil {
		a.hosts = hosts
	}
	if lerr == nil {
		a.leases = leases
	}
	rev := a.hostAt
	a.mu.Unlock()
	if herr != nil || lerr != nil {
		a.Log.Debug("mesh: no fresh view", "hosts_err", herr, "leases_err", lerr)
	}
	if rev, err := a.Store.Announce(rctx, a.record(), rev); err == nil {
		a.setHostRev(rev)
	} else if errors.Is(err, ErrConflict) {
		a.Log.Warn("mesh: host record lost; announcing again", "err", err)
		a.setHostRev(0)
	} else {
		a.Log.Debug("mesh: host record not renewed", "err", err)
	}

	a.mu.Lock()
	view := View{Clusters: a.Topology.Clusters(), Leases: a.leases}
	for _, h := range a.hosts {
		view.Hosts = append(view.Hosts, Capacity{Host: h.Host, Max: h.Capacity})
	}
	actions := Decide(a.Me, t, a.now(), view, a.held)
	a.mu.Unlock()
	// Hosts started together must see each other before any places
	// clusters, or the first would take all it has room for: a new host
	// takes no free lease for one renewal interval after it joined.
	settling := a.now().Sub(a.joined) < t.Renew
	actions = slices.DeleteFunc(actions, func(x Action) bool { return settling && x.Kind == Take && x.Rev == 0 })
	var unrenewed []int
	var renewErr error
	defer func() {
		// One line per pass, not per lease: a host cut off from the server
		// retries every lease on every pass until it fences them.
		if len(unrenewed) > 0 {
			a.Log.Warn("mesh: leases not renewed", "clusters", unrenewed, "err", renewErr)
		}
	}()
	for _, act := range actions {
		if rctx.Err() != nil {
			return
		}
		switch act.Kind {
		case Fence:
			a.fence(act.Cluster, "lease ended or taken")
		case Take:
			h, err := a.Store.Take(rctx, act.Cluster, a.Me, act.Rev)
			if err != nil {
				a.Log.Debug("mesh: lease not taken", "cluster", act.Cluster, "err", err)
				continue
			}
			a.mu.Lock()
			a.held[act.Cluster] = h
			a.mu.Unlock()
			a.Log.Info("mesh: lease taken", "cluster", act.Cluster)
			a.Start(act.Cluster)
		case Renew:
			h, err := a.Store.Renew(rctx, act.Cluster, a.Me, act.Rev)
			if err != nil {
				if errors.Is(err, ErrConflict) {
					a.fence(act.Cluster, "lease changed under its holder")
				} else {
					unrenewed, renewErr = append(unrenewed, act.Cluster), err
				}
				continue
			}
			a.mu.Lock()
			if _, ok := a.held[act.Cluster]; ok {
				a.held[act.Cluster] = h
			}
			a.mu.Unlock()
		}
	}
}

// fenceDue fences every lease past its fence.
func (a *Agent) fenceDue() {
	a.mu.Lock()
	var due []int
	for c, h := range a.held {
		if !a.now().Before(a.Store.Timing.FenceAt(h.Sent)) {
			due = append(due, c)
		}
	}
	a.mu.Unlock()
	slices.Sort(due)
	for _, c := range due {
		a.fence(c, "lease not renewed in time")
	}
}

func (a *Agent) fence(c int, why string) {
	a.mu.Lock()
	h, ok := a.held[c]
	delete(a.held, c)
	a.mu.Unlock()
	if ok {
		a.Log.Warn("mesh: fencing cluster", "cluster", c, "why", why)
		a.stopOne(c, h.Sent)
	}
}

// nextFence is the earliest fence of a held lease, or def if none is sooner.
func (a *Agent) nextFence(def time.Time) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, h := range a.held {
		if f := a.Store.Timing.FenceAt(h.Sent); f.Before(def) {
			def = f
		}
	}
	return def
}

func (a *Agent) record() HostRecord {
	a.mu.Lock()
	defer a.mu.Unlock()
	return HostRecord{Holder: a.Me, Capacity: a.Capacity, Clusters: slices.Sorted(maps.Keys(a.held)),
		Topology: a.Topology, Cluster: a.Cluster, Started: a.start}
}

func (a *Agent) setHostRev(rev uint64) {
	a.mu.Lock()
	a.hostAt = rev
	a.mu.Unlock()
}

// leave stops and releases every held cluster and removes the host record.
func (a *Agent) leave() {
	ctx := context.Background()
	a.mu.Lock()
	held := maps.Clone(a.held)
	a.held = map[int]Held{}
	for c, h := range held { // watched from now, not only once reached
		a.stopping[c] = a.Store.Timing.StopBy(h.Sent, a.now())
	}
	rev := a.hostAt
	a.mu.Unlock()
	for _, c := range slices.Sorted(maps.Keys(held)) {
		a.Stop(c)
		a.stopped(c)
		if err := a.Store.Release(ctx, c, held[c].Rev); err != nil {
			a.Log.Info("mesh: lease not released; it expires by itself", "cluster", c, "err", err)
		}
	}
	if err := a.Store.Leave(ctx, a.Me.Host, rev); err != nil {
		a.Log.Info("mesh: host record not removed; it expires by itself", "err", err)
	}
}
