package mesh

// Where a request for a cluster goes: the router's decisions, pure, so that
// their table test covers every case (hop_test.go).

// HopKind is what a router does with a request.
type HopKind int

const (
	// HopLocal runs the request on this host: its cluster is held here, or
	// its lease names this boot and the cluster is being started.
	HopLocal HopKind = iota
	// HopForward sends it to the host holding the cluster's lease.
	HopForward
	// HopFail answers it unavailable.
	HopFail
)

// Hop is a routing decision.
type Hop struct {
	Kind HopKind
	To   Holder // for HopForward
	Why  string // for HopFail: why no host can take it
}

// FirstHop decides where a request for a cluster goes from boot me:
// heldHere is whether this host supervises the cluster now, and owner
// (owned false: nobody) who holds its lease as the watch of the leases saw.
func FirstHop(me Holder, heldHere bool, owner Holder, owned bool) Hop {
	switch {
	case heldHere:
		return Hop{Kind: HopLocal}
	case !owned:
		return Hop{Kind: HopFail, Why: "no host holds its lease"}
	case owner == me:
		return Hop{Kind: HopLocal} // taken, and starting here
	case owner.Host == me.Host:
		return Hop{Kind: HopFail, Why: "its lease is a previous boot's of this host, until it expires"}
	}
	return Hop{Kind: HopForward, To: owner}
}

// Retry decides what to do with a request that from answered MOVED (the
// cluster is not there any more; the request did not run) after tries
// retries already: one retry under the owners as they are now, never back
// to the host that said it moved.
func Retry(me Holder, from Holder, tries int, heldHere bool, owner Holder, owned bool) Hop {
	if tries >= 1 {
		return Hop{Kind: HopFail, Why: "it moved twice while the request was on its way"}
	}
	h := FirstHop(me, heldHere, owner, owned)
	if h.Kind == HopForward && h.To == from {
		return Hop{Kind: HopFail, Why: "it is moving: its host says it is not there, and its lease still names that host"}
	}
	return h
}
