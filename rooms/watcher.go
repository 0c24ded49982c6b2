package rooms

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"

	"github.com/statecast/statecast/store"
)

// Position is where a watch resumes: an epoch and the first revision the
// watcher has not seen (last revision + 1).
type Position struct {
	Epoch string // "" accepts the room's current epoch
	Rev   uint64
}

// WatchOptions says what a watch covers and where it starts.
type WatchOptions struct {
	// Prefixes selects the keys; none (and no Keys) means the whole room.
	Prefixes []string
	// Keys selects these exact keys too: a key that merely starts with
	// one is not sent (the watcher index finds their watchers with one
	// lookup, however many watch other keys).
	Keys []string
	// Filter, when set, narrows the keys to those whose value passes it
	// (see Filter for what the watcher then receives).
	Filter Filter
	// From resumes at a position. Nil means a snapshot, then live events
	// (list-then-watch in one call).
	From *Position
	// FailIfCompacted makes Watch return a *store.CompactedError (or
	// ErrEpochMismatch) instead of falling back to a snapshot.
	FailIfCompacted bool
	// Exact makes a watcher that falls behind replay every revision it
	// missed from the history, as an etcd watch must, instead of being
	// caught up by one coalesced message or a snapshot; when the history
	// no longer holds them it ends with a *store.CompactedError.
	Exact bool
	// Notify, when set, is called instead of signalling Ready whenever the
	// watcher may have messages. It runs under the room's lock and must
	// not block (a non-blocking send on a connection's channel, say).
	Notify func()
}

type wstate uint8

const (
	stLive     wstate = iota // in the index: events are queued as they commit
	stReplay                 // replaying history from next, then synced
	stParked                 // was slow: coalesce (Exact: replay) from next once the queue drains
	stSnapshot               // gets a snapshot (reason) once the queue drains
	stClosed
)

// Watcher receives a room's changes for its prefixes. Its queue is
// bounded: a watcher that does not keep up is parked and later receives
// what it missed as one coalesced message (or a snapshot; an Exact one
// replays it from the history), so it never slows the writer or other
// watchers.
//
// Drain and Next must be called from one goroutine at a time; Close and
// Ready may be called from any goroutine.
type Watcher struct {
	room     *room
	prefixes []string
	filter   Filter
	exact    bool      // WatchOptions.Exact
	memo     *snapMemo // its filtered snapshots' memo, once it took one
	pos      []int32   // position in the index bucket of each prefix
	notify   func()
	ready    chan struct{}
	buf      []Message // Next's unread messages

	// Guarded by room.mu.
	state  wstate
	reason Reason     // why, in stSnapshot
	next   uint64     // first revision not yet handed over
	q      []Message  // in qbuf's buffer while not empty (push)
	qbuf   *[]Message // from queues while q holds something
	qbytes int64      // changeBytes of the events in q
	active bool       // something was queued since the last progress tick
	err    error
}

// Ready is signalled when the watcher may have messages to Drain. It is
// nil when WatchOptions.Notify was set.
func (w *Watcher) Ready() <-chan struct{} { return w.ready }

// Prefixes returns the watcher's key prefixes (normalized: none is a
// prefix of another, nor of one of its Keys).
func (w *Watcher) Prefixes() []string {
	return slices.DeleteFunc(slices.Clone(w.prefixes), func(p string) bool { _, ok := selectorKey(p); return ok })
}

// Keys returns the exact keys the watcher selects besides its Prefixes.
func (w *Watcher) Keys() []string {
	var keys []string
	for _, p := range w.prefixes {
		if k, ok := selectorKey(p); ok {
			keys = append(keys, k)
		}
	}
	return keys
}

// Filter returns the watcher's filter, nil for none.
func (w *Watcher) Filter() Filter { return w.filter }

func (w *Watcher) signal() {
	if w.notify != nil {
		w.notify()
		return
	}
	select {
	case w.ready <- struct{}{}:
	default:
	}
}

