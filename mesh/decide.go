package mesh

import (
	"maps"
	"slices"
	"time"
)

// Lease is a cluster's lease as the leases bucket shows it.
type Lease struct {
	Holder Holder
	// Rev is the entry's revision: of the holder's last write or, when
	// Gone, of the marker that ended it.
	Rev uint64
	// Gone is set when the lease was released or expired: free to take.
	Gone bool
}

// Held is a lease this host holds, as only it knows it: the revision of its
// last successful write and when it sent that write, on its monotonic clock.
type Held struct {
	Rev  uint64
	Sent time.Time
}

// View is what a host knows of the mesh at one moment.
type View struct {
	// Clusters is how many clusters the topology makes.
	Clusters int
	// Hosts are the hosts with a live record, this one included once it
	// has announced itself.
	Hosts []Capacity
	// Leases are the clusters' leases by cluster id; a cluster never
	// leased is missing.
	Leases map[int]Lease
}

// Kind is what a host does about one lease.
type Kind int

// The kinds of Action.
const (
	// Take acquires the lease: a create, or, when Rev is set, an update at
	// Rev of an entry this boot still holds in the bucket (it fenced too
	// early, the lease outlived the fence). On success the host starts the
	// cluster.
	Take Kind = iota + 1
	// Renew writes the lease again at Rev, the revision last seen of it.
	Renew
	// Fence stops the cluster's process now and forgets the lease: the host
	// could not renew it in time, or the bucket shows it ended or taken.
	Fence
)

// String names the kind, for logs and test failures.
func (k Kind) String() string {
	switch k {
	case Take:
		return "take"
	case Renew:
		return "renew"
	case Fence:
		return "fence"
	}
	return "unknown"
}

// Action is one thing Decide asks the host to do.
type Action struct {
	Kind    Kind
	Cluster int
	Rev     uint64
}

// Decide is what host me does at now about every lease, given the view and
// the leases it holds. It fences first on its own clock (no view needed: a
// host cut off from the server has no fresh view), then on what the view
// shows (a lease ended or taken at a revision later than its own write);
// renews what is due; and takes the clusters placement gives it that nobody
// holds. The actions are in cluster order.
//
// A view that lags behind the host's own writes is normal (the bucket's
// watcher delivers them later than the write's answer): an entry older than
// the host's own last write says nothing about the lease.
func Decide(me Holder, t Timing, now time.Time, v View, held map[int]Held) []Action {
	var out []Action
	owners := make(map[int]string, len(v.Leases)+len(held))
	for c, l := range v.Leases {
		if !l.Gone {
			owners[c] = l.Holder.Host
		}
	}
	for _, c := range slices.Sorted(maps.Keys(held)) {
		h := held[c]
		owners[c] = me.Host
		l, seen := v.Leases[c]
		newer := seen && l.Rev > h.Rev
		switch {
		case !now.Before(t.FenceAt(h.Sent)):
			out = append(out, Action{Kind: Fence, Cluster: c})
		case newer && (l.Gone || l.Holder != me):
			out = append(out, Action{Kind: Fence, Cluster: c})
		case newer:
			// A write of ours whose answer was lost: renew on top of it.
			out = append(out, Action{Kind: Renew, Cluster: c, Rev: l.Rev})
		case t.RenewDue(h.Sent, now):
			out = append(out, Action{Kind: Renew, Cluster: c, Rev: h.Rev})
		}
	}

	mine := Place(v.Clusters, v.Hosts, owners)
	listed := slices.ContainsFunc(v.Hosts, func(c Capacity) bool { return c.Host == me.Host })
	for c := range v.Clusters {
		if _, ok := held[c]; ok {
			continue
		}
		l, seen := v.Leases[c]
		switch {
		case seen && !l.Gone && l.Holder == me:
			out = append(out, Action{Kind: Take, Cluster: c, Rev: l.Rev})
		case (!seen || l.Gone) && listed && mine[c] == me.Host:
			out = append(out, Action{Kind: Take, Cluster: c})
		}
	}
	slices.SortStableFunc(out, func(a, b Action) int { return a.Cluster - b.Cluster })
	return out
}
