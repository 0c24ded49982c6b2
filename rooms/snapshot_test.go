package rooms_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/store"
)

// TestSnapshotSharedAcrossWatchers: watchers that take a snapshot of the
// same keys at the same revision share its items (one list, not one per
// watcher); another prefix, or a later revision, gets its own.
func TestSnapshotSharedAcrossWatchers(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	const room = "snap"
	for i := range 50 {
		put(t, e, room, fmt.Sprintf("/a/%02d", i), "1")
	}
	put(t, e, room, "/b/1", "1")

	const n = 8
	msgs := make([]rooms.Message, n)
	var wg sync.WaitGroup
	for i := range n {
		w, err := e.Watch(ctx, room, rooms.WatchOptions{Prefixes: []string{"/a/"}})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		wg.Go(func() { msgs[i] = newClient().until(t, w, rooms.KindSnapshot) })
	}
	wg.Wait()
	for i, m := range msgs {
		if len(m.Items) != 50 || &m.Items[0] != &msgs[0].Items[0] {
			t.Fatalf("watcher %d: %d items, shared %v; want the 50 items of one list", i, len(m.Items), len(m.Items) > 0 && &m.Items[0] == &msgs[0].Items[0])
		}
	}

	other, _ := e.Watch(ctx, room, rooms.WatchOptions{Prefixes: []string{"/b/"}})
	defer other.Close()
	if m := newClient().until(t, other, rooms.KindSnapshot); len(m.Items) != 1 {
		t.Fatalf("another prefix got %d items, want 1", len(m.Items))
	}
	put(t, e, room, "/a/00", "2")
	later, _ := e.Watch(ctx, room, rooms.WatchOptions{Prefixes: []string{"/a/"}})
	defer later.Close()
	m := newClient().until(t, later, rooms.KindSnapshot)
	if m.Items[0].ModRev == msgs[0].Items[0].ModRev || &m.Items[0] == &msgs[0].Items[0] {
		t.Fatalf("a snapshot at a later revision reused the older one")
	}
}

// TestSnapshotEncodedOnce: concurrent callers of a shared snapshot's
// encoding wait for one encoding.
func TestSnapshotEncodedOnce(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	put(t, e, "enc", "k", "v")
	var snaps []*rooms.Snapshot
	for range 4 {
		w, _ := e.Watch(ctx, "enc", rooms.WatchOptions{})
		defer w.Close()
		snaps = append(snaps, newClient().until(t, w, rooms.KindSnapshot).Snap)
	}
	var mu sync.Mutex
	encodes := 0
	var wg sync.WaitGroup
	for _, s := range snaps {
		wg.Go(func() {
			s.Encoded(0, func([]store.KV) [][]byte {
				mu.Lock()
				encodes++
				mu.Unlock()
				return [][]byte{[]byte("x")}
			})
		})
	}
	wg.Wait()
	if encodes != 1 {
		t.Fatalf("encoded %d times, want 1", encodes)
	}
}
