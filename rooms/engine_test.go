package rooms_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/store"
)

func TestTransactionDeliveredTogetherOnce(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	const room = "txn"
	all, _ := e.Watch(ctx, room, rooms.WatchOptions{From: &rooms.Position{Rev: 1}})
	defer all.Close()
	part, _ := e.Watch(ctx, room, rooms.WatchOptions{Prefixes: []string{"/a/", "/a/x/"}, From: &rooms.Position{Rev: 1}})
	defer part.Close()
	ca, cp := newClient(), newClient()
	ca.until(t, all, rooms.KindSynced)
	cp.until(t, part, rooms.KindSynced)

	_, err := e.Apply(ctx, room, store.Write{Ops: []store.Op{
		{Type: store.OpPut, Key: "/a/1", Value: []byte("1")},
		{Type: store.OpPut, Key: "/b/1", Value: []byte("2")},
		{Type: store.OpPut, Key: "/a/x/2", Value: []byte("3")},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ma := ca.until(t, all, rooms.KindEvents)
	mp := cp.until(t, part, rooms.KindEvents)
	if len(ma.Change.Events) != 3 || len(mp.Change.Events) != 2 {
		t.Fatalf("got %d and %d events, want 3 (all) and 2 (/a/)", len(ma.Change.Events), len(mp.Change.Events))
	}
	noMessage(t, all)
	noMessage(t, part) // overlapping prefixes of one watcher do not duplicate

	// Replayed, the transaction is still one message.
	w, _ := e.Watch(ctx, room, rooms.WatchOptions{Prefixes: []string{"/a/"}, From: &rooms.Position{Rev: 1}})
	defer w.Close()
	c := newClient()
	c.until(t, w, rooms.KindSynced)
	if len(c.log) != 2 || len(c.log[0].Change.Events) != 2 {
		t.Fatalf("replay = %v, want one message with 2 events then synced", c.log)
	}
}

func TestChangeSharedAcrossWatchers(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	var ws []*rooms.Watcher
	for range 3 {
		w, _ := e.Watch(ctx, "shared", rooms.WatchOptions{From: &rooms.Position{Rev: 1}})
		defer w.Close()
		newClient().until(t, w, rooms.KindSynced)
		ws = append(ws, w)
	}
	put(t, e, "shared", "k", "v")
	encodes := 0
	var changes []*rooms.Change
	for _, w := range ws {
		m := newClient().until(t, w, rooms.KindEvents)
		changes = append(changes, m.Change)
		m.Change.Encoded(0, func(*rooms.Change) []byte { encodes++; return []byte("x") })
	}
	if changes[0] != changes[1] || changes[1] != changes[2] || encodes != 1 {
		t.Fatalf("changes not shared (encoded %d times)", encodes)
	}
}

func TestSlowWatcherCoalesces(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{QueueLimit: 4})
	const room = "slow"
	slow, _ := e.Watch(ctx, room, rooms.WatchOptions{From: &rooms.Position{Rev: 1}})
	defer slow.Close()
	fast, _ := e.Watch(ctx, room, rooms.WatchOptions{From: &rooms.Position{Rev: 1}})
	defer fast.Close()
	cs, cf := newClient(), newClient()
	cs.until(t, slow, rooms.KindSynced)
	cf.until(t, fast, rooms.KindSynced)

	for i := range 100 {
		put(t, e, room, fmt.Sprintf("k%d", i%10), fmt.Sprint(i))
		cf.drain(t, fast) // the fast watcher keeps up and sees every revision
		if i%7 == 3 {
			del(t, e, room, fmt.Sprintf("k%d", i%10))
			cf.drain(t, fast)
		}
	}
	if len(cf.seen) != 114 {
		t.Fatalf("fast watcher saw %d revisions, want 114", len(cf.seen))
	}
	cs.drain(t, slow) // the 4 queued
	cs.drain(t, slow) // then one coalesced message at head
	last := cs.log[len(cs.log)-1]
	if last.Kind != rooms.KindCoalesced || last.Rev != 114 {
		t.Fatalf("last message %v at %d, want coalesced at 114", last.Kind, last.Rev)
	}
	if n := len(last.Change.Events); n > 10 {
		t.Fatalf("coalesced %d events, want at most one per key (10)", n)
	}
	if diff := cmp.Diff(itemsOf(mustList(t, e, room)), cs.items); diff != "" {
		t.Fatalf("slow view (-want +got):\n%s", diff)
	}
	// Back to live.
	put(t, e, room, "after", "x")
	if m := cs.until(t, slow, rooms.KindEvents); m.Rev != 115 {
		t.Fatalf("live at %d, want 115", m.Rev)
	}
}

func TestSlowWatcherPastSecondBoundResyncs(t *testing.T) {
	ctx := context.Background()
	for name, tc := range map[string]struct {
		cfg   rooms.Config
		ret   store.RetentionPolicy
		value string
	}{
		"too many keys":       {rooms.Config{QueueLimit: 2, CoalesceLimit: 5}, store.RetentionPolicy{}, "v"},
		"history overwritten": {rooms.Config{QueueLimit: 2}, store.RetentionPolicy{Default: store.Retention{MaxEvents: 10}}, "v"},
		// A coalesced catch-up is encoded for its watcher alone, a snapshot
		// once for all: past a queue's worth of bytes, the snapshot.
		"too many bytes": {rooms.Config{QueueLimit: 2, QueueBytes: 16 << 10}, store.RetentionPolicy{}, strings.Repeat("x", 1000)},
	} {
		t.Run(name, func(t *testing.T) {
			e, _ := newEngine(t, tc.ret, tc.cfg)
			w, _ := e.Watch(ctx, "r", rooms.WatchOptions{From: &rooms.Position{Rev: 1}})
			defer w.Close()
			c := newClient()
			c.until(t, w, rooms.KindSynced)
			for i := range 50 {
				put(t, e, "r", fmt.Sprintf("k%d", i), tc.value)
			}
			m := c.until(t, w, rooms.KindSnapshot)
			if m.Reason != rooms.ReasonSlow || m.Rev != 50 {
				t.Fatalf("snapshot %v at %d, want slow at 50", m.Reason, m.Rev)
			}
			if !sameItems(c.items, itemsOf(mustList(t, e, "r"))) {
				t.Fatal("view differs from the room after resync")
			}
		})
	}
}

func TestEpochMismatchGivesSnapshot(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	put(t, e, "ep", "k", "v")
	from := &rooms.Position{Epoch: "another", Rev: 1}
	if _, err := e.Watch(ctx, "ep", rooms.WatchOptions{From: from, FailIfCompacted: true}); !errors.Is(err, rooms.ErrEpochMismatch) {
		t.Fatalf("got %v, want ErrEpochMismatch", err)
	}
	w, _ := e.Watch(ctx, "ep", rooms.WatchOptions{From: from})
	defer w.Close()
	if m := newClient().until(t, w, rooms.KindSnapshot); m.Reason != rooms.ReasonEpoch || len(m.Items) != 1 {
		t.Fatalf("got %v with %d items, want an epoch snapshot with 1", m.Reason, len(m.Items))
	}
}

func TestProgressMarksForIdleWatchers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{ProgressInterval: time.Second})
		w, _ := e.Watch(ctx, "p", rooms.WatchOptions{Prefixes: []string{"/mine/"}, From: &rooms.Position{Rev: 1}})
		defer w.Close()
		c := newClient()
		c.until(t, w, rooms.KindSynced)
		for range 5 {
			put(t, e, "p", "/other/k", "v")
		}
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		m := c.until(t, w, rooms.KindProgress)
		if m.Rev != 5 {
			t.Fatalf("progress at %d, want 5", m.Rev)
		}
		// Nothing new: no further marks.
		time.Sleep(3 * time.Second)
		synctest.Wait()
		noMessage(t, w)
	})
}

