package store

import (
	"strings"
	"time"
)

// DefaultMaxEvents is the history retained per room when nothing else is
// configured.
const DefaultMaxEvents = 10_000

// DefaultMaxBytes is the history retained per room, in bytes, when
// nothing else is configured: 64 MiB, a few hundred events at the largest
// value size, while the event bound is what limits rooms of small values.
const DefaultMaxBytes = 64 << 20

// EventOverhead is what EventBytes charges per event beyond its keys and
// values: the Event, its KV and Prev, and a history slot.
const EventOverhead = 160

// Retention bounds a room's history. Only whole revisions are dropped, so
// the oldest retained revision is always a complete batch.
type Retention struct {
	MaxEvents int           // events retained; 0 means DefaultMaxEvents
	MaxAge    time.Duration // 0 means no age limit
	// MaxBytes bounds the bytes of the retained history; 0 means
	// DefaultMaxBytes. Each backend counts what the history costs it: the
	// memory store the EventBytes of its events, the file store the size
	// of its encoded log records (what they take on disk and in its mmap;
	// the two measures are close), the Redis store the encoded batches of
	// its stream entries plus 64 bytes each, the rooms engine's history
	// ring its own count. A single revision larger than MaxBytes is
	// committed but leaves no history behind it, as one larger than
	// MaxEvents does.
	MaxBytes int64
}

// EventBytes is what an event costs a history: its key, value, write id
// and previous value, plus EventOverhead. A previous value is often shared
// with an older event's value; counting it anyway keeps the sum an upper
// bound of the memory the history pins, whatever the backend.
func EventBytes(ev *Event) int64 {
	n := int64(EventOverhead + len(ev.KV.Key) + len(ev.KV.Value) + len(ev.KV.Lease) + len(ev.Wid))
	if ev.Prev != nil {
		n += int64(len(ev.Prev.Value) + len(ev.Prev.Lease))
	}
	return n
}

// BatchBytes is the EventBytes of all of evs.
func BatchBytes(evs []Event) int64 {
	var n int64
	for i := range evs {
		n += EventBytes(&evs[i])
	}
	return n
}

// RoomClass gives the rooms whose name starts with Prefix (for example
// "lobby:" or "doc:") their own retention.
type RoomClass struct {
	Prefix    string
	Retention Retention
}

// RetentionPolicy picks a Retention per room: the class with the longest
// matching prefix, else Default. The zero value retains DefaultMaxEvents
// events and DefaultMaxBytes bytes per room with no age limit.
type RetentionPolicy struct {
	Default Retention
	Classes []RoomClass
}

// For returns the retention of room, with defaults filled in.
func (p RetentionPolicy) For(room string) Retention {
	r, best := p.Default, -1
	for _, c := range p.Classes {
		if len(c.Prefix) > best && strings.HasPrefix(room, c.Prefix) {
			r, best = c.Retention, len(c.Prefix)
		}
	}
	if r.MaxEvents <= 0 {
		r.MaxEvents = DefaultMaxEvents
	}
	if r.MaxBytes <= 0 {
		r.MaxBytes = DefaultMaxBytes
	}
	return r
}

// Drops reports whether the oldest retained batch, committed at oldestAt,
// must go when the history holds total events: too many events, or too
// old at now. Backends call it in a loop, dropping one whole batch at a
// time, so a write costs O(batches dropped), not O(history). A backend
// that counts bytes also drops while OverBytes.
func (r Retention) Drops(total int, oldestAt, now time.Time) bool {
	return total > r.MaxEvents || (r.MaxAge > 0 && now.Sub(oldestAt) > r.MaxAge)
}

// OverBytes reports whether a history of bytes (in the backend's measure,
// see MaxBytes) must drop its oldest batch.
func (r Retention) OverBytes(bytes int64) bool { return bytes > r.MaxBytes }

// OldestFirst picks, among rooms, the one whose oldest retained revision
// is the oldest (oldest reports it, false for a room with none), and the
// runner-up's oldest time (zero when there is none): a node-wide history
// budget compacts the victim down to the runner-up, so the history that
// goes is always the oldest on the node.
func OldestFirst[R any](rooms []R, oldest func(R) (time.Time, bool)) (victim R, next time.Time, found bool) {
	var at time.Time
	for _, r := range rooms {
		t, ok := oldest(r)
		switch {
		case !ok:
		case !found || t.Before(at):
			victim, next, at, found = r, at, t, true
		case next.IsZero() || t.Before(next):
			next = t
		}
	}
	return victim, next, found
}
