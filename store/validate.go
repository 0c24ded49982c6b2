package store

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Limits bounds what one write may carry. The zero value of each field
// means its default.
type Limits struct {
	MaxKeyBytes   int // default 1024
	MaxValueBytes int // default 256 KiB
	MaxOps        int // ops plus conditions per write, default 256
	// MaxRoomKeys and MaxRoomBytes are a room's quota: its keys, and
	// the sum of its keys' and values' lengths. A write that would take
	// the room past either is refused with a *QuotaError; one that does
	// not grow what is over (a delete, a smaller value) always commits.
	MaxRoomKeys  int   // default 100,000
	MaxRoomBytes int64 // default 64 MiB
}

const (
	defaultMaxKeyBytes   = 1024
	defaultMaxValueBytes = 256 << 10
	defaultMaxOps        = 256
	defaultMaxRoomKeys   = 100_000
	defaultMaxRoomBytes  = 64 << 20
	maxRoomBytes         = 128
	// MaxWidBytes bounds a client's write id (ValidWid).
	MaxWidBytes = 64
	// MaxStoredWidBytes bounds Write.Wid: a client's id with the scope
	// the server puts before it, and Write.Fingerprint.
	MaxStoredWidBytes = 128
)

// WithDefaults returns l with zero fields set to their defaults.
func (l Limits) WithDefaults() Limits {
	if l.MaxKeyBytes <= 0 {
		l.MaxKeyBytes = defaultMaxKeyBytes
	}
	if l.MaxValueBytes <= 0 {
		l.MaxValueBytes = defaultMaxValueBytes
	}
	if l.MaxOps <= 0 {
		l.MaxOps = defaultMaxOps
	}
	if l.MaxRoomKeys <= 0 {
		l.MaxRoomKeys = defaultMaxRoomKeys
	}
	if l.MaxRoomBytes <= 0 {
		l.MaxRoomBytes = defaultMaxRoomBytes
	}
	return l
}

// ValidRoom reports whether name is a valid room name and why not.
// Room names are 1..128 bytes of [A-Za-z0-9] and "._:-@". They appear in
// URLs and, on Redis, inside a cluster hash tag, so "/", "{" and "}" and
// anything else outside that set are rejected.
func ValidRoom(name string) error {
	if name == "" || len(name) > maxRoomBytes {
		return fmt.Errorf("%w: %q must be 1 to %d bytes", ErrInvalidRoom, name, maxRoomBytes)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '.' || c == '_' || c == ':' || c == '-' || c == '@':
		default:
			return fmt.Errorf("%w: %q contains %q (allowed: letters, digits and ._:-@)", ErrInvalidRoom, name, c)
		}
	}
	return nil
}

// ValidWid reports whether wid is a valid write id: 1 to MaxWidBytes
// bytes of printable ASCII without space (0x21-0x7e), so it is safe in a
// header, a log line and every store's encoding.
func ValidWid(wid string) error { return validWid(wid, MaxWidBytes) }

// ValidStoredWid is ValidWid for Write.Wid, which may be longer: up to
// MaxStoredWidBytes.
func ValidStoredWid(wid string) error { return validWid(wid, MaxStoredWidBytes) }

func validWid(wid string, max int) error {
	if wid == "" || len(wid) > max {
		return fmt.Errorf("%w: must be 1 to %d bytes, got %d", ErrInvalidWid, max, len(wid))
	}
	for i := 0; i < len(wid); i++ {
		if c := wid[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("%w: byte %d is %#02x (allowed: printable ASCII 0x21-0x7e)", ErrInvalidWid, i, c)
		}
	}
	return nil
}

