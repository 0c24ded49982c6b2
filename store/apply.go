package store

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// plan turns w into the events it would commit at revision head+1, given
// get, which reads a key's current state. It returns a *ConflictError when
// a condition fails, and no events when w changes nothing. Backends that
// keep state in Go (memory, file) share it; the caller holds whatever lock
// makes get and the later commit atomic.
func plan(w Write, head uint64, get func(key string) (KV, bool, error)) ([]Event, error) {
	for _, c := range w.Conds {
		cur, ok, err := get(c.Key)
		if err != nil {
			return nil, err
		}
		var modRev uint64
		if ok {
			modRev = cur.ModRev
		}
		if modRev != c.ModRev {
			return nil, &ConflictError{Key: c.Key, ModRev: modRev, Rev: head}
		}
	}
	rev := head + 1
	var events []Event
	for _, op := range w.Ops {
		cur, ok, err := get(op.Key)
		if err != nil {
			return nil, err
		}
		var prev *KV
		if ok {
			p := cur
			prev = &p
		}
		switch op.Type {
		case OpPut:
			kv := KV{Key: op.Key, Value: op.Value, CreateRev: rev, ModRev: rev, Version: 1, Lease: op.Lease}
			if ok {
				kv.CreateRev, kv.Version = cur.CreateRev, cur.Version+1
			}
			events = append(events, Event{Type: OpPut, KV: kv, Prev: prev, Wid: w.Wid})
		case OpDelete:
			if !ok {
				continue // deleting a missing key writes nothing
			}
			events = append(events, Event{Type: OpDelete, KV: KV{Key: op.Key, ModRev: rev}, Prev: prev, Wid: w.Wid})
		}
	}
	return events, nil
}

// seenWid checks w's write id before w is planned, in the same atomic
// step as its commit. committed looks the id up among the room's
// remembered ids, which cover the revisions from oldest on. It returns the
// revision the id committed at (dup), or ErrWidCompacted when the id is
// unknown but the first attempt may have committed before oldest.
func seenWid(w Write, oldest uint64, committed func(wid string) (uint64, bool, error)) (rev uint64, dup bool, err error) {
	if w.Wid == "" {
		return 0, false, nil
	}
	if rev, dup, err = committed(w.Wid); dup || err != nil {
		return rev, dup, err
	}
	if w.Since != nil && *w.Since < oldest-1 { // oldest >= 1; since+1 may overflow
		return 0, false, fmt.Errorf("%w (oldest retained revision %d, write first sent after %d)", ErrWidCompacted, oldest, *w.Since)
	}
	return 0, false, nil
}

// NewEpoch returns a fresh random epoch id.
func NewEpoch() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}
