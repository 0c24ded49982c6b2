package client

import (
	"fmt"
	"sort"

	"github.com/statecast/statecast/server/wire"
)

// View is the state a subscriber holds: the keys its subscription
// covers, as of Rev in Epoch. Apply checks the revision contract as it
// goes (docs/DESIGN.md#the-revision-contract), so a test or the load
// tool that feeds it every message learns of a gap it cannot see — a
// duplicate or a regression — at the message that shows it. Not safe for
// concurrent use.
type View struct {
	Epoch string
	Rev   uint64 // the last message's revision: the resume point is Rev+1
	Items map[string]wire.Item
	// Started: a message has been applied (Rev 0 is a valid revision).
	Started bool
}

// NewView returns an empty view.
func NewView() *View { return &View{Items: make(map[string]wire.Item)} }

// Position returns where a new subscription resumes this view ({Epoch,
// Rev+1}), or nil before any message, meaning "send a snapshot".
func (v *View) Position() *wire.Position {
	if !v.Started {
		return nil
	}
	return &wire.Position{Epoch: v.Epoch, Rev: v.Rev + 1}
}

// Apply applies one subscription message. It returns an error, leaving
// the view unchanged, when the message breaks the revision contract:
// events or coalesced at or below the current revision (a duplicate or a
// regression), an event whose mod_rev does not match, a snapshot older
// than the view in the same epoch, or a marker going backwards. Messages
// that carry no state (unsubscribed, replies) are ignored.
func (v *View) Apply(m wire.Message) error {
	if v.Items == nil {
		v.Items = make(map[string]wire.Item)
	}
	switch m.T {
	case wire.TSnapshot:
		if v.Started && m.Epoch == v.Epoch && m.Rev < v.Rev {
			return fmt.Errorf("view: snapshot at rev %d is older than the view at %d", m.Rev, v.Rev)
		}
		clear(v.Items)
		for _, it := range m.Items {
			v.Items[it.Key] = it
		}
		v.Epoch, v.Rev, v.Started = m.Epoch, m.Rev, true
	case wire.TEvents, wire.TCoalesced:
		if v.Started && m.Rev <= v.Rev {
			return fmt.Errorf("view: %s at rev %d, but the view is at %d: duplicate or out of order", m.T, m.Rev, v.Rev)
		}
		for _, ev := range m.Events {
			bad := ev.ModRev != m.Rev // events: every event is of this revision
			if m.T == wire.TCoalesced {
				// Coalesced: the latest change of each key since the last message.
				bad = ev.ModRev > m.Rev || (v.Started && ev.ModRev <= v.Rev)
			}
			if bad {
				return fmt.Errorf("view: %s at rev %d carries %s of %q with mod_rev %d", m.T, m.Rev, ev.Type, ev.Key, ev.ModRev)
			}
		}
		for _, ev := range m.Events {
			if ev.Type != "put" { // delete, or leave: the key left a filtered view
				delete(v.Items, ev.Key)
				continue
			}
			v.Items[ev.Key] = wire.Item{Key: ev.Key, Value: ev.Value, CreateRev: ev.CreateRev,
				ModRev: ev.ModRev, Version: ev.Version, Lease: ev.Lease}
		}
		v.Rev, v.Started = m.Rev, true
	case wire.TSynced, wire.TProgress:
		if v.Started && m.Rev < v.Rev {
			return fmt.Errorf("view: %s at rev %d, but the view is at %d", m.T, m.Rev, v.Rev)
		}
		v.Rev, v.Started = m.Rev, true
	}
	return nil
}

// Sorted returns the items sorted by key, as snapshots and the HTTP list
// carry them, for comparing a view with the room.
func (v *View) Sorted() []wire.Item {
	items := make([]wire.Item, 0, len(v.Items))
	for _, it := range v.Items {
		items = append(items, it)
	}
	sort.Slice(items, func(i, j int) bool { return items[i].Key < items[j].Key })
	return items
}
