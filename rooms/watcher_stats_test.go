package rooms_test

import (
	"context"
	"testing"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/store"
)

func TestWatcherStatsBehind(t *testing.T) {
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	put(t, e, "r", "a", `1`)
	w, err := e.Watch(context.Background(), "r", rooms.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if st := w.Stats(); st.State != "snapshot" || st.Head != 1 {
		t.Fatalf("before the first drain: %+v, want snapshot at head 1", st)
	}
	if _, err := w.Drain(nil); err != nil {
		t.Fatal(err)
	}
	if st := w.Stats(); st.State != "live" || st.Behind != 0 || st.Queued != 0 {
		t.Fatalf("after the snapshot: %+v, want live, not behind", st)
	}
	put(t, e, "r", "a", `2`)
	put(t, e, "r", "b", `3`)
	if st := w.Stats(); st.Behind != 2 || st.Queued != 2 || st.Head != 3 {
		t.Fatalf("two revisions queued: %+v, want behind 2, queued 2, head 3", st)
	}
	if _, err := w.Drain(nil); err != nil {
		t.Fatal(err)
	}
	if st := w.Stats(); st.Behind != 0 {
		t.Fatalf("drained: %+v, want behind 0", st)
	}

	// A resume from revision 1 replays 1..3: three revisions behind.
	r, err := e.Watch(context.Background(), "r", rooms.WatchOptions{From: &rooms.Position{Rev: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if st := r.Stats(); st.State != "replay" || st.Behind != 3 {
		t.Fatalf("resume from 1: %+v, want replay, behind 3", st)
	}
	r.Close()
	if st := r.Stats(); st.State != "closed" || st.Behind != 0 {
		t.Fatalf("closed: %+v", st)
	}
}
