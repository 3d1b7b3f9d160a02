package mesh_test

import (
	"context"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/mesh"
)

// TestOwnersWatch: the watch of the leases sees leases held before it
// started, a take, a renewal under a renewing holder (the holder stays, never
// flickers away), a release, an expiry, and ignores clusters out of range.
func TestOwnersWatch(t *testing.T) {
	srv := startServer(t, "")
	_, st := open(t, meshConfig(srv.URL, "a"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, b := mesh.Holder{Host: "a", Boot: "a1"}, mesh.Holder{Host: "b", Boot: "b1"}
	if _, err := st.Take(ctx, 0, a, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Take(ctx, 9, a, 0); err != nil { // past the topology
		t.Fatal(err)
	}
	o := st.WatchOwners(ctx, 4, nil)
	select {
	case <-o.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the watch never read the bucket")
	}
	if h, ok := o.Owner(0); !ok || h != a {
		t.Fatalf("Owner(0) = %v %v, want %v", h, ok, a)
	}
	for _, c := range []int{-1, 1, 4, 9} {
		if h, ok := o.Owner(c); ok {
			t.Fatalf("Owner(%d) = %v", c, h)
		}
	}
	hb, err := st.Take(ctx, 2, b, 0)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the take of cluster 2 seen", func() bool { h, ok := o.Owner(2); return ok && h == b })
	if got := o.Hosts(); len(got) != 2 || got[0] != a || got[1] != b {
		t.Fatalf("Hosts = %v", got)
	}

	// Renewed every 200 ms for longer than a lease: the owner never flickers.
	end := time.Now().Add(lease + lease/2)
	next := time.Now()
	for time.Now().Before(end) {
		if time.Now().After(next) {
			if hb, err = st.Renew(ctx, 2, b, hb.Rev); err != nil {
				t.Fatal(err)
			}
			next = time.Now().Add(200 * time.Millisecond)
		}
		if h, ok := o.Owner(2); !ok || h != b {
			t.Fatalf("under renewal Owner(2) = %v %v", h, ok)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := st.Release(ctx, 2, hb.Rev); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the release of cluster 2 seen", func() bool { _, ok := o.Owner(2); return !ok })
	// Cluster 0 was never renewed: it expires.
	testenv.WaitFor(t, 3*lease, "the expiry of cluster 0 seen", func() bool { _, ok := o.Owner(0); return !ok })
}
