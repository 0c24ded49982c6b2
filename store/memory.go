package store

import (
	"context"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// MemoryConfig configures a Memory store. The zero value is ready to use.
type MemoryConfig struct {
	Limits    Limits
	Retention RetentionPolicy
	// HistoryBytes bounds the history of all rooms together, in
	// EventBytes: over it, the oldest revisions across rooms are dropped
	// first (down to 15/16 of it), as the rooms engine does for its own
	// rings. Memory never unloads a room, so without it each room keeps
	// up to its Retention's MaxBytes. 0 means no node-wide bound.
	HistoryBytes int64
	// Clock is the time source for age retention; defaults to time.Now.
	Clock func() time.Time
}

// Memory is an ephemeral Store: state lives in this process only and a
// new Memory has a new epoch, so clients that resume from an earlier
// process get a snapshot. All methods may be called concurrently.
type Memory struct {
	cfg   MemoryConfig
	epoch string

	mu     sync.RWMutex
	rooms  map[string]*memRoom
	closed bool
	// sessions are the server's session records (memory_sessions.go).
	sessions map[string]SessionRecord

	histBytes  atomic.Int64 // EventBytes of every room's history
	compacting sync.Mutex   // one compaction at a time
}

var _ Store = (*Memory)(nil)

type memRoom struct {
	mu        sync.Mutex
	rev       uint64
	kv        map[string]KV
	usage     Usage         // of kv, for the quota
	hist      []Batch       // retained history, oldest first
	events    int           // events in hist
	bytes     int64         // EventBytes of hist
	total     *atomic.Int64 // the store's histBytes
	followers map[*func(Batch)]struct{}
	// wids maps the write ids of the retained batches to their revision
	// and fingerprint; nil until a write carries one.
	wids map[string]widRecord
}

// widRecord is what a room remembers of a write id.
type widRecord struct {
	rev uint64
	fp  string
}

// NewMemory returns an empty Memory store with a fresh epoch.
func NewMemory(cfg MemoryConfig) *Memory {
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	return &Memory{cfg: cfg, epoch: NewEpoch(), rooms: make(map[string]*memRoom)}
}

// room returns the room named name, creating it when create is set.
func (m *Memory) room(name string, create bool) (*memRoom, error) {
	if err := ValidRoom(name); err != nil {
		return nil, err
	}
	m.mu.RLock()
	r, closed := m.rooms[name], m.closed
	m.mu.RUnlock()
	if closed {
		return nil, ErrClosed
	}
	if r != nil || !create {
		return r, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	if r = m.rooms[name]; r == nil {
		r = &memRoom{kv: make(map[string]KV), total: &m.histBytes, followers: make(map[*func(Batch)]struct{})}
		m.rooms[name] = r
	}
	return r, nil
}

func (m *Memory) Apply(ctx context.Context, room string, w Write) (Result, error) {
	if err := m.cfg.Limits.Validate(room, w); err != nil {
		return Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	r, err := m.room(room, true)
	if err != nil {
		return Result{}, err
	}
	res, err := m.apply(r, room, w)
	if h := m.cfg.HistoryBytes; h > 0 && m.histBytes.Load() > h {
		m.compact(h - h/16)
	}
	return res, err
}

func (m *Memory) apply(r *memRoom, room string, w Write) (Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rev, dup, err := seenWid(w, r.oldestLocked(), func(wid string) (uint64, string, bool, error) {
		rec, ok := r.wids[wid]
		return rec.rev, rec.fp, ok, nil
	}); dup || err != nil {
		return Result{Epoch: m.epoch, Rev: rev, Dup: dup}, err
	}
	events, err := plan(w, m.epoch, r.rev, func(k string) (KV, bool, error) {
		kv, ok := r.kv[k]
		return kv, ok, nil
	})
	if err != nil || len(events) == 0 {
		return Result{Epoch: m.epoch, Rev: r.rev}, err
	}
	usage := r.usage.after(events)
	if err := m.cfg.Limits.checkQuota(r.usage, usage); err != nil {
		return Result{}, err
	}
	r.usage = usage
	r.rev++
	for i := range events {
		ev := &events[i]
		if ev.Type == OpPut {
			ev.KV.Value = clone(ev.KV.Value) // the caller may reuse its buffer
			r.kv[ev.KV.Key] = ev.KV
		} else {
			delete(r.kv, ev.KV.Key)
		}
	}
	b := Batch{Epoch: m.epoch, Rev: r.rev, Time: m.cfg.Clock(), Events: events}
	r.hist = append(r.hist, b)
	r.events += len(b.Events)
	n := BatchBytes(b.Events)
	r.bytes += n
	r.total.Add(n)
	if w.Wid != "" {
		if r.wids == nil {
			r.wids = make(map[string]widRecord)
		}
		r.wids[w.Wid] = widRecord{rev: r.rev, fp: fingerprint(w)}
	}
	r.trimLocked(m.cfg.Retention.For(room), b.Time)
	for fn := range r.followers {
		(*fn)(b)
	}
	return Result{Epoch: m.epoch, Rev: r.rev, Events: events}, nil
}

func (r *memRoom) trimLocked(ret Retention, now time.Time) {
	for len(r.hist) > 0 && (ret.Drops(r.events, r.hist[0].Time, now) || ret.OverBytes(r.bytes)) {
		r.dropOldestLocked()
	}
}

func (r *memRoom) dropOldestLocked() {
	n := BatchBytes(r.hist[0].Events)
	r.events -= len(r.hist[0].Events)
	r.bytes -= n
	r.total.Add(-n)
	if wid := batchWid(r.hist[0].Events); wid != "" {
		delete(r.wids, wid)
	}
	r.hist[0] = Batch{}
	r.hist = r.hist[1:]
}

// compact drops the oldest history across rooms until the store holds at
// most low bytes of it: the room whose oldest revision is the oldest pays
// first, down to the next room's oldest. It holds one room lock at a time.
func (m *Memory) compact(low int64) {
	if !m.compacting.TryLock() {
		return // another writer is at it, and checks the total again
	}
	defer m.compacting.Unlock()
	for m.histBytes.Load() > low {
		m.mu.RLock()
		rooms := make([]*memRoom, 0, len(m.rooms))
		for _, r := range m.rooms {
			rooms = append(rooms, r)
		}
		m.mu.RUnlock()
		victim, next, found := OldestFirst(rooms, func(r *memRoom) (time.Time, bool) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if len(r.hist) == 0 {
				return time.Time{}, false
			}
			return r.hist[0].Time, true
		})
		if !found {
			return
		}
		victim.mu.Lock()
		for len(victim.hist) > 0 && m.histBytes.Load() > low {
			victim.dropOldestLocked()
			if len(victim.hist) > 0 && !next.IsZero() && victim.hist[0].Time.After(next) {
				break
			}
		}
		victim.mu.Unlock()
	}
}

// oldestLocked is the oldest replayable revision: the first retained
// batch, or head+1 when nothing is retained.
func (r *memRoom) oldestLocked() uint64 {
	if len(r.hist) > 0 {
		return r.hist[0].Rev
	}
	return r.rev + 1
}

func (m *Memory) Snapshot(ctx context.Context, room, prefix string) (Snapshot, error) {
	r, err := m.room(room, false)
	if err != nil {
		return Snapshot{}, err
	}
	if r == nil {
		return Snapshot{Epoch: m.epoch, Oldest: 1}, ctx.Err()
	}
	r.mu.Lock()
	r.trimLocked(m.cfg.Retention.For(room), m.cfg.Clock())
	s := Snapshot{Epoch: m.epoch, Rev: r.rev, Oldest: r.oldestLocked()}
	for k, kv := range r.kv {
		if strings.HasPrefix(k, prefix) {
			s.Items = append(s.Items, kv)
		}
	}
	r.mu.Unlock()
	sort.Slice(s.Items, func(i, j int) bool { return s.Items[i].Key < s.Items[j].Key })
	return s, ctx.Err()
}

func (m *Memory) History(ctx context.Context, room string, from uint64, limit int) ([]Batch, error) {
	r, err := m.room(room, false)
	if err != nil {
		return nil, err
	}
	if r == nil {
		// A never-written room is at revision 0 with Oldest 1 (as its
		// Snapshot says), so from=0 is compacted as in any other room.
		if from < 1 {
			return nil, &CompactedError{Oldest: 1}
		}
		return nil, ctx.Err()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trimLocked(m.cfg.Retention.For(room), m.cfg.Clock())
	if oldest := r.oldestLocked(); from < oldest {
		return nil, &CompactedError{Oldest: oldest}
	}
	if from > r.rev {
		return nil, ctx.Err()
	}
	i := int(from - r.hist[0].Rev) // revisions are contiguous in hist
	var out []Batch
	for n := 0; i < len(r.hist) && (limit <= 0 || n == 0 || n+len(r.hist[i].Events) <= limit); i++ {
		out = append(out, r.hist[i])
		n += len(r.hist[i].Events)
	}
	return out, ctx.Err()
}

func (m *Memory) Follow(room string, fn func(Batch)) (stop func(), err error) {
	r, err := m.room(room, true)
	if err != nil {
		return nil, err
	}
	key := &fn
	r.mu.Lock()
	r.followers[key] = struct{}{}
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(r.followers, key)
		r.mu.Unlock()
	}, nil
}

func (m *Memory) Leased(ctx context.Context, fn func(room string, kv KV) error) error {
	m.mu.RLock()
	if m.closed {
		m.mu.RUnlock()
		return ErrClosed
	}
	names := make([]string, 0, len(m.rooms))
	for name := range m.rooms {
		names = append(names, name)
	}
	m.mu.RUnlock()
	for _, name := range names {
		r, err := m.room(name, false)
		if err != nil || r == nil {
			return err
		}
		r.mu.Lock()
		var leased []KV
		for _, kv := range r.kv {
			if kv.Lease != "" {
				leased = append(leased, kv)
			}
		}
		r.mu.Unlock()
		for _, kv := range leased {
			if err := fn(name, kv); err != nil {
				return err
			}
		}
	}
	return ctx.Err()
}

// Close drops all state. Memory has no goroutines of its own.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.closed = true
	m.rooms, m.sessions = nil, nil
	return nil
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}

// Limits returns the limits the store enforces (with defaults filled in),
// so surfaces can refuse oversized input before reading all of it.
func (m *Memory) Limits() Limits { return m.cfg.Limits.WithDefaults() }
