package bench

import (
	"math/bits"
	"time"
)

// histogram records durations in log-linear buckets: exact below 128ns, then
// 128 buckets per power of two, so any quantile is within 0.8% of the true
// value. Its size is fixed, so a long run costs no more memory than a short one.
type histogram struct {
	counts [histBuckets]uint64
	n      uint64
	max    time.Duration
}

const (
	histSubBits = 7
	histSub     = 1 << histSubBits
	histBuckets = (64 - histSubBits) * histSub
)

func histBucket(v int64) int {
	if v < histSub {
		return int(max(v, 0))
	}
	shift := bits.Len64(uint64(v)) - histSubBits - 1
	return shift*histSub + int(v>>shift)
}

// histValue is the middle of bucket i.
func histValue(i int) int64 {
	if i < 2*histSub {
		return int64(i)
	}
	shift := i>>histSubBits - 1
	top := int64(i - shift*histSub)
	return top<<shift + int64(1)<<shift/2
}

// Record adds one duration.
func (h *histogram) Record(d time.Duration) {
	h.counts[histBucket(int64(d))]++
	h.n++
	h.max = max(h.max, d)
}

// Count returns how many durations were recorded.
func (h *histogram) Count() uint64 { return h.n }

// Max returns the largest duration recorded.
func (h *histogram) Max() time.Duration { return h.max }

// Quantile returns the duration below which a fraction q of the recorded ones
// fall (0 when none were recorded).
func (h *histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.5)
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(time.Duration(histValue(i)), h.max)
		}
	}
	return h.max
}

// Merge adds o's durations to h.
func (h *histogram) Merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// latencyUS is h's median, 99th percentile and maximum in µs: the round trips
// every load's report shows.
func latencyUS(h *histogram) (p50, p99, maxUS float64) {
	return micros(h.Quantile(0.5)), micros(h.Quantile(0.99)), micros(h.Max())
}
