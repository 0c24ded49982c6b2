package rooms

import "errors"

var (
	// ErrClosed is returned by an Engine after Close, and ends the watchers
	// that were open when it closed.
	ErrClosed = errors.New("rooms: engine closed")
	// ErrWatcherClosed is returned by a Watcher after its Close.
	ErrWatcherClosed = errors.New("rooms: watcher closed")
	// ErrRoomReset ends the watchers of a room whose view had to be
	// dropped (its store reported a gap or a new epoch); they resume from
	// their last revision on a fresh view.
	ErrRoomReset = errors.New("rooms: room reset, resume from the last revision")
	// ErrEpochMismatch is returned by Watch with FailIfCompacted when the
	// starting position belongs to another epoch.
	ErrEpochMismatch = errors.New("rooms: position is from another epoch")
	// ErrUnsynced fails a linearizable read when this node could not learn
	// the room's committed revision from the store, or its view did not
	// reach it within Config.SyncTimeout: retry, or read elsewhere.
	ErrUnsynced = errors.New("rooms: this node's view could not catch up with the store")
	// ErrTooManyFilters refuses a watch whose filter would be one more
	// distinct filter than Config.MaxFilters in its room.
	ErrTooManyFilters = errors.New("rooms: too many distinct filters watch this room")
	// ErrFilterTooSlow ends the watchers of a filter whose evaluations of
	// one change took longer than Config.FilterTimeBudget, and refuses
	// watches with it in that room for FilterBanTime.
	ErrFilterTooSlow = errors.New("rooms: the watch's filter took longer than its time budget to evaluate in this room")
)

// ErrFutureRevision fails a Compact to a revision past the room's head.
var ErrFutureRevision = errors.New("rooms: revision is past the room's head")
