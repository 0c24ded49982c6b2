package store

import (
	"strings"
	"time"
)

// DefaultMaxEvents is the history retained per room when nothing else is
// configured.
const DefaultMaxEvents = 10_000

// Retention bounds a room's history. Only whole revisions are dropped, so
// the oldest retained revision is always a complete batch.
type Retention struct {
	MaxEvents int           // events retained; 0 means DefaultMaxEvents
	MaxAge    time.Duration // 0 means no age limit
}

// RoomClass gives the rooms whose name starts with Prefix (for example
// "lobby:" or "doc:") their own retention.
type RoomClass struct {
	Prefix    string
	Retention Retention
}

// RetentionPolicy picks a Retention per room: the class with the longest
// matching prefix, else Default. The zero value retains DefaultMaxEvents
// events per room with no age limit.
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
	return r
}

// Drops reports whether the oldest retained batch, committed at oldestAt,
// must go when the history holds total events: too many events, or too
// old at now. Backends call it in a loop, dropping one whole batch at a
// time, so a write costs O(batches dropped), not O(history).
func (r Retention) Drops(total int, oldestAt, now time.Time) bool {
	return total > r.MaxEvents || (r.MaxAge > 0 && now.Sub(oldestAt) > r.MaxAge)
}