// countingStore counts the snapshots a node takes.
type countingStore struct {
	*store.Memory
	snapshots atomic.Int64
}

func (s *countingStore) Snapshot(ctx context.Context, room, prefix string) (store.Snapshot, error) {
	s.snapshots.Add(1)
	return s.Memory.Snapshot(ctx, room, prefix)
}

func TestOneSnapshotPerRoomPerNode(t *testing.T) {
	ctx := context.Background()
	st := &countingStore{Memory: store.NewMemory(store.MemoryConfig{})}
	defer st.Close()
	e := rooms.New(st, rooms.Config{})
	defer e.Close()
	for i := range 50 {
		if _, err := st.Apply(ctx, "busy", store.Put(fmt.Sprint(i), []byte("v"))); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	ws := make([]*rooms.Watcher, 200)
	for i := range ws {
		wg.Go(func() {
			w, err := e.Watch(ctx, "busy", rooms.WatchOptions{})
			if err != nil {
				t.Error(err)
				return
			}
			ws[i] = w
			if m, err := w.Next(ctx); err != nil || m.Kind != rooms.KindSnapshot || len(m.Items) != 50 {
				t.Errorf("got %v, %v", m.Kind, err)
			}
		})
	}
	wg.Wait()
	for _, w := range ws {
		if w != nil {
			w.Close()
		}
	}
	if n := st.snapshots.Load(); n != 1 {
		t.Fatalf("%d store snapshots for 200 watchers, want 1", n)
	}
}

// A watcher that gives up while its room is loading does not fail the
// load for the watchers waiting on it: the room loads once, for them.
func TestLoadOutlivesTheWatcherThatStartedIt(t *testing.T) {
	ctx := context.Background()
	st := &gatedStore{countingStore: countingStore{Memory: store.NewMemory(store.MemoryConfig{})}, gate: make(chan struct{})}
	defer st.Close()
	e := rooms.New(st, rooms.Config{})
	defer e.Close()
	if _, err := st.Apply(ctx, "r", store.Put("k", []byte("v"))); err != nil {
		t.Fatal(err)
	}
	first, cancel := context.WithCancel(ctx)
	firstErr := make(chan error, 1)
	go func() { _, err := e.Watch(first, "r", rooms.WatchOptions{}); firstErr <- err }()
	for st.snapshots.Load() == 0 { // the first watcher is loading the room
		time.Sleep(time.Millisecond)
	}
	second := make(chan error, 1)
	go func() {
		w, err := e.Watch(ctx, "r", rooms.WatchOptions{})
		if err == nil {
			m, nerr := w.Next(ctx)
			if nerr == nil && (m.Kind != rooms.KindSnapshot || len(m.Items) != 1) {
				nerr = fmt.Errorf("got %v with %d items, want the snapshot of 1 key", m.Kind, len(m.Items))
			}
			err = nerr
			w.Close()
		}
		second <- err
	}()
	cancel()
	if err := <-firstErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("the watcher that gave up: %v, want context.Canceled", err)
	}
	close(st.gate)
	if err := <-second; err != nil {
		t.Fatalf("the watcher that waited: %v", err)
	}
	if n := st.snapshots.Load(); n != 1 {
		t.Fatalf("%d store snapshots, want 1", n)
	}
}

