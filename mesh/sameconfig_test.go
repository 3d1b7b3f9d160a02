package mesh

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckSameConfig(t *testing.T) {
	topo := Topology{TotalShards: 24, ShardsPerCluster: 2}
	cl := ClusterDigest([]string{"/bin/bot", "--x"}, map[string]string{"A": "1"}, "")
	me := HostRecord{Holder: Holder{Host: "a", Boot: "new"}, Topology: topo, Cluster: cl}
	same := HostRecord{Holder: Holder{Host: "b", Boot: "1"}, Topology: topo, Cluster: ClusterDigest([]string{"/bin/bot", "--x"}, map[string]string{"A": "1"}, "")}
	if err := CheckSameConfig(me, []HostRecord{same}); err != nil {
		t.Fatalf("same configuration refused: %v", err)
	}
	old := HostRecord{Holder: Holder{Host: "c", Boot: "1"}, Topology: topo} // no digest: an older version
	if err := CheckSameConfig(me, []HostRecord{old}); err != nil {
		t.Fatalf("a record without a digest, same topology: %v", err)
	}
	// A previous boot of this host id is this host's own, whatever it ran.
	prev := HostRecord{Holder: Holder{Host: "a", Boot: "old"}, Topology: Topology{TotalShards: 48, ShardsPerCluster: 4}}
	if err := CheckSameConfig(me, []HostRecord{prev}); err != nil {
		t.Fatalf("this host's previous boot refused it: %v", err)
	}
	for _, tc := range []struct {
		name  string
		other HostRecord
		want  []string
	}{
		{"shards per cluster", HostRecord{Holder: Holder{Host: "b"}, Topology: Topology{TotalShards: 24, ShardsPerCluster: 3}, Cluster: cl},
			[]string{"host b", "topology.shards_per_cluster 2 here, 3 there"}},
		{"total shards", HostRecord{Holder: Holder{Host: "b"}, Topology: Topology{TotalShards: 48, ShardsPerCluster: 2}, Cluster: cl},
			[]string{"topology.total_shards 24 here, 48 there"}},
		{"command", HostRecord{Holder: Holder{Host: "b"}, Topology: topo, Cluster: ClusterDigest([]string{"/bin/bot", "--y"}, map[string]string{"A": "1"}, "")},
			[]string{"cluster.command differs"}},
		{"env value", HostRecord{Holder: Holder{Host: "b"}, Topology: topo, Cluster: ClusterDigest([]string{"/bin/bot", "--x"}, map[string]string{"A": "2"}, "")},
			[]string{"cluster.env differs"}},
		{"dir only there", HostRecord{Holder: Holder{Host: "b"}, Topology: topo, Cluster: ClusterDigest([]string{"/bin/bot", "--x"}, map[string]string{"A": "1"}, "/srv")},
			[]string{"cluster.dir differs"}},
	} {
		err := CheckSameConfig(me, []HostRecord{same, tc.other})
		if !errors.Is(err, ErrConfigMismatch) {
			t.Fatalf("%s: %v, want ErrConfigMismatch", tc.name, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tc.name, err, w)
			}
		}
		if strings.Contains(err.Error(), "/bin/bot") || strings.Contains(err.Error(), "/srv") {
			t.Errorf("%s: the error shows a value: %v", tc.name, err)
		}
	}
}
