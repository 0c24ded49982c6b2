package rooms

import "github.com/statecast/statecast/store"

// Filter selects the keys of a filtered watch by their value (rooms/filter
// compiles CEL expressions into one). Watchers holding the same Filter
// value share its evaluation: each event is evaluated once per distinct
// Filter, however many watchers hold it. Match must be safe for
// concurrent use and deterministic.
//
// A filtered watcher's view is the filter applied to the room: a key
// enters with a put when its new value starts matching, and leaves with a
// leave event (a delete in a Change marked Filtered) when it stops
// matching or is deleted; changes of keys that neither matched before nor
// match now are not sent. Whether a key matched before is the filter
// applied to the event's Prev, so no watcher keeps a per-key state, and
// replay and coalescing work from the shared history alone.
type Filter interface {
	Match(key string, value []byte) bool
}

// matchesKV reports whether kv (nil: no key) passes f.
func matchesKV(f Filter, kv *store.KV) bool {
	return kv != nil && f.Match(kv.Key, kv.Value)
}

// filterEvents returns evs as a watcher with f sees them: puts of matching
// values, leaves of keys that matched before, and nothing else.
func filterEvents(evs []store.Event, f Filter) []store.Event {
	var out []store.Event
	for _, ev := range evs {
		if ev.Type == store.OpPut && f.Match(ev.KV.Key, ev.KV.Value) {
			out = append(out, ev)
		} else if matchesKV(f, ev.Prev) {
			out = append(out, leaveOf(ev))
		}
	}
	return out
}

// leaveOf is ev as a leave: the key, gone from the filtered view at ev's
// revision.
func leaveOf(ev store.Event) store.Event {
	if ev.Type == store.OpDelete {
		return ev
	}
	return store.Event{Type: store.OpDelete, KV: store.KV{Key: ev.KV.Key, ModRev: ev.KV.ModRev}, Prev: ev.Prev, Wid: ev.Wid}
}

// filterChange returns ch's events evs (all of ch or a subset) as a watcher
// with f receives them, or nil when none is left.
func filterChange(ch *Change, evs []store.Event, f Filter) *Change {
	out := filterEvents(evs, f)
	if len(out) == 0 {
		return nil
	}
	return &Change{Rev: ch.Rev, Time: ch.Time, Events: out, Filtered: true}
}

// filteredLocked returns ch as the watchers with f receive it, evaluated
// once per notify and shared by them (nil: they receive nothing).
func (r *room) filteredLocked(ch *Change, f Filter) *Change {
	if c, ok := r.proj[f]; ok {
		return c
	}
	if r.proj == nil {
		r.proj = make(map[Filter]*Change)
	}
	c := filterChange(ch, ch.Events, f)
	r.proj[f] = c
	return c
}

// filterItems keeps the items that pass f (in place).
func filterItems(items []store.KV, f Filter) []store.KV {
	out := items[:0]
	for _, kv := range items {
		if f.Match(kv.Key, kv.Value) {
			out = append(out, kv)
		}
	}
	clear(items[len(out):])
	return out
}

// coalesced is the latest event of one key while a watcher was parked,
// and (filtered) whether the key was in the watcher's view before.
type coalesced struct {
	ev    store.Event
	wasIn bool
}

// coalescedEvents returns what a watcher with f (nil: none) receives of
// the keys' latest events: for a filter, a put if the latest value
// matches, else a leave if the key was in the view, else nothing.
func coalescedEvents(cs []coalesced, f Filter) []store.Event {
	evs := make([]store.Event, 0, len(cs))
	for _, c := range cs {
		switch {
		case f == nil:
			evs = append(evs, c.ev)
		case c.ev.Type == store.OpPut && f.Match(c.ev.KV.Key, c.ev.KV.Value):
			evs = append(evs, c.ev)
		case c.wasIn:
			evs = append(evs, leaveOf(c.ev))
		}
	}
	return evs
}
