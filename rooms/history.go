package rooms

import (
	"sort"
	"strings"
	"time"

	"github.com/statecast/statecast/store"
)

// history is a room's retained events, shared by all its watchers: one
// slot per event, oldest first, in a circular buffer that grows on demand
// up to the retention's event count. Slots are small and contiguous so a
// replay scans them at memory speed; the event itself is reached through
// its Change only when the key matches.
//
// Only whole revisions are retained: oldest is always the first revision
// of a complete Change. The retention bounds events, age and bytes
// (store.EventBytes, as the stores count them); the node's budget bounds
// the bytes of every loaded room's history together, the encodings cached
// at commit included. history is guarded by the room's mutex.
type history struct {
	ret    store.Retention
	node   *budget
	slots  []slot
	heads  []uint64 // keyHead of each slot's key, at the same index
	start  int      // index of the oldest slot
	n      int      // slots in use
	oldest uint64   // oldest replayable revision; head+1 when empty
	bytes  int64    // store.EventBytes of the retained events
	held   int64    // what node is charged for them
}

type slot struct {
	key string
	ch  *Change
}

func newHistory(ret store.Retention, head uint64, node *budget) *history {
	return &history{ret: ret, node: node, oldest: head + 1}
}

func (h *history) at(i int) slot { return h.slots[(h.start+i)%len(h.slots)] }

// changeBytes is store.BatchBytes of ch's events, computed once.
func changeBytes(ch *Change) int64 {
	if ch.size == 0 {
		ch.size = store.BatchBytes(ch.Events)
	}
	return ch.size
}

// push appends ch (revision head+1) and drops the oldest revisions beyond
// retention.
func (h *history) push(ch *Change) {
	k, size := len(ch.Events), changeBytes(ch)
	if k > h.ret.MaxEvents || size > h.ret.MaxBytes { // cannot be retained whole: nothing older is replayable either
		h.clear(ch.Rev + 1)
		return
	}
	for h.n+k > h.ret.MaxEvents || h.bytes+size > h.ret.MaxBytes {
		h.dropOldest()
	}
	if h.n+k > len(h.slots) {
		h.grow(h.n + k)
	}
	for i := range ch.Events {
		j := (h.start + h.n) % len(h.slots)
		h.slots[j] = slot{key: ch.Events[i].KV.Key, ch: ch}
		h.heads[j] = keyHead(ch.Events[i].KV.Key)
		h.n++
	}
	if h.n == k {
		h.oldest = ch.Rev
	}
	ch.held = size + ch.encodedBytes()
	h.bytes += size
	h.held += ch.held
	h.node.charge(ch.held)
	if h.node != nil {
		ch.acct.Store(h.node)
	}
	h.expire(ch.Time)
	// Backstop: the engine compacts the node's oldest history first, in
	// its own goroutine; should writes outrun it, a room over the hard
	// bound pays from its own history, so memory stays bounded anyway.
	for h.n > 0 && h.node.overHard() {
		h.dropOldest()
	}
}

// expire drops revisions older than the retention's MaxAge at now.
func (h *history) expire(now time.Time) {
	if h.ret.MaxAge <= 0 {
		return
	}
	for h.n > 0 && now.Sub(h.at(0).ch.Time) > h.ret.MaxAge {
		h.dropOldest()
	}
}

// dropOldest removes the oldest revision (all its slots).
func (h *history) dropOldest() {
	ch := h.at(0).ch
	for h.n > 0 && h.at(0).ch == ch {
		h.slots[h.start] = slot{}
		h.start = (h.start + 1) % len(h.slots)
		h.n--
	}
	h.oldest = ch.Rev + 1
	h.bytes -= ch.size
	h.held -= ch.held
	h.node.charge(-ch.held)
	ch.release()
}

// clear drops every revision and makes oldest the oldest replayable one.
// A room that unloads clears its history, so its memory goes back to the
// node's budget (and to the heap) at once.
func (h *history) clear(oldest uint64) {
	var last *Change
	for i := 0; i < h.n; i++ {
		if ch := h.at(i).ch; ch != last {
			ch.release()
			last = ch
		}
	}
	clear(h.slots)
	h.start, h.n, h.oldest = 0, 0, oldest
	h.node.charge(-h.held)
	h.bytes, h.held = 0, 0
}

// oldestTime is the commit time of the oldest retained revision.
func (h *history) oldestTime() (time.Time, bool) {
	if h.n == 0 {
		return time.Time{}, false
	}
	return h.at(0).ch.Time, true
}

func (h *history) grow(need int) {
	size := max(2*len(h.slots), 64, need)
	size = min(size, max(h.ret.MaxEvents, need))
	s := make([]slot, size)
	hd := make([]uint64, size)
	for i := 0; i < h.n; i++ {
		j := (h.start + i) % len(h.slots)
		s[i], hd[i] = h.slots[j], h.heads[j]
	}
	h.slots, h.heads, h.start = s, hd, 0
}

// find returns the index of the first slot with revision >= rev.
func (h *history) find(rev uint64) int {
	return sort.Search(h.n, func(i int) bool { return h.at(i).ch.Rev >= rev })
}

// segments returns the slots from index i to the newest as at most two
// contiguous runs, so hot loops index plain slices.
func (h *history) segments(i int) (a, b []slot) {
	ra, rb := h.runs(i)
	return h.slots[ra[0]:ra[1]], h.slots[rb[0]:rb[1]]
}

// headSegments is segments for the slots' key heads.
func (h *history) headSegments(i int) (a, b []uint64) {
	ra, rb := h.runs(i)
	return h.heads[ra[0]:ra[1]], h.heads[rb[0]:rb[1]]
}

// runs returns the index ranges [lo, hi) of segments(i).
func (h *history) runs(i int) (a, b [2]int) {
	if i >= h.n {
		return
	}
	first := (h.start + i) % len(h.slots)
	end := h.start + h.n
	if end <= len(h.slots) {
		return [2]int{first, end}, b
	}
	if first >= h.start {
		return [2]int{first, len(h.slots)}, [2]int{0, end - len(h.slots)}
	}
	return [2]int{first, end - len(h.slots)}, b
}

// keyHead packs the first 8 bytes of k, big-endian, zero-padded. Keys
// hold no NUL byte, so for a prefix p of at most 8 bytes without NUL,
// k starts with p exactly when keyHead(k)&mask(len(p)) == keyHead(p).
func keyHead(k string) uint64 {
	var x uint64
	for i := 0; i < 8 && i < len(k); i++ {
		x |= uint64(k[i]) << (56 - 8*i)
	}
	return x
}

// headFilter rejects, from its history key head alone, almost every key
// that does not start with one of a watcher's prefixes, so a replay reads
// 8 contiguous bytes per retained event instead of each key's string.
type headFilter struct {
	want, mask []uint64 // per prefix
	exact      bool     // a passing head is a match: no need to read the key
}

func newHeadFilter(prefixes []string) headFilter {
	f := headFilter{want: make([]uint64, len(prefixes)), mask: make([]uint64, len(prefixes)), exact: true}
	for i, p := range prefixes {
		n := min(len(p), 8)
		if n > 0 {
			f.mask[i] = ^uint64(0) << (64 - 8*n)
		}
		f.want[i] = keyHead(p[:n])
		f.exact = f.exact && len(p) <= 8 && strings.IndexByte(p, 0) < 0
	}
	return f
}

// pass reports whether a key with head hd may start with a prefix.
func (f *headFilter) pass(hd uint64) bool {
	for i, m := range f.mask {
		if hd&m == f.want[i] {
			return true
		}
	}
	return false
}
