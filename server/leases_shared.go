package server

import (
	"context"
	"strings"
	"time"

	"github.com/statecast/statecast/store"
)

// TTL leases on a store several nodes share (store.SharedLeases: Redis).
//
// The record in the store is the lease; no node holds it in memory. A
// keep-alive, a revoke or a write under the lease goes to the store on
// whichever node the client reaches, so a client moved to another node
// by a deploy keeps its lease, and a node's death or restart ends none.
// Keys carry the lease id with no node in it (lessor.stored): no node's
// recovery, claim or fence touches them.
//
//   - a write under a lease first asks the store whether the lease is
//     alive and the writer's (usable), then lists the key with the record
//     (attachShared). If the lease ended in between, the list refuses the
//     key and the writer deletes it at once: a key never outlives its lease.
//   - every node, every tick, takes the leases past their deadline out of
//     the store (EndDueLeases: each goes to one node) and deletes their
//     listed keys, each only if still the version its lease wrote: one
//     delete event per key across the cluster. A node that dies half-way
//     leaves the list to the next orphan sweep, which one node runs every
//     orphanEvery ticks (whose turn it is: lessor.takeTurn).
//   - a key written under a lease whose listing never happened (its node
//     died between the write and the listing) is found by the orphan sweep
//     too: it scans the leased keys for lease names the store no longer has.

// stateUse says whether owner may use a lease in state st.
func stateUse(st store.LeaseState, owner string) leaseUse {
	switch {
	case !st.Alive:
		return leaseMissing
	case st.Holder != owner:
		return leaseNotOwner
	}
	return leaseOK
}

// revokeShared ends lease id in the store and deletes its keys before
// returning, as a local revoke does.
func (l *lessor) revokeShared(ctx context.Context, id, owner string) (int, leaseUse, error) {
	st, keys, err := l.shared.RevokeLease(ctx, id, owner)
	if u := stateUse(st, owner); err != nil || u != leaseOK {
		return 0, u, err
	}
	l.metrics.leasesEnded.Inc()
	l.endKeys(id, keys)
	return len(keys), leaseOK, nil
}

// attachShared lists key with lease id in the store, or deletes it when
// the lease ended since the write's check, before the write is answered.
// It runs to its end even while the node shuts down: a write that
// committed must be listed, or its key would outlive the lease until an
// orphan sweep.
func (l *lessor) attachShared(id, room, key string, modRev uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ok, err := l.shared.AttachLease(ctx, id, store.LeaseKey{Room: room, Key: key, ModRev: modRev})
	switch {
	case err != nil:
		l.log.Warn("server: cannot list a key with its lease; the orphan sweep will end it with the lease", "lease", id, "room", room, "key", key, "err", err)
	case !ok:
		l.deleteKeys(map[roomKey]uint64{{room, key}: modRev})
	}
}

// listSessionKey lists key k with the record of session lease id, off
// the write's path, and deletes it when the session ended since the
// write's check. ls is the lease when held here (attach marked k listed
// in it, so writing k again costs Redis nothing more), else nil. A key it
// could not list ends with the session by an orphan sweep.
func (l *lessor) listSessionKey(id string, k roomKey, modRev uint64, ls *lease) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		got, err := l.sessionList.ListSessionKey(ctx, strings.TrimPrefix(id, sessionLeasePrefix), k.room, k.key)
		switch {
		case err != nil:
			if ls != nil {
				l.mu.Lock()
				delete(ls.listed, k) // the next write of it tries again
				l.mu.Unlock()
			}
			l.log.Warn("server: cannot list a key with its session; the orphan sweep will end it with the session", "lease", id, "room", k.room, "key", k.key, "err", err)
		case got == store.ListFull && ls != nil:
			l.mu.Lock()
			ls.listFull, ls.listed = true, nil // its end scans the rooms
			l.mu.Unlock()
		case got == store.NotListed:
			l.deleteKeys(map[roomKey]uint64{k: modRev})
		}
	}()
}

