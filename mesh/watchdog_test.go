package mesh

import (
	"slices"
	"testing"
	"time"
)

// TestStopBy: a Stop must be confirmed an Op after the fence, or after it
// began if that was sooner (a lease lost early), which leaves an eighth of
// the lease before anyone else can take the cluster.
func TestStopBy(t *testing.T) {
	tm := TimingFor(10 * time.Second)
	t0 := time.Unix(1000, 0)
	fence := tm.FenceAt(t0) // 7.5 s
	for _, tt := range []struct {
		name  string
		began time.Time
		want  time.Duration // after t0
	}{
		{"begun at the fence", fence, 8750 * time.Millisecond},
		{"begun late (the agent was slow to fence)", fence.Add(time.Second), 8750 * time.Millisecond},
		{"begun early: the lease was lost at 1 s", t0.Add(time.Second), 2250 * time.Millisecond},
	} {
		if got := tm.StopBy(t0, tt.began).Sub(t0); got != tt.want {
			t.Errorf("%s: StopBy = %v after the send, want %v", tt.name, got, tt.want)
		}
	}
	if left := tm.Lease - tm.StopBy(t0, fence).Sub(t0); left != tm.Lease/8 {
		t.Fatalf("a kill at StopBy leaves %v before the lease expires, want an eighth of it", left)
	}
}

// TestOverdue: the watchdog's decision, on an injected clock.
func TestOverdue(t *testing.T) {
	tm := TimingFor(2 * time.Second) // fence 1.5 s, Op 250 ms
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	for _, tt := range []struct {
		name     string
		now      time.Time
		held     map[int]Held
		stopping map[int]time.Time
		want     []int
	}{
		{"nothing held", ms(5000), nil, nil, nil},
		{"renewed in time", ms(1000), map[int]Held{0: {Sent: ms(0)}}, nil, nil},
		{"past the fence, within Op: the agent is fencing", ms(1600), map[int]Held{0: {Sent: ms(0)}}, nil, nil},
		{"past the fence by Op: the agent is stuck", ms(1750), map[int]Held{0: {Sent: ms(0)}}, nil, []int{0}},
		{"a Stop within its bound", ms(1700), nil, map[int]time.Time{3: ms(1750)}, nil},
		{"a Stop not confirmed by its bound", ms(1750), nil, map[int]time.Time{3: ms(1750)}, []int{3}},
		{"a held lease being stopped counts by its Stop", ms(1800),
			map[int]Held{3: {Sent: ms(0)}}, map[int]time.Time{3: ms(1900)}, nil},
		{"several, in cluster order", ms(3000),
			map[int]Held{5: {Sent: ms(0)}, 1: {Sent: ms(2000)}, 2: {Sent: ms(500)}},
			map[int]time.Time{4: ms(2999), 0: ms(3001)}, []int{2, 4, 5}},
	} {
		got := Overdue(tm, tt.now, tt.held, tt.stopping)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: Overdue = %v, want %v", tt.name, got, tt.want)
		}
		// The watchdog wakes no later than the next deadline: nothing falls
		// due between now and its wake.
		next := nextOverdue(tm, tt.now, tt.held, tt.stopping, time.Hour)
		if before := Overdue(tm, next.Add(-time.Nanosecond), tt.held, tt.stopping); len(before) > len(got) {
			t.Errorf("%s: a cluster fell due at %v, before the watchdog's wake at %v", tt.name, before, next.Sub(t0))
		}
	}
}
