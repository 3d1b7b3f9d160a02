package mesh_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/sm-supervisor/sm/mesh"
)

// TestTakeOver: a successor boot takes over exactly the leases the bucket
// shows its previous boot holding, and that boot's host record, each at its
// revision; a lease another host holds stays that host's, and a boot that is
// not this host's previous one is refused.
func TestTakeOver(t *testing.T) {
	srv := startServer(t, "")
	_, st := open(t, meshConfig(srv.URL, "a"))
	ctx := context.Background()
	prev := mesh.Holder{Host: "a", Boot: "old"}
	other := mesh.Holder{Host: "b", Boot: "b1"}
	for _, c := range []int{0, 1, 3} {
		if _, err := st.Take(ctx, c, prev, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Take(ctx, 2, other, 0); err != nil {
		t.Fatal(err)
	}
	// Cluster 3's lease ends (released) and b takes it: not prev's any more.
	ls, _ := st.Leases(ctx, 4)
	if err := st.Release(ctx, 3, ls[3].Rev); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Take(ctx, 3, other, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Announce(ctx, mesh.HostRecord{Holder: prev}, 0); err != nil {
		t.Fatal(err)
	}

	me := mesh.Holder{Host: "a", Boot: "new"}
	a := &mesh.Agent{Store: st, Me: me, Topology: mesh.Topology{TotalShards: 8, ShardsPerCluster: 2}}
	if _, err := a.TakeOver(ctx, mesh.Holder{Host: "b", Boot: "b1"}); err == nil {
		t.Fatal("took over another host's boot")
	}
	held, err := a.TakeOver(ctx, prev)
	if err != nil || !slices.Equal(held, []int{0, 1}) {
		t.Fatalf("TakeOver = %v, %v; want [0 1]", held, err)
	}
	ls, _ = st.Leases(ctx, 4)
	for c, want := range map[int]mesh.Holder{0: me, 1: me, 2: other, 3: other} {
		if ls[c].Holder != want || ls[c].Gone {
			t.Errorf("lease %d: %+v, want %v", c, ls[c], want)
		}
	}
	hosts, err := st.Hosts(ctx)
	if err != nil || len(hosts) != 1 || hosts[0].Holder != me || !slices.Equal(hosts[0].Clusters, []int{0, 1}) {
		t.Fatalf("host records after the takeover: %+v %v", hosts, err)
	}
	// The previous boot, were it alive, could renew nothing now.
	if _, err := st.Renew(ctx, 0, prev, ls[0].Rev-1); !errors.Is(err, mesh.ErrConflict) {
		t.Fatalf("the previous boot's renewal after the takeover: %v", err)
	}
}