// queues holds the watchers' queue buffers: a watcher takes one when
// something is queued for it and gives it back when drained, so an idle
// watcher holds none and a busy one does not grow a new one from nothing
// after each drain (at 1,000 sockets, 5-6 % of the node's CPU went to
// growing them and 6-7 % to collecting them).
var queues = sync.Pool{New: func() any { return new([]Message) }}

const (
	// queueFirst is the room a new queue buffer has: a write to a room of
	// 100,000 idle watchers (whose buffers the collector has taken back)
	// queues one message each, and 64 entries (5 KiB) each made that one
	// write allocate 500 MB. A busy watcher's buffer grows by append and
	// is pooled at the size it grew to.
	queueFirst = 4
	queueKeep  = 1024 // a buffer grown past this by a burst is not pooled
)

// push queues m. Called with the room's lock held.
func (w *Watcher) push(m Message) {
	if w.qbuf == nil {
		w.qbuf = queues.Get().(*[]Message)
		w.q = (*w.qbuf)[:0]
		if cap(w.q) == 0 {
			w.q = make([]Message, 0, queueFirst)
		}
	}
	w.q = append(w.q, m)
}

// releaseQueue empties the queue and gives its buffer back. Called with
// the room's lock held.
func (w *Watcher) releaseQueue() {
	if w.qbuf == nil {
		return
	}
	clear(w.q) // the changes and snapshots it held can be collected
	*w.qbuf = nil
	if cap(w.q) <= queueKeep {
		*w.qbuf = w.q[:0]
	}
	queues.Put(w.qbuf)
	w.q, w.qbuf = nil, nil
}

// Drain appends the watcher's available messages to dst without blocking.
// When it returns no messages and a nil error, wait for Ready (or Notify)
// and call it again. A non-nil error means the watcher has ended; every
// message queued before the end has been returned by then.
func (w *Watcher) Drain(dst []Message) ([]Message, error) {
	r := w.room
	r.mu.Lock()
	if len(w.q) > 0 {
		dst = append(dst, w.q...)
		w.qbytes = 0
		w.releaseQueue()
		if w.state != stLive {
			w.signal() // catch-up or end follows on the next call
		}
		r.mu.Unlock()
		return dst, nil
	}
	switch w.state {
	case stClosed:
		r.mu.Unlock()
		return dst, w.err
	case stReplay:
		dst = r.replayLocked(w, dst)
	case stParked:
		if w.exact {
			w.state = stReplay
			dst = r.replayLocked(w, dst)
		} else {
			dst = r.coalesceLocked(w, dst)
		}
	}
	if w.state != stSnapshot {
		r.mu.Unlock()
		return dst, nil
	}
	// Clone the view under the lock (copy-on-write, O(1)) and collect the
	// items after releasing it, so a large snapshot never stalls writers.
	view, rev, epoch, reason := r.view.Clone(), r.head, r.epoch, w.reason
	var memo *snapMemo
	if w.filter != nil {
		memo = r.memoLocked(w)
	}
	snap := r.sharedSnapLocked(w, epoch, rev)
	r.goLiveLocked(w)
	r.mu.Unlock()
	snapshotOf(snap, view, w, memo, epoch, rev)
	return append(dst, Message{Kind: KindSnapshot, Rev: rev, Epoch: epoch, Reason: reason, Items: snap.Items(), Snap: snap}), nil
}

// Next returns the next message, waiting for one until ctx is done. It
// needs Ready, so it cannot be used with WatchOptions.Notify.
func (w *Watcher) Next(ctx context.Context) (Message, error) {
	for len(w.buf) == 0 {
		msgs, err := w.Drain(nil)
		if err != nil {
			return Message{}, err
		}
		if len(msgs) > 0 {
			w.buf = msgs
			break
		}
		if w.ready == nil {
			return Message{}, errors.New("rooms: Next needs a watcher without Notify")
		}
		select {
		case <-w.ready:
		case <-ctx.Done():
			return Message{}, ctx.Err()
		}
	}
	m := w.buf[0]
	w.buf[0] = Message{}
	w.buf = w.buf[1:]
	return m, nil
}

