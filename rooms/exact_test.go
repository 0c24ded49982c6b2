package rooms_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/statecast/statecast/rooms"
	cel "github.com/statecast/statecast/rooms/filter"
	"github.com/statecast/statecast/store"
)

// keysOf lists the keys a watcher was sent, in order, over every message.
func keysOf(log []rooms.Message) []string {
	var keys []string
	for _, m := range log {
		for _, kv := range m.Items {
			keys = append(keys, kv.Key)
		}
		if m.Change != nil {
			for _, ev := range m.Change.Events {
				keys = append(keys, ev.KV.Key)
			}
		}
	}
	return keys
}

// onlyKey fails unless every key a watcher was sent is one of want.
func onlyKeys(t *testing.T, what string, log []rooms.Message, want ...string) {
	t.Helper()
	for _, k := range keysOf(log) {
		if !slices.Contains(want, k) {
			t.Fatalf("%s was sent %q, want only %v (sent %v)", what, k, want, keysOf(log))
		}
	}
}

// writeAround writes games/7 and the keys it is a prefix of, and others.
func writeAround(t *testing.T, e *rooms.Engine, room string, i int) {
	t.Helper()
	for _, k := range []string{"games/70", "games/7/x", "games/", "games/7", "games/6", "games/7!"} {
		put(t, e, room, k, fmt.Sprint(i))
	}
	if _, err := e.Apply(context.Background(), room, store.Write{Ops: []store.Op{
		{Type: store.OpPut, Key: "games/71", Value: []byte("1")},
		{Type: store.OpPut, Key: "games/7", Value: []byte(fmt.Sprintf(`"txn%d"`, i))},
	}}); err != nil {
		t.Fatal(err)
	}
}

// TestExactKeyWatch: a watch of exact keys gets those keys only, in its
// snapshot, live, in a replay on resume and in a slow watcher's coalesced
// catch-up, while a prefix watch of the same string gets every key under it.
func TestExactKeyWatch(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{QueueLimit: 4})
	const room = "exact"
	writeAround(t, e, room, 0)

	exact, err := e.Watch(ctx, room, rooms.WatchOptions{Keys: []string{"games/7"}})
	if err != nil {
		t.Fatal(err)
	}
	defer exact.Close()
	prefix, _ := e.Watch(ctx, room, rooms.WatchOptions{Prefixes: []string{"games/7"}})
	defer prefix.Close()
	both, _ := e.Watch(ctx, room, rooms.WatchOptions{Prefixes: []string{"games/6"}, Keys: []string{"games/7", "games/6x", "games/70"}})
	defer both.Close()
	if got := both.Keys(); !slices.Equal(got, []string{"games/7", "games/70"}) || !slices.Equal(both.Prefixes(), []string{"games/6"}) {
		t.Fatalf("keys %q, prefixes %q: want games/6x covered by the prefix games/6", got, both.Prefixes())
	}
	ce, cp, cb := newClient(), newClient(), newClient()
	if m := ce.until(t, exact, rooms.KindSnapshot); len(m.Items) != 1 || m.Items[0].Key != "games/7" {
		t.Fatalf("exact snapshot %v, want games/7 alone", keysOf([]rooms.Message{m}))
	}
	cp.until(t, prefix, rooms.KindSnapshot)
	cb.until(t, both, rooms.KindSnapshot)

	writeAround(t, e, room, 1)
	ce.until(t, exact, rooms.KindEvents)
	ce.until(t, exact, rooms.KindEvents)
	cp.drain(t, prefix)
	cb.drain(t, both)
	onlyKeys(t, "the exact watch", ce.log, "games/7")
	onlyKeys(t, "the exact and prefix watch", cb.log, "games/7", "games/70", "games/6")
	if got := ce.items["games/7"]; got != `"txn1"` {
		t.Fatalf("exact watcher holds games/7 = %s, want \"txn1\"", got)
	}
	if n := len(cp.items); n != 5 {
		t.Fatalf("prefix watcher holds %d keys (%v), want the 5 under games/7", n, cp.items)
	}

	// Resume by replay: only the key's revisions, then synced.
	pos := ce.position()
	exact.Close()
	writeAround(t, e, room, 2)
	resumed, err := e.Watch(ctx, room, rooms.WatchOptions{Keys: []string{"games/7"}, From: pos})
	if err != nil {
		t.Fatal(err)
	}
	defer resumed.Close()
	cr := newClient()
	cr.until(t, resumed, rooms.KindSynced)
	onlyKeys(t, "the resumed exact watch", cr.log, "games/7")
	if n := len(cr.seen); n != 2 {
		t.Fatalf("replayed %d revisions, want the 2 that wrote games/7", n)
	}

	// A slow exact watcher coalesces to the key's latest value alone.
	for i := range 20 {
		writeAround(t, e, room, 3+i)
	}
	cr.drain(t, resumed) // the queued ones
	cr.drain(t, resumed) // then the coalesced catch-up
	last := cr.log[len(cr.log)-1]
	if last.Kind != rooms.KindCoalesced || len(last.Change.Events) != 1 {
		t.Fatalf("last message %v with %v, want one coalesced event", last.Kind, keysOf(cr.log[len(cr.log)-1:]))
	}
	onlyKeys(t, "the slow exact watch", cr.log, "games/7")
	if got := cr.items["games/7"]; got != `"txn22"` {
		t.Fatalf("slow exact watcher holds games/7 = %s, want \"txn22\"", got)
	}
}

// TestExactKeyWatchFiltered: a filter narrows an exact-key watch as it
// does a prefix watch; keys beside it are never evaluated nor sent.
func TestExactKeyWatchFiltered(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	const room = "exactf"
	f, err := cel.Compile(`value > 5`)
	if err != nil {
		t.Fatal(err)
	}
	w, err := e.Watch(ctx, room, rooms.WatchOptions{Keys: []string{"n"}, Filter: f})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	c := newClient()
	c.until(t, w, rooms.KindSnapshot)
	for i := range 10 {
		put(t, e, room, "n", fmt.Sprint(i))
		put(t, e, room, "n2", fmt.Sprint(i))
	}
	put(t, e, room, "end", "1")
	c.until(t, w, rooms.KindEvents)
	ctxT, cancel := context.WithTimeout(ctx, 200e6)
	defer cancel()
	for {
		m, err := w.Next(ctxT)
		if err != nil {
			break
		}
		if err := c.apply(m); err != nil {
			t.Fatal(err)
		}
	}
	onlyKeys(t, "the filtered exact watch", c.log, "n")
	if got := c.items["n"]; got != "9" {
		t.Fatalf("holds n = %q, want 9", got)
	}
}
