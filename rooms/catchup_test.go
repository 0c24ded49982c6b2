package rooms_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/statecast/statecast/rooms"
	cel "github.com/statecast/statecast/rooms/filter"
	"github.com/statecast/statecast/store"
)

// catchUp drains w, applying what it gets to c, until its catch-up (a
// coalesced message, a snapshot or a progress) arrives, and returns it.
func catchUp(t *testing.T, c *client, w *rooms.Watcher) rooms.Message {
	t.Helper()
	for range 10 {
		msgs, err := w.Drain(nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if err := c.apply(m); err != nil {
				t.Fatal(err)
			}
			if m.Kind == rooms.KindCoalesced || m.Kind == rooms.KindSnapshot || m.Kind == rooms.KindProgress {
				return m
			}
		}
	}
	t.Fatal("no catch-up after 10 drains")
	return rooms.Message{}
}

// TestCoalescedCatchUpBytes: a parked watcher's catch-up is a snapshot
// past QueueBytes only where the snapshot costs no more than the
// coalesced message would: it holds half the room's keys or more, or
// another watcher holds the snapshot of that position. What counts is
// what the watcher is sent: the latest value of each key (not every
// value it missed, nor previous values), after its filter.
func TestCoalescedCatchUpBytes(t *testing.T) {
	ctx := context.Background()
	big := `"` + strings.Repeat("x", 1000) + `"`
	cfg := rooms.Config{QueueLimit: 2, QueueBytes: 4 << 10}
	watch := func(t *testing.T, e *rooms.Engine, room string, opts rooms.WatchOptions) (*rooms.Watcher, *client) {
		t.Helper()
		w, err := e.Watch(ctx, room, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Close)
		c := newClient()
		c.until(t, w, rooms.KindSnapshot) // the room as it is: live from its head
		return w, c
	}
	check := func(t *testing.T, e *rooms.Engine, room string, c *client, m rooms.Message, want rooms.Kind) {
		t.Helper()
		if m.Kind != want {
			t.Fatalf("catch-up %v, want %v", m.Kind, want)
		}
		if !sameItems(c.items, itemsOf(mustList(t, e, room))) {
			t.Fatal("view differs from the room after the catch-up")
		}
	}

	t.Run("two keys rewritten coalesce", func(t *testing.T) {
		e, _ := newEngine(t, store.RetentionPolicy{}, cfg)
		w, c := watch(t, e, "r", rooms.WatchOptions{})
		for i := range 120 { // 120 KB written, 2 KB the latest values
			put(t, e, "r", fmt.Sprintf("k%d", i%2), big)
		}
		check(t, e, "r", c, catchUp(t, c, w), rooms.KindCoalesced)
	})
	t.Run("a small part of a large room coalesces", func(t *testing.T) {
		e, _ := newEngine(t, store.RetentionPolicy{}, cfg)
		for i := range 100 {
			put(t, e, "r", fmt.Sprintf("k%02d", i), "1")
		}
		w, c := watch(t, e, "r", rooms.WatchOptions{})
		for i := range 10 { // 10 KB past the 4 KiB, a tenth of the room
			put(t, e, "r", fmt.Sprintf("k%02d", i), big)
		}
		check(t, e, "r", c, catchUp(t, c, w), rooms.KindCoalesced)
	})
	t.Run("most of the room is a snapshot", func(t *testing.T) {
		e, _ := newEngine(t, store.RetentionPolicy{}, cfg)
		w, c := watch(t, e, "r", rooms.WatchOptions{})
		for i := range 10 {
			put(t, e, "r", fmt.Sprintf("k%02d", i), big)
		}
		m := catchUp(t, c, w)
		check(t, e, "r", c, m, rooms.KindSnapshot)
		if m.Reason != rooms.ReasonSlow {
			t.Fatalf("snapshot reason %v, want slow", m.Reason)
		}
	})
	t.Run("a filter that drops what was missed", func(t *testing.T) {
		e, _ := newEngine(t, store.RetentionPolicy{}, cfg)
		f, err := cel.Compile(`value == "wanted"`)
		if err != nil {
			t.Fatal(err)
		}
		w, c := watch(t, e, "r", rooms.WatchOptions{Filter: f})
		for i := range 3 { // the third parks it
			put(t, e, "r", fmt.Sprintf("a%d", i), `"wanted"`)
		}
		for i := range 50 { // 50 KB it is not sent: never in its view
			put(t, e, "r", fmt.Sprintf("k%02d", i), big)
		}
		m := catchUp(t, c, w)
		if m.Kind != rooms.KindCoalesced || len(m.Change.Events) != 1 {
			t.Fatalf("catch-up %v, want coalesced with the one key the filter passes", m.Kind)
		}
	})
	t.Run("a snapshot another watcher holds is shared", func(t *testing.T) {
		e, _ := newEngine(t, store.RetentionPolicy{}, cfg)
		first, cf := watch(t, e, "r", rooms.WatchOptions{})
		for i := range 90 {
			put(t, e, "r", fmt.Sprintf("k%02d", i), big)
		}
		late, cl := watch(t, e, "r", rooms.WatchOptions{})
		for i := 90; i < 100; i++ { // the late watcher misses a tenth of the room
			put(t, e, "r", fmt.Sprintf("k%02d", i), big)
		}
		held := catchUp(t, cf, first)
		check(t, e, "r", cf, held, rooms.KindSnapshot)
		m := catchUp(t, cl, late)
		check(t, e, "r", cl, m, rooms.KindSnapshot)
		if m.Snap != held.Snap {
			t.Fatal("the late watcher's snapshot is not the one the first holds")
		}
	})
}

