package rooms_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/store"
)

// TestWidsReachEveryMessage: each event keeps the client write id of the
// write that made it in live events, in a coalesced catch-up (the latest
// write of each key) and in a replay, from the engine's history and from
// the store's after a reload.
func TestWidsReachEveryMessage(t *testing.T) {
	ctx := context.Background()
	e, st := newEngine(t, store.RetentionPolicy{}, rooms.Config{QueueLimit: 2})
	const room = "wids"
	slow, err := e.Watch(ctx, room, rooms.WatchOptions{From: &rooms.Position{Rev: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	cs := newClient()
	cs.until(t, slow, rooms.KindSynced)
	for i := range 10 {
		w := store.Put(fmt.Sprint("k", i%3), []byte(fmt.Sprint(i)))
		w.Wid = fmt.Sprint("w", i+1) // the wid of revision i+1
		if _, err := e.Apply(ctx, room, w); err != nil {
			t.Fatal(err)
		}
	}
	// Each event carries the wid of its revision (its mod_rev).
	check := func(what string, msgs []rooms.Message, kind rooms.Kind) {
		t.Helper()
		n := 0
		for _, m := range msgs {
			if m.Kind != kind {
				continue
			}
			for _, ev := range m.Change.Events {
				n++
				if want := fmt.Sprint("w", ev.KV.ModRev); ev.Wid != want {
					t.Errorf("%s: %s event of %q at %d carries wid %q, want %q", what, m.Kind, ev.KV.Key, ev.KV.ModRev, ev.Wid, want)
				}
			}
		}
		if n == 0 {
			t.Errorf("%s: no %s event", what, kind)
		}
	}
	cs.drain(t, slow)
	cs.drain(t, slow)
	check("slow watcher, live", cs.log, rooms.KindEvents)
	check("slow watcher, caught up", cs.log, rooms.KindCoalesced)

	replay := func(e *rooms.Engine) []rooms.Message {
		w, err := e.Watch(ctx, room, rooms.WatchOptions{From: &rooms.Position{Rev: 1}})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		c := newClient()
		c.until(t, w, rooms.KindSynced)
		if len(c.seen) != 10 {
			t.Errorf("replayed %d revisions, want 10", len(c.seen))
		}
		return c.log
	}
	check("replay", replay(e), rooms.KindEvents)
	reloaded := rooms.New(st, rooms.Config{})
	defer reloaded.Close()
	check("replay after a reload", replay(reloaded), rooms.KindEvents)
}
