package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redisstore"
	"github.com/statecast/statecast/store/redistest"
	"github.com/statecast/statecast/store/storetest"
)

// TestTwoNodesEpochReset: two nodes (an engine on its own Redis store
// each) share one Redis. A write on node A reaches a watcher on node B;
// after FLUSHALL, B's watcher is reset within about CheckInterval, and a
// resume from the old epoch gets an epoch snapshot, then live events.
func TestTwoNodesEpochReset(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	node := func() *rooms.Engine {
		st, err := redisstore.New(ctx, redisstore.Config{URL: srv.URL(), CheckInterval: 200 * time.Millisecond})
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

// TestWidAcrossNodes: one write sent with one id through two store
// clients, and through two nodes (engines), of one Redis at once -- an
// original still in flight on node A while its resend reaches node B --
// applies once: every send names the same revision, and a watcher on B
// sees one event, carrying the id.
func TestWidAcrossNodes(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	open := func() store.Store {
		st, err := redisstore.New(ctx, redisstore.Config{URL: srv.URL(), CheckInterval: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	sa, sb := open(), open()
	storetest.ConcurrentSendsApplyOnce(t, "stores", sa.Apply, sb.Apply)
	if bs, err := sb.History(ctx, "stores", 1, 0); err != nil || len(bs) != 1 {
		t.Errorf("History after the sends: %d batches, %v; want 1", len(bs), err)
	}

	a, b := rooms.New(open(), rooms.Config{}), rooms.New(open(), rooms.Config{})
	t.Cleanup(func() { a.Close(); b.Close() })
	w, err := b.Watch(ctx, "nodes", rooms.WatchOptions{From: &rooms.Position{Rev: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	storetest.ConcurrentSendsApplyOnce(t, "nodes", a.Apply, b.Apply)
	if _, err := a.Apply(ctx, "nodes", store.Put("after", []byte("1"))); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 2 {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		m, err := w.Next(c)
		cancel()
		if err != nil {
			t.Fatalf("watcher on node B after %v: %v", got, err)
		}
		if m.Kind == rooms.KindEvents {
			for _, ev := range m.Change.Events {
				got = append(got, fmt.Sprintf("%d %s wid=%q", m.Rev, ev.KV.Key, ev.Wid))
			}
		}
	}
	if want := []string{`1 k wid="once"`, `2 after wid=""`}; !reflect.DeepEqual(got, want) {
		t.Errorf("watcher on node B saw %q, want %q", got, want)
	}
}
