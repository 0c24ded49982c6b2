package rooms_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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

func (f *countingFilter) String() string { return "contains " + f.want }

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

// TestFilteredSnapshotsShareEvaluations: the snapshots of one filter's
// watchers evaluate only the keys written since the last one, and still
// hold exactly the filtered room; once they have all left, a snapshot
// evaluates every key again.
func TestFilteredSnapshotsShareEvaluations(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	room := map[string]string{}
	write := func(key, val string) {
		if val == "" {
			del(t, e, "lobby", key)
			delete(room, key)
		} else {
			put(t, e, "lobby", key, val)
			room[key] = val
		}
	}
	for i := range 100 {
		write(fmt.Sprintf("games/%02d", i), []string{`"duel"`, `"team"`}[i%2])
	}
	f := &countingFilter{want: "duel"}
	snapshot := func(wantEvals int64) *rooms.Watcher {
		t.Helper()
		before := f.calls.Load()
		w, err := e.Watch(ctx, "lobby", rooms.WatchOptions{Prefixes: []string{"games/"}, Filter: f})
		if err != nil {
			t.Fatal(err)
		}
		c := newClient()
		c.until(t, w, rooms.KindSnapshot)
		if n := f.calls.Load() - before; n != wantEvals {
			t.Errorf("the snapshot evaluated the filter %d times, want %d", n, wantEvals)
		}
		want := map[string]string{}
		for k, v := range room {
			if v == `"duel"` {
				want[k] = v
			}
		}
		if !maps.Equal(c.items, want) {
			t.Fatalf("snapshot %v, want %v", c.items, want)
		}
		return w
	}
	w1 := snapshot(100)
	w2 := snapshot(0)
	write("games/00", `"team"`) // leaves
	write("games/01", `"duel"`) // enters
	write("games/02", "")       // deleted
	write("games/x", `"duel"`)  // new
	w3 := snapshot(3)
	for _, w := range []*rooms.Watcher{w1, w2, w3} {
		w.Close()
	}
	// Once its watchers left, the memo is gone: a snapshot at a new
	// revision (not the one the others shared) evaluates every key.
	write("games/y", `"team"`)
	snapshot(int64(len(room))).Close()
}

// TestFilterSharedAcrossInstancesAndTransactions: two Filter values with
// the same text are one filter to the room, and watchers that see only
// part of a transaction share the evaluations of the others.
func TestFilterSharedAcrossInstancesAndTransactions(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	a, b := &countingFilter{want: "duel"}, &countingFilter{want: "duel"}
	var ws []*rooms.Watcher
	for i := range 40 {
		f, prefixes := a, []string{"games/"}
		if i%2 == 1 {
			f = b
		}
		if i%4 >= 2 {
			prefixes = nil // the whole room: the whole transaction
		}
		w, err := e.Watch(ctx, "lobby", rooms.WatchOptions{Prefixes: prefixes, Filter: f, From: &rooms.Position{Rev: 1}})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		newClient().until(t, w, rooms.KindSynced)
		ws = append(ws, w)
	}
	if _, err := e.Apply(ctx, "lobby", store.Write{Ops: []store.Op{
		{Type: store.OpPut, Key: "games/1", Value: []byte(`"duel"`)},
		{Type: store.OpPut, Key: "other/1", Value: []byte(`"duel"`)},
	}}); err != nil {
		t.Fatal(err)
	}
	for i, w := range ws {
		m := newClient().until(t, w, rooms.KindEvents)
		if want := 2 - i%4/2; len(m.Change.Events) != 2-(1-i%4/2) && len(m.Change.Events) != want {
			t.Fatalf("watcher %d got %d events", i, len(m.Change.Events))
		}
	}
	if n := a.calls.Load() + b.calls.Load(); n != 2 {
		t.Fatalf("2 events evaluated %d times for 40 watchers of one filter text", n)
	}
}

// TestMaxFiltersPerRoom: a room serves at most MaxFilters distinct filter
// texts; more watchers of one text are free, and a text leaving frees a
// place.
func TestMaxFiltersPerRoom(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{MaxFilters: 2})
	watch := func(want string) (*rooms.Watcher, error) {
		return e.Watch(ctx, "lobby", rooms.WatchOptions{Filter: &countingFilter{want: want}})
	}
	w1, err := watch("a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch("b"); err != nil {
		t.Fatal(err)
	}
	if _, err := watch("a"); err != nil {
		t.Fatalf("a second watcher of a filter the room has: %v", err)
	}
	if _, err := watch("c"); err != rooms.ErrTooManyFilters {
		t.Fatalf("a third distinct filter: %v, want ErrTooManyFilters", err)
	}
	if _, err := e.Watch(ctx, "other", rooms.WatchOptions{Filter: &countingFilter{want: "c"}}); err != nil {
		t.Fatalf("the bound is per room: %v", err)
	}
	w1.Close()
	if _, err := watch("c"); err != rooms.ErrTooManyFilters {
		t.Fatalf("a's other watcher still holds it: %v, want ErrTooManyFilters", err)
	}
}

