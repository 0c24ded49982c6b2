package rooms

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/btree"

	"github.com/statecast/statecast/store"
)

// Engine serves rooms from memory on one node. A room is loaded on first
// use with one snapshot and one history read from the store, however many
// watchers arrive, follows the store's tail from then on, and is unloaded
// once it has had no watchers for Config.IdleTimeout.
//
// All methods may be called concurrently. An Engine runs one goroutine
// (progress marks and unloading), which Close stops.
type Engine struct {
	st  store.Store
	cfg Config

	mu     sync.Mutex
	rooms  map[string]*room
	closed bool

	hist  budget        // retained history of every loaded room
	loads atomic.Uint64 // rooms loaded from the store (each a snapshot read)

	stopc chan struct{}
	wg    sync.WaitGroup

	// life is cancelled by Close: room loads run under it, not under the
	// context of the watcher that happened to start them.
	life   context.Context
	cancel context.CancelFunc
}

// loadTimeout bounds one room load (snapshot and history read), so a
// store that hangs fails the load and the next watcher tries again.
const loadTimeout = time.Minute

// New returns an Engine serving the rooms of st. The caller keeps owning
// st and closes it after the Engine.
func New(st store.Store, cfg Config) *Engine {
	e := &Engine{st: st, cfg: cfg.withDefaults(), rooms: make(map[string]*room), stopc: make(chan struct{})}
	e.life, e.cancel = context.WithCancel(context.Background())
	b := e.cfg.HistoryBytes
	e.hist = budget{limit: b, low: b - b/16, hard: b + b/8, kick: make(chan struct{}, 1)}
	e.wg.Add(2)
	go e.sweepLoop()
	go e.compactLoop()
	return e
}

// budget is the node-wide bound of retained history: the rooms' histories
// charge it under their own locks, the engine's compactor drains it.
type budget struct {
	used  atomic.Int64
	limit int64 // above it, the compactor drops the node's oldest history
	low   int64 // down to here, so it scans the rooms once per limit/16 written
	hard  int64 // above it, a room that commits drops its own oldest
	kick  chan struct{}
}

func (b *budget) charge(n int64) {
	if b == nil {
		return
	}
	if b.used.Add(n) > b.limit && n > 0 {
		select {
		case b.kick <- struct{}{}:
		default:
		}
	}
}

func (b *budget) aboveLow() bool { return b.used.Load() > b.low }
func (b *budget) overHard() bool { return b != nil && b.used.Load() > b.hard }

// HistoryBytes is what the retained history of the loaded rooms holds
// (see Config.HistoryBytes).
func (e *Engine) HistoryBytes() int64 { return e.hist.used.Load() }

func (e *Engine) compactLoop() {
	defer e.wg.Done()
	for {
		select {
		case <-e.stopc:
			return
		case <-e.hist.kick:
			e.compact()
		}
	}
}

// compact drops the node's oldest history until it is back under the
// budget, with a margin: the room whose oldest retained revision is the
// oldest pays first, down to the next room's oldest, and so on, so the
// history that goes is the one least likely to be resumed from; a resume
// from there gets a snapshot. It holds one room lock at a time and never
// Engine.mu with it.
func (e *Engine) compact() {
	for e.hist.aboveLow() {
		victim, next, found := store.OldestFirst(e.loadedRooms(), func(r *room) (time.Time, bool) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.closed || r.loading || r.hist == nil {
				return time.Time{}, false
			}
			return r.hist.oldestTime()
		})
		if !found {
			return
		}
		victim.mu.Lock()
		if !victim.closed {
			h := victim.hist
			for h.n > 0 && e.hist.aboveLow() {
				h.dropOldest()
				if t, ok := h.oldestTime(); ok && !next.IsZero() && t.After(next) {
					break
				}
			}
		}
		victim.mu.Unlock()
	}
}

