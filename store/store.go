// Package store holds the durable truth of each room: its key/value state,
// its revision counter, its epoch and its retained history.
//
// The memory (NewMemory) and file (OpenFile) backends are in this package,
// the Redis backend in store/redisstore. Every backend implements Store and
// passes the conformance suite in store/storetest. The revision contract
// (docs/DESIGN.md#the-revision-contract):
//
//   - A room's revision starts at 0 and grows by exactly 1 per committed
//     write. A transaction over many keys is one revision; all its events
//     carry that revision.
//   - Deleting a missing key writes nothing and does not bump the revision.
//   - Snapshot is consistent: items and rev are read at one revision.
//   - History returns whole revisions in order, or a *CompactedError naming
//     the oldest revision still replayable.
//   - Follow delivers every committed batch in revision order, exactly once,
//     after it is durable.
package store

import (
	"context"
	"time"
)

// Store is the backend contract. All methods may be called concurrently.
// Values, events and batches a Store returns are shared and read-only.
type Store interface {
	// Apply commits w to room atomically and returns the revision it
	// committed at. A write whose conditions fail returns a *ConflictError
	// and writes nothing. A write that changes nothing (only deletes of
	// missing keys, or only conditions) returns the current revision with
	// no events and does not bump it. Apply returns only once the write is
	// durable as far as the backend promises durability.
	Apply(ctx context.Context, room string, w Write) (Result, error)

	// Snapshot returns the keys of room that start with prefix ("" = all),
	// sorted by key, at one consistent revision.
	Snapshot(ctx context.Context, room, prefix string) (Snapshot, error)

	// History returns the committed batches of room with Rev >= from, in
	// revision order, at most limit events' worth of whole batches (limit
	// <= 0 means no limit; a single batch larger than limit is still
	// returned whole). from below the oldest retained revision returns a
	// *CompactedError. from above the head returns an empty slice.
	History(ctx context.Context, room string, from uint64, limit int) ([]Batch, error)

	// Follow calls fn with every batch committed to room after Follow
	// returns, in revision order, once each batch is durable. fn runs on
	// the committing goroutine and must not block nor call back into the
	// store. stop unregisters fn; after stop returns fn is not called again.
	//
	// When the room's state is lost or replaced (a Redis flushed, restarted
	// without persistence, or failed over with lost writes), fn receives an
	// epoch notice, Batch{Epoch: new, Rev: 0, Events: nil}, then the new
	// epoch's batches; a follower holding the old epoch must list again.
	Follow(room string, fn func(Batch)) (stop func(), err error)

	// Leased calls fn for every key bound to a lease, in any order. A
	// server calls it at start-up to end the leases of a previous process.
	Leased(ctx context.Context, fn func(room string, kv KV) error) error

	// Close releases the store. Calls after Close return ErrClosed.
	Close() error
}

// Heads is implemented by a store whose Follow may deliver a batch after
// Apply returned it (Redis: the push travels by pub/sub). A node then asks
// the store for the room's committed position (one round trip) and serves
// a linearizable read once its view has reached it, as etcd's ReadIndex
// does. A store without Heads calls the Follow callbacks before Apply
// returns, so a node's view already holds every acknowledged write.
type Heads interface {
	// Head returns room's committed position: its epoch ("" when the
	// store holds nothing of the room) and its revision.
	Head(ctx context.Context, room string) (epoch string, rev uint64, err error)
	// CatchUp makes the room's Follow read what it missed from the store
	// now (a lost push), not at its next periodic check.
	CatchUp(room string)
}

// OpType says whether an Op writes or removes a key.
type OpType uint8

const (
	OpPut OpType = iota + 1
	OpDelete
)

// Op is one change inside a Write.
type Op struct {
	Type  OpType
	Key   string
	Value []byte // Put only; opaque to the store
	// Lease, on a Put, binds the key to a lease: whoever ends the lease
	// deletes the key. Opaque to the store, which only keeps it on the KV.
	Lease string
	// KeepLease, on a Put, keeps the key's current lease binding instead
	// of naming one (Lease must be ""): a key bound to none, or created by
	// the put, is bound to none. The store reads the binding in the
	// write's atomic step, so a concurrent write cannot make it lose one.
	KeepLease bool
	// KeepValue, on a Put, keeps the key's current value (Value must be
	// empty): the put changes the key's lease only. The key must exist.
	KeepValue bool
	// MustExist, on a Put, fails the write with ErrKeyNotFound when the
	// key does not exist (etcd's ignore_lease and ignore_value).
	MustExist bool
}

