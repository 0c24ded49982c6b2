package rooms_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/store"
)

// laggingStore is a memory store whose tail lags its commits, as Redis's
// pub/sub does: batches are held until CatchUp (or release) hands them
// on. held counts CatchUp calls.
type laggingStore struct {
	*store.Memory
	mu       sync.Mutex
	held     []store.Batch
	fns      []func(store.Batch)
	catchUps int
	noCatch  bool // CatchUp delivers nothing (a follower that cannot read the store)
}

var _ store.Heads = (*laggingStore)(nil)

func (s *laggingStore) Follow(room string, fn func(store.Batch)) (func(), error) {
	return s.Memory.Follow(room, func(b store.Batch) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.fns) == 0 {
			s.fns = append(s.fns, fn)
		}
		s.held = append(s.held, b)
	})
}

func (s *laggingStore) Head(ctx context.Context, room string) (string, uint64, error) {
	snap, err := s.Memory.Snapshot(ctx, room, "\x00none")
	return snap.Epoch, snap.Rev, err
}

func (s *laggingStore) CatchUp(room string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.catchUps++
	if s.noCatch {
		return
	}
	for _, b := range s.held {
		for _, fn := range s.fns {
			fn(b)
		}
	}
	s.held = nil
}

func newLagging(t *testing.T, cfg rooms.Config) (*rooms.Engine, *laggingStore) {
	t.Helper()
	st := &laggingStore{Memory: store.NewMemory(store.MemoryConfig{})}
	e := rooms.New(st, cfg)
	t.Cleanup(func() { e.Close(); st.Close() })
	return e, st
}

// A write committed by another node (straight to the store) whose push
// has not arrived: a linearizable read makes this node catch up and sees
// it; a serializable one serves the view as it is.
func TestLinearizableReadCatchesUp(t *testing.T) {
	e, st := newLagging(t, rooms.Config{})
	ctx := context.Background()
	if _, err := e.Get(ctx, "r", "k", rooms.ReadOptions{}); err != nil { // loads the room
		t.Fatal(err)
	}
	res, err := st.Memory.Apply(ctx, "r", store.Put("k", []byte("v")))
	if err != nil {
		t.Fatal(err)
	}
	if s, err := e.Get(ctx, "r", "k", rooms.ReadOptions{Serializable: true}); err != nil || len(s.Items) != 0 {
		t.Fatalf("serializable read: %+v, %v; want the view before the write", s, err)
	}
	s, err := e.Get(ctx, "r", "k", rooms.ReadOptions{})
	if err != nil || len(s.Items) != 1 || s.Rev < res.Rev {
		t.Fatalf("linearizable read: %+v, %v; want the write at rev %d", s, err, res.Rev)
	}
	st.mu.Lock()
	n := st.catchUps
	st.mu.Unlock()
	if n == 0 {
		t.Fatal("the read did not ask the store to catch up")
	}
	// min_rev past the view: served as a linearizable read.
	res2, _ := st.Memory.Apply(ctx, "r", store.Put("k", []byte("w")))
	s, err = e.Get(ctx, "r", "k", rooms.ReadOptions{Serializable: true, MinRev: res2.Rev})
	if err != nil || s.Rev < res2.Rev {
		t.Fatalf("min_rev read: %+v, %v; want rev >= %d", s, err, res2.Rev)
	}
}

// Apply's reply waits until the view of a loaded room holds the write.
func TestApplyWaitsForView(t *testing.T) {
	e, st := newLagging(t, rooms.Config{})
	ctx := context.Background()
	if _, err := e.Get(ctx, "r", "k", rooms.ReadOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err := e.Apply(ctx, "r", store.Put("k", []byte("v")))
	if err != nil {
		t.Fatal(err)
	}
	if s, err := e.Get(ctx, "r", "k", rooms.ReadOptions{Serializable: true}); err != nil || s.Rev < res.Rev {
		t.Fatalf("serializable read after the write's reply: %+v, %v; want rev %d", s, err, res.Rev)
	}
	_ = st
}

// A view that cannot catch up fails the read with ErrUnsynced after
// SyncTimeout, and gives up the wait (no waiter left behind).
func TestLinearizableReadBounded(t *testing.T) {
	e, st := newLagging(t, rooms.Config{SyncTimeout: 50 * time.Millisecond})
	st.noCatch = true
	ctx := context.Background()
	if _, err := e.Get(ctx, "r", "k", rooms.ReadOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Memory.Apply(ctx, "r", store.Put("k", []byte("v"))); err != nil {
		t.Fatal(err)
	}
	if _, err := e.List(ctx, "r", "", rooms.ReadOptions{}); !errors.Is(err, rooms.ErrUnsynced) {
		t.Fatalf("read of a view that cannot catch up: %v, want ErrUnsynced", err)
	}
	w, err := e.Watch(ctx, "r", rooms.WatchOptions{})
	if !errors.Is(err, rooms.ErrUnsynced) {
		t.Fatalf("snapshot watch of a view that cannot catch up: %v, want ErrUnsynced", err)
	}
	_ = w
	if _, err := e.List(ctx, "r", "", rooms.ReadOptions{Serializable: true}); err != nil {
		t.Fatalf("serializable read: %v", err)
	}
}

// GetKeys reads several keys from one view, linearizably: a write
// committed by another node is seen, absent keys are left out, and the
// keys found come in the order asked.
func TestGetKeysLinearizable(t *testing.T) {
	e, st := newLagging(t, rooms.Config{})
	ctx := context.Background()
	if _, err := e.Get(ctx, "r", "a", rooms.ReadOptions{}); err != nil { // loads the room
		t.Fatal(err)
	}
	if _, err := st.Memory.Apply(ctx, "r", store.Put("a", []byte("1"))); err != nil {
		t.Fatal(err)
	}
	res, err := st.Memory.Apply(ctx, "r", store.Put("b", []byte("2")))
	if err != nil {
		t.Fatal(err)
	}
	s, err := e.GetKeys(ctx, "r", []string{"b", "missing", "a"}, rooms.ReadOptions{})
	if err != nil || s.Rev < res.Rev || len(s.Items) != 2 || s.Items[0].Key != "b" || s.Items[0].ModRev != res.Rev || s.Items[1].Key != "a" {
		t.Fatalf("GetKeys: %+v, %v; want b at %d then a", s, err, res.Rev)
	}
}
