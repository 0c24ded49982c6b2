package rooms

import (
	"strings"
	"sync"
	"weak"

	"github.com/google/btree"
	"github.com/statecast/statecast/store"
)

// Snapshot is the keys of a snapshot message: one room's keys under a
// watcher's prefixes and filter at one revision. The watchers that take
// the same snapshot (room, epoch, revision, prefixes, filter) while
// another still holds it share it, and its encodings: twenty subscribers
// of a 100 MiB room cost one list and one encoding per codec, not twenty.
// A Snapshot is read-only.
type Snapshot struct {
	once  sync.Once
	items []store.KV

	enc [MaxCodecs]struct {
		once   sync.Once
		pieces [][]byte
	}
}

// Items returns the keys, sorted. Callers must not modify them.
func (s *Snapshot) Items() []store.KV { return s.items }

// Encoded returns the encoding of the items in slot codec (0 <= codec <
// MaxCodecs), made by encode on the first call: concurrent callers wait
// for that one, so the encoding is made once however many ask at once.
// It is held in pieces, so a large room needs no single allocation of
// its size and none is copied while it grows.
func (s *Snapshot) Encoded(codec int, encode func([]store.KV) [][]byte) [][]byte {
	e := &s.enc[codec]
	e.once.Do(func() { e.pieces = encode(s.items) })
	return e.pieces
}

// fill collects the items on the first call; concurrent callers wait.
func (s *Snapshot) fill(collect func() []store.KV) {
	s.once.Do(func() { s.items = collect() })
}

// snapKey names the snapshots watchers can share.
type snapKey struct {
	epoch    string
	rev      uint64
	prefixes string
	filter   string
}

func snapKeyOf(w *Watcher, epoch string, rev uint64) snapKey {
	k := snapKey{epoch: epoch, rev: rev, prefixes: strings.Join(w.prefixes, "\x00")}
	if w.filter != nil {
		k.filter = w.filter.String()
	}
	return k
}

// snapHeldLocked reports whether a snapshot w would share at (epoch, rev)
// is still held by another watcher's sender.
func (r *room) snapHeldLocked(w *Watcher, epoch string, rev uint64) bool {
	return r.snaps[snapKeyOf(w, epoch, rev)].Value() != nil
}

// sharedSnapLocked returns the snapshot w takes at (epoch, rev): one
// another watcher still holds, or a new one. The room remembers it
// weakly, so it lives as long as a sender holds it and no longer; a
// snapshot of an older revision is forgotten when a new one is made.
func (r *room) sharedSnapLocked(w *Watcher, epoch string, rev uint64) *Snapshot {
	k := snapKeyOf(w, epoch, rev)
	if s := r.snaps[k].Value(); s != nil {
		return s
	}
	for old, p := range r.snaps {
		if old.rev != rev || old.epoch != epoch || p.Value() == nil {
			delete(r.snaps, old)
		}
	}
	if r.snaps == nil {
		r.snaps = make(map[snapKey]weak.Pointer[Snapshot])
	}
	s := new(Snapshot)
	r.snaps[k] = weak.Make(s)
	return s
}

// snapshotOf fills s with the keys of view under w's prefixes that pass
// its filter (through memo), unless another watcher did.
func snapshotOf(s *Snapshot, view *btree.BTreeG[store.KV], w *Watcher, memo *snapMemo, epoch string, rev uint64) {
	s.fill(func() []store.KV {
		if memo != nil {
			return memo.snapshot(view, w.prefixes, w.filter, epoch, rev)
		}
		return collect(view, w.prefixes)
	})
}