// Compact drops this node's history of room below rev, etcd's Compact of
// one room: a watch or resume from an older revision then gets a
// snapshot, or a *store.CompactedError with FailIfCompacted. The store
// keeps its own history under its retention, so a node that loads the
// room afresh (another node, or this one after the room went idle) may
// replay those revisions again: compaction here frees this node's memory
// and makes the node's answers etcd's, it is not a promise about the
// store. rev past the head is ErrFutureRevision. It returns the head.
func (e *Engine) Compact(ctx context.Context, room string, rev uint64) (uint64, error) {
	if err := store.ValidRoom(room); err != nil {
		return 0, err
	}
	r, err := e.ready(ctx, room, ReadOptions{})
	if err != nil {
		return 0, err
	}
	defer r.mu.Unlock()
	if rev > r.head {
		return r.head, ErrFutureRevision
	}
	for r.hist.n > 0 && r.hist.oldest < rev {
		r.hist.dropOldest()
	}
	if len(r.watchers) == 0 {
		r.idleSince = time.Now()
	}
	return r.head, nil
}

// Apply commits w to room in the store. Watchers of the room on every
// node see it through the store's tail; here, before Apply returns.
//
// On a store whose tail lags its commits (store.Heads), Apply returns once
// this node's view of a loaded room holds the write (bounded by
// Config.SyncTimeout), so the writer's next read here, even serializable,
// and every watcher started after the reply see it.
func (e *Engine) Apply(ctx context.Context, room string, w store.Write) (store.Result, error) {
	if e.isClosed() {
		return store.Result{}, ErrClosed
	}
	if e.cfg.BeforeApply != nil {
		if err := e.cfg.BeforeApply(ctx, room); err != nil {
			return store.Result{}, err
		}
	}
	res, err := e.st.Apply(ctx, room, w)
	if _, lags := e.st.(store.Heads); err == nil && lags {
		e.awaitApplied(ctx, room, res)
	}
	return res, err
}

// awaitApplied waits until the view of room, when loaded here, holds res.
// A room not loaded has nothing to catch up: its load reads the store. Past
// the bound the write is still acknowledged (it committed); linearizable
// reads then wait on their own.
func (e *Engine) awaitApplied(ctx context.Context, name string, res store.Result) {
	e.mu.Lock()
	r := e.rooms[name]
	e.mu.Unlock()
	if r == nil {
		return
	}
	select {
	case <-r.loaded:
	case <-ctx.Done():
		return
	}
	r.mu.Lock()
	if r.closed || r.loadErr != nil || r.reachedLocked(res.Epoch, res.Rev) {
		r.mu.Unlock()
		return
	}
	pw := r.waitLocked(res.Epoch, res.Rev)
	r.mu.Unlock()
	if e.await(ctx, r, pw, time.Now().Add(e.cfg.SyncTimeout), false) != nil {
		e.cfg.Logger.Debug("rooms: view did not reach an acknowledged write in time", "room", name, "epoch", res.Epoch, "rev", res.Rev)
	}
}

// waitLocked registers a waiter for position (epoch, rev).
func (r *room) waitLocked(epoch string, rev uint64) *posWaiter {
	pw := &posWaiter{epoch: epoch, rev: rev, ch: make(chan struct{})}
	r.waiters = append(r.waiters, pw)
	return pw
}

// catchUpAfter is how long a waiter gives the store's push before it asks
// the store to read what this node missed (store.Heads.CatchUp): a push
// normally takes well under a millisecond; one that is lost would
// otherwise wait for the store's periodic check.
const catchUpAfter = 10 * time.Millisecond

// await waits until pw is released (the view reached its position, or the
// room closed), ctx ends or the deadline passes (ErrUnsynced). now asks
// the store to catch up at once instead of after catchUpAfter.
func (e *Engine) await(ctx context.Context, r *room, pw *posWaiter, deadline time.Time, now bool) error {
	heads, _ := e.st.(store.Heads)
	nudge := time.NewTimer(catchUpAfter)
	defer nudge.Stop()
	if now && heads != nil {
		heads.CatchUp(r.name)
		nudge.Stop()
	}
	bound := time.NewTimer(time.Until(deadline))
	defer bound.Stop()
	for {
		select {
		case <-pw.ch:
			return nil
		case <-nudge.C:
			if heads != nil {
				heads.CatchUp(r.name)
			}
			continue
		case <-bound.C:
			r.mu.Lock()
			r.dropWaiterLocked(pw)
			r.mu.Unlock()
			return ErrUnsynced
		case <-ctx.Done():
			r.mu.Lock()
			r.dropWaiterLocked(pw)
			r.mu.Unlock()
			return ctx.Err()
		}
	}
}

