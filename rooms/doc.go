// Package rooms is the room engine of one node: it serves watchers of a
// room from memory, list-then-watching the store exactly once per room.
//
// A loaded room holds its view at the head revision (a B-tree, cloned
// copy-on-write for snapshots), a history ring shared by all its watchers
// (one small slot per retained event), and a prefix index of its live
// watchers. The store's tail (store.Store.Follow) moves the view forward
// strictly in revision order; each revision becomes one Change, handed to
// every matching watcher as one message and shared, so an encoding cached
// on it is made once however many watchers receive it.
//
// A watcher is a cursor and a bounded queue, in one of four states:
//
//	live      in the index; each matching revision is queued as it commits
//	replay    catching up from the ring (resume); ends with a synced marker
//	parked    its queue overflowed; once drained it gets one coalesced
//	          message (latest value per key, deletes as tombstones) up to head
//	snapshot  gets the view at head: initial list, compacted or foreign
//	          epoch, or slow past CoalesceLimit keys or the ring's reach (or
//	          past QueueBytes, where a snapshot costs no more)
//
// A watcher may carry a Filter over values: its view is then the filter
// applied to the room, evaluated once per event per distinct filter
// (filtered.go; rooms/filter compiles CEL expressions into one).
//
// Writers never wait for watchers: delivery is a non-blocking append, and
// the catch-up work of a replaying or slow watcher is done by its own
// consumer when it calls Drain, not by the writer.
//
// Lock order, and what may never be done under room.mu: docs/LOCKS.md.
package rooms