// Cond makes a Write conditional on the current mod_rev of a key.
type Cond struct {
	// Room, when set, must equal the written room: a transaction is
	// atomic within one room only, so a condition on another room's key
	// is rejected with ErrCrossRoom instead of being silently ignored.
	Room string
	Key  string
	// ModRev is the key's expected mod_rev; 0 means the key must not exist.
	ModRev uint64
}

// Write is a put, a delete or a transaction: all Conds must hold, then
// all Ops apply at one revision. A key may appear in at most one Op.
type Write struct {
	Conds []Cond
	Ops   []Op
	// Wid, when set, is the id of this write (ValidStoredWid), which
	// makes it idempotent within the room: Apply checks it and commits in
	// one atomic step, so a write whose Wid already committed in the room
	// is not applied again and Apply returns that commit's revision with
	// Dup set. The store remembers a room's wids for as long as it
	// retains the revisions that carried them. Every event of the write
	// carries it. A write that failed or changed nothing is not
	// remembered: a repeat is evaluated again. The server scopes a
	// client's id to its writer (server/wids.go), so two writers' ids
	// never meet here.
	Wid string
	// Fingerprint, with Wid, identifies the write's content (its
	// conditions and operations: FingerprintOf) and is remembered with
	// the id. A repeat of a committed id whose fingerprint differs is
	// another write under a reused id: Apply fails with a
	// *WidReusedError and writes nothing. Empty: the store computes it
	// from w. An id remembered without one (written by an older build)
	// matches any.
	Fingerprint string
	// LegacyWid, with Wid, is the id as a build before write ids were
	// scoped stored it: found among the room's ids as such a build left
	// it (without a fingerprint), it counts as this write's commit (Dup),
	// so a write first sent to an older node and retried on this one
	// during a rolling upgrade is not applied twice. It is looked up,
	// never stored.
	LegacyWid string
	// Since, with Wid, is a revision of the room seen before the write was
	// first sent: that attempt can only have committed after it. When the
	// store does not know Wid and no longer retains the revision after
	// Since, it cannot tell whether that attempt committed: Apply fails
	// with ErrWidCompacted and writes nothing. Without Since, an unknown
	// Wid is applied.
	Since *uint64
}

// Put returns a Write that sets key to value.
func Put(key string, value []byte) Write {
	return Write{Ops: []Op{{Type: OpPut, Key: key, Value: value}}}
}

// Delete returns a Write that removes key.
func Delete(key string) Write {
	return Write{Ops: []Op{{Type: OpDelete, Key: key}}}
}

// KV is a key with its value and its etcd-style revisions.
type KV struct {
	Key       string
	Value     []byte
	CreateRev uint64 // revision that created the key (since its last delete)
	ModRev    uint64 // revision of the last write to the key
	Version   uint64 // writes since creation: 1 on create
	Lease     string // lease the key is bound to; "" for none
}

// Event is one key's change at a revision. A delete carries the key with
// ModRev = the delete's revision, no value and Version 0 (a tombstone).
type Event struct {
	Type OpType
	KV   KV
	// Prev is the key before this change, nil when it did not exist.
	Prev *KV
	// Wid is the client write id of the write that made the change
	// (Write.Wid), "" for none; every event of a batch has the same.
	Wid string
}

// Batch is everything one revision changed: one put, one delete, or all
// events of one transaction, in the order of the Write's Ops.
type Batch struct {
	Epoch  string
	Rev    uint64
	Time   time.Time // commit time, used for age retention
	Events []Event
}

// Result is what Apply committed.
type Result struct {
	Epoch string
	// Rev is the revision the write committed at, or the current head
	// when the write changed nothing.
	Rev    uint64
	Events []Event // nil when nothing changed
	// Dup: the write's Wid had already committed, at Rev; nothing was
	// applied now.
	Dup bool
}

// batchWid is the client write id the events of one batch carry.
func batchWid(evs []Event) string {
	if len(evs) == 0 {
		return ""
	}
	return evs[0].Wid
}

// Snapshot is a consistent view of a room (or a prefix of it).
type Snapshot struct {
	Epoch string
	Rev   uint64
	// Oldest is the oldest revision History can still replay (Rev+1 when
	// no history is retained).
	Oldest uint64
	Items  []KV
}
