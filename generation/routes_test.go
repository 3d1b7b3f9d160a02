package generation

import (
	"sync"
	"sync/atomic"
	"testing"
)

func TestRoutes(t *testing.T) {
	topo := Topology{Total: 16, PerCluster: 4}
	empty := NewRoutes(topo)
	for c := -1; c <= topo.Clusters(); c++ {
		if p, ok := empty.Routed(c); ok {
			t.Fatalf("empty table routes cluster %d to %v", c, p)
		}
	}

	a := ProcRef{Cluster: 2, Generation: 5, Seq: 1}
	b := ProcRef{Cluster: 2, Generation: 6, Seq: 9}
	r1 := empty.With(a)
	r2 := r1.With(b)
	tests := []struct {
		name   string
		r      *Routes
		c      int
		want   ProcRef
		wantOK bool
	}{
		{"With routes the cluster", r1, 2, a, true},
		{"With leaves the original alone", empty, 2, ProcRef{}, false},
		{"With replaces", r2, 2, b, true},
		{"replacing leaves the original alone", r1, 2, a, true},
		{"other clusters unrouted", r2, 1, ProcRef{}, false},
		{"Without the routed process unroutes", r2.Without(b), 2, ProcRef{}, false},
		{"Without a stale process changes nothing", r2.Without(a), 2, b, true},
		{"Without keeps the original", r2, 2, b, true},
		{"out of range", r2, 4, ProcRef{}, false},
		{"negative", r2, -1, ProcRef{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tt.r.Routed(tt.c)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("Routed(%d) = %v, %v; want %v, %v", tt.c, got, ok, tt.want, tt.wantOK)
			}
			if tt.r.Topology != topo {
				t.Errorf("Topology = %v", tt.r.Topology)
			}
		})
	}
	c := ProcRef{Cluster: 0, Generation: 6, Seq: 10}
	all := r1.WithAll([]ProcRef{b, c})
	if p, _ := all.Routed(0); p != c {
		t.Errorf("WithAll: cluster 0 routed to %v", p)
	}
	if p, _ := all.Routed(2); p != b {
		t.Errorf("WithAll: cluster 2 routed to %v", p)
	}
	if p, _ := r1.Routed(2); p != a {
		t.Errorf("WithAll changed the original")
	}
	if r2.Without(a) != r2 {
		t.Error("Without of a process that is not routed copied the table")
	}
}

func TestRoutesWithPanicsOutOfRange(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("With of a cluster outside the topology did not panic")
		}
	}()
	NewRoutes(Topology{Total: 4, PerCluster: 2}).With(ProcRef{Cluster: 2})
}

func TestProcRefString(t *testing.T) {
	if got := (ProcRef{Cluster: 2, Generation: 6, Seq: 17}).String(); got != "2@6#17" {
		t.Errorf("String() = %q", got)
	}
}

// TestRoutesPublish is how the manager uses a table: one writer swapping
// copies through an atomic.Pointer, readers without a lock (run with -race).
func TestRoutesPublish(t *testing.T) {
	topo := Topology{Total: 8, PerCluster: 2}
	var cur atomic.Pointer[Routes]
	cur.Store(NewRoutes(topo))
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 1000 {
				r := cur.Load()
				for c := range r.Topology.Clusters() {
					if p, ok := r.Routed(c); ok && p.Cluster != c {
						t.Errorf("cluster %d routed to %v", c, p)
					}
				}
			}
		})
	}
	for i := range 1000 {
		p := ProcRef{Cluster: i % 4, Generation: 1, Seq: uint64(i)}
		cur.Store(cur.Load().With(p))
		if i%3 == 0 {
			cur.Store(cur.Load().Without(p))
		}
	}
	wg.Wait()
}
