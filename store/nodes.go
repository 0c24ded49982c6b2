package store

import (
	"context"
	"time"
)

// Nodes is implemented by stores that several nodes share (Redis). It is
// how leases outlive the node that granted them by a bounded time only:
// every node beats while it runs; a node that has not beaten for a
// timeout is dead, and the one node that claims it ends its leases.
// Times are the store's own clock, so the nodes' clocks need not agree.
type Nodes interface {
	// Beat records that node is alive now. added is true when node was
	// not registered: for a node that had beaten before, the others took
	// it for dead (claimed it) in between.
	Beat(ctx context.Context, node string) (added bool, err error)
	// Registered returns the nodes that beat within timeout (alive) and
	// those that did not (stale).
	Registered(ctx context.Context, timeout time.Duration) (alive, stale []string, err error)
	// Claim removes node from the registry if it is still stale. Of nodes
	// racing to claim the same stale node, at most one gets true.
	Claim(ctx context.Context, node string, timeout time.Duration) (bool, error)
	// TakeTurn gives the turn called name to node for ttl, unless a node
	// holds it: of the nodes asking while it is free, one gets true. The
	// turn is never given back; it expires. Work the cluster needs done
	// once an interval, not by every node (the orphan sweeps), runs on
	// the node that took the turn.
	TakeTurn(ctx context.Context, name, node string, ttl time.Duration) (bool, error)
}
