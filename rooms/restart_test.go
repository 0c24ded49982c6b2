package rooms_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/store"
)

// A client resumes across a restart of a file-store node by replay, not
// by snapshot: epoch, revisions and history survive.
func TestResumeAcrossFileStoreRestart(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "statecast.db")
	open := func() (*rooms.Engine, *store.File) {
		st, err := store.OpenFile(store.FileConfig{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		return rooms.New(st, rooms.Config{}), st
	}
	e, st := open()
	w, _ := e.Watch(ctx, "doc", rooms.WatchOptions{})
	c := newClient()
	c.until(t, w, rooms.KindSnapshot)
	for i := range 5 {
		put(t, e, "doc", fmt.Sprintf("k%d", i), "before")
		c.until(t, w, rooms.KindEvents)
	}
	w.Close()
	e.Close()
	st.Close()

	e, st = open()
	defer st.Close()
	defer e.Close()
	for i := range 3 {
		put(t, e, "doc", fmt.Sprintf("k%d", i), "after")
	}
	w, err := e.Watch(ctx, "doc", rooms.WatchOptions{From: c.position()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if m := c.until(t, w, rooms.KindSynced); m.Rev != 8 {
		t.Fatalf("synced at %d, want 8", m.Rev)
	}
	for _, m := range c.log {
		if m.Kind == rooms.KindSnapshot && m.Reason != rooms.ReasonInitial {
			t.Fatalf("resume fell back to a %v snapshot", m.Reason)
		}
	}
	if !sameItems(c.items, itemsOf(mustList(t, e, "doc"))) {
		t.Fatal("view differs after resume")
	}
}

// A memory store restart loses the state and changes the epoch: a client
// resuming from the old epoch gets a snapshot of the new state.
func TestResumeAcrossMemoryStoreRestart(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	put(t, e, "doc", "old", "v")
	old := mustList(t, e, "doc")

	e2, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	put(t, e2, "doc", "new", "v")
	w, err := e2.Watch(ctx, "doc", rooms.WatchOptions{From: &rooms.Position{Epoch: old.Epoch, Rev: old.Rev + 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	c := newClient()
	c.epoch, c.items = old.Epoch, itemsOf(old)
	m := c.until(t, w, rooms.KindSnapshot)
	if m.Reason != rooms.ReasonEpoch || m.Epoch == old.Epoch {
		t.Fatalf("got a %v snapshot in epoch %s, want an epoch snapshot in a new epoch", m.Reason, m.Epoch)
	}
	if _, ok := c.items["old"]; ok || c.items["new"] != "v" {
		t.Fatalf("view %v after epoch change", c.items)
	}
}
