package hooks

import (
	"context"

	"github.com/statecast/statecast/store"
)

// WriteCursorForTest exposes writeCursor.
func WriteCursorForTest(ctx context.Context, st store.Store, hook, room string, claimRev, rev uint64) error {
	return writeCursor(ctx, st, hook, room, claimRev, cursor{Epoch: "e", Rev: rev})
}
