package store

import (
	"context"
	"time"
)

// Nodes is implemented by stores that several nodes share (Redis). It is
// how leases outlive the node that granted them by a bounded time only:
// every node beats while it runs; a node whose last beat is older than a
// timeout is dead, and the one node that claims it ends its leases.
type Nodes interface {
	// Beat records that node is alive at now.
	Beat(ctx context.Context, node string, now time.Time) error
	// Beats returns every registered node with the time of its last beat.
	Beats(ctx context.Context) (map[string]time.Time, error)
	// Claim removes node from the registry if its last beat is still
	// before the given time. Of nodes racing to claim the same dead node,
	// exactly one gets true: that one ends its leases.
	Claim(ctx context.Context, node string, before time.Time) (bool, error)
}
