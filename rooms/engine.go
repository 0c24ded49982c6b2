package rooms

import (
	"context"
	"errors"
	"sync"
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

	stopc chan struct{}
	wg    sync.WaitGroup
}

// New returns an Engine serving the rooms of st. The caller keeps owning
// st and closes it after the Engine.
func New(st store.Store, cfg Config) *Engine {
	e := &Engine{st: st, cfg: cfg.withDefaults(), rooms: make(map[string]*room), stopc: make(chan struct{})}
	e.wg.Add(1)
	go e.sweepLoop()
	return e
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
				HistoryEvents: r.hist.n, Keys: r.view.Len(), Watchers: len(r.watchers)})
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
	var batches []store.Batch
	from := snap.Oldest
	for attempt := 0; from <= snap.Rev; attempt++ {
		batches, err = e.st.History(ctx, r.name, from, 0)
		var ce *store.CompactedError
		if errors.As(err, &ce) && attempt < 3 { // trimmed meanwhile
			from = ce.Oldest
			continue
		}
		if err != nil {
			return err
		}
		break
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	r.epoch, r.head = snap.Epoch, snap.Rev
	for _, kv := range snap.Items {
		r.view.ReplaceOrInsert(kv)
	}
	ret := e.cfg.Retention.For(r.name)
	r.hist = newHistory(ret, snap.Rev)
	for i, b := range batches {
		if b.Rev > snap.Rev {
			break
		}
		if i == 0 {
			r.hist = newHistory(ret, b.Rev-1)
		}
		r.hist.push(&Change{Rev: b.Rev, Time: b.Time, Events: b.Events})
	}
	if r.hist.n == 0 {
		r.hist.oldest = snap.Rev + 1
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