// TestExactWatcherReplays: an exact watcher that falls behind gets every
// revision it missed, in order and each once, from the history (no
// coalesced message, no snapshot), then goes live; one whose missed
// revisions the history no longer holds ends with a CompactedError.
func TestExactWatcherReplays(t *testing.T) {
	ctx := context.Background()
	cfg := rooms.Config{QueueLimit: 2, QueueBytes: 4 << 10}
	t.Run("replays", func(t *testing.T) {
		e, _ := newEngine(t, store.RetentionPolicy{}, cfg)
		head := put(t, e, "r", "k", "0")
		w, err := e.Watch(ctx, "r", rooms.WatchOptions{From: &rooms.Position{Rev: head + 1}, Exact: true})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		for i := 1; i <= 100; i++ { // its queue holds 2: it falls behind
			put(t, e, "r", fmt.Sprintf("k%d", i%3), fmt.Sprint(i))
		}
		next := head + 1
		for next <= head+100 {
			msgs, err := w.Drain(nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range msgs {
				switch m.Kind {
				case rooms.KindEvents:
					if m.Rev != next {
						t.Fatalf("revision %d, want %d", m.Rev, next)
					}
					next++
				case rooms.KindSynced, rooms.KindProgress:
				default:
					t.Fatalf("an exact watcher got a %v message", m.Kind)
				}
			}
		}
		put(t, e, "r", "live", "1")
		if m, err := w.Next(ctx); err != nil || m.Kind != rooms.KindEvents && m.Kind != rooms.KindSynced {
			t.Fatalf("after the replay: %+v, %v; want live events", m, err)
		}
	})
	t.Run("compacted", func(t *testing.T) {
		ret := store.RetentionPolicy{Default: store.Retention{MaxEvents: 10}}
		e, _ := newEngine(t, ret, cfg)
		head := put(t, e, "r", "k", "0")
		w, err := e.Watch(ctx, "r", rooms.WatchOptions{From: &rooms.Position{Rev: head + 1}, Exact: true})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		for i := range 100 {
			put(t, e, "r", "k", fmt.Sprint(i))
		}
		var ce *store.CompactedError
		for range 10 {
			msgs, err := w.Drain(nil)
			if errors.As(err, &ce) {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range msgs {
				if m.Kind == rooms.KindCoalesced || m.Kind == rooms.KindSnapshot {
					t.Fatalf("an exact watcher got a %v message", m.Kind)
				}
			}
		}
		t.Fatal("an exact watcher whose revisions were compacted did not end with a CompactedError")
	})
}
