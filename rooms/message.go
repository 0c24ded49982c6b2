package rooms

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/statecast/statecast/store"
)

// Kind says what a Message tells a watcher.
type Kind uint8

const (
	// KindEvents carries the watcher's matching events of one revision
	// (all of a transaction's matching events, together).
	KindEvents Kind = iota + 1
	// KindSynced marks the end of a replay: the watcher has every matching
	// event up to Rev, the head when the replay ended; live events follow.
	KindSynced
	// KindProgress tells an idle watcher that nothing matching happened up
	// to Rev, so its resume point can move forward.
	KindProgress
	// KindSnapshot replaces the watcher's whole view with Items at Rev.
	KindSnapshot
	// KindCoalesced carries the latest event per key (deletes as
	// tombstones) of everything the watcher missed while it was slow, up
	// to Rev. After it the watcher's view equals the room at Rev.
	KindCoalesced
)

func (k Kind) String() string {
	switch k {
	case KindEvents:
		return "events"
	case KindSynced:
		return "synced"
	case KindProgress:
		return "progress"
	case KindSnapshot:
		return "snapshot"
	case KindCoalesced:
		return "coalesced"
	}
	return "unknown"
}

// Reason says why a watcher got a snapshot.
type Reason uint8

const (
	// ReasonInitial: the watch named no starting revision (list-then-watch).
	ReasonInitial Reason = iota + 1
	// ReasonCompacted: the starting revision is older than retained history.
	ReasonCompacted
	// ReasonEpoch: the starting position belongs to another epoch (the
	// room's state was lost and recreated).
	ReasonEpoch
	// ReasonSlow: the watcher fell too far behind to be caught up by
	// replay or coalescing.
	ReasonSlow
)

func (r Reason) String() string {
	switch r {
	case ReasonInitial:
		return "initial"
	case ReasonCompacted:
		return "compacted"
	case ReasonEpoch:
		return "epoch"
	case ReasonSlow:
		return "slow"
	}
	return ""
}

// Message is what a Watcher delivers. Rev never decreases from one message
// to the next, and the revisions of Events, Coalesced and Snapshot
// messages strictly increase.
type Message struct {
	Kind   Kind
	Rev    uint64
	Change *Change    // KindEvents and KindCoalesced
	Epoch  string     // KindSnapshot
	Items  []store.KV // KindSnapshot, sorted by key: Snap's, read-only
	Reason Reason     // KindSnapshot
	Snap   *Snapshot  // KindSnapshot: the items, shared, with their encodings
}

// Change is the events of one revision as one watcher receives them. A
// watcher that receives every event of a revision shares the room's Change
// with every other such watcher, so encodings cached on it are made once.
// A Change is read-only.
type Change struct {
	Rev    uint64
	Time   time.Time
	Events []store.Event
	// Filtered marks the Change of a filtered watcher (see Filter): its
	// deletes are leaves, keys that left the watcher's view.
	Filtered bool

	enc [MaxCodecs]atomic.Pointer[[]byte]

	// Set by the room under its lock: size is store.BatchBytes(Events)
	// (see changeBytes); held is what the node's history budget was
	// charged for it when the room's history took it.
	size, held int64
	// While a history retains c, acct is the node's budget, charged for
	// every encoding cached later too (extra); dropping c swaps extra to
	// released, so an encoding cached meanwhile is not charged.
	acct  atomic.Pointer[budget]
	extra atomic.Int64
}

const released = math.MinInt64 / 2

// release takes c's cached encodings back from the budget it was charged
// to; history's held covers the rest.
func (c *Change) release() {
	if b := c.acct.Swap(nil); b != nil {
		b.charge(-c.extra.Swap(released))
	}
}

// MaxCodecs is the number of encoding slots a Change caches.
const MaxCodecs = 6

// encodedBytes is the size of the encodings cached on c so far.
func (c *Change) encodedBytes() int64 {
	var n int64
	for i := range c.enc {
		if p := c.enc[i].Load(); p != nil {
			n += int64(len(*p))
		}
	}
	return n
}

// Encoded returns the encoding of c in slot codec (0 <= codec < MaxCodecs),
// calling encode the first time. Concurrent callers may both encode; one
// result wins and is returned to all later callers.
func (c *Change) Encoded(codec int, encode func(*Change) []byte) []byte {
	if p := c.enc[codec].Load(); p != nil {
		return *p
	}
	b := encode(c)
	if c.enc[codec].CompareAndSwap(nil, &b) {
		if a := c.acct.Load(); a != nil && c.extra.Add(int64(len(b))) > 0 {
			a.charge(int64(len(b))) // a replay in another codec grew a retained revision
		}
		return b
	}
	return *c.enc[codec].Load()
}
