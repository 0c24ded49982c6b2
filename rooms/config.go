package rooms

import (
	"context"
	"log/slog"
	"time"

	"github.com/statecast/statecast/store"
)

// Config configures an Engine. Zero fields take the documented defaults.
type Config struct {
	// Retention bounds each room's history ring. Give it the store's
	// policy: a ring that retains less than the store only makes resumes
	// fall back to snapshots sooner.
	Retention store.RetentionPolicy

	// HistoryBytes bounds the retained history of all loaded rooms
	// together: store.EventBytes of their events plus the encodings
	// cached at commit (Prepare). Over it, the oldest history on the node
	// is dropped first (whole revisions, the room with the oldest
	// retained revision first), so a resume from there gets a snapshot
	// instead of the node running out of memory. Default 512 MiB.
	HistoryBytes int64

	// QueueLimit is how many messages a watcher may have waiting before it
	// is parked as slow; its missed changes are then sent as one coalesced
	// message when it drains. Default 1024.
	QueueLimit int

	// QueueBytes is how many bytes of events (store.EventBytes) a watcher
	// may have waiting before it is parked as slow, as for QueueLimit; a
	// single message larger than it is still queued when the queue is
	// empty. Default 4 MiB.
	QueueBytes int64

	// CoalesceLimit is the most distinct keys a coalesced catch-up may
	// carry; a slow watcher that missed more gets a snapshot instead (as
	// it does past QueueBytes where the snapshot costs no more: see
	// coalesceLocked). Default 4096.
	CoalesceLimit int

	// ReplayChunk is the most revisions one Drain takes from history while
	// replaying (a filtered watcher counts those its filter drops too),
	// which bounds how long a replay holds the room lock. Default 1024.
	ReplayChunk int

	// MaxFilters is the most distinct filters (by text) a room's watchers
	// may hold at once: each is an evaluation per event of the room.
	// Default 256.
	MaxFilters int

	// FilterTimeBudget is the most the evaluations of one filter may take
	// for one change of a room, under its lock; a filter over it for
	// FilterStrikes changes in a row ends its watchers there
	// (ErrFilterTooSlow) and is refused in that room for FilterBanTime.
	// rooms/filter refuses at compile time what could cost more than
	// about one decode of the largest value; this is the backstop for what
	// the estimate does not see (a slower machine, a Go Filter). Default
	// 50ms; negative disables.
	FilterTimeBudget time.Duration

	// ProgressInterval is how often idle watchers get a progress mark
	// carrying the head revision. Default 10s; negative disables.
	ProgressInterval time.Duration

	// IdleTimeout is how long a room with no watchers stays loaded.
	// Default 1 minute.
	IdleTimeout time.Duration

	// SyncTimeout bounds how long a linearizable read (and the reply to a
	// write) waits for this node's view to reach the store's committed
	// revision, on a store whose tail lags its commits (Redis). A read
	// past it fails with ErrUnsynced. Default 5s.
	SyncTimeout time.Duration

	// Prepare, when set, is called with each committed revision's Change
	// before any watcher sees it, under the room's lock: a server uses it
	// to cache the encoding most clients need, so a later replay writes
	// ready bytes instead of encoding thousands of revisions on demand.
	// It must be quick and must not block.
	Prepare func(*Change)

	// BeforeApply, when set, runs before every write Apply sends to the
	// store; an error fails the write, which is not sent. The webhooks use
	// it to record a room in the store before its first write, so that
	// no committed revision can escape them.
	BeforeApply func(ctx context.Context, room string) error

	// Logger receives room lifecycle messages (never one per event).
	// Defaults to discarding.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.QueueLimit <= 0 {
		c.QueueLimit = 1024
	}
	if c.QueueBytes <= 0 {
		c.QueueBytes = 4 << 20
	}
	if c.HistoryBytes <= 0 {
		c.HistoryBytes = 512 << 20
	}
	if c.CoalesceLimit <= 0 {
		c.CoalesceLimit = 4096
	}
	if c.ReplayChunk <= 0 {
		c.ReplayChunk = 1024
	}
	if c.MaxFilters <= 0 {
		c.MaxFilters = 256
	}
	if c.FilterTimeBudget == 0 {
		c.FilterTimeBudget = 50 * time.Millisecond
	}
	if c.ProgressInterval == 0 {
		c.ProgressInterval = 10 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = time.Minute
	}
	if c.SyncTimeout <= 0 {
		c.SyncTimeout = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}
