package mesh

import (
	"cmp"
	"slices"
)

// Capacity is one live host as placement sees it.
type Capacity struct {
	Host string
	// Max is how many clusters the host runs at most; 0 is no limit.
	Max int
}

// Place decides which host runs each of clusters clusters (ids 0 to
// clusters−1). owners holds the clusters that already have a lease, by
// holder: they stay where they are (moving a running cluster is a deploy's
// work, not placement's), and count against their holder's capacity even if
// the holder is not among hosts (its lease has not expired yet). Every other
// cluster goes, in id order, to the live host with the fewest clusters that
// still has room, the lowest host id among equals, so a host that joins takes
// its share of what was left unplaced, and every host computing Place from
// the same view gets the same answer. A cluster no host has room for is left
// out of the result.
func Place(clusters int, hosts []Capacity, owners map[int]string) map[int]string {
	hs := slices.Clone(hosts)
	slices.SortFunc(hs, func(a, b Capacity) int { return cmp.Compare(a.Host, b.Host) })
	hs = slices.CompactFunc(hs, func(a, b Capacity) bool { return a.Host == b.Host })

	out := make(map[int]string, clusters)
	load := make(map[string]int, len(hs))
	for c, h := range owners {
		if c >= 0 && c < clusters {
			out[c] = h
			load[h]++
		}
	}
	for c := range clusters {
		if _, ok := out[c]; ok {
			continue
		}
		best := -1
		for i, h := range hs {
			if h.Max > 0 && load[h.Host] >= h.Max {
				continue
			}
			if best < 0 || load[h.Host] < load[hs[best].Host] {
				best = i
			}
		}
		if best < 0 {
			break // every host is full; so are they for the clusters after this one
		}
		out[c] = hs[best].Host
		load[hs[best].Host]++
	}
	return out
}
