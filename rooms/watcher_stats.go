package rooms

// WatcherStats describes a watcher for operators (the server's inspector).
type WatcherStats struct {
	State  string // live, replay, parked (slow: coalescing), snapshot, closed
	Head   uint64 // the room's head revision
	Queued int    // messages waiting for the connection to take them
	// Behind is how many of the room's revisions the watcher's connection
	// has not taken yet: 0 for a live watcher with nothing queued (a prefix
	// watcher is never behind for revisions that did not match it).
	Behind uint64
}

var stateNames = [...]string{stLive: "live", stReplay: "replay", stParked: "parked", stSnapshot: "snapshot", stClosed: "closed"}

// Stats returns w's state; it takes the room's lock briefly.
func (w *Watcher) Stats() WatcherStats {
	r := w.room
	r.mu.Lock()
	defer r.mu.Unlock()
	st := WatcherStats{State: stateNames[w.state], Head: r.head, Queued: len(w.q)}
	from := w.next // replay, parked: the first revision not handed over
	if len(w.q) > 0 {
		from = w.q[0].Rev
	}
	if (w.state != stLive || len(w.q) > 0) && w.state != stSnapshot && w.state != stClosed && from <= r.head {
		st.Behind = r.head - from + 1
	}
	return st
}
