package hooks

import (
	"fmt"

	"github.com/statecast/statecast/server/internal/wids"
	"github.com/statecast/statecast/server/internal/wireconv"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// Delivery is the JSON body of one webhook POST: either consecutive
// committed revisions of one room (Type "revisions"), or the whole state
// of the room at one revision (Type "snapshot") when the revisions after
// the hook's cursor can no longer be replayed.
type Delivery struct {
	Hook  string `json:"hook"`
	Type  string `json:"type"` // "revisions" or "snapshot"
	Room  string `json:"room"`
	Epoch string `json:"epoch"`
	// FromRev and ToRev bound the revisions delivered (both included);
	// a snapshot has both at its revision.
	FromRev   uint64     `json:"from_rev"`
	ToRev     uint64     `json:"to_rev"`
	Revisions []Revision `json:"revisions,omitempty"`
	// Reason says why a snapshot was sent: "initial" (the hook never
	// delivered this room and its history from revision 1 is gone),
	// "compacted" (the history after the cursor is gone) or "epoch" (the
	// room's state was lost and started again: revisions restart).
	Reason string      `json:"reason,omitempty"`
	Items  []wire.Item `json:"items,omitempty"`
}

// Delivery types and snapshot reasons.
const (
	TypeRevisions   = "revisions"
	TypeSnapshot    = "snapshot"
	ReasonInitial   = "initial"
	ReasonCompacted = "compacted"
	ReasonEpoch     = "epoch"
)

// Revision is one committed revision: its events, with previous values,
// in the order of the write's operations.
type Revision struct {
	Rev    uint64       `json:"rev"`
	TimeMS int64        `json:"time_ms"` // commit time, Unix milliseconds
	Events []wire.Event `json:"events"`
}

// Key is the delivery's idempotency key, also sent as Statecast-Delivery.
func (d *Delivery) Key() string {
	if d.Type == TypeSnapshot {
		return fmt.Sprintf("%s@%s:snapshot-%d", d.Room, d.Epoch, d.ToRev)
	}
	return fmt.Sprintf("%s@%s:%d-%d", d.Room, d.Epoch, d.FromRev, d.ToRev)
}

func revisionsDelivery(hook, room string, batches []store.Batch) *Delivery {
	d := &Delivery{Hook: hook, Type: TypeRevisions, Room: room, Epoch: batches[0].Epoch,
		FromRev: batches[0].Rev, ToRev: batches[len(batches)-1].Rev, Revisions: make([]Revision, len(batches))}
	for i, b := range batches {
		evs := wireconv.Events(b.Events, true, false, wids.Client)
		for j := range evs {
			if evs[j].Prev != nil {
				evs[j].Prev.Key = evs[j].Key // whole, rather than an empty key
			}
		}
		d.Revisions[i] = Revision{Rev: b.Rev, TimeMS: b.Time.UnixMilli(), Events: evs}
	}
	return d
}

func snapshotDelivery(hook, room, reason string, snap store.Snapshot) *Delivery {
	d := &Delivery{Hook: hook, Type: TypeSnapshot, Room: room, Epoch: snap.Epoch,
		FromRev: snap.Rev, ToRev: snap.Rev, Reason: reason, Items: wireconv.Items(snap.Items)}
	return d
}
