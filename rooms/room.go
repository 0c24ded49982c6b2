package rooms

import (
	"sync"
	"time"
	"weak"

	"github.com/google/btree"
	"github.com/statecast/statecast/store"
)

// room is one room's state on this node: the view at head, the history
// ring and the watchers. It list-then-watches the store: Follow first
// (buffering), then one Snapshot and History read, then the buffered tail.
// Lock order: docs/LOCKS.md.
type room struct {
	e      *Engine
	name   string
	loaded chan struct{} // closed when loading ended; then loadErr is set

	loadErr error

	mu        sync.Mutex
	loading   bool
	pending   []store.Batch // tail batches that arrived while loading
	stop      func()        // ends the store Follow
	closed    bool
	epoch     string
	head      uint64
	view      *btree.BTreeG[store.KV]
	hist      *history
	idx       *index
	watchers  map[*Watcher]struct{}
	victims   []*Watcher                         // overflowed during the current notify
	proj      map[string]*Change                 // the current notify's Change per filter text (filteredLocked)
	vals      eventValues                        // the current notify's decoded values (filteredLocked)
	memos     map[memoID]*snapMemo               // filtered snapshots' memos (snapMemo)
	snaps     map[snapKey]weak.Pointer[Snapshot] // snapshots being sent (sharedSnapLocked)
	filters   map[string]int                     // the watchers' distinct filters, and how many hold each
	slow      map[string]time.Time               // filters over Config.FilterTimeBudget, refused until then
	strikes   map[string]int                     // changes in a row a filter took longer than the budget
	ended     []*Watcher                         // their watchers met during the current notify
	idleSince time.Time                          // when the last watcher left
	progAt    time.Time                          // last progress sweep
	waiters   []*posWaiter                       // reads and writes waiting for the view to reach a store position
}

// posWaiter is a read or an acknowledged write waiting for the view to
// reach a store position; applyLocked (or the room's shutdown) closes ch.
type posWaiter struct {
	epoch string
	rev   uint64
	ch    chan struct{}
}

// reachedLocked reports whether the view holds store position
// (epoch, rev). Epoch "" is a room the store holds nothing of: an empty
// view at revision 0 is it.
func (r *room) reachedLocked(epoch string, rev uint64) bool {
	if epoch == "" {
		return r.head == 0 && rev == 0
	}
	return r.epoch == epoch && r.head >= rev
}