// gatedStore holds every Snapshot until gate closes or its context ends.
type gatedStore struct {
	countingStore
	gate chan struct{}
}

func (s *gatedStore) Snapshot(ctx context.Context, room, prefix string) (store.Snapshot, error) {
	s.snapshots.Add(1)
	select {
	case <-s.gate:
		return s.Memory.Snapshot(ctx, room, prefix)
	case <-ctx.Done():
		return store.Snapshot{}, ctx.Err()
	}
}

func TestIdleRoomUnloads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{IdleTimeout: time.Minute})
		w, _ := e.Watch(ctx, "idle", rooms.WatchOptions{})
		time.Sleep(5 * time.Minute)
		synctest.Wait()
		if len(e.Stats()) != 1 {
			t.Fatal("a room with a watcher was unloaded")
		}
		w.Close()
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if s := e.Stats(); len(s) != 0 {
			t.Fatalf("idle room still loaded: %+v", s)
		}
		// Reloaded on next use, with the same state.
		put(t, e, "idle", "k", "v")
		if s := mustList(t, e, "idle"); s.Rev != 1 || len(s.Items) != 1 {
			t.Fatalf("reloaded room at %d with %d items", s.Rev, len(s.Items))
		}
	})
}

func TestCloseEndsWatchers(t *testing.T) {
	ctx := context.Background()
	st := store.NewMemory(store.MemoryConfig{})
	defer st.Close()
	e := rooms.New(st, rooms.Config{})
	w, _ := e.Watch(ctx, "c", rooms.WatchOptions{})
	if _, err := w.Next(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := w.Next(ctx); done <- err }()
	e.Close()
	if err := <-done; !errors.Is(err, rooms.ErrClosed) {
		t.Fatalf("watcher ended with %v, want ErrClosed", err)
	}
	if _, err := e.Watch(ctx, "c", rooms.WatchOptions{}); !errors.Is(err, rooms.ErrClosed) {
		t.Fatalf("watch after close: %v", err)
	}
	w.Close()
	if _, err := w.Drain(nil); !errors.Is(err, rooms.ErrClosed) {
		t.Fatalf("drain after close: %v", err)
	}
}

