package mesh

import (
	"reflect"
	"testing"
	"time"
)

func TestTimingFor(t *testing.T) {
	tm := TimingFor(10 * time.Second)
	want := Timing{Lease: 10 * time.Second, Renew: 2500 * time.Millisecond, Margin: 2500 * time.Millisecond, Op: 1250 * time.Millisecond}
	if tm != want {
		t.Fatalf("TimingFor(10s) = %+v, want %+v", tm, want)
	}
	t0 := time.Unix(1000, 0)
	if got := tm.FenceAt(t0); got != t0.Add(7500*time.Millisecond) {
		t.Fatalf("FenceAt = %v, want 7.5s after the send", got.Sub(t0))
	}
	// Two renewals fit between a good write and its fence, each ended
	// (Op) before the next is due, and the fence leaves the margin.
	if tm.FenceAt(t0).Sub(t0) < 2*tm.Renew+tm.Op || tm.Op >= tm.Renew || tm.Lease-tm.FenceAt(t0).Sub(t0) != tm.Margin {
		t.Fatalf("timing %+v leaves no room for two renewals before the fence", tm)
	}
	if tm.RenewDue(t0, t0.Add(2*time.Second)) || !tm.RenewDue(t0, t0.Add(2300*time.Millisecond)) {
		t.Fatal("RenewDue: due 2.25s after the send, not before")
	}
}

func TestDecide(t *testing.T) {
	tm := TimingFor(10 * time.Second)
	me := Holder{Host: "a", Boot: "a1"}
	old := Holder{Host: "a", Boot: "a0"}
	other := Holder{Host: "b", Boot: "b1"}
	t0 := time.Unix(1000, 0)
	hosts := []Capacity{{Host: "a"}, {Host: "b"}}
	tests := []struct {
		name   string
		now    time.Time
		view   View
		held   map[int]Held
		expect []Action
	}{
		{"takes its share of unleased clusters", t0,
			View{Clusters: 4, Hosts: hosts},
			nil, []Action{{Kind: Take, Cluster: 0}, {Kind: Take, Cluster: 2}}},
		{"takes nothing before it is listed", t0,
			View{Clusters: 2, Hosts: []Capacity{{Host: "b"}}},
			nil, nil},
		{"takes an expired lease placement gives it", t0,
			View{Clusters: 2, Hosts: hosts, Leases: map[int]Lease{0: {Rev: 9, Gone: true}, 1: {Holder: other, Rev: 4}}},
			nil, []Action{{Kind: Take, Cluster: 0}}},
		{"waits out its old boot's lease", t0,
			View{Clusters: 1, Hosts: hosts, Leases: map[int]Lease{0: {Holder: old, Rev: 3}}},
			nil, nil},
		{"takes back a lease it fenced that has not expired", t0,
			View{Clusters: 1, Hosts: hosts, Leases: map[int]Lease{0: {Holder: me, Rev: 3}}},
			nil, []Action{{Kind: Take, Cluster: 0, Rev: 3}}},
		{"renews when due, not before", t0.Add(3 * time.Second),
			View{Clusters: 2, Hosts: hosts, Leases: map[int]Lease{0: {Holder: me, Rev: 5}, 1: {Holder: me, Rev: 6}}},
			map[int]Held{0: {Rev: 5, Sent: t0}, 1: {Rev: 6, Sent: t0.Add(2 * time.Second)}},
			[]Action{{Kind: Renew, Cluster: 0, Rev: 5}}},
		{"a view behind its own write changes nothing", t0.Add(3 * time.Second),
			View{Clusters: 1, Hosts: hosts, Leases: map[int]Lease{0: {Holder: other, Rev: 2}}},
			map[int]Held{0: {Rev: 5, Sent: t0}},
			[]Action{{Kind: Renew, Cluster: 0, Rev: 5}}},
		{"fences on its own clock, view or not", t0.Add(7500 * time.Millisecond),
			View{Clusters: 1, Hosts: hosts, Leases: map[int]Lease{0: {Holder: me, Rev: 5}}},
			map[int]Held{0: {Rev: 5, Sent: t0}},
			[]Action{{Kind: Fence, Cluster: 0}}},
		{"fences a lease taken since", t0.Add(time.Second),
			View{Clusters: 1, Hosts: hosts, Leases: map[int]Lease{0: {Holder: other, Rev: 8}}},
			map[int]Held{0: {Rev: 5, Sent: t0}},
			[]Action{{Kind: Fence, Cluster: 0}}},
		{"fences a lease that ended since", t0.Add(time.Second),
			View{Clusters: 1, Hosts: hosts, Leases: map[int]Lease{0: {Rev: 8, Gone: true}}},
			map[int]Held{0: {Rev: 5, Sent: t0}},
			[]Action{{Kind: Fence, Cluster: 0}}},
		{"renews on top of its own write whose answer was lost", t0.Add(time.Second),
			View{Clusters: 1, Hosts: hosts, Leases: map[int]Lease{0: {Holder: me, Rev: 8}}},
			map[int]Held{0: {Rev: 5, Sent: t0}},
			[]Action{{Kind: Renew, Cluster: 0, Rev: 8}}},
		{"held leases count against capacity", t0,
			View{Clusters: 3, Hosts: []Capacity{{Host: "a", Max: 1}}},
			map[int]Held{2: {Rev: 1, Sent: t0}},
			nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Decide(me, tm, tt.now, tt.view, tt.held); !reflect.DeepEqual(got, tt.expect) {
				t.Fatalf("Decide = %v, want %v", got, tt.expect)
			}
		})
	}
}
