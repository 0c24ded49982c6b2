package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redistest"
)

// TestRedisTwoNodesEpochReset: two nodes (an engine on its own Redis store
// each) share one Redis. A write on node A reaches a watcher on node B;
// after FLUSHALL, B's watcher is reset within about CheckInterval, and a
// resume from the old epoch gets an epoch snapshot, then live events.
func TestRedisTwoNodesEpochReset(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	node := func() *rooms.Engine {
		st, err := store.OpenRedis(ctx, store.RedisConfig{URL: srv.URL(), CheckInterval: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		e := rooms.New(st, rooms.Config{})
		t.Cleanup(func() { e.Close(); st.Close() })
		return e
	}
	a, b := node(), node()
	next := func(w *rooms.Watcher) (rooms.Message, error) {
		t.Helper()
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return w.Next(c)
	}
	must := func(w *rooms.Watcher, kind rooms.Kind) rooms.Message {
		t.Helper()
		for {
			m, err := next(w)
			if err != nil {
				t.Fatalf("waiting for %v: %v", kind, err)
			}
			if m.Kind == kind {
				return m
			}
			if m.Kind != rooms.KindProgress && m.Kind != rooms.KindSynced {
				t.Fatalf("got %v at rev %d while waiting for %v", m.Kind, m.Rev, kind)
			}
		}
	}
	w, err := b.Watch(ctx, "doc", rooms.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	snap := must(w, rooms.KindSnapshot)
	epoch := snap.Epoch
	for i := range 3 {
		if _, err := a.Apply(ctx, "doc", store.Put(fmt.Sprint("k", i), []byte("v"))); err != nil {
			t.Fatal(err)
		}
		if m := must(w, rooms.KindEvents); m.Rev != uint64(i+1) {
			t.Fatalf("node B got rev %d, want %d", m.Rev, i+1)
		}
	}

	raw := redis.NewClient(&redis.Options{Addr: srv.Addr(), DisableIdentity: true})
	defer raw.Close()
	raw.FlushAll(ctx)
	start := time.Now()
	for {
		m, err := next(w)
		if errors.Is(err, rooms.ErrRoomReset) {
			break
		}
		if err != nil {
			t.Fatalf("after FLUSHALL: %v, want ErrRoomReset", err)
		}
		if m.Kind == rooms.KindEvents {
			t.Fatalf("after FLUSHALL: events at rev %d", m.Rev)
		}
	}
	t.Logf("node B reset %v after FLUSHALL", time.Since(start))

	w2, err := b.Watch(ctx, "doc", rooms.WatchOptions{From: &rooms.Position{Epoch: epoch, Rev: 4}})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	m := must(w2, rooms.KindSnapshot)
	if m.Reason != rooms.ReasonEpoch || m.Epoch == epoch || len(m.Items) != 0 {
		t.Fatalf("resume after FLUSHALL: %v snapshot (reason %v) epoch %q with %d items; want an epoch snapshot of the new, empty room",
			m.Kind, m.Reason, m.Epoch, len(m.Items))
	}
	if _, err := a.Apply(ctx, "doc", store.Put("k", []byte("new"))); err != nil {
		t.Fatal(err)
	}
	if m := must(w2, rooms.KindEvents); m.Rev != 1 {
		t.Fatalf("first event of the new epoch at rev %d, want 1", m.Rev)
	}
}
