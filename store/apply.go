package store

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// plan turns w into the events it would commit at revision head+1 of
// epoch, given
// get, which reads a key's current state. It returns a *ConflictError when
// a condition fails, and no events when w changes nothing. Backends that
// keep state in Go (memory, file) share it; the caller holds whatever lock
// makes get and the later commit atomic.
func plan(w Write, epoch string, head uint64, get func(key string) (KV, bool, error)) ([]Event, error) {
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
			return nil, &ConflictError{Key: c.Key, ModRev: modRev, Rev: head, Epoch: epoch}
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
			if !ok && (op.MustExist || op.KeepValue) {
				return nil, &KeyNotFoundError{Key: op.Key}
			}
			kv := KV{Key: op.Key, Value: op.Value, CreateRev: rev, ModRev: rev, Version: 1, Lease: op.Lease}
			if ok {
				kv.CreateRev, kv.Version = cur.CreateRev, cur.Version+1
				if op.KeepLease {
					kv.Lease = cur.Lease
				}
				if op.KeepValue {
					kv.Value = cur.Value
				}
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
// step as its commit. committed looks an id up among the room's
// remembered ids, which cover the revisions from oldest on, and returns
// the fingerprint remembered with it ("" for none). It returns the
// revision the id committed at (dup); a *WidReusedError when it committed
// with another fingerprint; ErrWidCompacted when the id is unknown but the
// first attempt may have committed before oldest.
func seenWid(w Write, oldest uint64, committed func(wid string) (rev uint64, fp string, ok bool, err error)) (rev uint64, dup bool, err error) {
	if w.Wid == "" {
		return 0, false, nil
	}
	rev, fp, dup, err := committed(w.Wid)
	if err != nil {
		return 0, false, err
	}
	if dup {
		if fp != "" && fp != fingerprint(w) {
			return rev, false, &WidReusedError{Rev: rev}
		}
		return rev, true, nil
	}
	// An id an older build stored has no fingerprint: only such a record
	// is a legacy id's commit (one a newer build stored is another
	// writer's, whatever its text).
	if w.LegacyWid != "" {
		rev, fp, found, err := committed(w.LegacyWid)
		if err != nil {
			return 0, false, err
		}
		if found && fp == "" {
			return rev, true, nil
		}
	}
	if w.Since != nil && *w.Since < oldest-1 { // oldest >= 1; since+1 may overflow
		return 0, false, fmt.Errorf("%w (oldest retained revision %d, write first sent after %d)", ErrWidCompacted, oldest, *w.Since)
	}
	return 0, false, nil
}

// fingerprint is w's Fingerprint, or FingerprintOf(w) when it has none.
func fingerprint(w Write) string {
	if w.Fingerprint != "" {
		return w.Fingerprint
	}
	return FingerprintOf(w)
}

// FingerprintOf identifies w's content for its write id: its conditions
// and its operations (type, key, value, and whether a put keeps its value
// or must find its key), in order; not its leases (named or kept), which
// a retry on a new connection may name differently, nor its id or since.
// 96 bits of SHA-256, in base64url (16 bytes).
func FingerprintOf(w Write) string {
	h := sha256.New()
	var b []byte
	str := func(s []byte) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	for _, c := range w.Conds {
		b = append(b[:0], 'c')
		str([]byte(c.Key))
		b = binary.AppendUvarint(b, c.ModRev)
		h.Write(b)
	}
	for _, op := range w.Ops {
		b = append(b[:0], 'o', byte(op.Type))
		// A put that keeps its value or must find its key is marked 'O'
		// with its flags; other ops as an older build remembered them.
		if f := opFlags(op); f != 0 {
			b = append(b[:0], 'O', byte(op.Type), f)
		}
		str([]byte(op.Key))
		h.Write(b)
		if op.Type == OpPut {
			b = binary.AppendUvarint(b[:0], uint64(len(op.Value)))
			h.Write(b)
			h.Write(op.Value)
		}
	}
	var sum [sha256.Size]byte
	return base64.RawURLEncoding.EncodeToString(h.Sum(sum[:0])[:12])
}

// opFlags is what a put's KeepValue and MustExist add to its content.
func opFlags(op Op) byte {
	var f byte
	if op.KeepValue {
		f |= 1
	}
	if op.MustExist {
		f |= 2
	}
	return f
}

// NewEpoch returns a fresh random epoch id.
func NewEpoch() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}
