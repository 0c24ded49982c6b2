package server

import (
	"context"
	"crypto/sha256"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/statecast/statecast/store"
)

// Sessions on a store several nodes share (store.SharedSessions: Redis).
//
// The record in the store is the session; a node's memory only holds
// the sessions attached to it. A record names its owner node, a
// generation and, once detached, a deadline of the store's clock:
//
//   - open with session + resume is a compare-and-set on the record
//     (TakeSession: same subject, the hash of the presented secret, not
//     past its deadline) on whichever node the client reaches: it becomes
//     the owner, the generation moves on, the secret rotates. Of two
//     nodes resuming with one secret one wins; the other opens a new
//     session.
//   - the session's lease is named "session:<id>" on its keys, with no
//     node in it (lessor.stored): a takeover rewrites no key, a dead
//     node's claim and the orphan sweep of node leases skip it, and no
//     node ends it from memory.
//   - a detach (socket closed, or SIGTERM) starts the grace in the record
//     if the record is still at the generation this node took: the node
//     it was taken from no longer can.
//   - the claim of a dead node starts the grace of the sessions it owned,
//     from the store's list of them (ReleaseNodeSessions); so does, every
//     orphanEvery ticks, the node whose turn it is (lessor.takeTurn), for
//     owners that are not alive (a claimer that died half-way, sessions an
//     older build attached), by a scan of every session (ReleaseSessions).
//   - every node, every tick, takes the records past their deadline out
//     of the store (EndDueSessions: each goes to one node) and deletes
//     their keys, each only if still the version its lease wrote: one
//     delete event per key across the cluster.
//
// A connection that stays open on a node after its session was resumed
// on another is not closed (its node is not told); whatever it writes
// under the session belongs to the session, and its detach is a no-op.

// orphanEvery: ticks between the orphan sweeps (of sessions left by dead
// owners and session keys whose record is gone; of node and TTL leases),
// each run by one node of the cluster (lessor.takeTurn).
const orphanEvery = 25

// startShared turns the shared mode on and starts the sweeper.
func (ss *sessions) startShared(st store.SharedSessions, node string, every time.Duration) {
	ss.shared, ss.node, ss.every = st, node, every
	ss.leases.sharedSessions, ss.leases.sessionList = true, st
	ss.leases.onClaim = ss.releaseNode
	ss.wg.Add(1)
	go ss.sweep()
}

func (ss *sessions) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), ss.timeout)
}

// sweepCtx bounds one store call of the sweeper, and ends with the
// sessions (shutdown): the sweep is not worth waiting for then.
func (ss *sessions) sweepCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(ss.halt, ss.timeout)
}

func (ss *sessions) openShared(c *conn, id, resume, subject, secret string, read time.Time) (s *session, resumed bool, old *conn, err error) {
	hash := sha256.Sum256([]byte(secret))
	if id != "" && resume != "" {
		presented := sha256.Sum256([]byte(resume))
		ss.mu.Lock()
		ss.taking[id]++ // until s is in ss.m: settleUnsure must not detach it
		ss.mu.Unlock()
		defer ss.took(id)
		ctx, cancel := ss.ctx()
		rec, _, ok, err := ss.shared.TakeSession(ctx, id, subject, presented[:], hash[:], ss.node, read)
		cancel()
		if errors.Is(err, store.ErrStaleTake) {
			return nil, false, nil, err // nothing was written
		}
		if err != nil {
			// Whether the session is alive, and whether the take ran, is
			// not known: a new session would let the client's keys end
			// with the old one. The caller closes the socket (1011) and
			// the client comes back with the secret it presented, still
			// good if the take ran (the store keeps the one presented
			// last); the sweeper starts the grace of a take that ran
			// here with nobody attached.
			ss.log.Warn("server: cannot resume a session from the store; the client is asked to reconnect", "session", id, "err", err)
			ss.markUnsure(id)
			return nil, false, nil, err
		}
		if ok {
			ss.mu.Lock()
			if s = ss.m[id]; s == nil {
				s = &session{id: id, subject: subject, lease: rec.Lease}
				ss.m[id] = s
				ss.leases.grantSession(s.lease, subject)
			}
			old, s.conn, s.gen, s.resume = s.conn, c, rec.Gen, hash
			ss.mu.Unlock()
			return s, true, old, nil // the take saved the new hash
		}
	}
	s = &session{id: randomID("s_"), subject: subject, conn: c, resume: hash}
	s.lease = sessionLeasePrefix + s.id
	ss.mu.Lock()
	ss.m[s.id] = s
	ss.mu.Unlock()
	ss.leases.grantSession(s.lease, subject)
	ctx, cancel := ss.ctx()
	defer cancel()
	rec := store.SessionRecord{ID: s.id, Subject: subject, ResumeHash: hash[:], Lease: s.lease, Owner: ss.node, Listed: true}
	if err = ss.shared.SaveSession(ctx, rec); err != nil {
		// Without a record the session cannot be resumed: the caller
		// closes the connection (1011) instead of handing its secret out.
		ss.log.Warn("server: cannot write a session record", "session", s.id, "err", err)
		ss.mu.Lock()
		if errors.Is(err, store.ErrUnavailable) {
			// Not written: nothing to detach when the socket closes (a
			// round trip each, while the store is already behind).
			s.conn = nil
			delete(ss.m, s.id)
			ss.leases.drop(s.lease)
		} else {
			// Written or not: should the socket's detach miss a record
			// that landed, the sweeper starts its grace.
			ss.unsure[s.id] = true
		}
		ss.mu.Unlock()
	}
	return s, false, nil, err
}

