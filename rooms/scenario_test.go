package rooms_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/store"
)

// TestReferenceScenario is the scenario statecast was designed from:
// list, writes racing the watch, resume after a disconnect, compaction.
func TestReferenceScenario(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	const room = "scenario"

	// 20 rounds of writes over /svc/0..6 and /cfg/a.
	for round := range 20 {
		for i := range 7 {
			put(t, e, room, fmt.Sprintf("/svc/%d", i), fmt.Sprintf("r%d", round))
		}
		put(t, e, room, "/cfg/a", fmt.Sprintf("r%d", round))
	}

	// List /svc/ at R.
	list, err := e.List(ctx, room, "/svc/", rooms.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	R := list.Rev
	if R != 160 || len(list.Items) != 7 {
		t.Fatalf("list at %d with %d items, want 160 and 7", R, len(list.Items))
	}

	// Between list and watch: a put (new key), a put (update), a delete,
	// and a write to another prefix.
	put(t, e, room, "/svc/new", "n")
	put(t, e, room, "/svc/1", "updated")
	del(t, e, room, "/svc/3")
	put(t, e, room, "/cfg/a", "other")

	// Watch from R+1 delivers exactly the 3 matching events, then synced.
	w, err := e.Watch(ctx, room, rooms.WatchOptions{Prefixes: []string{"/svc/"}, From: &rooms.Position{Epoch: list.Epoch, Rev: R + 1}})
	if err != nil {
		t.Fatal(err)
	}
	c := newClient()
	c.epoch, c.rev, c.data, c.items = list.Epoch, R, R, itemsOf(list)
	synced := c.until(t, w, rooms.KindSynced)
	var got []string
	for _, m := range c.log {
		if m.Kind == rooms.KindEvents {
			for _, ev := range m.Change.Events {
				got = append(got, fmt.Sprintf("%d %v %s", m.Rev, ev.Type, ev.KV.Key))
			}
		}
	}
	want := []string{"161 1 /svc/new", "162 1 /svc/1", "163 2 /svc/3"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("replay (-want +got):\n%s", diff)
	}
	if synced.Rev != 164 {
		t.Fatalf("synced at %d, want head 164", synced.Rev)
	}
	// Plus later ones, live.
	put(t, e, room, "/svc/live", "l")
	put(t, e, room, "/cfg/b", "not ours")
	m := c.until(t, w, rooms.KindEvents)
	if m.Rev != 165 {
		t.Fatalf("live event at %d, want 165", m.Rev)
	}
	// Snapshot + stream equals a fresh list.
	fresh, _ := e.List(ctx, room, "/svc/", rooms.ReadOptions{})
	if diff := cmp.Diff(itemsOf(fresh), c.items); diff != "" {
		t.Fatalf("snapshot+stream != fresh list (-want +got):\n%s", diff)
	}

	// Disconnect; three writes to /svc/a; resume from last+1.
	w.Close()
	put(t, e, room, "/svc/a", "1")
	put(t, e, room, "/svc/a", "2")
	del(t, e, room, "/svc/a")
	before := len(c.log)
	w, err = e.Watch(ctx, room, rooms.WatchOptions{Prefixes: []string{"/svc/"}, From: c.position()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	c.until(t, w, rooms.KindSynced) // apply() fails on any duplicate or regression
	var resumed []uint64
	for _, m := range c.log[before:] {
		if m.Kind == rooms.KindEvents {
			resumed = append(resumed, m.Rev)
		}
	}
	if diff := cmp.Diff([]uint64{167, 168, 169}, resumed); diff != "" {
		t.Fatalf("resumed revisions (-want +got):\n%s", diff)
	}
	fresh, _ = e.List(ctx, room, "/svc/", rooms.ReadOptions{})
	if diff := cmp.Diff(itemsOf(fresh), c.items); diff != "" {
		t.Fatalf("after resume (-want +got):\n%s", diff)
	}
}

// TestScenarioCompacted: with a history of 5 events and 20 writes,
// watching from 1 fails as compacted with oldest replayable revision 16;
// relisting and watching from R+1 succeeds.
func TestScenarioCompacted(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{Default: store.Retention{MaxEvents: 5}}, rooms.Config{})
	const room = "compacted"
	for i := range 20 {
		put(t, e, room, fmt.Sprintf("/k/%d", i%3), fmt.Sprint(i))
	}
	_, err := e.Watch(ctx, room, rooms.WatchOptions{From: &rooms.Position{Rev: 1}, FailIfCompacted: true})
	var ce *store.CompactedError
	if !errors.As(err, &ce) || ce.Oldest != 16 || !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("watch from 1: got %v, want compacted with oldest 16", err)
	}
	// Without FailIfCompacted the same watch falls back to a snapshot.
	w, err := e.Watch(ctx, room, rooms.WatchOptions{From: &rooms.Position{Rev: 1}})
	if err != nil {
		t.Fatal(err)
	}
	c := newClient()
	m := c.until(t, w, rooms.KindSnapshot)
	w.Close()
	if m.Reason != rooms.ReasonCompacted || m.Rev != 20 {
		t.Fatalf("fallback %v at %d, want compacted snapshot at 20", m.Reason, m.Rev)
	}

	list, err := e.List(ctx, room, "", rooms.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err = e.Watch(ctx, room, rooms.WatchOptions{From: &rooms.Position{Epoch: list.Epoch, Rev: list.Rev + 1}, FailIfCompacted: true})
	if err != nil {
		t.Fatalf("watch from R+1 after relist: %v", err)
	}
	defer w.Close()
	c = newClient()
	c.epoch, c.rev, c.data, c.items = list.Epoch, list.Rev, list.Rev, itemsOf(list)
	if m := c.until(t, w, rooms.KindSynced); m.Rev != 20 {
		t.Fatalf("synced at %d, want 20", m.Rev)
	}
	put(t, e, room, "/k/9", "x")
	if m := c.until(t, w, rooms.KindEvents); m.Rev != 21 {
		t.Fatalf("live at %d, want 21", m.Rev)
	}
	if !sameItems(c.items, itemsOf(mustList(t, e, room))) {
		t.Fatal("view differs from the room")
	}
}

func mustList(t testing.TB, e *rooms.Engine, room string) store.Snapshot {
	t.Helper()
	s, err := e.List(context.Background(), room, "", rooms.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The etcd behaviours: from R includes R; from head+1 waits for the next
// write; a far-future revision is accepted and waits.
func TestWatchFromEtcdSemantics(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	const room = "etcd"
	for i := range 10 {
		put(t, e, room, fmt.Sprintf("k%d", i), "v")
	}

	t.Run("from R includes R", func(t *testing.T) {
		w, err := e.Watch(ctx, room, rooms.WatchOptions{From: &rooms.Position{Rev: 7}})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		c := newClient()
		c.rev, c.data = 6, 6
		c.until(t, w, rooms.KindSynced)
		if c.log[0].Kind != rooms.KindEvents || c.log[0].Rev != 7 {
			t.Fatalf("first message %v at %d, want the event at 7", c.log[0].Kind, c.log[0].Rev)
		}
		if n := len(c.seen); n != 4 {
			t.Fatalf("replayed %d revisions, want 7..10", n)
		}
	})

	t.Run("from head+1 waits", func(t *testing.T) {
		w, err := e.Watch(ctx, room, rooms.WatchOptions{From: &rooms.Position{Rev: 11}})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		c := newClient()
		c.rev, c.data = 10, 10
		if m := c.until(t, w, rooms.KindSynced); m.Rev != 10 {
			t.Fatalf("synced at %d, want 10", m.Rev)
		}
		noMessage(t, w)
		rev := put(t, e, room, "next", "v")
		if m := c.until(t, w, rooms.KindEvents); m.Rev != rev {
			t.Fatalf("event at %d, want %d", m.Rev, rev)
		}
	})

	t.Run("far future accepted and waits", func(t *testing.T) {
		head := mustList(t, e, room).Rev
		target := head + 5
		w, err := e.Watch(ctx, room, rooms.WatchOptions{From: &rooms.Position{Rev: target}})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		for range 4 {
			put(t, e, room, "early", "v")
		}
		noMessage(t, w)
		put(t, e, room, "due", "v")
		c := newClient()
		m := c.until(t, w, rooms.KindEvents)
		if m.Rev != target || m.Change.Events[0].KV.Key != "due" {
			t.Fatalf("first event %d %q, want %d due", m.Rev, m.Change.Events[0].KV.Key, target)
		}
	})
}
