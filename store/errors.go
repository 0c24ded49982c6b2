package store

import (
	"errors"
	"fmt"
)

// Sentinels for bad input. Apply wraps them with detail; test with errors.Is.
// A write rejected with any of them has written nothing.
var (
	ErrInvalidRoom   = errors.New("store: invalid room name")
	ErrInvalidKey    = errors.New("store: invalid key")
	ErrValueTooLarge = errors.New("store: value too large")
	ErrTooManyOps    = errors.New("store: too many operations in one write")
	ErrDuplicateKey  = errors.New("store: key written twice in one write")
	ErrCrossRoom     = errors.New("store: condition on a key of another room")
	ErrInvalidOp     = errors.New("store: invalid operation")
	ErrEmptyWrite    = errors.New("store: write has no operations and no conditions")
	ErrInvalidWid    = errors.New("store: invalid write id")
	ErrClosed        = errors.New("store: closed")
	// ErrKeyNotFound matches any *KeyNotFoundError.
	ErrKeyNotFound = errors.New("store: key not found")
	// ErrUnavailable: the store could not be reached, so the write was
	// not sent and nothing was written (unlike a write that failed in
	// flight, whose outcome is unknown). A read that got no answer (in
	// time) may wrap it too: a read writes nothing.
	ErrUnavailable = errors.New("store: unreachable; nothing was written")
	// ErrWidCompacted: a write's id (Write.Wid) is not remembered, and
	// the history since its first attempt (Write.Since) is compacted, so
	// whether that attempt committed cannot be told. Nothing was written.
	ErrWidCompacted = errors.New("store: write id not found and the room's history since the write was first sent has been compacted; whether it committed is unknown")
	// ErrWidReused matches any *WidReusedError.
	ErrWidReused = errors.New("store: write id already used by a different write")
	// ErrQuotaExceeded matches any *QuotaError.
	ErrQuotaExceeded = errors.New("store: room quota exceeded")
	// ErrCompacted matches any *CompactedError.
	ErrCompacted = errors.New("store: required revision has been compacted")
	// ErrConflict matches any *ConflictError.
	ErrConflict = errors.New("store: condition failed")
	// ErrStaleTake: a session take-over (SharedSessions.TakeSession)
	// presented the secret a later-read connect of the same client has
	// already taken the session over with. Nothing was written.
	ErrStaleTake = errors.New("store: the session was taken over by a connect read after this one; nothing was written")
)

// ConflictError reports the first condition of a Write that did not hold.
type ConflictError struct {
	Key    string
	ModRev uint64 // the key's current mod_rev; 0 when it does not exist
	Rev    uint64 // the room's head revision when the condition was checked
	// Epoch is the room's epoch that ModRev and Rev are of: after a store
	// lost writes (a new epoch) the same numbers mean other writes.
	Epoch string
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("store: condition failed on key %q: current mod_rev is %d", e.Key, e.ModRev)
}

func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// KeyNotFoundError reports a put that must find its key (Op.MustExist,
// Op.KeepValue) and did not. Nothing was written.
type KeyNotFoundError struct{ Key string }

func (e *KeyNotFoundError) Error() string {
	return fmt.Sprintf("store: key %q not found (a put keeping its value or lease needs one)", e.Key)
}

func (e *KeyNotFoundError) Is(target error) bool { return target == ErrKeyNotFound }

// CompactedError reports that a requested revision is no longer retained.
type CompactedError struct {
	// Oldest is the oldest revision still replayable: revisions below it
	// are gone. It is what etcd calls the compact revision, from which a
	// watch may still start (server/etcd answers it as compact_revision).
	Oldest uint64
}

func (e *CompactedError) Error() string {
	return fmt.Sprintf("store: required revision has been compacted; oldest replayable revision is %d", e.Oldest)
}

func (e *CompactedError) Is(target error) bool { return target == ErrCompacted }

// WidReusedError reports a write whose id (Write.Wid) already committed
// with other content (Write.Fingerprint): a repeat must be the same write,
// so nothing was written.
type WidReusedError struct {
	Rev uint64 // the revision the id committed at
}

func (e *WidReusedError) Error() string {
	return fmt.Sprintf("store: write id already committed at revision %d with different conditions or operations", e.Rev)
}

func (e *WidReusedError) Is(target error) bool { return target == ErrWidReused }

// QuotaError reports a write refused because it would take its room past
// its quota (Limits.MaxRoomKeys, Limits.MaxRoomBytes). Nothing was written.
type QuotaError struct {
	Keys, Bytes       int64 // the room's size had the write committed
	MaxKeys, MaxBytes int64
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("store: room quota exceeded: the write would make the room %d keys and %d bytes of keys and values (limits %d keys, %d bytes); delete keys first",
		e.Keys, e.Bytes, e.MaxKeys, e.MaxBytes)
}

func (e *QuotaError) Is(target error) bool { return target == ErrQuotaExceeded }
