package mesh

import (
	"fmt"
	"maps"
	"reflect"
	"testing"

	"pgregory.net/rapid"
)

func TestPlace(t *testing.T) {
	hosts := func(spec ...any) []Capacity { // "a", 2, "b", 0, ...
		var out []Capacity
		for i := 0; i < len(spec); i += 2 {
			out = append(out, Capacity{Host: spec[i].(string), Max: spec[i+1].(int)})
		}
		return out
	}
	tests := []struct {
		name     string
		clusters int
		hosts    []Capacity
		owners   map[int]string
		want     map[int]string
	}{
		{"no hosts", 3, nil, nil, map[int]string{}},
		{"one host takes all", 3, hosts("a", 0), nil, map[int]string{0: "a", 1: "a", 2: "a"}},
		{"spread evenly, ties to the lowest id", 5, hosts("b", 0, "a", 0), nil,
			map[int]string{0: "a", 1: "b", 2: "a", 3: "b", 4: "a"}},
		{"within capacity", 5, hosts("a", 1, "b", 0), nil,
			map[int]string{0: "a", 1: "b", 2: "b", 3: "b", 4: "b"}},
		{"too little capacity leaves clusters out", 5, hosts("a", 1, "b", 2), nil,
			map[int]string{0: "a", 1: "b", 2: "b"}},
		{"owners stay, even on a host not listed", 4, hosts("a", 0), map[int]string{1: "gone"},
			map[int]string{0: "a", 1: "gone", 2: "a", 3: "a"}},
		{"a joining host takes its share of the unplaced", 6, hosts("a", 0, "b", 0, "c", 0),
			map[int]string{0: "a", 1: "a", 2: "b", 3: "b"},
			map[int]string{0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}},
		{"a joining host moves nothing", 4, hosts("a", 0, "b", 0, "c", 0),
			map[int]string{0: "a", 1: "a", 2: "b", 3: "b"},
			map[int]string{0: "a", 1: "a", 2: "b", 3: "b"}},
		{"owners count against capacity", 4, hosts("a", 2, "b", 2), map[int]string{0: "a", 1: "a"},
			map[int]string{0: "a", 1: "a", 2: "b", 3: "b"}},
		{"owners past the topology are ignored", 2, hosts("a", 1), map[int]string{7: "a"},
			map[int]string{0: "a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Place(tt.clusters, tt.hosts, tt.owners); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Place(%d, %v, %v) = %v, want %v", tt.clusters, tt.hosts, tt.owners, got, tt.want)
			}
		})
	}
}

// TestPlaceRandomized checks Place's promises on random views: owners kept,
// capacity respected, nothing left out while a host has room, new clusters
// spread evenly, and the same answer whatever the order of the hosts.
func TestPlaceRandomized(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		clusters := rapid.IntRange(0, 40).Draw(t, "clusters")
		n := rapid.IntRange(0, 6).Draw(t, "hosts")
		var hosts []Capacity
		caps := map[string]int{}
		for i := range n {
			h := Capacity{Host: fmt.Sprintf("h%d", i), Max: rapid.IntRange(0, 8).Draw(t, "max")}
			hosts = append(hosts, h)
			caps[h.Host] = h.Max
		}
		owners := map[int]string{}
		load := map[string]int{}
		for c := range clusters {
			// Owners, within capacity as leases are, some on hosts not listed.
			if rapid.IntRange(0, 2).Draw(t, "owned") > 0 {
				continue
			}
			h := fmt.Sprintf("h%d", rapid.IntRange(0, n).Draw(t, "owner"))
			if m, listed := caps[h]; listed && m > 0 && load[h] >= m {
				continue
			}
			owners[c] = h
			load[h]++
		}

		got := Place(clusters, hosts, maps.Clone(owners))
		for c, h := range owners {
			if got[c] != h {
				t.Fatalf("owned cluster %d moved from %s to %s", c, h, got[c])
			}
		}
		count := map[string]int{}
		fresh := map[string]int{}
		for c, h := range got {
			if c < 0 || c >= clusters {
				t.Fatalf("placed cluster %d of %d", c, clusters)
			}
			count[h]++
			if _, owned := owners[c]; !owned {
				if _, listed := caps[h]; !listed {
					t.Fatalf("cluster %d placed on %s, which is not a live host", c, h)
				}
				fresh[h]++
			}
		}
		room := func(h string) bool { return caps[h] == 0 || count[h] < caps[h] }
		for h, m := range caps {
			if m > 0 && count[h] > m {
				t.Fatalf("%s holds %d clusters, capacity %d", h, count[h], m)
			}
			if room(h) && len(got) < clusters {
				t.Fatalf("%d clusters left out while %s has room (%d of %d)", clusters-len(got), h, count[h], m)
			}
		}
		// Evenness: a host given a new cluster ends at most one above any
		// host that still has room.
		for h := range fresh {
			for o := range caps {
				if room(o) && count[h] > count[o]+1 {
					t.Fatalf("%s got new clusters up to %d while %s, with room, has %d: %v", h, count[h], o, count[o], got)
				}
			}
		}
		perm := rapid.Permutation(hosts).Draw(t, "order")
		if again := Place(clusters, perm, owners); !reflect.DeepEqual(again, got) {
			t.Fatalf("Place depends on the hosts' order: %v, then %v", got, again)
		}
	})
}