// Watch starts a watch of room per the revision contract:
//   - no From: a snapshot, then live events;
//   - From in retained history: a replay from From.Rev (inclusive), a
//     synced marker at the head, then live events;
//   - From older than history, or from another epoch: a snapshot (or an
//     error with FailIfCompacted), then live events;
//   - From = head+1: a synced marker, then live events;
//   - From beyond head+1: accepted; events start at From.Rev.
func (e *Engine) Watch(ctx context.Context, room string, opts WatchOptions) (*Watcher, error) {
	if err := store.ValidRoom(room); err != nil {
		return nil, err
	}
	// A snapshot start is a read: linearizable, as List's. A resume
	// continues from the client's own position, but on a store whose tail
	// lags it asks for the room's head first, without waiting for it: a
	// store that lost revisions this node delivered (Redis after a failover)
	// then starts the room's new epoch before the resume is served, so the
	// client gets its snapshot, never the lost tail. A store that does not
	// answer does not refuse the resume: it commits nothing meanwhile.
	if heads, lags := e.st.(store.Heads); lags && opts.From != nil {
		_, _, _ = heads.Head(ctx, room)
	}
	r, err := e.ready(ctx, room, ReadOptions{Serializable: opts.From != nil})
	if err != nil {
		return nil, err
	}
	defer r.mu.Unlock()
	prefixes := normalizePrefixes(opts.Prefixes, opts.Keys)
	w := &Watcher{room: r, prefixes: prefixes, filter: opts.Filter, exact: opts.Exact, pos: make([]int32, len(prefixes)), notify: opts.Notify}
	if w.notify == nil {
		w.ready = make(chan struct{}, 1)
	}
	if err := r.startLocked(w, opts); err != nil {
		return nil, err
	}
	return w, nil
}

// ReadOptions choose what a read waits for.
type ReadOptions struct {
	// Serializable serves this node's view as it is, without asking the
	// store: it may miss writes acknowledged by other nodes (those whose
	// push has not arrived yet). By default a read is linearizable: it
	// reflects every write acknowledged before it began, on any node.
	Serializable bool
	// MinRev, with Serializable, is the least revision the view must
	// hold (a position the client already saw, perhaps on another node):
	// a view behind it serves the read as a linearizable one instead.
	MinRev uint64
}

// List returns the keys of room under prefix at the room's head, from
// this node's view, once it is as fresh as opts asks.
func (e *Engine) List(ctx context.Context, room, prefix string, opts ReadOptions) (store.Snapshot, error) {
	s, view, err := e.read(ctx, room, opts)
	if err == nil {
		s.Items = collect(view, []string{prefix})
	}
	return s, err
}

// KeyRange is the keys from Lo up to, not including, Hi ("": no end).
type KeyRange struct{ Lo, Hi string }

// ListRanges returns the keys of room in ranges at the room's head,
// sorted and each once, from one view (one revision), once it is as fresh
// as opts asks: the reads of a transaction, which cost its ranges, not
// the keys between them.
func (e *Engine) ListRanges(ctx context.Context, room string, ranges []KeyRange, opts ReadOptions) (store.Snapshot, error) {
	s, view, err := e.read(ctx, room, opts)
	if err != nil {
		return s, err
	}
	for _, r := range mergeRanges(ranges) {
		view.AscendGreaterOrEqual(store.KV{Key: r.Lo}, func(kv store.KV) bool {
			if r.Hi != "" && kv.Key >= r.Hi {
				return false
			}
			s.Items = append(s.Items, kv)
			return true
		})
	}
	return s, nil
}