// took ends a take of session id begun by openShared.
func (ss *sessions) took(id string) {
	ss.mu.Lock()
	if ss.taking[id]--; ss.taking[id] <= 0 {
		delete(ss.taking, id)
	}
	ss.mu.Unlock()
}

// detachShared starts the session's grace in the store, unless another
// connection (here or on another node) took it over meanwhile.
func (ss *sessions) detachShared(s *session, c *conn) {
	ss.mu.Lock()
	if s.conn != c || ss.closed {
		ss.mu.Unlock()
		return
	}
	s.conn = nil
	if ss.m[s.id] == s {
		delete(ss.m, s.id)
	}
	ss.leases.drop(s.lease)
	gen := s.gen
	ss.wg.Add(1)
	ss.mu.Unlock()
	go func() {
		defer ss.wg.Done()
		ss.detachRecord(s.id, gen)
	}()
}

func (ss *sessions) detachRecord(id string, gen int64) {
	ctx, cancel := ss.ctx()
	defer cancel()
	if _, err := ss.shared.DetachSession(ctx, id, gen, ss.grace); err != nil {
		// The owner is alive and the record attached: the sweeper tries
		// again, unless its client resumes it meanwhile. When many clients
		// leave at once and the store falls behind, a line each would
		// flood the log: the sweeper counts the others (settleUnsure).
		if ss.detachFails.Add(1) == 1 {
			ss.log.Warn("server: cannot start a session's grace in the store; trying again", "session", id, "err", err)
		}
		ss.markUnsure(id)
	}
}

func (ss *sessions) markUnsure(id string) {
	ss.mu.Lock()
	ss.unsure[id] = true
	ss.mu.Unlock()
}

// settleUnsure starts the grace of each unsure session that the store
// holds attached to this node while no connection here has it (a take
// that ran though its reply was lost, a detach that got no answer, a
// save that did). The detach is fenced by the generation read: a take
// after the read, here or elsewhere, wins; one before it is here, or
// still being taken here (its record read may already show it attached
// to this node while ss.m does not yet: detaching it then ended a
// connected session after its grace, and its keys). Those the store
// cannot answer for stay unsure.
func (ss *sessions) settleUnsure() {
	if n := ss.detachFails.Swap(0); n > 1 {
		ss.log.Warn("server: cannot start the grace of more sessions in the store; trying again", "sessions", n-1)
	}
	ss.mu.Lock()
	ids := make([]string, 0, len(ss.unsure))
	for id := range ss.unsure {
		ids = append(ids, id)
	}
	ss.mu.Unlock()
	for _, id := range ids {
		ctx, cancel := ss.sweepCtx()
		rec, ok, err := ss.shared.Session(ctx, id)
		if err != nil && !errors.Is(err, store.ErrCorrupt) {
			// The store did not answer (or this node is stopping): the
			// next tick tries again. Trying the others now would cost a
			// timeout each: after a connect storm, thousands, and a
			// shutdown waiting for them all.
			cancel()
			return
		}
		if err == nil && ok && rec.Owner == ss.node && rec.Deadline == 0 {
			ss.mu.Lock()
			s := ss.m[id]
			here := s != nil && s.conn != nil || ss.taking[id] > 0
			ss.mu.Unlock()
			if !here {
				_, err = ss.shared.DetachSession(ctx, id, rec.Gen, ss.grace)
			}
		}
		cancel()
		if err == nil {
			ss.mu.Lock()
			delete(ss.unsure, id)
			ss.mu.Unlock()
		}
	}
}

