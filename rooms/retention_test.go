package rooms_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/store"
)

// evBytes is what history charges for a put of key to val, first write.
func evBytes(key, val string) int64 {
	return store.EventBytes(&store.Event{KV: store.KV{Key: key, Value: []byte(val)}})
}

func roomStats(t testing.TB, e *rooms.Engine, name string) rooms.RoomStats {
	t.Helper()
	for _, s := range e.Stats() {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("room %s not loaded", name)
	return rooms.RoomStats{}
}

// TestHistoryBoundedByBytes: a history of 5 events' worth of bytes keeps
// the last 5 revisions, in the ring and in the memory store alike; a
// resume from before them gets a compacted snapshot; a revision bigger
// than the bound alone leaves nothing older replayable.
func TestHistoryBoundedByBytes(t *testing.T) {
	ctx := context.Background()
	val := strings.Repeat("v", 1000)
	one := evBytes("k00", val)
	ret := store.RetentionPolicy{Default: store.Retention{MaxBytes: 5 * one}}
	e, st := newEngine(t, ret, rooms.Config{})
	const room = "bytes"
	mustList(t, e, room) // loaded: the ring follows every write
	for i := range 20 {
		put(t, e, room, fmt.Sprintf("k%02d", i), val)
	}
	if s := roomStats(t, e, room); s.Oldest != 16 || s.HistoryEvents != 5 || s.HistoryBytes != 5*one {
		t.Fatalf("ring: oldest %d, %d events, %d bytes; want 16, 5, %d", s.Oldest, s.HistoryEvents, s.HistoryBytes, 5*one)
	}
	if s, _ := st.Snapshot(ctx, room, ""); s.Oldest != 16 {
		t.Fatalf("memory store: oldest %d, want 16", s.Oldest)
	}
	_, err := e.Watch(ctx, room, rooms.WatchOptions{From: &rooms.Position{Rev: 15}, FailIfCompacted: true})
	var ce *store.CompactedError
	if !errors.As(err, &ce) || ce.Oldest != 16 {
		t.Fatalf("watch from 15: %v, want compacted with oldest 16", err)
	}
	w, _ := e.Watch(ctx, room, rooms.WatchOptions{From: &rooms.Position{Rev: 15}})
	if m := newClient().until(t, w, rooms.KindSnapshot); m.Reason != rooms.ReasonCompacted || m.Rev != 20 {
		t.Fatalf("resume from 15: %v snapshot at %d, want compacted at 20", m.Reason, m.Rev)
	}
	w.Close()
	w, _ = e.Watch(ctx, room, rooms.WatchOptions{From: &rooms.Position{Rev: 16}})
	c := newClient()
	c.rev, c.data = 15, 15
	if m := c.until(t, w, rooms.KindSynced); m.Rev != 20 || len(c.seen) != 5 {
		t.Fatalf("resume from 16: synced at %d after %d revisions, want 20 after 5", m.Rev, len(c.seen))
	}
	w.Close()

	put(t, e, room, "big", strings.Repeat("b", int(6*one)))
	if s := roomStats(t, e, room); s.Oldest != 22 || s.HistoryEvents != 0 || s.HistoryBytes != 0 {
		t.Fatalf("after an oversized revision: oldest %d, %d events, %d bytes; want 22, 0, 0", s.Oldest, s.HistoryEvents, s.HistoryBytes)
	}
	if s, _ := st.Snapshot(ctx, room, ""); s.Oldest != 22 {
		t.Fatalf("memory store after an oversized revision: oldest %d, want 22", s.Oldest)
	}
}

// TestNodeHistoryBudgetCompactsOldestFirst: three rooms written one after
// the other under a node budget of 12 events: what goes over it comes out
// of the room written first (twice 2 events: the compactor goes down to
// 15/16 of the budget), and a resume from there gets a snapshot. An
// unloaded room gives its history back to the budget.
func TestNodeHistoryBudgetCompactsOldestFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		val := strings.Repeat("v", 1000)
		one := evBytes("k0", val)
		e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{HistoryBytes: 12 * one, IdleTimeout: time.Minute})
		for _, room := range []string{"a", "b", "c"} {
			mustList(t, e, room)
		}
		for _, room := range []string{"a", "b", "c"} {
			for i := range 5 {
				time.Sleep(time.Millisecond) // commit times are the compaction order
				put(t, e, room, fmt.Sprintf("k%d", i), val)
				synctest.Wait() // the compactor has run
				if got := e.HistoryBytes(); got > 12*one {
					t.Fatalf("after %s/k%d: node history %d bytes, budget %d", room, i, got, 12*one)
				}
			}
		}
		want := map[string]uint64{"a": 5, "b": 1, "c": 1}
		for room, oldest := range want {
			if s := roomStats(t, e, room); s.Oldest != oldest {
				t.Errorf("room %s: oldest %d, want %d", room, s.Oldest, oldest)
			}
		}
		w, _ := e.Watch(ctx, "a", rooms.WatchOptions{From: &rooms.Position{Rev: 4}})
		if m := newClient().until(t, w, rooms.KindSnapshot); m.Reason != rooms.ReasonCompacted || m.Rev != 5 {
			t.Fatalf("resume a from 4: %v snapshot at %d, want compacted at 5", m.Reason, m.Rev)
		}
		w.Close()

		time.Sleep(2 * time.Minute) // every room idles out and unloads
		synctest.Wait()
		if len(e.Stats()) != 0 || e.HistoryBytes() != 0 {
			t.Fatalf("after unloading: %d rooms, node history %d bytes; want 0, 0", len(e.Stats()), e.HistoryBytes())
		}
	})
}