// releaseLocked wakes the waiters whose position the view has reached.
func (r *room) releaseLocked() {
	kept := r.waiters[:0]
	for _, w := range r.waiters {
		if r.reachedLocked(w.epoch, w.rev) {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	clear(r.waiters[len(kept):])
	r.waiters = kept
}

// dropWaiterLocked forgets w (its caller gave up).
func (r *room) dropWaiterLocked(w *posWaiter) {
	for i, x := range r.waiters {
		if x == w {
			r.waiters = append(r.waiters[:i], r.waiters[i+1:]...)
			return
		}
	}
}

func kvLess(a, b store.KV) bool { return a.Key < b.Key }

func newRoom(e *Engine, name string) *room {
	return &room{
		e: e, name: name, loaded: make(chan struct{}), loading: true,
		view: btree.NewG(32, kvLess), idx: newIndex(),
		watchers: make(map[*Watcher]struct{}), idleSince: time.Now(),
	}
}

// onBatch is the store's Follow callback; it runs under the store's
// follower lock, which is why room code never calls the store under mu.
func (r *room) onBatch(b store.Batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
	case r.loading:
		r.pending = append(r.pending, b)
	default:
		r.applyLocked(b)
	}
}

// applyLocked moves the view to b, strictly in revision order: older
// batches are duplicates and dropped; a gap or another epoch means this
// view can no longer be trusted, so the room resets and its watchers
// resume on a fresh one.
func (r *room) applyLocked(b store.Batch) {
	if b.Epoch != r.epoch || b.Rev > r.head+1 {
		r.e.cfg.Logger.Warn("rooms: store tail out of order; resetting room",
			"room", r.name, "epoch", r.epoch, "head", r.head, "got_epoch", b.Epoch, "got_rev", b.Rev)
		r.shutdownLocked(ErrRoomReset)
		return
	}
	if b.Rev <= r.head {
		return
	}
	ch := &Change{Rev: b.Rev, Time: b.Time, Events: b.Events}
	for _, ev := range b.Events {
		if ev.Type == store.OpPut {
			r.view.ReplaceOrInsert(ev.KV)
		} else {
			r.view.Delete(ev.KV)
		}
	}
	r.head = b.Rev
	if prep := r.e.cfg.Prepare; prep != nil {
		prep(ch)
	}
	r.hist.push(ch)
	r.notifyLocked(ch)
	if len(r.waiters) > 0 {
		r.releaseLocked()
	}
}

// notifyLocked hands ch to every live watcher it matches: the whole
// Change (shared, encoded once) when all its events match, else the
// matching subset. Overflowing watchers are parked afterwards, not while
// the index is being walked.
func (r *room) notifyLocked(ch *Change) {
	if len(ch.Events) == 1 {
		r.idx.match(ch.Events[0].KV.Key, func(w *Watcher) {
			if w.filter == nil {
				r.deliverLocked(w, ch)
			} else if c := r.filteredLocked(ch, w.filter); r.slowLocked(w) {
				return
			} else if c != nil {
				r.deliverLocked(w, c)
			}
		})
	} else {
		var subsets map[*Watcher][]store.Event
		for _, ev := range ch.Events {
			r.idx.match(ev.KV.Key, func(w *Watcher) {
				if subsets == nil {
					subsets = make(map[*Watcher][]store.Event)
				}
				subsets[w] = append(subsets[w], ev)
			})
		}
		for w, evs := range subsets {
			c := ch
			switch {
			case w.filter != nil && len(evs) == len(ch.Events):
				c = r.filteredLocked(ch, w.filter)
			case w.filter != nil:
				c = r.filteredPartLocked(ch, evs, w.filter)
			case len(evs) != len(ch.Events):
				c = &Change{Rev: ch.Rev, Time: ch.Time, Events: evs}
			}
			if w.filter != nil && r.slowLocked(w) {
				continue
			}
			if c != nil {
				r.deliverLocked(w, c)
			}
		}
	}
	clear(r.proj)
	r.vals.reset(nil)
	if len(r.victims) > 0 {
		r.parkVictimsLocked()
	}
	if len(r.ended) > 0 {
		r.endSlowLocked()
	}
}

// goLiveLocked puts w in the index at head: it receives every later event.
func (r *room) goLiveLocked(w *Watcher) {
	w.state, w.next = stLive, r.head+1
	r.indexLocked(w)
}

func (r *room) indexLocked(w *Watcher) {
	for k := range w.prefixes {
		r.idx.add(w, k)
	}
}

func (r *room) unindexLocked(w *Watcher) {
	for k := range w.prefixes {
		r.idx.remove(w, k)
	}
}

// removeLocked takes w out of the room.
func (r *room) removeLocked(w *Watcher) {
	if w.state == stLive {
		r.unindexLocked(w)
	}
	delete(r.watchers, w)
	r.dropMemoLocked(w)
	r.dropFilterLocked(w)
	if len(r.watchers) == 0 {
		r.idleSince = time.Now()
	}
}

// startLocked places a new watcher per the revision contract.
func (r *room) startLocked(w *Watcher, opts WatchOptions) error {
	if w.filter != nil && r.filters[w.filter.String()] == 0 && len(r.filters) >= r.e.cfg.MaxFilters {
		return ErrTooManyFilters
	}
	if w.filter != nil && r.bannedLocked(w.filter.String()) {
		return ErrFilterTooSlow
	}
	r.hist.expire(time.Now())
	from := opts.From
	switch {
	case from == nil:
		w.state, w.reason = stSnapshot, ReasonInitial
	case from.Epoch != "" && from.Epoch != r.epoch:
		if opts.FailIfCompacted {
			return ErrEpochMismatch
		}
		w.state, w.reason = stSnapshot, ReasonEpoch
	case from.Rev < r.hist.oldest:
		if opts.FailIfCompacted {
			return &store.CompactedError{Oldest: r.hist.oldest}
		}
		w.state, w.reason = stSnapshot, ReasonCompacted
	case from.Rev <= r.head:
		w.state, w.next = stReplay, from.Rev
	default: // live at head+1, or waiting for a future revision
		w.state, w.next = stLive, from.Rev
		r.indexLocked(w)
		if from.Rev == r.head+1 {
			w.push(Message{Kind: KindSynced, Rev: r.head})
		}
	}
	r.watchers[w] = struct{}{}
	r.addFilterLocked(w)
	w.signal()
	return nil
}

// progressLocked gives every live watcher that got nothing since the last
// sweep a progress mark at head, when that moves its resume point.
func (r *room) progressLocked() {
	for w := range r.watchers {
		if w.state == stLive && !w.active && r.head >= w.next && len(w.q) < r.e.cfg.QueueLimit {
			w.push(Message{Kind: KindProgress, Rev: r.head})
			w.next = r.head + 1
			if len(w.q) == 1 {
				w.signal()
			}
		}
		w.active = false
	}
}

// shutdownLocked closes the room and ends its watchers with err. The
// store Follow stays registered (onBatch ignores a closed room) until
// whoever removes the room from the engine runs takeStopLocked's result.
func (r *room) shutdownLocked(err error) {
	r.closed = true
	for w := range r.watchers {
		w.end(err)
	}
	clear(r.watchers)
	clear(r.filters)
	for _, pw := range r.waiters { // they look again, on a fresh room
		close(pw.ch)
	}
	r.waiters = nil
	r.idx = newIndex()
	if r.hist != nil { // give its memory back now, not when the room is collected
		r.hist.clear(r.head + 1)
	}
}

// takeStopLocked returns the store Follow's stop (once) for the caller to
// run after unlocking: the store may be calling onBatch under its own lock.
func (r *room) takeStopLocked() func() {
	stop := r.stop
	r.stop = nil
	if stop == nil {
		return func() {}
	}
	return stop
}

// collect returns the items of view under any of prefixes, sorted by key.
func collect(view *btree.BTreeG[store.KV], prefixes []string) []store.KV {
	var items []store.KV
	if len(prefixes) == 1 && prefixes[0] == "" {
		items = make([]store.KV, 0, view.Len()) // the whole room: no copies while it grows
	}
	for _, p := range prefixes { // sorted, disjoint: items come out sorted
		ascend(view, p, func(kv store.KV) bool {
			items = append(items, kv)
			return true
		})
	}
	return items
}