// mergeRanges sorts ranges and joins those that overlap or touch, so that
// the result is disjoint and in key order; empty ranges are dropped.
func mergeRanges(ranges []KeyRange) []KeyRange {
	rs := slices.DeleteFunc(slices.Clone(ranges), func(r KeyRange) bool { return r.Hi != "" && r.Hi <= r.Lo })
	slices.SortFunc(rs, func(a, b KeyRange) int { return strings.Compare(a.Lo, b.Lo) })
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && (out[n-1].Hi == "" || r.Lo <= out[n-1].Hi) {
			if out[n-1].Hi != "" && (r.Hi == "" || r.Hi > out[n-1].Hi) {
				out[n-1].Hi = r.Hi
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

// Get returns key at the room's head (Items holds it, or nothing when the
// key does not exist), from this node's view, once it is as fresh as opts
// asks.
func (e *Engine) Get(ctx context.Context, room, key string, opts ReadOptions) (store.Snapshot, error) {
	s, view, err := e.read(ctx, room, opts)
	if err != nil {
		return s, err
	}
	if kv, ok := view.Get(store.KV{Key: key}); ok {
		s.Items = []store.KV{kv}
	}
	return s, nil
}

// GetKeys returns those of keys that exist at the room's head (in Items,
// in the order of keys), read from one view, once it is as fresh as opts
// asks: what a write validated by a hook is conditioned on.
func (e *Engine) GetKeys(ctx context.Context, room string, keys []string, opts ReadOptions) (store.Snapshot, error) {
	s, view, err := e.read(ctx, room, opts)
	if err != nil {
		return s, err
	}
	for _, key := range keys {
		if kv, ok := view.Get(store.KV{Key: key}); ok {
			s.Items = append(s.Items, kv)
		}
	}
	return s, nil
}

// read returns the head position of room and a copy-on-write clone of its
// view, loading the room if needed.
func (e *Engine) read(ctx context.Context, room string, opts ReadOptions) (store.Snapshot, *btree.BTreeG[store.KV], error) {
	if err := store.ValidRoom(room); err != nil {
		return store.Snapshot{}, nil, err
	}
	r, err := e.ready(ctx, room, opts)
	if err != nil {
		return store.Snapshot{}, nil, err
	}
	defer r.mu.Unlock()
	r.hist.expire(time.Now())
	view := r.view.Clone()
	s := store.Snapshot{Epoch: r.epoch, Rev: r.head, Oldest: r.hist.oldest}
	if len(r.watchers) == 0 {
		r.idleSince = time.Now()
	}
	return s, view, nil
}

// ready returns the loaded room, locked, once its view is as fresh as
// opts asks. A linearizable read on a store whose tail lags (store.Heads)
// is etcd's ReadIndex: it learns the room's committed position from the
// store (one round trip) and waits, at most Config.SyncTimeout, for the
// view to reach it; past that it fails with ErrUnsynced. Other stores
// deliver every write to the view before acknowledging it: their view is
// always fresh enough.
func (e *Engine) ready(ctx context.Context, name string, opts ReadOptions) (*room, error) {
	heads, lags := e.st.(store.Heads)
	var (
		target   bool // wait for (epoch, rev)
		epoch    string
		rev      uint64
		refreshs int
		deadline time.Time
	)
	learn := func() error {
		var err error
		epoch, rev, err = heads.Head(ctx, name)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrUnsynced, err)
		}
		target = true
		if deadline.IsZero() {
			deadline = time.Now().Add(e.cfg.SyncTimeout)
		}
		return nil
	}
	if lags && !opts.Serializable {
		if err := learn(); err != nil {
			return nil, err
		}
	}
	for {
		r, err := e.acquire(ctx, name)
		if err != nil {
			return nil, err
		}
		r.mu.Lock()
		switch {
		case r.closed: // unloaded or reset since acquire: take a fresh one
			r.mu.Unlock()
			continue
		case !target && lags && r.head < opts.MinRev:
			// Behind what the client saw: catch up as a linearizable read
			// would (a MinRev of another epoch then is served at the
			// store's head, not waited for).
			r.mu.Unlock()
			if err := learn(); err != nil {
				return nil, err
			}
			continue
		case !target || r.reachedLocked(epoch, rev):
			return r, nil
		}
		// Another epoch: the room's state was lost or replaced. Its
		// follower catches up at once; if the view had already moved on
		// past what Head said, Head is asked again.
		foreign := epoch != "" && r.epoch != epoch || epoch == "" && r.head > 0
		retry := foreign && refreshs < 3
		wait := deadline
		if t := time.Now().Add(foreignWait); retry && t.Before(deadline) {
			wait = t
		}
		pw := r.waitLocked(epoch, rev)
		r.mu.Unlock()
		err = e.await(ctx, r, pw, wait, foreign)
		if err != nil && !(retry && errors.Is(err, ErrUnsynced) && time.Now().Before(deadline)) {
			return nil, err
		}
		if retry {
			refreshs++
			if err := learn(); err != nil {
				return nil, err
			}
		}
	}
}

// foreignWait is how long a read whose view is in another epoch than the
// store's head waits for the view to reset before it asks the store again
// (the store may have changed epoch again after the view did).
const foreignWait = 100 * time.Millisecond

// RoomStats describes a loaded room.
type RoomStats struct {
	Name          string
	Epoch         string
	Rev           uint64
	Oldest        uint64 // oldest replayable revision
	HistoryEvents int
	HistoryBytes  int64 // store.EventBytes of the retained history
	Keys          int
	Watchers      int
}

// Loads is how many times this Engine has loaded a room from the store,
// each a snapshot read: however many watchers a room has, a node loads
// it once, and again only after it was unloaded, reset or failed to load.
func (e *Engine) Loads() uint64 { return e.loads.Load() }

// Stats describes the rooms loaded on this node.
func (e *Engine) Stats() []RoomStats {
	var out []RoomStats
	for _, r := range e.loadedRooms() {
		r.mu.Lock()
		if !r.closed && !r.loading {
			out = append(out, RoomStats{Name: r.name, Epoch: r.epoch, Rev: r.head, Oldest: r.hist.oldest,
				HistoryEvents: r.hist.n, HistoryBytes: r.hist.bytes, Keys: r.view.Len(), Watchers: len(r.watchers)})
		}
		r.mu.Unlock()
	}
	return out
}

// Close ends every watcher with ErrClosed, unloads every room and stops
// the Engine's goroutine. It does not close the store.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	e.closed = true
	rooms := e.rooms
	e.rooms = nil
	e.mu.Unlock()
	close(e.stopc)
	e.cancel()
	e.wg.Wait()
	for _, r := range rooms {
		r.mu.Lock()
		r.shutdownLocked(ErrClosed)
		stop := r.takeStopLocked()
		r.mu.Unlock()
		stop()
	}
	return nil
}