// closeShared (shutdown) starts the grace of every session attached
// here: its client resumes it on any node, or it ends after the grace.
func (ss *sessions) closeShared() {
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		return
	}
	ss.closed = true
	ss.haltSweep()
	var attached []*session
	for id, s := range ss.m {
		if s.conn != nil {
			attached = append(attached, s)
		}
		delete(ss.m, id)
	}
	ss.mu.Unlock()
	// One timeout for all: with Redis unreachable the shutdown must not
	// wait for each. A session left attached starts its grace when the
	// others find this node dead (ReleaseNodeSessions). Detaches run
	// shutdownDetaches at a time: one after another, a node's 20,000
	// took longer than the timeout in a restart's reconnect storm, each
	// waiting out a round trip.
	ctx, cancel := ss.ctx()
	defer cancel()
	next := make(chan *session)
	var failed sync.Once
	var workers sync.WaitGroup
	for range min(shutdownDetaches, len(attached)) {
		workers.Go(func() {
			for s := range next {
				if _, err := ss.shared.DetachSession(ctx, s.id, s.gen, ss.grace); err != nil {
					failed.Do(func() {
						ss.log.Warn("server: cannot start the grace of the sessions at shutdown; the others start it once this node is found dead", "sessions", len(attached), "err", err)
						cancel()
					})
				}
			}
		})
	}
	for _, s := range attached {
		if ctx.Err() != nil {
			break
		}
		next <- s
	}
	close(next)
	workers.Wait()
	ss.wg.Wait()
}

// shutdownDetaches is how many session detaches a shutdown has in flight.
const shutdownDetaches = 32

// sweep ends the due sessions every tick, and looks for orphans every
// orphanEvery ticks when it is this node's turn.
func (ss *sessions) sweep() {
	defer ss.wg.Done()
	t := time.NewTicker(ss.every)
	defer t.Stop()
	ss.releaseDead() // sessions a migration brought, or whose node died while none ran
	for tick := 1; ; tick++ {
		select {
		case <-ss.halt.Done():
			return
		case <-t.C:
		}
		ss.settleUnsure()
		ss.endDue()
		if tick%orphanEvery == 0 {
			ss.leases.takeTurn(&ss.leases.sessionOrphans, ss.sweepOrphans)
		}
	}
}

// endDue takes the sessions past their deadline out of the store and
// deletes their keys: those listed with them, or, for a session opened by
// a node that did not list (an older build), those a scan of the rooms
// finds under its lease (one scan for all of them). If this node dies
// before the keys are deleted, the orphan sweep deletes them: their
// record is gone.
func (ss *sessions) endDue() {
	unlisted := make(map[string]bool)
	for ss.halt.Err() == nil {
		ctx, cancel := ss.sweepCtx()
		recs, err := ss.shared.EndDueSessions(ctx, 1000)
		cancel()
		if err != nil {
			ss.log.Warn("server: cannot end the due sessions", "err", err)
		}
		for _, rec := range recs {
			if rec.Listed {
				ss.endListed(rec)
			} else {
				unlisted[rec.Lease] = true
			}
		}
		if len(recs) < 1000 {
			break
		}
	}
	if len(unlisted) > 0 {
		ss.leases.sweep(ss.leases.ctx, "sessions ended after the grace; deleting their keys", func(lease string) bool { return unlisted[lease] })
	}
}

