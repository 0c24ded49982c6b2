package rooms

import (
	"context"
	"errors"
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

	hist budget // retained history of every loaded room

	stopc chan struct{}
	wg    sync.WaitGroup
}

// New returns an Engine serving the rooms of st. The caller keeps owning
// st and closes it after the Engine.
func New(st store.Store, cfg Config) *Engine {
	e := &Engine{st: st, cfg: cfg.withDefaults(), rooms: make(map[string]*room), stopc: make(chan struct{})}
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

func (b *budget) over() bool     { return b != nil && b.used.Load() > b.limit }
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

// Apply commits w to room in the store. Watchers of the room on every
// node see it through the store's tail; here, before Apply returns.
func (e *Engine) Apply(ctx context.Context, room string, w store.Write) (store.Result, error) {
	if e.isClosed() {
		return store.Result{}, ErrClosed
	}
	return e.st.Apply(ctx, room, w)
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
	for {
		r, err := e.acquire(ctx, room)
		if err != nil {
			return nil, err
		}
		prefixes := normalizePrefixes(opts.Prefixes)
		w := &Watcher{room: r, prefixes: prefixes, pos: make([]int32, len(prefixes)), notify: opts.Notify}
		if w.notify == nil {
			w.ready = make(chan struct{}, 1)
		}
		r.mu.Lock()
		if r.closed { // unloaded or reset since acquire: take a fresh one
			r.mu.Unlock()
			continue
		}
		err = r.startLocked(w, opts)
		r.mu.Unlock()
		if err != nil {
			return nil, err
		}
		return w, nil
	}
}

// List returns the keys of room under prefix at the room's head, from
// this node's view.
func (e *Engine) List(ctx context.Context, room, prefix string) (store.Snapshot, error) {
	s, view, err := e.read(ctx, room)
	if err == nil {
		s.Items = collect(view, []string{prefix})
	}
	return s, err
}

// Get returns key at the room's head (Items holds it, or nothing when the
// key does not exist), from this node's view.
func (e *Engine) Get(ctx context.Context, room, key string) (store.Snapshot, error) {
	s, view, err := e.read(ctx, room)
	if err != nil {
		return s, err
	}
	if kv, ok := view.Get(store.KV{Key: key}); ok {
		s.Items = []store.KV{kv}
	}
	return s, nil
}

// read returns the head position of room and a copy-on-write clone of its
// view, loading the room if needed.
func (e *Engine) read(ctx context.Context, room string) (store.Snapshot, *btree.BTreeG[store.KV], error) {
	if err := store.ValidRoom(room); err != nil {
		return store.Snapshot{}, nil, err
	}
	for {
		r, err := e.acquire(ctx, room)
		if err != nil {
			return store.Snapshot{}, nil, err
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			continue
		}
		r.hist.expire(time.Now())
		view := r.view.Clone()
		s := store.Snapshot{Epoch: r.epoch, Rev: r.head, Oldest: r.hist.oldest}
		if len(r.watchers) == 0 {
			r.idleSince = time.Now()
		}
		r.mu.Unlock()
		return s, view, nil
	}
}

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
// one caller loads a room; the others wait for it.
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
	loader := r == nil
	if loader {
		r = newRoom(e, name)
		e.rooms[name] = r
	}
	e.mu.Unlock()
	if stale != nil {
		stale()
	}
	if loader {
		r.loadErr = e.load(ctx, r)
		close(r.loaded)
		if r.loadErr != nil {
			e.mu.Lock()
			if e.rooms[name] == r {
				delete(e.rooms, name)
			}
			e.mu.Unlock()
			r.mu.Lock()
			r.shutdownLocked(r.loadErr)
			stop := r.takeStopLocked()
			r.mu.Unlock()
			stop()
		}
	}
	select {
	case <-r.loaded:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return r, r.loadErr
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