func (e *Engine) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

func (e *Engine) loadedRooms() []*room {
	e.mu.Lock()
	defer e.mu.Unlock()
	rs := make([]*room, 0, len(e.rooms))
	for _, r := range e.rooms {
		rs = append(rs, r)
	}
	return rs
}

// acquire returns the loaded room named name, loading it if needed. Only
// one load runs per room; every caller waits for it, each under its own
// context: a caller that gives up leaves the load running for the others.
func (e *Engine) acquire(ctx context.Context, name string) (*room, error) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, ErrClosed
	}
	r := e.rooms[name]
	var stale func()
	if r != nil {
		r.mu.Lock()
		if r.closed { // reset: replace it
			stale = r.takeStopLocked()
			r.mu.Unlock()
			r = nil
		} else {
			r.mu.Unlock()
		}
	}
	if r == nil {
		r = newRoom(e, name)
		e.rooms[name] = r
		e.wg.Add(1) // under e.mu with !e.closed: before Close waits
		go e.loadRoom(r)
	}
	e.mu.Unlock()
	if stale != nil {
		stale()
	}
	select {
	case <-r.loaded:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return r, r.loadErr
}

// loadRoom loads r and publishes the outcome to its waiters; a room that
// fails to load leaves the engine, so the next acquire starts afresh.
func (e *Engine) loadRoom(r *room) {
	defer e.wg.Done()
	e.loads.Add(1)
	ctx, cancel := context.WithTimeout(e.life, loadTimeout)
	r.loadErr = e.load(ctx, r)
	cancel()
	close(r.loaded)
	if r.loadErr == nil {
		return
	}
	if !errors.Is(r.loadErr, ErrClosed) {
		e.cfg.Logger.Warn("rooms: loading a room failed; the next watcher loads it again", "room", r.name, "err", r.loadErr)
	}
	e.mu.Lock()
	if e.rooms[r.name] == r {
		delete(e.rooms, r.name)
	}
	e.mu.Unlock()
	r.mu.Lock()
	r.shutdownLocked(r.loadErr)
	stop := r.takeStopLocked()
	r.mu.Unlock()
	stop()
}

