package bench

import (
	"math"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

func TestJudgeGrowth(t *testing.T) {
	steady := []float64{40, 52, 41, 40, 43, 40, 41, 60, 40, 41, 40, 42, 40, 41, 40, 44}
	leak := make([]float64, 40)
	for i := range leak {
		leak[i] = 40 + float64(i) // one goroutine per sample: 40 → 79
	}
	for _, tc := range []struct {
		name      string
		values    []float64
		rule      growthRule
		grew      bool
		undecided bool
	}{
		{"steady with spikes", steady, goroutineRule, false, false},
		{"steady leak", leak, goroutineRule, true, false},
		{"within the absolute allowance", []float64{10, 10, 10, 10, 10, 10, 19, 19}, growthRule{Abs: 10}, false, false},
		{"past the absolute allowance", []float64{10, 10, 10, 10, 10, 10, 21, 21}, growthRule{Abs: 10}, true, false},
		{"within the relative allowance", []float64{0, 0, 100, 100, 0, 0, 110, 110}, growthRule{Rel: 0.1}, false, false},
		{"past the relative allowance", []float64{0, 0, 100, 100, 0, 0, 111, 111}, growthRule{Rel: 0.1}, true, false},
		{"first quarter ignored", []float64{1, 1, 50, 50, 50, 50, 50, 50}, growthRule{}, false, false},
		{"shrinking", []float64{90, 90, 80, 80, 70, 70, 60, 60}, growthRule{}, false, false},
		{"too few samples", []float64{1, 100, 1000}, growthRule{}, false, true},
		{"none", nil, growthRule{}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := judgeGrowth("m", tc.values, tc.rule, 5)
			if v.Grew != tc.grew || v.Undecided != tc.undecided {
				t.Fatalf("%+v: grew %v undecided %v, want %v %v", v, v.Grew, v.Undecided, tc.grew, tc.undecided)
			}
			if v.String() == "" {
				t.Fatal("no text")
			}
		})
	}
	v := judgeGrowth("goroutines", leak, goroutineRule, 5)
	// One per 5 s sample is 12 a minute.
	if math.Abs(v.SlopePerMin-12) > 1e-9 || v.First != 40 || v.Max != 79 {
		t.Fatalf("leak verdict %+v", v)
	}
	// Quarters of 40 samples: Q2 is 10..19 (median 54.5), Q4 is 30..39 (74.5).
	if v.Q2Median != 54.5 || v.Q4Median != 74.5 || v.Limit != 54.5*1.1+10 {
		t.Fatalf("leak quarters %+v", v)
	}
}

func TestSlope(t *testing.T) {
	if s := slope([]float64{3, 5, 7, 9}); math.Abs(s-2) > 1e-12 {
		t.Fatalf("slope %v", s)
	}
	if s := slope([]float64{4}); s != 0 {
		t.Fatalf("slope of one %v", s)
	}
}

func TestParseMetrics(t *testing.T) {
	text := []byte(`# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 57
go_gc_duration_seconds{quantile="0.5"} 3.1e-05
process_open_fds 42 1700000000000
go_memstats_heap_inuse_bytes 4.530176e+06
`)
	m, err := parseMetrics(text, "go_goroutines", "process_open_fds", "go_memstats_heap_inuse_bytes")
	if err != nil {
		t.Fatal(err)
	}
	if m["go_goroutines"] != 57 || m["process_open_fds"] != 42 || m["go_memstats_heap_inuse_bytes"] != 4530176 {
		t.Fatalf("parsed %v", m)
	}
	if _, err := parseMetrics(text, "process_max_fds"); err == nil {
		t.Fatal("a missing metric is no error")
	}
	if _, err := parseMetrics([]byte("go_goroutines lots\n"), "go_goroutines"); err == nil {
		t.Fatal("a bad value is no error")
	}
}

func TestNextSend(t *testing.T) {
	t0 := time.Unix(1000, 0)
	iv := 10 * time.Millisecond
	if got := nextSend(t0, iv, t0); !got.Equal(t0.Add(iv)) {
		t.Fatalf("on time: %v", got.Sub(t0))
	}
	// A little late: keep the schedule (the next comes sooner).
	if got := nextSend(t0, iv, t0.Add(15*time.Millisecond)); !got.Equal(t0.Add(iv)) {
		t.Fatalf("a little late: %v", got.Sub(t0))
	}
	// Far behind: no burst, start again from now.
	now := t0.Add(time.Second)
	if got := nextSend(t0, iv, now); !got.Equal(now) {
		t.Fatalf("far behind: %v", got.Sub(t0))
	}
}

func TestBooksSub(t *testing.T) {
	a := books{Sent: 10, OK: 8, Errors: map[string]uint64{"unavailable": 2}}
	b := books{Sent: 25, OK: 20, Errors: map[string]uint64{"unavailable": 4, "timeout": 1}, Duplicates: 1}
	d := b.sub(a)
	if d.Sent != 15 || d.OK != 12 || d.Errors["unavailable"] != 2 || d.Errors["timeout"] != 1 || d.Duplicates != 1 {
		t.Fatalf("sub %+v", d)
	}
	if z := a.sub(a); len(z.Errors) != 0 || z.Sent != 0 {
		t.Fatalf("a - a = %+v", z)
	}
}

func TestUnexplained(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	windows := []killWindow{{cluster: "3", from: at(100), till: at(600)}}
	fails := []loadFailure{
		{sent: at(90), at: at(101), target: "3", code: ipc.CodeUnavailable},  // in flight at the kill
		{sent: at(550), at: at(560), target: "3", code: ipc.CodeUnavailable}, // sent inside the window
		{sent: at(90), at: at(99), target: "3", code: ipc.CodeUnavailable},   // failed before the kill
		{sent: at(601), at: at(620), target: "3", code: ipc.CodeUnavailable}, // sent after it was routed again
		{sent: at(200), at: at(210), target: "4", code: ipc.CodeUnavailable}, // another cluster
		{sent: at(200), at: at(210), target: "3", code: ipc.CodeBusy},        // another code
	}
	if n := unexplained(fails, windows); n != 4 {
		t.Fatalf("unexplained %d, want 4", n)
	}
}

func TestClusterTarget(t *testing.T) {
	f := clusterTarget(16, 16)
	for n := range uint64(3) {
		if f(5, n) != "5" {
			t.Fatalf("16 workers on 16 clusters: worker 5 request %d → %s", n, f(5, n))
		}
	}
	g := clusterTarget(512, 8)
	seen := map[string]bool{}
	for w := range 8 {
		for n := range uint64(64) {
			seen[g(w, n)] = true
		}
	}
	if len(seen) != 512 {
		t.Fatalf("8 workers × 64 requests reached %d of 512 clusters", len(seen))
	}
}
