package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/storetest"
)

func TestMemoryConformance(t *testing.T) {
	storetest.Run(t, storetest.Factory{
		// Memory keeps nothing on disk: dir is ignored, and a reopened
		// store is empty with a new epoch.
		Open: func(t testing.TB, dir string, cfg storetest.Config) store.Store {
			return store.NewMemory(store.MemoryConfig{Limits: cfg.Limits, Retention: cfg.Retention, Clock: cfg.Clock})
		},
		Durable: false,
	})
}

// TestMemoryHistoryBytes: each room keeps at most its MaxBytes of
// history, and all rooms together at most HistoryBytes, the oldest
// revisions going first whichever room holds them.
func TestMemoryHistoryBytes(t *testing.T) {
	ctx := context.Background()
	val := strings.Repeat("v", 1000)
	one := store.EventBytes(&store.Event{KV: store.KV{Key: "k0", Value: []byte(val)}})
	now := time.Unix(0, 0)
	clock := func() time.Time { now = now.Add(time.Second); return now }
	m := store.NewMemory(store.MemoryConfig{Clock: clock, HistoryBytes: 16 * one,
		Retention: store.RetentionPolicy{Default: store.Retention{MaxBytes: 6 * one}}})
	defer m.Close()
	oldest := func(room string) uint64 {
		s, err := m.Snapshot(ctx, room, "")
		if err != nil {
			t.Fatal(err)
		}
		return s.Oldest
	}
	for _, room := range []string{"a", "b", "c"} {
		for i := range 8 { // distinct keys: no previous values
			if _, err := m.Apply(ctx, room, store.Put(fmt.Sprintf("k%d", i), []byte(val))); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Per room: revisions 3..8 (6 events). All rooms: c's 5th write made
	// 17 events > 16, so the compaction (down to 15) took 2 more from a,
	// the oldest; later writes to c drop c's own oldest.
	for room, want := range map[string]uint64{"a": 5, "b": 3, "c": 3} {
		if got := oldest(room); got != want {
			t.Errorf("room %s: oldest %d, want %d", room, got, want)
		}
	}
	if _, err := m.History(ctx, "a", 4, 0); !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("history of a from 4: %v, want compacted", err)
	}
}