// load list-then-watches the store for r: it registers the tail first so
// nothing committed after the snapshot is missed, then reads the state and
// the retained history, then applies what the tail buffered meanwhile.
func (e *Engine) load(ctx context.Context, r *room) error {
	stop, err := e.st.Follow(r.name, r.onBatch)
	if err != nil {
		return err
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		stop()
		return ErrClosed
	}
	r.stop = stop
	r.mu.Unlock()

	snap, err := e.st.Snapshot(ctx, r.name, "")
	if err != nil {
		return err
	}
	hist, err := e.loadHistory(ctx, r.name, snap)
	if err != nil {
		return err
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		hist.clear(snap.Rev + 1)
		return ErrClosed
	}
	r.epoch, r.head, r.hist = snap.Epoch, snap.Rev, hist
	for _, kv := range snap.Items {
		r.view.ReplaceOrInsert(kv)
	}
	r.loading = false
	for _, b := range r.pending {
		if !r.closed {
			r.applyLocked(b)
		}
	}
	r.pending = nil
	if r.closed {
		return ErrRoomReset
	}
	return nil
}

// loadChunk is the most events load reads from the store's history at a
// time: the ring trims by bytes as it goes, so a long history of large
// values never sits in memory whole.
const loadChunk = 256

// loadHistory reads the store's retained history of room up to snap.Rev
// into a new ring, a chunk at a time.
func (e *Engine) loadHistory(ctx context.Context, room string, snap store.Snapshot) (*history, error) {
	ret := e.cfg.Retention.For(room)
	h := newHistory(ret, snap.Rev, &e.hist)
	from, trimmed := snap.Oldest, 0
	for from <= snap.Rev {
		batches, err := e.st.History(ctx, room, from, loadChunk)
		var ce *store.CompactedError
		if errors.As(err, &ce) && trimmed < 3 { // trimmed meanwhile: start over from there
			trimmed++
			h.clear(snap.Rev + 1)
			from = ce.Oldest
			continue
		}
		if err == nil && len(batches) == 0 { // a gap: replay nothing rather than skip it
			h.clear(snap.Rev + 1)
			break
		}
		if err != nil {
			h.clear(snap.Rev + 1)
			return nil, err
		}
		for _, b := range batches {
			if b.Rev > snap.Rev {
				break
			}
			h.push(&Change{Rev: b.Rev, Time: b.Time, Events: b.Events})
		}
		from = batches[len(batches)-1].Rev + 1
	}
	if h.n == 0 {
		h.oldest = snap.Rev + 1
	}
	return h, nil
}

// sweepLoop sends progress marks and unloads idle rooms.
func (e *Engine) sweepLoop() {
	defer e.wg.Done()
	tick := e.cfg.IdleTimeout / 2
	if p := e.cfg.ProgressInterval; p > 0 && p < tick {
		tick = p
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-e.stopc:
			return
		case now := <-t.C:
			e.sweep(now)
		}
	}
}

func (e *Engine) sweep(now time.Time) {
	var stops []func()
	e.mu.Lock()
	for name, r := range e.rooms {
		r.mu.Lock()
		idle := !r.loading && len(r.watchers) == 0 && now.Sub(r.idleSince) >= e.cfg.IdleTimeout
		if r.closed || idle {
			r.shutdownLocked(ErrClosed)
			stops = append(stops, r.takeStopLocked())
			delete(e.rooms, name)
		} else if p := e.cfg.ProgressInterval; p > 0 && !r.loading && now.Sub(r.progAt) >= p {
			r.progAt = now
			r.progressLocked()
		}
		r.mu.Unlock()
	}
	e.mu.Unlock()
	for _, stop := range stops {
		stop()
	}
	if len(stops) > 0 {
		e.cfg.Logger.Debug("rooms: unloaded idle rooms", "count", len(stops))
	}
}