// Close ends the watcher and releases its place in the room. It is safe
// to call more than once.
func (w *Watcher) Close() {
	r := w.room
	r.mu.Lock()
	defer r.mu.Unlock()
	if w.state != stClosed {
		r.removeLocked(w)
		w.end(ErrWatcherClosed)
	}
	w.releaseQueue() // nobody drains a closed watcher
	w.qbytes = 0
}

// end moves w to stClosed with err; queued messages stay deliverable.
func (w *Watcher) end(err error) {
	w.state, w.err = stClosed, err
	w.signal()
}

// deliverLocked queues ch for w, or marks w as a victim when its queue is
// full, in messages or in bytes. It never blocks.
func (r *room) deliverLocked(w *Watcher, ch *Change) {
	if ch.Rev < w.next { // waiting for a future revision
		return
	}
	n := changeBytes(ch)
	if len(w.q) >= r.e.cfg.QueueLimit || (len(w.q) > 0 && w.qbytes+n > r.e.cfg.QueueBytes) {
		r.victims = append(r.victims, w)
		return
	}
	w.push(Message{Kind: KindEvents, Rev: ch.Rev, Change: ch})
	w.qbytes += n
	w.next, w.active = ch.Rev+1, true
	if len(w.q) == 1 {
		w.signal()
	}
}

// parkVictimsLocked takes the watchers whose queue overflowed during the
// last notify out of the index; they catch up by coalescing from the first
// revision they missed (etcd's victims, plus latest-value-per-key).
func (r *room) parkVictimsLocked() {
	for _, w := range r.victims {
		if w.state != stLive {
			continue
		}
		r.unindexLocked(w)
		w.state, w.next = stParked, r.head // the revision that did not fit
		w.signal()
	}
	clear(r.victims)
	r.victims = r.victims[:0]
}

// replayLocked appends up to ReplayChunk revisions of history from w.next;
// at the head it appends the synced marker and puts w live.
func (r *room) replayLocked(w *Watcher, dst []Message) []Message {
	h := r.hist
	if w.next < h.oldest {
		if w.exact {
			r.removeLocked(w)
			w.end(&store.CompactedError{Oldest: h.oldest})
			return dst
		}
		w.state, w.reason = stSnapshot, ReasonCompacted
		return dst
	}
	var (
		cur     *Change
		nsel    int // events of cur that match
		emitted int
	)
	prefixes := w.prefixes
	flush := func() {
		if cur == nil {
			return
		}
		ch := cur
		if nsel != len(cur.Events) { // part of a transaction matches
			evs := make([]store.Event, 0, nsel)
			for _, ev := range cur.Events {
				if matchesAny(ev.KV.Key, prefixes) {
					evs = append(evs, ev)
				}
			}
			ch = &Change{Rev: cur.Rev, Time: cur.Time, Events: evs}
		}
		if w.filter != nil {
			ch = filterChange(ch, ch.Events, w.filter)
		}
		if ch != nil {
			dst = append(dst, Message{Kind: KindEvents, Rev: ch.Rev, Change: ch})
		}
		emitted++ // a revision the filter drops cost its evaluation too
		cur, nsel = nil, 0
	}
	first := h.find(w.next)
	a, b := h.segments(first)
	ha, hb := h.headSegments(first)
	f := newHeadFilter(prefixes)
	single := len(prefixes) == 1
	want, mask := f.want[0], f.mask[0]
	for k, seg := range [2][]slot{a, b} {
		heads := [2][]uint64{ha, hb}[k][:len(seg)]
		for i, hd := range heads {
			if single { // the common case, kept to one compare per event
				if hd&mask != want {
					continue
				}
			} else if !f.pass(hd) {
				continue
			}
			s := &seg[i]
			if !f.exact && !matchesAny(s.key, prefixes) {
				continue
			}
			if s.ch != cur {
				flush()
				if emitted >= r.e.cfg.ReplayChunk {
					w.next = s.ch.Rev
					w.signal() // more to replay on the next call
					if n := len(dst); w.filter != nil && (n == 0 || dst[n-1].Rev < w.next-1) {
						// What the filter dropped left the view as it was: say
						// so, so the resume point moves and Drain returns something.
						dst = append(dst, Message{Kind: KindProgress, Rev: w.next - 1})
					}
					return dst
				}
				cur = s.ch
			}
			nsel++
		}
	}
	flush()
	r.goLiveLocked(w)
	return append(dst, Message{Kind: KindSynced, Rev: r.head})
}

