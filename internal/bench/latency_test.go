package bench

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestHistogramBuckets(t *testing.T) {
	prev := -1
	for _, v := range []int64{0, 1, 127, 128, 255, 256, 257, 1000, 1 << 20, 1<<40 + 12345, math.MaxInt64} {
		i := histBucket(v)
		if i < prev || i >= histBuckets {
			t.Fatalf("bucket(%d) = %d after %d", v, i, prev)
		}
		prev = i
		if mid := histValue(i); math.Abs(float64(mid-v)) > float64(v)/histSub+1 {
			t.Errorf("bucket(%d) = %d, whose middle %d is too far", v, i, mid)
		}
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var h histogram
	if h.Quantile(0.5) != 0 {
		t.Fatal("empty histogram has a median")
	}
	r := rand.New(rand.NewPCG(1, 2))
	var all []time.Duration
	for range 100000 {
		d := time.Duration(r.ExpFloat64() * float64(200*time.Microsecond))
		all = append(all, d)
		h.Record(d)
	}
	slices.Sort(all)
	for _, q := range []float64{0.01, 0.5, 0.99, 0.999} {
		want := all[int(q*float64(len(all)))-1]
		got := h.Quantile(q)
		if math.Abs(float64(got-want)) > 0.01*float64(want)+1 {
			t.Errorf("q%v = %v, want %v ±1%%", q, got, want)
		}
	}
	if h.Quantile(1) != all[len(all)-1] || h.Max() != all[len(all)-1] || h.Count() != 100000 {
		t.Errorf("max %v / q1 %v, want %v", h.Max(), h.Quantile(1), all[len(all)-1])
	}
}

func TestBooks(t *testing.T) {
	b := books{Sent: 10, OK: 7, Errors: map[string]uint64{"timeout": 2}, Lost: 1}
	if why := b.Broken(); why != "1 lost, 2 timeout" {
		t.Errorf("Broken = %q", why)
	}
	b.Add(books{Sent: 1, OK: 2, Duplicates: 1})
	if why := b.Broken(); why != "1 lost, 1 duplicate replies, 2 timeout, books do not balance: sent 11 != ok 9 + errors 2 + lost 1" {
		t.Errorf("Broken = %q", why)
	}
	if why := (&books{Sent: 3, OK: 3}).Broken(); why != "" {
		t.Errorf("clean books broken: %q", why)
	}
}