func TestWatchRejectsInvalidRoom(t *testing.T) {
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	if _, err := e.Watch(context.Background(), "a/b", rooms.WatchOptions{}); !errors.Is(err, store.ErrInvalidRoom) {
		t.Fatalf("got %v, want ErrInvalidRoom", err)
	}
}

func TestGetReadsOneKey(t *testing.T) {
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	put(t, e, "g", "a", "1")
	put(t, e, "g", "ab", "2")
	s, err := e.Get(context.Background(), "g", "a", rooms.ReadOptions{})
	if err != nil || len(s.Items) != 1 || string(s.Items[0].Value) != "1" || s.Rev != 2 {
		t.Fatalf("Get a = %+v, %v", s, err)
	}
	if s, err := e.Get(context.Background(), "g", "missing", rooms.ReadOptions{}); err != nil || len(s.Items) != 0 {
		t.Fatalf("Get missing = %+v, %v", s, err)
	}
	if _, err := e.Get(context.Background(), "a/b", "k", rooms.ReadOptions{}); !errors.Is(err, store.ErrInvalidRoom) {
		t.Fatalf("Get on an invalid room: %v", err)
	}
}

// BeforeApply runs before each write with its room, and its error fails
// the write, which then commits nothing.
func TestBeforeApplyRunsFirstAndCanRefuse(t *testing.T) {
	ctx := context.Background()
	var seen []string
	refuse := errors.New("refused")
	e, st := newEngine(t, store.RetentionPolicy{}, rooms.Config{BeforeApply: func(_ context.Context, room string) error {
		seen = append(seen, room)
		if room == "no" {
			return refuse
		}
		return nil
	}})
	if _, err := e.Apply(ctx, "yes", store.Put("k", []byte("1"))); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Apply(ctx, "no", store.Put("k", []byte("1"))); !errors.Is(err, refuse) {
		t.Fatalf("write to a refused room: %v, want the hook's error", err)
	}
	if snap, err := st.Snapshot(ctx, "no", ""); err != nil || snap.Rev != 0 {
		t.Fatalf("the refused room is at %d (%v), want nothing committed", snap.Rev, err)
	}
	if fmt.Sprint(seen) != "[yes no]" {
		t.Fatalf("BeforeApply saw %v", seen)
	}
}