// endKeys deletes the listed keys of an ended lease, then forgets the
// list. A list left behind (store unreachable) is finished by an orphan
// sweep.
func (l *lessor) endKeys(id string, keys []store.LeaseKey) {
	m := make(map[roomKey]uint64, len(keys))
	for _, k := range keys {
		m[roomKey{k.Room, k.Key}] = k.ModRev
	}
	l.deleteKeys(m)
	ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
	defer cancel()
	if err := l.shared.ForgetLeaseKeys(ctx, id); err != nil {
		l.log.Warn("server: cannot forget the key list of an ended lease; an orphan sweep will", "lease", id, "err", err)
	}
}

// startShared ends the due leases every tick. The orphan sweeps run on
// their own ticker, when it is this node's turn: a long scan must not
// delay the ends.
func (l *lessor) startShared() {
	every := max(l.nodeTimeout/5, 100*time.Millisecond)
	l.wg.Add(2)
	go l.tick(every, func() { l.endLeases(l.shared.EndDueLeases) })
	go l.tick(orphanEvery*every, func() {
		l.takeTurn(&l.ttlOrphans, func() bool {
			ended := l.endLeases(l.shared.EndedLeaseKeys)
			return l.sweepUnlisted() && ended
		})
	})
}

// tick runs fn every d until the lessor stops.
func (l *lessor) tick(d time.Duration, fn func()) {
	defer l.wg.Done()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		fn()
	}
}

// endLeases deletes the keys of the leases next returns, a page at a
// time, until none is left or the lessor stops; false when next failed.
func (l *lessor) endLeases(next func(context.Context, int) (map[string][]store.LeaseKey, error)) bool {
	const page = 1000
	for {
		ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
		ended, err := next(ctx, page)
		cancel()
		if err != nil {
			if l.ctx.Err() == nil {
				l.log.Warn("server: cannot end the due leases", "err", err)
			}
			return false
		}
		for id, keys := range ended {
			l.metrics.leasesEnded.Inc()
			l.endKeys(id, keys)
		}
		if len(ended) < page || l.ctx.Err() != nil {
			return true
		}
	}
}

// sweepUnlisted deletes keys written under a TTL lease the store no
// longer has, which no key list named (their writer died before listing
// them); false when it could not finish.
func (l *lessor) sweepUnlisted() bool {
	ctx, cancel := context.WithTimeout(l.ctx, time.Minute)
	defer cancel()
	return l.sweepEnded(ctx, "deleting keys of TTL leases that ended", l.sharedTTL, l.shared.LeaseIDs)
}

// sweepEnded deletes the keys whose stored lease name matches but is not
// among the names live returns. Keys first, then the live names: a lease
// exists before a key is written under it, so a name missing from the
// later read belongs to a lease that has ended. It returns false when
// the scan or live failed.
func (l *lessor) sweepEnded(ctx context.Context, what string, match func(string) bool, live func(context.Context) ([]string, error)) bool {
	leased := make(map[string]map[roomKey]uint64)
	err := l.st.Leased(ctx, func(room string, kv store.KV) error {
		if match(kv.Lease) {
			if leased[kv.Lease] == nil {
				leased[kv.Lease] = make(map[roomKey]uint64)
			}
			leased[kv.Lease][roomKey{room, kv.Key}] = kv.ModRev
		}
		return nil
	})
	if err != nil {
		l.log.Warn("server: cannot scan the leased keys; "+what+" waits for the next sweep", "err", err)
		return false
	}
	if len(leased) == 0 {
		return true
	}
	names, err := live(ctx)
	if err != nil {
		l.log.Warn("server: cannot list the live leases; "+what+" waits for the next sweep", "err", err)
		return false
	}
	for _, n := range names {
		delete(leased, n)
	}
	keys := make(map[roomKey]uint64)
	for _, ks := range leased {
		for k, rev := range ks {
			keys[k] = rev
		}
	}
	if len(keys) > 0 {
		l.log.Info("server: "+what, "keys", len(keys))
		l.deleteKeys(keys)
	}
	return true
}