// TestWatcherQueueBoundedByBytes: a watcher that does not drain is parked
// once its queue holds QueueBytes, though far below QueueLimit messages,
// and its catch-up leaves it equal to the room: a snapshot, as the
// events it missed are more than a queue's bytes.
func TestWatcherQueueBoundedByBytes(t *testing.T) {
	ctx := context.Background()
	val := strings.Repeat("v", 1000)
	one := evBytes("k00", val)
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{QueueBytes: 3 * one})
	const room = "q"
	w, _ := e.Watch(ctx, room, rooms.WatchOptions{From: &rooms.Position{Rev: 1}})
	defer w.Close()
	c := newClient()
	c.until(t, w, rooms.KindSynced)
	for i := range 10 {
		put(t, e, room, fmt.Sprintf("k%02d", i), val)
	}
	msgs, err := w.Drain(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 3 {
		t.Fatalf("queued %d messages, want the 3 that fit in QueueBytes", len(msgs))
	}
	for _, m := range msgs {
		if err := c.apply(m); err != nil {
			t.Fatal(err)
		}
	}
	// The 7 missed events are more bytes than a queue may hold: a
	// coalesced message of them would be the watcher's alone.
	if m := c.until(t, w, rooms.KindSnapshot); m.Rev != 10 || m.Reason != rooms.ReasonSlow {
		t.Fatalf("catch-up %v at %d, want a slow snapshot at 10", m.Reason, m.Rev)
	}
	if !sameItems(c.items, itemsOf(mustList(t, e, room))) {
		t.Fatal("view differs from the room after the catch-up")
	}
	put(t, e, room, "after", "x")
	if m := c.until(t, w, rooms.KindEvents); m.Rev != 11 {
		t.Fatalf("live at %d, want 11", m.Rev)
	}
}

// TestLoadReadsLongHistoryInChunks: a room loaded on a second engine
// replays a history longer than one load chunk whole and in order.
func TestLoadReadsLongHistoryInChunks(t *testing.T) {
	ctx := context.Background()
	e, st := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	for i := range 700 {
		put(t, e, "long", fmt.Sprintf("k%d", i%7), fmt.Sprint(i))
	}
	e2 := rooms.New(st, rooms.Config{})
	defer e2.Close()
	w, _ := e2.Watch(ctx, "long", rooms.WatchOptions{From: &rooms.Position{Rev: 1}})
	defer w.Close()
	c := newClient()
	if m := c.until(t, w, rooms.KindSynced); m.Rev != 700 || len(c.seen) != 700 {
		t.Fatalf("synced at %d after %d revisions, want 700 after 700", m.Rev, len(c.seen))
	}
	if !sameItems(c.items, itemsOf(mustList(t, e2, "long"))) {
		t.Fatal("replayed view differs from the room")
	}
}

