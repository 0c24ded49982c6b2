package rooms

import (
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/google/btree"

	"github.com/statecast/statecast/store"
)

// Filter selects the keys of a filtered watch by their value (rooms/filter
// compiles CEL expressions into one). Watchers whose filters have the same
// String share its evaluation: each event is evaluated once per distinct
// filter text, however many watchers hold it, so String must name the
// selection exactly (the expression). Match must be safe for concurrent
// use and deterministic. A room serves at most Config.MaxFilters distinct
// filters at once.
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
	String() string
}

// ValueFilter is a Filter that also evaluates a value already decoded by
// encoding/json (into an any), as rooms/filter's CEL filters do. A notify
// decodes each event's value once and hands it to every distinct
// ValueFilter, instead of each filter decoding it again.
type ValueFilter interface {
	Filter
	MatchValue(key string, value any) bool
}

// matchesKV reports whether kv (nil: no key) passes f.
func matchesKV(f Filter, kv *store.KV) bool {
	return kv != nil && f.Match(kv.Key, kv.Value)
}

// eventValues evaluates filters on the events of one Change, decoding each
// value (the new one and the previous one) at most once for all of them,
// and evaluating each filter on each at most once, whichever watchers
// (whole Change or part of a transaction) ask.
type eventValues struct {
	took time.Duration // in the filters' evaluations, decoding aside
	evs  []store.Event
	dec  []decoded         // two per event: its value, then its previous value
	res  map[string][]int8 // per filter text, two per event: 1 passed, -1 not, 0 not yet asked
}

type decoded struct {
	v        any
	done, ok bool
}

// reset points d at evs, forgetting the values decoded so far.
func (d *eventValues) reset(evs []store.Event) {
	clear(d.dec)
	clear(d.res)
	d.evs = evs
	if n := 2 * len(evs); cap(d.dec) >= n {
		d.dec = d.dec[:n]
	} else {
		d.dec = make([]decoded, n)
	}
}

// match reports whether event i's value (prev: its previous value, if
// any) passes f.
func (d *eventValues) match(f Filter, i int, prev bool) bool {
	res := d.res[f.String()]
	if res == nil {
		if d.res == nil {
			d.res = make(map[string][]int8)
		}
		res = make([]int8, 2*len(d.evs))
		d.res[f.String()] = res
	}
	slot := 2 * i
	if prev {
		slot++
	}
	if res[slot] == 0 {
		res[slot] = -1
		if d.eval(f, i, prev) {
			res[slot] = 1
		}
	}
	return res[slot] == 1
}

func (d *eventValues) eval(f Filter, i int, prev bool) bool {
	kv, slot := &d.evs[i].KV, 2*i
	if prev {
		kv, slot = d.evs[i].Prev, slot+1
		if kv == nil {
			return false
		}
	}
	vf, ok := f.(ValueFilter)
	var x *decoded
	if ok {
		x = &d.dec[slot]
		if !x.done {
			x.done = true
			x.ok = json.Unmarshal(kv.Value, &x.v) == nil
		}
	}
	start := time.Now()
	var pass bool
	if ok && x.ok {
		pass = vf.MatchValue(kv.Key, x.v)
	} else {
		pass = f.Match(kv.Key, kv.Value) // not JSON: f says no (and counts it)
	}
	d.took += time.Since(start)
	return pass
}

