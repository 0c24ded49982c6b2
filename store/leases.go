package store

import (
	"context"
	"time"
)

// SharedLeases is implemented by a store that several nodes share (with
// Nodes): a TTL lease is a record of the store, not of the node that
// granted it, so a client keeps it alive, revokes it or writes under it
// through any node, and it survives the restart of any node. A lease ends
// when its record's deadline passes, ended by whichever node takes it out
// of the store (EndDueLeases), exactly once across the cluster.
//
// The keys written under a lease are listed with its record (AttachLease),
// so ending a lease touches its own keys only. Lease ids are unguessable
// and chosen by the server; the holder is the token subject that granted it.
type SharedLeases interface {
	// GrantLease records lease id of holder, due after ttl. It is false
	// when holder already holds max leases.
	GrantLease(ctx context.Context, id, holder string, ttl time.Duration, max int) (bool, error)
	// KeepAliveLease moves the deadline of lease id to now + its TTL if
	// holder holds it, and returns what it found (nothing changes unless
	// the lease is alive and holder's).
	KeepAliveLease(ctx context.Context, id, holder string) (LeaseState, error)
	// Lease returns the state of lease id.
	Lease(ctx context.Context, id string) (LeaseState, error)
	// RevokeLease ends lease id now if holder holds it, and returns what
	// it found and the keys written under it, which the caller deletes
	// (each only if still the version written under the lease) and then
	// forgets with ForgetLeaseKeys.
	RevokeLease(ctx context.Context, id, holder string) (LeaseState, []LeaseKey, error)
	// AttachLease lists key of room, written at modRev, under lease id.
	// It is false when the lease has ended: the caller deletes the key,
	// which must not outlive its lease.
	AttachLease(ctx context.Context, id string, k LeaseKey) (bool, error)
	// EndDueLeases removes up to max leases past their deadline and
	// returns their ids with their keys: of nodes racing, each lease goes
	// to one.
	EndDueLeases(ctx context.Context, max int) (map[string][]LeaseKey, error)
	// ForgetLeaseKeys drops the key list of an ended lease once its keys
	// are deleted.
	ForgetLeaseKeys(ctx context.Context, id string) error
	// EndedLeaseKeys returns the key lists of leases that ended but whose
	// keys were not forgotten (their ender died half-way), at most max.
	EndedLeaseKeys(ctx context.Context, max int) (map[string][]LeaseKey, error)
	// LeaseIDs returns the ids of every lease not yet ended.
	LeaseIDs(ctx context.Context) ([]string, error)
}

// LeaseState is a lease as an operation found it: Alive is false when it
// has ended or never existed. Holder may be "" (an anonymous subject).
type LeaseState struct {
	Alive  bool
	Holder string
	TTL    time.Duration
}

// LeaseKey is a key written under a lease, at ModRev.
type LeaseKey struct {
	Room, Key string
	ModRev    uint64
}
