package rooms

import (
	"sort"
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
// of a complete Change. history is guarded by the room's mutex.
type history struct {
	ret    store.Retention
	slots  []slot
	start  int    // index of the oldest slot
	n      int    // slots in use
	oldest uint64 // oldest replayable revision; head+1 when empty
}

type slot struct {
	key string
	ch  *Change
}

func newHistory(ret store.Retention, head uint64) *history {
	return &history{ret: ret, oldest: head + 1}
}

func (h *history) at(i int) slot { return h.slots[(h.start+i)%len(h.slots)] }

// push appends ch (revision head+1) and drops the oldest revisions beyond
// retention.
func (h *history) push(ch *Change) {
	k := len(ch.Events)
	if k > h.ret.MaxEvents { // cannot be retained whole: nothing older is replayable either
		clear(h.slots)
		h.start, h.n, h.oldest = 0, 0, ch.Rev+1
		return
	}
	for h.n+k > h.ret.MaxEvents {
		h.dropOldest()
	}
	if h.n+k > len(h.slots) {
		h.grow(h.n + k)
	}
	for i := range ch.Events {
		h.slots[(h.start+h.n)%len(h.slots)] = slot{key: ch.Events[i].KV.Key, ch: ch}
		h.n++
	}
	if h.n == k {
		h.oldest = ch.Rev
	}
	h.expire(ch.Time)
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
}

func (h *history) grow(need int) {
	size := max(2*len(h.slots), 64, need)
	size = min(size, max(h.ret.MaxEvents, need))
	s := make([]slot, size)
	for i := 0; i < h.n; i++ {
		s[i] = h.at(i)
	}
	h.slots, h.start = s, 0
}

// find returns the index of the first slot with revision >= rev.
func (h *history) find(rev uint64) int {
	return sort.Search(h.n, func(i int) bool { return h.at(i).ch.Rev >= rev })
}

// segments returns the slots from index i to the newest as at most two
// contiguous runs, so hot loops index plain slices.
func (h *history) segments(i int) (a, b []slot) {
	if i >= h.n {
		return nil, nil
	}
	first := (h.start + i) % len(h.slots)
	end := h.start + h.n
	if end <= len(h.slots) {
		return h.slots[first:end], nil
	}
	if first >= h.start {
		return h.slots[first:], h.slots[:end-len(h.slots)]
	}
	return h.slots[first : end-len(h.slots)], nil
}
