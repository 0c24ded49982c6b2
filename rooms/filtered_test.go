package rooms_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/statecast/statecast/rooms"
	cel "github.com/statecast/statecast/rooms/filter"
	"github.com/statecast/statecast/store"
)

// countingFilter counts its evaluations.
type countingFilter struct {
	want  string
	calls atomic.Int64
}

func (f *countingFilter) Match(_ string, value []byte) bool {
	f.calls.Add(1)
	return strings.Contains(string(value), f.want)
}

// TestFilterEvaluatedOncePerEventPerFilter: watchers holding the same
// filter share its evaluation and the Change it makes (encoded once);
// the cost of an event grows with the distinct filters, not the watchers.
func TestFilterEvaluatedOncePerEventPerFilter(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	filters := []*countingFilter{{want: "duel"}, {want: "team"}}
	byFilter := map[*countingFilter][]*rooms.Watcher{}
	for i := range 100 {
		f := filters[i%2]
		w, err := e.Watch(ctx, "lobby", rooms.WatchOptions{Prefixes: []string{"games/"}, Filter: f, From: &rooms.Position{Rev: 1}})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		newClient().until(t, w, rooms.KindSynced)
		byFilter[f] = append(byFilter[f], w)
	}
	put(t, e, "lobby", "games/1", `"duel"`)
	put(t, e, "lobby", "games/1", `"team"`) // leaves the duel watchers, enters the team ones
	for _, f := range filters {
		// Per event: the new value, and the previous one when the new one
		// does not match: at most 2 × 2 events.
		if n := f.calls.Load(); n == 0 || n > 4 {
			t.Errorf("filter %q evaluated %d times for 2 events and 50 watchers", f.want, n)
		}
		var first *rooms.Change
		for _, w := range byFilter[f] {
			c := newClient()
			m := c.until(t, w, rooms.KindEvents)
			if f.want == "duel" {
				m = c.until(t, w, rooms.KindEvents) // the put, then the leave
			}
			if first == nil {
				first = m.Change
			} else if m.Change != first {
				t.Fatalf("watchers of filter %q got different Changes of rev %d", f.want, m.Rev)
			}
		}
		if f.want == "duel" && (!first.Filtered || first.Events[0].Type != store.OpDelete) {
			t.Fatalf("the duel watchers' last change: %+v, want a leave", first)
		}
	}
}

// TestCELFilterOnEngine: a compiled CEL filter drives a watcher: the
// snapshot holds the matching keys; a key that stops matching leaves.
func TestCELFilterOnEngine(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	put(t, e, "lobby", "games/1", `{"mode":"duel","players":1,"max":2}`)
	put(t, e, "lobby", "games/2", `{"mode":"duel","players":2,"max":2}`)
	f, err := cel.Compile(`value.mode == "duel" && value.players < value.max`)
	if err != nil {
		t.Fatal(err)
	}
	w, err := e.Watch(ctx, "lobby", rooms.WatchOptions{Filter: f})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	c := newClient()
	c.until(t, w, rooms.KindSnapshot)
	if len(c.items) != 1 || c.items["games/1"] == "" {
		t.Fatalf("snapshot %v, want games/1 only", c.items)
	}
	put(t, e, "lobby", "games/1", `{"mode":"duel","players":2,"max":2}`)
	put(t, e, "lobby", "games/2", `{"mode":"duel","players":1,"max":2}`)
	c.until(t, w, rooms.KindEvents)
	c.until(t, w, rooms.KindEvents)
	if len(c.items) != 1 || c.items["games/2"] == "" {
		t.Fatalf("view %v, want games/2 only", c.items)
	}
}
