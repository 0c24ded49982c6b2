package server

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/store"
)

// lessor keeps this node's leases: session leases (held while their
// session is attached, then ending after the grace) and TTL leases (the
// etcd model: kept alive by their writer). When a lease ends, each of its
// keys is deleted by an ordinary delete, conditional on the key's mod_rev
// still being the one written under the lease, so a key rewritten since
// is left alone.
//
// The lease a key belongs to is also stored on the key (store.KV.Lease),
// so a restarted node finds the leases its previous process left behind
// (recover) and ends them after the grace.
type lessor struct {
	engine  *rooms.Engine
	log     *slog.Logger
	metrics *metrics

	mu     sync.Mutex
	leases map[string]*lease

	wake chan struct{}
	stop chan struct{}
	wg   sync.WaitGroup
}

type lease struct {
	ttl      time.Duration // TTL leases: the keep-alive period
	deadline time.Time     // zero while held by an attached session
	keys     map[roomKey]uint64
}

type roomKey struct{ room, key string }

// deleteAttempts bounds the retries of a lease key's delete when the
// store fails; each retry waits a second.
const deleteAttempts = 10

func newLessor(e *rooms.Engine, log *slog.Logger, m *metrics) *lessor {
	l := &lessor{engine: e, log: log, metrics: m, leases: make(map[string]*lease),
		wake: make(chan struct{}, 1), stop: make(chan struct{})}
	l.wg.Add(1)
	go l.run()
	return l
}

func (l *lessor) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// grantSession creates a session lease, held until release.
func (l *lessor) grantSession(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leases[id] = &lease{keys: make(map[roomKey]uint64)}
}

// hold keeps a session lease alive again (its session was taken over).
// It reports false when the lease has already ended.
func (l *lessor) hold(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	ls := l.leases[id]
	if ls == nil {
		return false
	}
	ls.deadline = time.Time{}
	return true
}

// release lets a session lease end after grace.
func (l *lessor) release(id string, grace time.Duration) {
	l.mu.Lock()
	if ls := l.leases[id]; ls != nil {
		ls.deadline = time.Now().Add(grace)
	}
	l.mu.Unlock()
	l.signal()
}

// grant creates a TTL lease.
func (l *lessor) grant(ttl time.Duration) string {
	id := randomID("ttl_")
	l.mu.Lock()
	l.leases[id] = &lease{ttl: ttl, deadline: time.Now().Add(ttl), keys: make(map[roomKey]uint64)}
	l.mu.Unlock()
	l.signal()
	return id
}

// keepAlive renews a TTL lease; false when it does not exist (any more).
func (l *lessor) keepAlive(id string) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ls := l.leases[id]
	if ls == nil || ls.ttl == 0 {
		return 0, false
	}
	ls.deadline = time.Now().Add(ls.ttl)
	return ls.ttl, true
}

// revoke ends a lease now and deletes its keys before returning (as etcd's
// LeaseRevoke does), so a caller that revoked sees them gone. It returns
// how many keys the lease held.
func (l *lessor) revoke(id string) (int, bool) {
	l.mu.Lock()
	ls := l.leases[id]
	delete(l.leases, id) // from here on attach cannot reach ls.keys
	l.mu.Unlock()
	if ls == nil {
		return 0, false
	}
	l.metrics.leasesEnded.Inc()
	n := len(ls.keys)
	l.deleteKeys(ls.keys)
	return n, true
}

func (l *lessor) alive(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leases[id] != nil
}

// attach records that key was written at modRev under lease id. When the
// lease ended between the write's check and now, the key is deleted at
// once, so it cannot outlive its lease.
func (l *lessor) attach(id, room, key string, modRev uint64) {
	l.mu.Lock()
	ls := l.leases[id]
	if ls != nil {
		ls.keys[roomKey{room, key}] = modRev
	}
	l.mu.Unlock()
	if ls == nil {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.deleteKeys(map[roomKey]uint64{{room, key}: modRev})
		}()
	}
}

// recover adopts the leased keys a previous process left in st: each of
// their leases ends after grace unless a TTL writer keeps it alive.
func (l *lessor) recover(ctx context.Context, st store.Store, grace time.Duration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	deadline := time.Now().Add(grace)
	err := st.Leased(ctx, func(room string, kv store.KV) error {
		ls := l.leases[kv.Lease]
		if ls == nil {
			ls = &lease{ttl: grace, deadline: deadline, keys: make(map[roomKey]uint64)}
			l.leases[kv.Lease] = ls
		}
		ls.keys[roomKey{room, kv.Key}] = kv.ModRev
		return nil
	})
	if n := len(l.leases); n > 0 {
		l.log.Info("server: recovered leases of a previous process; they end after the grace", "leases", n, "grace", grace)
	}
	l.signal()
	return err
}

// run ends leases at their deadline.
func (l *lessor) run() {
	defer l.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		next := l.expire(time.Now())
		t.Reset(time.Until(next))
		select {
		case <-l.stop:
			return
		case <-l.wake:
		case <-t.C:
		}
	}
}

// expire ends the leases due at now and returns the next deadline.
func (l *lessor) expire(now time.Time) time.Time {
	next := now.Add(time.Hour)
	var keys map[roomKey]uint64
	l.mu.Lock()
	for id, ls := range l.leases {
		switch {
		case ls.deadline.IsZero():
		case !ls.deadline.After(now):
			delete(l.leases, id)
			if keys == nil {
				keys = make(map[roomKey]uint64)
			}
			for k, rev := range ls.keys {
				keys[k] = rev
			}
			l.metrics.leasesEnded.Inc()
		case ls.deadline.Before(next):
			next = ls.deadline
		}
	}
	l.mu.Unlock()
	if len(keys) > 0 {
		l.deleteKeys(keys)
	}
	return next
}

// deleteKeys deletes each key if it is still the version its lease wrote.
func (l *lessor) deleteKeys(keys map[roomKey]uint64) {
	for attempt := 0; len(keys) > 0 && attempt < deleteAttempts; attempt++ {
		if attempt > 0 {
			select {
			case <-l.stop:
				return // the next start's recovery finishes the job
			case <-time.After(time.Second):
			}
		}
		for k, rev := range keys {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := l.engine.Apply(ctx, k.room, store.Write{
				Conds: []store.Cond{{Key: k.key, ModRev: rev}},
				Ops:   []store.Op{{Type: store.OpDelete, Key: k.key}},
			})
			cancel()
			if err == nil || errors.Is(err, store.ErrConflict) {
				delete(keys, k) // deleted, or rewritten since: no longer ours
				continue
			}
			l.log.Warn("server: cannot delete a leased key; will retry", "room", k.room, "key", k.key, "err", err)
		}
	}
}

// close stops the lessor. Leases still alive stay in the store and are
// recovered by the next start.
func (l *lessor) close() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}