// endListed deletes the keys listed with an ended session that still
// carry its lease, each only if still the version read, then forgets the
// list. A key rewritten since under another lease (or none) stays.
func (ss *sessions) endListed(rec store.SessionRecord) {
	byRoom := make(map[string][]string)
	for _, k := range rec.Keys {
		byRoom[k.Room] = append(byRoom[k.Room], k.Key)
	}
	keys := make(map[roomKey]uint64)
	for room, ks := range byRoom {
		ctx, cancel := ss.sweepCtx()
		kvs, err := ss.shared.CurrentKeys(ctx, room, ks)
		cancel()
		if err != nil {
			ss.log.Warn("server: cannot read the keys of an ended session; the orphan sweep will delete them", "session", rec.ID, "room", room, "err", err)
			continue
		}
		for _, kv := range kvs {
			if kv.Lease == rec.Lease {
				keys[roomKey{room, kv.Key}] = kv.ModRev
			}
		}
	}
	ss.leases.deleteKeys(keys)
	ctx, cancel := ss.ctx()
	defer cancel()
	if err := ss.shared.ForgetSessionKeys(ctx, rec.ID); err != nil {
		ss.log.Warn("server: cannot forget the key list of an ended session; it expires", "session", rec.ID, "err", err)
	}
}

// release starts the grace of the sessions attached to dead nodes; false
// when it could not (some may have started).
func (ss *sessions) release(dead []string) bool {
	ctx, cancel := ss.ctx()
	defer cancel()
	n, err := ss.shared.ReleaseSessions(ctx, dead, ss.grace)
	return ss.released(dead, n, err)
}

// releaseNode starts the grace of the sessions of node, just claimed as
// dead: from its list in the store, so that the claim costs no scan of
// every session in the middle of the reconnect storm its death starts.
// The orphan sweep (releaseDead) releases what the list misses.
func (ss *sessions) releaseNode(node string) {
	ctx, cancel := ss.ctx()
	defer cancel()
	n, err := ss.shared.ReleaseNodeSessions(ctx, node, ss.grace)
	ss.released([]string{node}, n, err)
}

// released logs a release of dead nodes' sessions.
func (ss *sessions) released(dead []string, n int, err error) bool {
	if err != nil {
		ss.log.Warn("server: cannot start the grace of a dead node's sessions; the orphan sweep tries again", "nodes", dead, "released", n, "err", err)
	} else if n > 0 {
		ss.log.Info("server: sessions of a node that is gone end after the grace unless resumed", "sessions", n, "nodes", dead)
	}
	return err == nil
}

// releaseDead starts the grace of the sessions whose owner is gone from
// the registry; false when the store could not say or release them.
//
// An owner that is registered but late (stale) is left to the claim: it
// may beat again before anyone claims it, and then it lives on, its
// clients connected, unaware of a grace started behind its back (their
// session-bound keys would be deleted when it ran out). A claim removes
// it from the registry, so its next beat fences it, and releases its
// sessions; what a claimer that died half-way leaves is gone from the
// registry, and this sweep's.
func (ss *sessions) releaseDead() bool {
	l := ss.leases
	ctx, cancel := context.WithTimeout(l.ctx, time.Minute)
	defer cancel()
	// Owners first, then the registry: a node registers before it opens
	// a session, so an owner missing from the later read is gone.
	owners, err := ss.shared.SessionOwners(ctx)
	if err != nil {
		return false
	}
	alive, stale, err := l.nodes.Registered(ctx, l.nodeTimeout)
	if err != nil {
		return false
	}
	var dead []string
	for _, o := range owners {
		if o != ss.node && !slices.Contains(alive, o) && !slices.Contains(stale, o) {
			dead = append(dead, o)
		}
	}
	return len(dead) == 0 || ss.release(dead)
}

// sweepOrphans releases the sessions of owners that are not alive (their
// claimer died before releasing them) and deletes the keys of session
// leases whose record is gone (their ender died before deleting them);
// false when it could not finish.
func (ss *sessions) sweepOrphans() bool {
	l := ss.leases
	ctx, cancel := context.WithTimeout(l.ctx, time.Minute)
	defer cancel()
	if !ss.releaseDead() {
		return false
	}
	// A record is written before its session can bind a key.
	return l.sweepEnded(ctx, "deleting the keys of sessions that ended", l.sharedSession, func(ctx context.Context) ([]string, error) {
		recs, err := ss.shared.ListSessions(ctx)
		names := make([]string, len(recs))
		for i, rec := range recs {
			names[i] = rec.Lease
		}
		return names, err
	})
}