// filterEvents returns d's events (only those in sel, when not nil: a
// subsequence of them) as a watcher with f sees them: puts of matching
// values, leaves of keys that matched before, and nothing else.
func filterEvents(d *eventValues, f Filter, sel []store.Event) []store.Event {
	var out []store.Event
	j := 0
	for i, ev := range d.evs {
		if sel != nil {
			if j == len(sel) || sel[j].KV.Key != ev.KV.Key {
				continue // keys are unique in a revision
			}
			j++
		}
		if ev.Type == store.OpPut && d.match(f, i, false) {
			out = append(out, ev)
		} else if d.match(f, i, true) {
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
	var d eventValues
	d.reset(evs)
	return filteredChange(ch, &d, f, nil)
}

func filteredChange(ch *Change, d *eventValues, f Filter, sel []store.Event) *Change {
	out := filterEvents(d, f, sel)
	if len(out) == 0 {
		return nil
	}
	return &Change{Rev: ch.Rev, Time: ch.Time, Events: out, Filtered: true}
}

// filteredLocked returns ch as the watchers with f receive it, evaluated
// once per notify and shared by them (nil: they receive nothing); the
// events' values are decoded once for all the filters (r.vals).
func (r *room) filteredLocked(ch *Change, f Filter) *Change {
	if c, ok := r.proj[f.String()]; ok {
		return c
	}
	if r.proj == nil {
		r.proj = make(map[string]*Change)
	}
	if r.bannedLocked(f.String()) {
		r.proj[f.String()] = nil
		return nil
	}
	d := r.valuesLocked(ch)
	took := d.took
	c := filteredChange(ch, d, f, nil)
	r.proj[f.String()] = c
	r.timedLocked(f, d.took-took)
	return c
}

// filteredPartLocked is filteredLocked for the events evs of ch that a
// watcher's prefixes select (part of a transaction): its own Change, from
// the evaluations shared with the other watchers of f.
func (r *room) filteredPartLocked(ch *Change, evs []store.Event, f Filter) *Change {
	if r.bannedLocked(f.String()) {
		return nil
	}
	d := r.valuesLocked(ch)
	took := d.took
	c := filteredChange(ch, d, f, evs)
	r.timedLocked(f, d.took-took)
	return c
}

// FilterBanTime is how long a room refuses a filter that went over
// Config.FilterTimeBudget.
const FilterBanTime = 10 * time.Second

// FilterStrikes is how many changes in a row a filter's evaluations must
// take longer than Config.FilterTimeBudget to be banned: a wall clock
// also counts the time the evaluating goroutine waited for a CPU, which
// on a loaded machine may once take longer than any filter.
const FilterStrikes = 3

// timedLocked bans f from the room when its evaluations took longer than
// the budget for FilterStrikes changes in a row.
func (r *room) timedLocked(f Filter, took time.Duration) {
	b := r.e.cfg.FilterTimeBudget
	if b < 0 {
		return
	}
	k := f.String()
	if took <= b {
		delete(r.strikes, k)
		return
	}
	if r.strikes == nil {
		r.strikes = make(map[string]int)
	}
	if r.strikes[k]++; r.strikes[k] < FilterStrikes {
		return
	}
	delete(r.strikes, k)
	if r.slow == nil {
		r.slow = make(map[string]time.Time)
	}
	r.slow[k] = time.Now().Add(FilterBanTime)
}

// bannedLocked reports whether the room refuses the filter text.
func (r *room) bannedLocked(text string) bool {
	until, ok := r.slow[text]
	if ok && time.Now().After(until) {
		delete(r.slow, text)
		return false
	}
	return ok
}

// slowLocked reports whether w's filter is banned, and then notes w to
// be ended once the notify is done (it may not leave the index while the
// notify walks it).
func (r *room) slowLocked(w *Watcher) bool {
	if _, ok := r.slow[w.filter.String()]; !ok {
		return false
	}
	r.ended = append(r.ended, w)
	return true
}

// endSlowLocked ends the watchers noted by slowLocked.
func (r *room) endSlowLocked() {
	for _, w := range r.ended {
		if w.state != stClosed {
			r.removeLocked(w)
			w.end(ErrFilterTooSlow)
		}
	}
	clear(r.ended)
	r.ended = r.ended[:0]
}

// valuesLocked returns the current notify's eventValues, over ch.
func (r *room) valuesLocked(ch *Change) *eventValues {
	if len(r.vals.evs) == 0 {
		r.vals.reset(ch.Events)
	}
	return &r.vals
}

// addFilterLocked counts w's filter among the room's distinct filters
// (startLocked checked Config.MaxFilters).
func (r *room) addFilterLocked(w *Watcher) {
	if w.filter == nil {
		return
	}
	if r.filters == nil {
		r.filters = make(map[string]int)
	}
	r.filters[w.filter.String()]++
}

// dropFilterLocked takes w's filter out of the count.
func (r *room) dropFilterLocked(w *Watcher) {
	if w.filter == nil {
		return
	}
	k := w.filter.String()
	if r.filters[k]--; r.filters[k] <= 0 {
		delete(r.filters, k)
	}
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

// snapMemo remembers, for the snapshots of one filter over one set of
// prefixes in a room, which keys passed the filter in the view at rev, so
// that a later snapshot evaluates only the keys written since (a key's
// mod_rev says which value it holds): 1,000 subscribers of a filter
// connecting to a 50,000-key room cost one pass of 50,000 evaluations and
// then lookups, not 50 million evaluations. Its watchers share it from
// their first snapshot until they leave the room.
type snapMemo struct {
	id    memoID
	users int // watchers holding it, under the room's mu

	mu    sync.Mutex
	epoch string
	rev   uint64              // 0: nothing known yet
	in    map[string]struct{} // the keys that passed at rev (and some deleted since)
}

type memoID struct {
	filter, prefixes string
}

// memoLocked returns w's snapshot memo, taking a share of it.
func (r *room) memoLocked(w *Watcher) *snapMemo {
	if w.memo != nil {
		return w.memo
	}
	id := memoID{w.filter.String(), strings.Join(w.prefixes, "\x00")}
	m := r.memos[id]
	if m == nil {
		if r.memos == nil {
			r.memos = make(map[memoID]*snapMemo)
		}
		m = &snapMemo{id: id}
		r.memos[id] = m
	}
	m.users++
	w.memo = m
	return m
}

// dropMemoLocked gives up w's share of its memo.
func (r *room) dropMemoLocked(w *Watcher) {
	if m := w.memo; m != nil {
		w.memo = nil
		if m.users--; m.users == 0 {
			delete(r.memos, m.id)
		}
	}
}

// snapshot returns the items of view (the room at epoch and rev) under
// the memo's prefixes that pass f, sorted; it walks the view itself
// rather than a copy of every item, as most do not pass.
func (m *snapMemo) snapshot(view *btree.BTreeG[store.KV], prefixes []string, f Filter, epoch string, rev uint64) []store.KV {
	m.mu.Lock()
	defer m.mu.Unlock()
	if epoch != m.epoch {
		m.epoch, m.rev, m.in = epoch, 0, nil
	}
	if rev < m.rev { // older than what the memo knows: no help
		return filterItems(collect(view, prefixes), f)
	}
	if m.in == nil {
		m.in = make(map[string]struct{})
	}
	var out []store.KV
	for _, p := range prefixes { // sorted, disjoint: items come out sorted
		ascend(view, p, func(kv store.KV) bool {
			var pass bool
			if kv.ModRev <= m.rev {
				_, pass = m.in[kv.Key]
			} else if pass = f.Match(kv.Key, kv.Value); pass {
				m.in[kv.Key] = struct{}{}
			} else {
				delete(m.in, kv.Key)
			}
			if pass {
				out = append(out, kv)
			}
			return true
		})
	}
	m.rev = rev
	// Deleted keys stay in the memo: start afresh from this snapshot's
	// keys when they may outnumber them.
	if len(m.in) > 2*len(out)+1024 {
		m.in = make(map[string]struct{}, len(out))
		for _, kv := range out {
			m.in[kv.Key] = struct{}{}
		}
	}
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
