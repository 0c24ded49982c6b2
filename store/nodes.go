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
	// Beat records that node is alive now.
	Beat(ctx context.Context, node string) (BeatResult, error)
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

// BeatResult is what a beat found.
type BeatResult struct {
	// Added: node was not registered. For a node that had beaten before,
	// the others took it for dead (claimed it) in between.
	Added bool
	// Reached is how long after it was sent the store ran the beat, on
	// the store's clock as the node maps its own onto it (0: not known).
	// A late beat's time is this and its answer's way back: a beat
	// stuck on its way out (the node's scheduler, its connection's
	// queue) tells a different story from an answer read late.
	Reached time.Duration
}
