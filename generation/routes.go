package generation

import "fmt"

// ProcRef names one spawned process: its cluster, its generation and a
// manager-wide spawn sequence number, so two spawns never share a name.
type ProcRef struct {
	Cluster    int    `json:"cluster"`
	Generation int64  `json:"generation"`
	Seq        uint64 `json:"seq"`
}

// String renders p as "cluster@generation#seq", e.g. "2@6#17".
func (p ProcRef) String() string { return fmt.Sprintf("%d@%d#%d", p.Cluster, p.Generation, p.Seq) }

// Routes is the routing table: the topology in force and, per cluster of it,
// the process business ops go to (at most one; none while a cluster has no
// ready process, so its requests wait instead of reaching a dead one).
//
// A Routes is never changed once built: With and Without return a new table.
// That lets the manager publish it through an atomic.Pointer and lets readers
// use it without a lock.
type Routes struct {
	// Topology is the shard split the table routes by; guild: and shard:
	// targets resolve with it.
	Topology Topology

	procs []route // indexed by cluster
}

type route struct {
	p  ProcRef
	ok bool
}

// NewRoutes returns a table for topology t (which must be valid) with no
// cluster routed.
func NewRoutes(t Topology) *Routes {
	return &Routes{Topology: t, procs: make([]route, t.Clusters())}
}

// Routed returns the process cluster c is routed to, if any. Clusters outside
// the topology have none.
func (r *Routes) Routed(c int) (ProcRef, bool) {
	if c < 0 || c >= len(r.procs) {
		return ProcRef{}, false
	}
	return r.procs[c].p, r.procs[c].ok
}

// With returns a copy of r that routes p.Cluster to p. It panics if p.Cluster
// is not a cluster of r.Topology, as an out-of-range index would.
func (r *Routes) With(p ProcRef) *Routes { return r.WithAll([]ProcRef{p}) }

// WithAll returns a copy of r that routes each p.Cluster to p, copying the
// table once (With in a loop would copy it per process). It panics as With does.
func (r *Routes) WithAll(ps []ProcRef) *Routes {
	n := r.clone()
	for _, p := range ps {
		if p.Cluster < 0 || p.Cluster >= len(n.procs) {
			panic(fmt.Sprintf("generation: route %v: not a cluster of %v", p, r.Topology))
		}
		n.procs[p.Cluster] = route{p: p, ok: true}
	}
	return n
}

// Without returns a table in which p is not routed: a copy of r with p's
// cluster unrouted if p is its routed process, else r itself. Taking the
// process rather than the cluster means a stale caller never unroutes a
// process that replaced p.
func (r *Routes) Without(p ProcRef) *Routes {
	if q, ok := r.Routed(p.Cluster); !ok || q != p {
		return r
	}
	n := r.clone()
	n.procs[p.Cluster] = route{}
	return n
}

func (r *Routes) clone() *Routes {
	return &Routes{Topology: r.Topology, procs: append([]route(nil), r.procs...)}
}
