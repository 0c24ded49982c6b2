// Package groupcommit holds what the stores' group commits share (the file
// store's committer and the Redis store's, one per master): handing each
// queued write over between its caller and the committer exactly once.
package groupcommit

import "sync/atomic"

// Handover is a queued write's state: the committer takes it or its
// caller abandons it (gave up waiting), whichever comes first; an
// abandoned write is never committed.
type Handover struct{ v atomic.Int32 }

const (
	queued int32 = iota
	taken
	abandoned
)

// Take is the committer's side: false when the caller abandoned it.
func (h *Handover) Take() bool { return h.v.CompareAndSwap(queued, taken) }

// Abandon is the caller's side: false when the committer took it first,
// so that its outcome is the commit's.
func (h *Handover) Abandon() bool { return h.v.CompareAndSwap(queued, abandoned) }
