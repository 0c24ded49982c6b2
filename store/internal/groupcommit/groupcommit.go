// Package groupcommit holds what the stores' group commits share (the file
// store's committer and the Redis store's, one per master): gathering the
// writes queued for one commit, and handing each write over between its
// caller and the committer exactly once.
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

// Fill appends to group, which holds a commit's first write, whatever q
// holds at this moment, until group has maxWrites writes or their sizes
// add up to maxBytes, or q is closed.
func Fill[T any](group []T, q <-chan T, maxWrites, maxBytes int, size func(T) int) []T {
	n := 0
	for _, w := range group {
		n += size(w)
	}
	for len(group) < maxWrites && n < maxBytes {
		select {
		case w, ok := <-q:
			if !ok {
				return group
			}
			group = append(group, w)
			n += size(w)
		default:
			return group
		}
	}
	return group
}