// TestHeapBoundedUnderLargeValues is the reported attack: 2,000 values of
// 250 KB into one room whose one watcher never drains. With the default
// bounds (64 MiB of history per room, 4 MiB per watcher queue) the live
// heap stays near them, where it used to hold every value (~500 MB): the
// store's and the ring's 10,000-event histories and a 1,024-message queue.
func TestHeapBoundedUnderLargeValues(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 500 MB")
	}
	ctx := context.Background()
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}
	base := heap()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	const room = "big"
	w, _ := e.Watch(ctx, room, rooms.WatchOptions{From: &rooms.Position{Rev: 1}})
	defer w.Close()
	newClient().until(t, w, rooms.KindSynced) // then never drained again
	val := make([]byte, 250<<10)
	for i := range 2000 {
		val[0] = byte(i)
		if _, err := e.Apply(ctx, room, store.Put(fmt.Sprintf("k%d", i%100), val)); err != nil {
			t.Fatal(err)
		}
	}
	const limit = store.DefaultMaxBytes + 4<<20 + 32<<20 // history, the queue, slack
	if h := heap(); h > base && h-base > limit {
		got := h - base
		t.Fatalf("heap grew by %d MiB, want at most %d MiB", got>>20, limit>>20)
	}
	t.Logf("heap grew by %d MiB", (max(heap(), base)-base)>>20)
	runtime.KeepAlive(w)
}

// TestNodeBudgetCountsLaterEncodings: an encoding cached on a retained
// revision after it committed (a replay in another codec) is charged to
// the node's budget, and given back when the room unloads.
func TestNodeBudgetCountsLaterEncodings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
		put(t, e, "enc", "k", "v")
		mustList(t, e, "enc")
		put(t, e, "enc", "k", "w")
		before := e.HistoryBytes()
		w, _ := e.Watch(ctx, "enc", rooms.WatchOptions{From: &rooms.Position{Rev: 1}})
		m := newClient().until(t, w, rooms.KindEvents)
		enc := make([]byte, 1000)
		m.Change.Encoded(2, func(*rooms.Change) []byte { return enc })
		if got := e.HistoryBytes(); got != before+1000 {
			t.Fatalf("node history %d bytes after caching 1000 more, want %d", got, before+1000)
		}
		w.Close()
		time.Sleep(2 * time.Minute) // the room idles out and unloads
		synctest.Wait()
		if got := e.HistoryBytes(); got != 0 {
			t.Fatalf("after unloading: node history %d bytes, want 0", got)
		}
	})
}

// TestCompact: Engine.Compact drops the room's history below a revision
// (etcd's Compact of one room): a watch from before it is compacted, one
// from it replays; a revision past the head is refused.
func TestCompact(t *testing.T) {
	e, _ := newEngine(t, store.RetentionPolicy{Default: store.Retention{MaxEvents: 100, MaxBytes: 1 << 20}}, rooms.Config{})
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		put(t, e, "r", "k", fmt.Sprint(i))
	}
	if head, err := e.Compact(ctx, "r", 6); !errors.Is(err, rooms.ErrFutureRevision) || head != 5 {
		t.Fatalf("compact past the head: %d, %v", head, err)
	}
	if head, err := e.Compact(ctx, "r", 3); err != nil || head != 5 {
		t.Fatalf("compact: %d, %v", head, err)
	}
	_, err := e.Watch(ctx, "r", rooms.WatchOptions{From: &rooms.Position{Rev: 2}, FailIfCompacted: true})
	var ce *store.CompactedError
	if !errors.As(err, &ce) || ce.Oldest != 3 {
		t.Fatalf("watch from 2: %v, want compacted with oldest 3", err)
	}
	w, err := e.Watch(ctx, "r", rooms.WatchOptions{From: &rooms.Position{Rev: 3}, FailIfCompacted: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if m, err := w.Next(ctx); err != nil || m.Kind != rooms.KindEvents || m.Rev != 3 {
		t.Fatalf("watch from 3: %+v, %v", m, err)
	}
}