// coalesceLocked appends one message with the latest event per key that
// w missed since it was parked, or moves it to a snapshot when history no
// longer covers that or it spans more than CoalesceLimit keys. A
// catch-up of more than QueueBytes is a snapshot too where that costs no
// more: one of this position another watcher took is still held (a burst
// that parked many sockets, caught up at its end), or the catch-up holds
// half the room's keys. A coalesced message is encoded for its watcher
// alone and held while its socket is slow; a snapshot's encoding is
// shared by the watchers that take it at the same position.
func (r *room) coalesceLocked(w *Watcher, dst []Message) []Message {
	h := r.hist
	if w.next < h.oldest {
		w.state, w.reason = stSnapshot, ReasonSlow
		return dst
	}
	pos := make(map[string]int)
	var cs []coalesced
	a, b := h.segments(h.find(w.next))
	for _, seg := range [2][]slot{a, b} {
		for i := range seg {
			s := &seg[i]
			if !matchesAny(s.key, w.prefixes) {
				continue
			}
			if j, ok := pos[s.key]; ok {
				cs[j].ev = eventOf(s)
				continue
			}
			if len(cs) >= r.e.cfg.CoalesceLimit {
				w.state, w.reason = stSnapshot, ReasonSlow
				return dst
			}
			pos[s.key] = len(cs)
			ev := eventOf(s)
			// The first event of a key since w.next: its Prev is what w holds.
			cs = append(cs, coalesced{ev: ev, wasIn: w.filter != nil && matchesKV(w.filter, ev.Prev)})
		}
	}
	evs := coalescedEvents(cs, w.filter)
	if len(evs) > 1 && sentBytes(evs) > r.e.cfg.QueueBytes &&
		(r.snapHeldLocked(w, r.epoch, r.head) || 2*len(evs) >= r.view.Len()) {
		w.state, w.reason = stSnapshot, ReasonSlow
		return dst
	}
	// Latest writes last, so a client applying them in order sees the
	// same revision order as the room.
	slices.SortFunc(evs, func(x, y store.Event) int { return cmpRev(x.KV.ModRev, y.KV.ModRev) })
	r.goLiveLocked(w)
	if len(evs) == 0 {
		return append(dst, Message{Kind: KindProgress, Rev: r.head})
	}
	return append(dst, Message{Kind: KindCoalesced, Rev: r.head,
		Change: &Change{Rev: r.head, Events: evs, Filtered: w.filter != nil}})
}

// sentBytes is what evs take on the wire at least: keys, values and
// leases (previous values only go to subscriptions that ask for them).
func sentBytes(evs []store.Event) int64 {
	var n int64
	for i := range evs {
		n += int64(len(evs[i].KV.Key) + len(evs[i].KV.Value) + len(evs[i].KV.Lease))
	}
	return n
}

func cmpRev(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// eventOf returns the event a history slot stands for.
func eventOf(s *slot) store.Event {
	evs := s.ch.Events
	if len(evs) == 1 {
		return evs[0]
	}
	for i := range evs {
		if evs[i].KV.Key == s.key {
			return evs[i]
		}
	}
	panic("rooms: history slot without its event")
}

// normalizePrefixes returns the selectors of prefixes and exact keys,
// sorted and deduped, without any covered by a shorter prefix, so a key
// matches at most one selector of a watcher.
func normalizePrefixes(prefixes, keys []string) []string {
	if len(prefixes) == 0 && len(keys) == 0 {
		return []string{""}
	}
	ps := slices.Clone(prefixes)
	for _, k := range keys {
		ps = append(ps, exactSelector(k))
	}
	slices.Sort(ps)
	out := ps[:0]
	for _, p := range ps {
		if len(out) > 0 && strings.HasPrefix(p, out[len(out)-1]) {
			continue
		}
		out = append(out, p)
	}
	return slices.Clip(out)
}