// TestFilteredReplayInChunks: a filtered replay over history its filter
// drops still stops every ReplayChunk revisions, so one Drain never
// evaluates the whole ring under the room's lock.
func TestFilteredReplayInChunks(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{ReplayChunk: 4})
	for i := range 100 {
		put(t, e, "lobby", "games/1", fmt.Sprintf(`"team %d"`, i))
	}
	f := &countingFilter{want: "duel"}
	w, err := e.Watch(ctx, "lobby", rooms.WatchOptions{Filter: f, From: &rooms.Position{Rev: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	msgs, err := w.Drain(nil)
	if err != nil || len(msgs) != 1 || msgs[0].Kind != rooms.KindProgress || msgs[0].Rev != 4 {
		t.Fatalf("first Drain: %+v, %v; want a progress mark at 4", msgs, err)
	}
	if n := f.calls.Load(); n > 8 {
		t.Fatalf("one Drain evaluated %d values, want at most 2 per revision of a chunk of 4", n)
	}
	if m := newClient().until(t, w, rooms.KindSynced); m.Rev != 100 {
		t.Fatalf("synced at %d", m.Rev)
	}
}

// slowFilter takes at least took per evaluation, as a costly expression
// over a large value does, and counts its evaluations.
type slowFilter struct {
	took  time.Duration
	calls atomic.Int64
}

func (f *slowFilter) Match(string, []byte) bool {
	f.calls.Add(1)
	for start := time.Now(); time.Since(start) < f.took; {
	}
	return true
}

func (f *slowFilter) String() string { return "slow" }

// TestSlowFilterEnded: a filter whose evaluation of a change takes longer
// than FilterTimeBudget is evaluated FilterStrikes times, however many
// writes follow: its watcher ends with ErrFilterTooSlow, a new watch with it is refused in
// that room, and a bystander's watcher in the room gets every write.
// Before, every write paid the slow filter under the room's lock.
func TestSlowFilterEnded(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{FilterTimeBudget: time.Millisecond})
	slow := &slowFilter{took: 2 * time.Millisecond}
	hostile, err := e.Watch(ctx, "lobby", rooms.WatchOptions{Filter: slow, From: &rooms.Position{Rev: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer hostile.Close()
	bystander, err := e.Watch(ctx, "lobby", rooms.WatchOptions{Filter: &countingFilter{want: "duel"}, From: &rooms.Position{Rev: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer bystander.Close()
	newClient().until(t, hostile, rooms.KindSynced)
	newClient().until(t, bystander, rooms.KindSynced)
	const writes = 10
	for i := range writes {
		put(t, e, "lobby", "games/1", fmt.Sprintf(`"duel %d"`, i))
	}
	if n := slow.calls.Load(); n != rooms.FilterStrikes {
		t.Fatalf("the slow filter was evaluated %d times for %d writes, want %d", n, writes, rooms.FilterStrikes)
	}
	got := 0 // the changes before the last strike, then the end
	for ; got <= writes; got++ {
		if _, err = hostile.Next(ctx); err != nil {
			break
		}
	}
	if err != rooms.ErrFilterTooSlow || got != rooms.FilterStrikes-1 {
		t.Fatalf("the slow filter's watcher: %d changes, then %v; want %d, then ErrFilterTooSlow", got, err, rooms.FilterStrikes-1)
	}
	c := newClient()
	for i := range writes {
		if m := c.until(t, bystander, rooms.KindEvents); !strings.Contains(string(m.Change.Events[0].KV.Value), fmt.Sprint(i)) {
			t.Fatalf("the bystander's event %d: %s", i, m.Change.Events[0].KV.Value)
		}
	}
	if _, err := e.Watch(ctx, "lobby", rooms.WatchOptions{Filter: slow}); err != rooms.ErrFilterTooSlow {
		t.Fatalf("a new watch with the slow filter: %v, want ErrFilterTooSlow", err)
	}
	if _, err := e.Watch(ctx, "other", rooms.WatchOptions{Filter: &slowFilter{}}); err != nil {
		t.Fatalf("the ban is per room: %v", err)
	}
}