// ValidKey reports whether key is a valid key under l: non-empty, valid
// UTF-8, no NUL byte, at most MaxKeyBytes.
func (l Limits) ValidKey(key string) error {
	l = l.WithDefaults()
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	case len(key) > l.MaxKeyBytes:
		return fmt.Errorf("%w: key of %d bytes exceeds the limit of %d", ErrInvalidKey, len(key), l.MaxKeyBytes)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: key is not valid UTF-8", ErrInvalidKey)
	}
	for i := 0; i < len(key); i++ {
		if key[i] == 0 {
			return fmt.Errorf("%w: key contains a NUL byte", ErrInvalidKey)
		}
	}
	return nil
}

// Validate checks room and w against l. Backends call it before touching
// any state, so a rejected write has written nothing.
func (l Limits) Validate(room string, w Write) error {
	l = l.WithDefaults()
	if err := ValidRoom(room); err != nil {
		return err
	}
	if len(w.Ops) == 0 && len(w.Conds) == 0 {
		return ErrEmptyWrite
	}
	if w.Wid != "" {
		if err := ValidStoredWid(w.Wid); err != nil {
			return err
		}
		if w.Fingerprint != "" {
			if err := ValidStoredWid(w.Fingerprint); err != nil {
				return fmt.Errorf("fingerprint: %w", err)
			}
		}
		if w.LegacyWid != "" {
			if err := ValidWid(w.LegacyWid); err != nil {
				return fmt.Errorf("legacy id: %w", err)
			}
		}
	} else if w.Since != nil || w.Fingerprint != "" || w.LegacyWid != "" {
		return fmt.Errorf("%w: since, fingerprint or legacy id given without a write id", ErrInvalidWid)
	}
	if n := len(w.Ops) + len(w.Conds); n > l.MaxOps {
		return fmt.Errorf("%w: %d exceeds the limit of %d", ErrTooManyOps, n, l.MaxOps)
	}
	for _, c := range w.Conds {
		if c.Room != "" && c.Room != room {
			return fmt.Errorf("%w: condition on room %q in a write to room %q", ErrCrossRoom, c.Room, room)
		}
		if err := l.ValidKey(c.Key); err != nil {
			return err
		}
	}
	seen := make(map[string]struct{}, len(w.Ops))
	for _, op := range w.Ops {
		if err := l.ValidKey(op.Key); err != nil {
			return err
		}
		if _, dup := seen[op.Key]; dup {
			return fmt.Errorf("%w: %q", ErrDuplicateKey, op.Key)
		}
		seen[op.Key] = struct{}{}
		switch op.Type {
		case OpPut:
			if len(op.Value) > l.MaxValueBytes {
				return fmt.Errorf("%w: %d bytes exceeds the limit of %d", ErrValueTooLarge, len(op.Value), l.MaxValueBytes)
			}
			if op.KeepLease && op.Lease != "" {
				return fmt.Errorf("%w: a put of %q keeps its lease and names one", ErrInvalidOp, op.Key)
			}
			if op.KeepValue && len(op.Value) > 0 {
				return fmt.Errorf("%w: a put of %q keeps its value and gives one", ErrInvalidOp, op.Key)
			}
		case OpDelete:
			if op.KeepLease || op.KeepValue || op.MustExist {
				return fmt.Errorf("%w: a delete of %q keeps nothing", ErrInvalidOp, op.Key)
			}
		default:
			return fmt.Errorf("%w: unknown op type %d", ErrInvalidOp, op.Type)
		}
	}
	return nil
}

// ReservedRoomPrefix starts the names of the rooms a server keeps for
// itself (the webhooks' registry, claims and cursors): valid store rooms
// that no client may read, watch or write.
const ReservedRoomPrefix = "_statecast:"

// ValidClientRoom is ValidRoom, and also refuses the reserved rooms.
func ValidClientRoom(name string) error {
	if err := ValidRoom(name); err != nil {
		return err
	}
	if strings.HasPrefix(name, ReservedRoomPrefix) {
		return fmt.Errorf("%w: %q: rooms named %s* are reserved for the server", ErrInvalidRoom, name, ReservedRoomPrefix)
	}
	return nil
}
