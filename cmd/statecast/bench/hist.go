package bench

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// latencyHist is a log-bucketed histogram of durations in nanoseconds,
// recorded in O(1) without allocation: values below 256 ns have a bucket
// each, larger ones fall in one of 128 buckets per power of two, so a
// bucket is at most 1/128 (0.8 %) of its values wide. Values from
// 2^37 ns (137 s) up are counted in the last bucket. The zero value is
// ready; its buckets are allocated on the first Record.
type latencyHist struct {
	counts   []uint64
	n        uint64
	sum      uint64 // nanoseconds
	min, max uint64
}

const (
	histSubBits  = 7                                             // 128 buckets per power of two
	histMaxShift = 29                                            // values up to 2^(29+8) ns
	histBuckets  = (histMaxShift + 2) << histSubBits             // 3968
	histCeiling  = uint64(1) << (histMaxShift + histSubBits + 1) // first value clamped
)

// histIndex is the bucket of v: v itself below 256; above, the top 8 bits
// of v (128..255) offset by 128 per power of two beyond the eighth.
func histIndex(v uint64) int {
	if v >= histCeiling {
		v = histCeiling - 1
	}
	s := bits.Len64(v) - (histSubBits + 1)
	if s <= 0 {
		return int(v)
	}
	return s<<histSubBits + int(v>>uint(s))
}

// histBounds is the range [lo, hi] of the values of bucket i.
func histBounds(i int) (lo, hi uint64) {
	if i < 2<<histSubBits {
		return uint64(i), uint64(i)
	}
	s := i>>histSubBits - 1
	top := uint64(i - s<<histSubBits)
	return top << uint(s), (top+1)<<uint(s) - 1
}

// Record adds one duration; negative ones count as zero.
func (h *latencyHist) Record(d time.Duration) {
	v := uint64(0)
	if d > 0 {
		v = uint64(d)
	}
	if h.counts == nil {
		h.counts = make([]uint64, histBuckets)
	}
	h.counts[histIndex(v)]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	h.sum += v
}

// Count is the number of recorded values.
func (h *latencyHist) Count() uint64 { return h.n }

// Merge adds o's values to h.
func (h *latencyHist) Merge(o *latencyHist) {
	if o.n == 0 {
		return
	}
	if h.counts == nil {
		h.counts = make([]uint64, histBuckets)
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.n += o.n
	h.sum += o.sum
}

// Quantile is the value below or at which a fraction q of the recorded
// values lie (the middle of its bucket, kept within [min, max]); 0 when
// nothing was recorded.
func (h *latencyHist) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	rank = min(rank, h.n)
	var seen uint64
	for i, c := range h.counts {
		if seen += c; seen >= rank {
			lo, hi := histBounds(i)
			v := lo + (hi-lo)/2
			v = max(v, h.min)
			v = min(v, h.max)
			return time.Duration(v)
		}
	}
	return time.Duration(h.max)
}

// Mean is the exact mean of the recorded values.
func (h *latencyHist) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / h.n)
}

// Max is the largest recorded value.
func (h *latencyHist) Max() time.Duration { return time.Duration(h.max) }

// atomicHist is a latencyHist that many goroutines record into at once
// (a process's connections into one histogram, not one each).
type atomicHist struct {
	counts      [histBuckets]atomic.Uint64
	n, sum, max atomic.Uint64
	min         atomic.Uint64 // the smallest value + 1; 0: none yet
}

// Record adds one duration; negative ones count as zero.
func (h *atomicHist) Record(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[histIndex(v)].Add(1)
	h.n.Add(1)
	h.sum.Add(v)
	for m := h.max.Load(); v > m && !h.max.CompareAndSwap(m, v); m = h.max.Load() {
	}
	for m := h.min.Load(); (m == 0 || v+1 < m) && !h.min.CompareAndSwap(m, v+1); m = h.min.Load() {
	}
}

func (h *atomicHist) reset() {
	for i := range h.counts {
		h.counts[i].Store(0)
	}
	h.n.Store(0)
	h.sum.Store(0)
	h.max.Store(0)
	h.min.Store(0)
}

// histJSON is a histogram as a report carries it: the non-empty buckets
// as [index, count] pairs, so that reports of several processes merge
// exactly (every process buckets alike).
type histJSON struct {
	N       uint64      `json:"n"`
	Sum     uint64      `json:"sum_ns"`
	Min     uint64      `json:"min_ns"`
	Max     uint64      `json:"max_ns"`
	Buckets [][2]uint64 `json:"buckets,omitempty"`
}

func (h *atomicHist) json() histJSON {
	j := histJSON{N: h.n.Load(), Sum: h.sum.Load(), Max: h.max.Load()}
	if m := h.min.Load(); m > 0 {
		j.Min = m - 1
	}
	for i := range h.counts {
		if c := h.counts[i].Load(); c > 0 {
			j.Buckets = append(j.Buckets, [2]uint64{uint64(i), c})
		}
	}
	return j
}

func (h *latencyHist) toJSON() histJSON {
	j := histJSON{N: h.n, Sum: h.sum, Min: h.min, Max: h.max}
	for i, c := range h.counts {
		if c > 0 {
			j.Buckets = append(j.Buckets, [2]uint64{uint64(i), c})
		}
	}
	return j
}

// hist is j as a latencyHist (buckets out of range are dropped).
func (j histJSON) hist() latencyHist {
	h := latencyHist{n: j.N, sum: j.Sum, min: j.Min, max: j.Max}
	if j.N > 0 {
		h.counts = make([]uint64, histBuckets)
		for _, b := range j.Buckets {
			if b[0] < histBuckets {
				h.counts[b[0]] += b[1]
			}
		}
	}
	return h
}
