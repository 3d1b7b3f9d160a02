package mesh_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/internal/natstest"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/mesh"
)

const lease = 2 * time.Second // the shortest allowed, to keep expiry tests short

func meshConfig(url, host string) config.Mesh {
	m := config.Default().Mesh
	m.NATSURL, m.HostID, m.Lease = url, host, config.Duration{Duration: lease}
	return m
}

func startServer(t *testing.T, auth string) *natstest.Server {
	return natstest.Start(t, natstest.Options{Bin: testenv.Bin("nats-server"), Auth: auth})
}

// open connects host to srv's mesh and opens its store.
func open(t *testing.T, cfg config.Mesh) (*nats.Conn, *mesh.Store) {
	t.Helper()
	nc, err := mesh.Connect(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	st, err := mesh.Open(context.Background(), nc, cfg.Name, cfg.Lease.Duration)
	if err != nil {
		t.Fatal(err)
	}
	return nc, st
}

func secretFile(t *testing.T, s string, mode os.FileMode) string {
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(s+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConnectCredentials: the right token or password joins; a wrong one is
// refused with an error naming the key at fault and never the secret, and
// leaves nothing behind in the server.
func TestConnectCredentials(t *testing.T) {
	srv := startServer(t, `authorization { users: [ {user: "sm", password: "right-pass"} ] }`)
	cfg := meshConfig(srv.URL, "a")
	cfg.User, cfg.PasswordFile = "sm", secretFile(t, "wrong-pass", 0o600)
	_, err := mesh.Connect(cfg)
	if !errors.Is(err, mesh.ErrRefused) || !strings.Contains(err.Error(), "mesh.user sm") || strings.Contains(err.Error(), "pass") {
		t.Fatalf("wrong password: err = %v, want ErrRefused naming mesh.user and no password", err)
	}
	cfg.PasswordFile = secretFile(t, "right-pass", 0o644)
	if _, err := mesh.Connect(cfg); err == nil || !strings.Contains(err.Error(), "mesh.password_file") || !strings.Contains(err.Error(), "0644") {
		t.Fatalf("password file readable by others: err = %v", err)
	}
	cfg.PasswordFile = secretFile(t, "right-pass", 0o600)
	nc, err := mesh.Connect(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// The refused attempts made nothing: no buckets until a host opens them.
	js, _ := nc.JetStream()
	for name := range js.KeyValueStoreNames() {
		t.Fatalf("bucket %s exists before any host opened the store", name)
	}

	tok := startServer(t, `authorization { token: "right-token" }`)
	cfg = meshConfig(tok.URL, "a")
	cfg.TokenFile = secretFile(t, "wrong-token", 0o600)
	if _, err := mesh.Connect(cfg); !errors.Is(err, mesh.ErrRefused) || !strings.Contains(err.Error(), "mesh.token_file") || strings.Contains(err.Error(), "token\"") {
		t.Fatalf("wrong token: err = %v, want ErrRefused naming mesh.token_file", err)
	}
	cfg.TokenFile = secretFile(t, "right-token", 0o400)
	nc2, err := mesh.Connect(cfg)
	if err != nil {
		t.Fatal(err)
	}
	nc2.Close()
	cfg.TokenFile = ""
	if _, err := mesh.Connect(cfg); !errors.Is(err, mesh.ErrRefused) || !strings.Contains(err.Error(), "no credentials") {
		t.Fatalf("no token: err = %v, want ErrRefused saying no credentials were given", err)
	}

	srv.Stop()
	if _, err := mesh.Connect(meshConfig(srv.URL, "a")); err == nil || errors.Is(err, mesh.ErrRefused) || !strings.Contains(err.Error(), srv.URL) {
		t.Fatalf("no server: err = %v, want a connection error naming the URL", err)
	}
}

// TestOpenChecksLease: every host of a mesh must count the same lease.
func TestOpenChecksLease(t *testing.T) {
	srv := startServer(t, "")
	open(t, meshConfig(srv.URL, "a"))
	cfg := meshConfig(srv.URL, "b")
	cfg.Lease.Duration = 3 * time.Second
	nc, err := mesh.Connect(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := mesh.Open(context.Background(), nc, cfg.Name, cfg.Lease.Duration); !errors.Is(err, mesh.ErrLeaseMismatch) ||
		!strings.Contains(err.Error(), "2s") || !strings.Contains(err.Error(), "3s") {
		t.Fatalf("Open with another lease: err = %v, want ErrLeaseMismatch naming both", err)
	}
	// Another mesh name is another set of buckets, with its own lease.
	if _, err := mesh.Open(context.Background(), nc, "other", cfg.Lease.Duration); err != nil {
		t.Fatal(err)
	}
}

// TestLeaseCompareAndSet: only the revision decides who holds a lease.
func TestLeaseCompareAndSet(t *testing.T) {
	srv := startServer(t, "")
	_, st := open(t, meshConfig(srv.URL, "a"))
	ctx := context.Background()
	a, b := mesh.Holder{Host: "a", Boot: "a1"}, mesh.Holder{Host: "b", Boot: "b1"}

	ha, err := st.Take(ctx, 3, a, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Take(ctx, 3, b, 0); !errors.Is(err, mesh.ErrConflict) {
		t.Fatalf("second take: err = %v, want ErrConflict", err)
	}
	ha2, err := st.Renew(ctx, 3, a, ha.Rev)
	if err != nil || ha2.Rev <= ha.Rev || ha2.Sent.Before(ha.Sent) {
		t.Fatalf("renew = %+v, %v after %+v", ha2, err, ha)
	}
	if _, err := st.Renew(ctx, 3, b, ha.Rev); !errors.Is(err, mesh.ErrConflict) {
		t.Fatalf("renew at a stale revision: err = %v, want ErrConflict", err)
	}
	if err := st.Release(ctx, 3, ha.Rev); !errors.Is(err, mesh.ErrConflict) {
		t.Fatalf("release at a stale revision: err = %v, want ErrConflict", err)
	}
	ls, err := st.Leases(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	if l := ls[3]; l.Holder != a || l.Rev != ha2.Rev || l.Gone || len(ls) != 1 {
		t.Fatalf("leases = %+v, want cluster 3 held by a at %d", ls, ha2.Rev)
	}
	if err := st.Release(ctx, 3, ha2.Rev); err != nil {
		t.Fatal(err)
	}
	if ls, _ := st.Leases(ctx, 4); !ls[3].Gone {
		t.Fatalf("after release: %+v, want cluster 3 gone", ls)
	}
	// A direct read of a key shows the marker too, at its revision, and no
	// entry for a key never written.
	if l, found, err := mesh.LeaseDirect(ctx, st, 3); err != nil || !found || !l.Gone || l.Rev <= ha2.Rev {
		t.Fatalf("direct read after release: %+v %v %v, want gone after revision %d", l, found, err, ha2.Rev)
	}
	if _, found, err := mesh.LeaseDirect(ctx, st, 0); err != nil || found {
		t.Fatalf("direct read of a lease never taken: found %v, %v", found, err)
	}
	if _, err := st.Renew(ctx, 3, a, ha2.Rev); !errors.Is(err, mesh.ErrConflict) {
		t.Fatalf("renew after release: err = %v, want ErrConflict", err)
	}
	hb, err := st.Take(ctx, 3, b, 0)
	if err != nil {
		t.Fatalf("take after release: %v", err)
	}
	// Many takers at once: exactly one wins.
	wins := make(chan int, 8)
	for i := range 8 {
		go func() {
			if _, err := st.Take(ctx, 9, mesh.Holder{Host: "h", Boot: string(rune('a' + i))}, 0); err == nil {
				wins <- i
			} else if !errors.Is(err, mesh.ErrConflict) {
				t.Error(err)
			}
			wins <- -1
		}()
	}
	won := 0
	for range 8 {
		if <-wins >= 0 {
			won++
			<-wins
		}
	}
	if won != 1 || hb.Rev == 0 {
		t.Fatalf("%d of 8 concurrent takes won, want 1", won)
	}
}

// TestLeaseExpiry: a lease nobody renews ends on the server's clock, never
// sooner than a lease after its holder sent the write, and then another host
// takes it; its holder's fence came a margin before.
func TestLeaseExpiry(t *testing.T) {
	srv := startServer(t, "")
	_, st := open(t, meshConfig(srv.URL, "a"))
	ctx := context.Background()
	h, err := st.Take(ctx, 0, mesh.Holder{Host: "a", Boot: "a1"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	fence := st.Timing.FenceAt(h.Sent)
	other := mesh.Holder{Host: "b", Boot: "b1"}
	var took time.Time
	for took.IsZero() {
		if _, err := st.Take(ctx, 0, other, 0); err == nil {
			took = time.Now()
		} else if !errors.Is(err, mesh.ErrConflict) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		if time.Since(h.Sent) > 10*lease {
			t.Fatal("the lease never expired")
		}
	}
	if took.Sub(h.Sent) < lease {
		t.Fatalf("taken over %v after the holder's write; the lease is %v", took.Sub(h.Sent), lease)
	}
	if !fence.Before(took) {
		t.Fatalf("the holder's fence (%v after its write) is not before the takeover (%v)", fence.Sub(h.Sent), took.Sub(h.Sent))
	}
	t.Logf("lease %v: fence at %v, taken over at %v after the write", lease, fence.Sub(h.Sent), took.Sub(h.Sent))
}

// TestHostRecords: one live boot per host id, records expire a lease after
// their last renewal, and a restarted host joins once its old record is gone.
func TestHostRecords(t *testing.T) {
	srv := startServer(t, "")
	_, st := open(t, meshConfig(srv.URL, "a"))
	ctx := context.Background()
	rec := mesh.HostRecord{Holder: mesh.Holder{Host: "a", Boot: mesh.NewBootID()}, Capacity: 3,
		Topology: mesh.Topology{TotalShards: 8, ShardsPerCluster: 2}, Started: time.Now()}
	rev, err := st.Announce(ctx, rec, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Announce(ctx, mesh.HostRecord{Holder: mesh.Holder{Host: "b", Boot: "b1"}}, 0); err != nil {
		t.Fatal(err)
	}
	rec.Clusters = []int{0, 2}
	if rev, err = st.Announce(ctx, rec, rev); err != nil {
		t.Fatal(err)
	}
	hs, err := st.Hosts(ctx)
	if err != nil || len(hs) != 2 || hs[0].Host != "a" || hs[1].Host != "b" || len(hs[0].Clusters) != 2 || hs[0].Capacity != 3 ||
		hs[0].Topology.Clusters() != 4 {
		t.Fatalf("Hosts = %+v, %v", hs, err)
	}
	again := rec
	again.Boot = mesh.NewBootID()
	if _, err := st.Announce(ctx, again, 0); !errors.Is(err, mesh.ErrHostIDInUse) {
		t.Fatalf("a second boot of host a: err = %v, want ErrHostIDInUse", err)
	}
	start := time.Now()
	for {
		if _, err = st.Announce(ctx, again, 0); err == nil {
			break
		}
		if time.Since(start) > 10*lease {
			t.Fatalf("the old boot's record never expired: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := st.Announce(ctx, rec, rev); err == nil {
		t.Fatal("the old boot renewed the record its successor holds")
	}
	if hs, _ := st.Hosts(ctx); len(hs) != 1 || hs[0].Boot != again.Boot {
		t.Fatalf("Hosts = %+v, want only a's new boot (b expired)", hs)
	}
}

// TestLeasesSurviveServerRestart: the buckets are on disk, so a restarted
// server still knows who holds what and the revisions still decide.
func TestLeasesSurviveServerRestart(t *testing.T) {
	srv := startServer(t, "")
	_, st := open(t, meshConfig(srv.URL, "a"))
	ctx := context.Background()
	a := mesh.Holder{Host: "a", Boot: "a1"}
	h, err := st.Take(ctx, 1, a, 0)
	if err != nil {
		t.Fatal(err)
	}
	srv.Restart()
	testenv.WaitFor(t, 10*time.Second, "renewal after the server's restart", func() bool {
		h2, err := st.Renew(ctx, 1, a, h.Rev)
		if err == nil {
			h = h2
			return true
		}
		if errors.Is(err, mesh.ErrConflict) {
			t.Fatalf("the lease was lost in the restart: %v", err)
		}
		return false
	})
	if _, err := st.Take(ctx, 1, mesh.Holder{Host: "b", Boot: "b1"}, 0); !errors.Is(err, mesh.ErrConflict) {
		t.Fatalf("take of a held lease after the restart: err = %v", err)
	}
}
