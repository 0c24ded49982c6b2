package server

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

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
// as "<node>/<lease>", so a restarted node finds the leases its previous
// process left behind (recover) and ends them after the grace.
//
// On a store that several nodes share (store.Nodes), each node beats in
// the store's registry; a node silent for nodeTimeout is dead, and the
// one survivor that claims it deletes the keys of its leases: a dead
// node's leased keys end within nodeTimeout + sweepEvery + one scan. A
// starting node adopts only the leased keys of nodes gone from the
// registry (a late node may beat again: its stale entry is the claim's).
// Session leases of a store with shared sessions are the exception: they
// carry no node and end by their session's record (session_shared.go).
type lessor struct {
	engine      *rooms.Engine
	st          store.Store
	nodes       store.Nodes // nil: the store has one node at a time
	node        string
	nodeTimeout time.Duration
	log         *slog.Logger
	metrics     *metrics
	onFence     func() // set before recover
	// onClaim runs when this node won the claim of dead node n, before
	// its keys are deleted (set before recover).
	onClaim func(n string)
	// sharedSessions: session leases belong to the store's session
	// records, not to a node (server/session.go): stored without a node,
	// never ended here, skipped by recover, claims and fences. Their keys
	// are listed beside the record in sessionList, each once per session
	// held here (lease.listed).
	sharedSessions bool
	sessionList    store.SharedSessions
	// shared keeps the TTL leases when the store several nodes share
	// keeps them (leases_shared.go); nil: this node's memory does.
	shared store.SharedLeases
	// The orphan sweeps of node leases, TTL leases and sessions, each
	// run by one node of the cluster an interval (takeTurn).
	nodeOrphans, ttlOrphans, sessionOrphans orphanTurn

	mu     sync.Mutex
	leases map[string]*lease
	// owned counts the TTL leases of each subject, at most maxOwned: a
	// lease holds memory until its TTL ends, however fast it was granted.
	owned    map[string]int
	maxOwned int

	wake chan struct{}
	stop chan struct{}
	ctx  context.Context // ends with stop: bounds the sweeps
	halt context.CancelFunc
	wg   sync.WaitGroup
}

type lease struct {
	ttl      time.Duration // TTL leases: the keep-alive period
	deadline time.Time     // zero while held by an attached session
	keys     map[roomKey]uint64
	// listed: a shared session's keys listed with its record from this
	// node (listSessionKey); listFull: its list is full, none are.
	listed   map[roomKey]bool
	listFull bool
	// owner is the subject that granted the lease: only it may keep the
	// lease alive, revoke it or bind keys to it. A lease adopted by
	// recover has no known owner (the store keeps none), so nobody may:
	// it only ends, unless it is a session lease whose session is resumed
	// (hold), which makes the session's subject its owner again.
	owner   string
	adopted bool
}

// leaseUse is whether a subject may use a lease.
type leaseUse int

const (
	leaseOK       leaseUse = iota
	leaseMissing           // no such lease (any more), or adopted by recover
	leaseNotOwner          // alive, but granted by another subject
)

// use says whether owner may use ls (which may be nil). An adopted lease
// is as good as gone to every caller: its writer's keep-alive answers
// not found, and it grants a new lease, as after an ended one.
func (ls *lease) use(owner string) leaseUse {
	switch {
	case ls == nil || ls.adopted:
		return leaseMissing
	case ls.owner != owner:
		return leaseNotOwner
	}
	return leaseOK
}

type roomKey struct{ room, key string }

// deleteAttempts bounds the retries of a lease key's delete when the
// store fails; each retry waits a second.
const deleteAttempts = 10

func newLessor(e *rooms.Engine, st store.Store, node string, nodeTimeout time.Duration, log *slog.Logger, m *metrics) *lessor {
	l := &lessor{engine: e, st: st, node: node, nodeTimeout: nodeTimeout, log: log, metrics: m,
		leases: make(map[string]*lease), owned: make(map[string]int), wake: make(chan struct{}, 1), stop: make(chan struct{}),
		nodeOrphans: orphanTurn{name: "node-leases"}, ttlOrphans: orphanTurn{name: "ttl-leases"}, sessionOrphans: orphanTurn{name: "sessions"}}
	l.nodes, _ = st.(store.Nodes)
	if l.nodes != nil {
		l.shared, _ = st.(store.SharedLeases)
	}
	l.ctx, l.halt = context.WithCancel(context.Background())
	l.wg.Add(1)
	go l.run()
	return l
}

// stored is the name under which the store keeps local lease id.
func (l *lessor) stored(id string) string {
	if l.sharedSessions && strings.HasPrefix(id, sessionLeasePrefix) || l.sharedTTL(id) {
		return id
	}
	return l.node + "/" + id
}

// sharedSession says whether a stored lease name is a session lease kept
// by the store's session records (no node in it).
func (l *lessor) sharedSession(stored string) bool {
	return l.sharedSessions && strings.HasPrefix(stored, sessionLeasePrefix) && !strings.Contains(stored, "/")
}

// sharedTTL says whether a stored lease name is a TTL lease kept by the
// store's lease records (no node in it).
func (l *lessor) sharedTTL(stored string) bool {
	return l.shared != nil && strings.HasPrefix(stored, ttlLeasePrefix) && !strings.Contains(stored, "/")
}

// ofStore says whether a stored lease name belongs to a record of the
// store rather than to a node: no node's recovery, claim or fence ends it.
func (l *lessor) ofStore(stored string) bool {
	return l.sharedSession(stored) || l.sharedTTL(stored)
}

// local is the lease id of a stored lease name: the local id for this
// node's leases, the stored name itself for a lease adopted from another.
func (l *lessor) local(stored string) string {
	if id, ok := strings.CutPrefix(stored, l.node+"/"); ok {
		return id
	}
	return stored
}

// owner is the node a stored lease name belongs to ("" for a name without
// one, written before leases carried their node).
func owner(stored string) string {
	n, _, ok := strings.Cut(stored, "/")
	if !ok {
		return ""
	}
	return n
}

func (l *lessor) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// grantSession creates a session lease of subject owner, held until release.
func (l *lessor) grantSession(id, owner string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leases[id] = &lease{keys: make(map[roomKey]uint64), owner: owner}
}

// hold keeps a session lease alive again (its session was taken over by
// a connection of subject owner). A lease that recover adopted (the
// session was opened by an earlier process) becomes owner's session
// lease again. It reports false when the lease has already ended.
func (l *lessor) hold(id, owner string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	ls := l.leases[id]
	if ls == nil || ls.adopted && !ls.deadline.IsZero() && !ls.deadline.After(time.Now()) {
		return false // ended, or ending now: its keys are being deleted
	}
	if ls.adopted {
		ls.adopted, ls.owner, ls.ttl = false, owner, 0
	}
	ls.deadline = time.Time{}
	return true
}

// restoreSession makes the session lease id of a session loaded from the
// store wait for its session: recover adopted it with a deadline when the
// session had keys (without keys it is made here, empty); from now on the
// session ends it (end), not the deadline, so a session and its keys end
// in that order. It returns when the session ends unless resumed: at the
// recovered deadline.
func (l *lessor) restoreSession(id string, grace time.Duration) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	ls := l.leases[id]
	if ls == nil {
		ls = &lease{ttl: grace, deadline: time.Now().Add(grace), keys: make(map[roomKey]uint64), adopted: true}
		l.leases[id] = ls
	}
	at := ls.deadline
	ls.deadline = time.Time{}
	return at
}

// drop forgets lease id without deleting its keys: a shared session
// lease whose session left this node (it ends by its store record).
func (l *lessor) drop(id string) {
	l.mu.Lock()
	if ls := l.leases[id]; ls != nil {
		l.dropLocked(id, ls)
	}
	l.mu.Unlock()
}

// end ends the session lease id now and deletes its keys before returning.
// A session lease has no deadline in the lessor: its session ends it.
func (l *lessor) end(id string) {
	l.mu.Lock()
	ls := l.leases[id]
	if ls == nil {
		l.mu.Unlock()
		return
	}
	l.dropLocked(id, ls) // from here on attach cannot reach ls.keys
	l.mu.Unlock()
	l.metrics.leasesEnded.Inc()
	l.deleteKeys(ls.keys)
}

// grant creates a TTL lease of subject owner; false when owner holds
// maxOwned already.
func (l *lessor) grant(ctx context.Context, ttl time.Duration, owner string) (string, bool, error) {
	id := randomID(ttlLeasePrefix)
	ok, err := l.grantID(ctx, id, ttl, owner)
	return id, ok, err
}

// grantID is grant of a lease whose id the caller chose (unguessable,
// starting with ttlLeasePrefix: the etcd API's numeric ids, etcd.go).
func (l *lessor) grantID(ctx context.Context, id string, ttl time.Duration, owner string) (bool, error) {
	if l.shared != nil {
		return l.shared.GrantLease(ctx, id, owner, ttl, l.maxOwned)
	}
	l.mu.Lock()
	if l.owned[owner] >= l.maxOwned {
		l.mu.Unlock()
		return false, nil
	}
	l.owned[owner]++
	l.leases[id] = &lease{ttl: ttl, deadline: time.Now().Add(ttl), keys: make(map[roomKey]uint64), owner: owner}
	l.mu.Unlock()
	l.signal()
	return true, nil
}

// dropLocked forgets lease id (ls), giving its owner's count back.
func (l *lessor) dropLocked(id string, ls *lease) {
	delete(l.leases, id)
	if ls.ttl > 0 && !ls.adopted {
		if l.owned[ls.owner]--; l.owned[ls.owner] <= 0 {
			delete(l.owned, ls.owner)
		}
	}
}

// keepAlive renews the TTL lease id of subject owner.
func (l *lessor) keepAlive(ctx context.Context, id, owner string) (time.Duration, leaseUse, error) {
	if l.sharedTTL(id) {
		st, err := l.shared.KeepAliveLease(ctx, id, owner)
		return st.TTL, stateUse(st, owner), err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ls := l.leases[id]
	if ls != nil && ls.ttl == 0 {
		ls = nil // a session lease is kept alive by its session
	}
	if u := ls.use(owner); u != leaseOK {
		return 0, u, nil
	}
	ls.deadline = time.Now().Add(ls.ttl)
	return ls.ttl, leaseOK, nil
}

// revoke ends a lease now and deletes its keys before returning (as etcd's
// LeaseRevoke does), so a caller that revoked sees them gone. It returns
// how many keys the lease held. Only its owner may revoke it.
func (l *lessor) revoke(ctx context.Context, id, owner string) (int, leaseUse, error) {
	if l.sharedTTL(id) {
		return l.revokeShared(ctx, id, owner)
	}
	l.mu.Lock()
	ls := l.leases[id]
	if u := ls.use(owner); u != leaseOK {
		l.mu.Unlock()
		return 0, u, nil
	}
	l.dropLocked(id, ls) // from here on attach cannot reach ls.keys
	l.mu.Unlock()
	l.metrics.leasesEnded.Inc()
	n := len(ls.keys)
	l.deleteKeys(ls.keys)
	return n, leaseOK, nil
}

// usable says whether subject owner may bind keys to lease id.
func (l *lessor) usable(ctx context.Context, id, owner string) (leaseUse, error) {
	if l.sharedTTL(id) {
		st, err := l.shared.Lease(ctx, id)
		return stateUse(st, owner), err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leases[id].use(owner), nil
}

// attach records that key was written at modRev under lease id. When the
// lease ended between the write's check and now, the key is deleted at
// once, so it cannot outlive its lease.
func (l *lessor) attach(id, room, key string, modRev uint64) {
	if l.sharedTTL(id) {
		l.attachShared(id, room, key, modRev)
		return
	}
	k := roomKey{room, key}
	l.mu.Lock()
	ls := l.leases[id]
	if ls != nil {
		// Two writes of one key can attach out of order: keep the later.
		ls.keys[k] = max(ls.keys[k], modRev)
	}
	// A shared session held here lists each key once; one missing here
	// left this node (taken over elsewhere) or ended: its record decides.
	shared := l.sharedSession(id)
	list := shared && (ls == nil || !ls.listFull && !ls.listed[k])
	if list && ls != nil {
		if ls.listed == nil {
			ls.listed = make(map[roomKey]bool)
		}
		ls.listed[k] = true
	}
	l.mu.Unlock()
	if list {
		l.listSessionKey(id, k, modRev, ls)
	}
	if shared {
		return
	}
	if ls == nil {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.deleteKeys(map[roomKey]uint64{{room, key}: modRev})
		}()
	}
}

// recover adopts the leased keys a previous process left in the store:
// each of their leases ends after grace. The store does not keep a
// lease's owner, so an adopted lease can no longer be kept alive,
// revoked or written to by anyone (not found): its writer grants a new
// one, as after any lease that ended. On a shared store it
// first registers, then adopts only the keys of nodes gone from the
// registry: the leases of live nodes stay theirs, and so do those of a
// late (stale) one, which may beat again; a dead one's are its
// claimer's (claim).
func (l *lessor) recover(ctx context.Context, grace time.Duration) error {
	registered := func(string) bool { return false }
	if l.nodes != nil {
		if _, err := l.nodes.Beat(ctx, l.node); err != nil {
			return err
		}
		live, stale, err := l.nodes.Registered(ctx, l.nodeTimeout)
		if err != nil {
			return err
		}
		registered = func(n string) bool { return slices.Contains(live, n) || slices.Contains(stale, n) }
	}
	l.mu.Lock()
	deadline := time.Now().Add(grace)
	err := l.st.Leased(ctx, func(room string, kv store.KV) error {
		n := owner(kv.Lease)
		if n == l.node || n != "" && registered(n) || l.ofStore(kv.Lease) {
			return nil
		}
		id := kv.Lease
		if l.nodes == nil { // one node at a time: the lease is ours again
			id = strings.TrimPrefix(kv.Lease, n+"/")
		}
		ls := l.leases[id]
		if ls == nil {
			ls = &lease{ttl: grace, deadline: deadline, keys: make(map[roomKey]uint64), adopted: true}
			l.leases[id] = ls
		}
		ls.keys[roomKey{room, kv.Key}] = kv.ModRev
		return nil
	})
	if n := len(l.leases); n > 0 {
		l.log.Info("server: adopted leases of a process that is gone; they end after the grace", "leases", n, "grace", grace)
	}
	l.mu.Unlock()
	if err == nil {
		err = l.loadTTL(ctx)
	}
	l.signal()
	if l.nodes != nil && err == nil {
		l.wg.Add(1)
		go l.beat()
	}
	if l.shared != nil && err == nil {
		l.startShared()
	}
	return err
}

// loadTTL gives back the TTL leases a graceful shutdown wrote (a store
// of one node at a time that keeps them, store.LeaseKeeper): each has its
// holder again and ends at its deadline unless kept alive, one whose
// deadline passed while no server ran at once. The records are deleted
// once loaded: the leases live in this process now, and a crash must not
// bring back one revoked meanwhile.
func (l *lessor) loadTTL(ctx context.Context) error {
	lk, ok := l.st.(store.LeaseKeeper)
	if !ok || l.nodes != nil {
		return nil
	}
	recs, err := lk.LeaseRecords(ctx)
	if err != nil || len(recs) == 0 {
		return err
	}
	l.mu.Lock()
	for _, rec := range recs {
		ls := l.leases[rec.ID]
		if ls == nil {
			ls = &lease{keys: make(map[roomKey]uint64)}
			l.leases[rec.ID] = ls
		}
		ls.adopted, ls.owner = false, rec.Holder
		ls.ttl, ls.deadline = time.Duration(rec.TTLms)*time.Millisecond, time.UnixMilli(rec.Deadline)
		l.owned[rec.Holder]++
	}
	l.mu.Unlock()
	l.log.Info("server: loaded the TTL leases of a process that is gone; each ends at its deadline unless kept alive", "leases", len(recs))
	return eachRecord(ctx, recs, func(ctx context.Context, rec store.LeaseRecord) error { return lk.DeleteLeaseRecord(ctx, rec.ID) })
}

// eachRecord runs fn on every record, many at a time: a file store's
// group commit takes them in few fsyncs.
func eachRecord(ctx context.Context, recs []store.LeaseRecord, fn func(context.Context, store.LeaseRecord) error) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(128) // a group commit's size
	for _, rec := range recs {
		g.Go(func() error { return fn(ctx, rec) })
	}
	return g.Wait()
}

// ttlRecords returns this node's TTL leases as records (those a store
// several nodes share keeps are not here).
func (l *lessor) ttlRecords() []store.LeaseRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []store.LeaseRecord
	for id, ls := range l.leases {
		if ls.ttl > 0 && !ls.adopted {
			out = append(out, store.LeaseRecord{ID: id, Holder: ls.owner, TTLms: ls.ttl.Milliseconds(), Deadline: ls.deadline.UnixMilli()})
		}
	}
	return out
}

// keepTTL writes this node's TTL leases to a store that keeps them
// between processes, at a graceful shutdown (after close): the next
// start gives them back (loadTTL). A crash writes none: their keys are
// adopted and end after the grace, as before.
func (l *lessor) keepTTL() {
	lk, ok := l.st.(store.LeaseKeeper)
	if !ok || l.nodes != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := eachRecord(ctx, l.ttlRecords(), lk.SaveLeaseRecord); err != nil {
		l.log.Warn("server: cannot keep the TTL leases for the next start; their keys end after the grace then", "err", err)
	}
}

// beat keeps this node registered; a goroutine beside it (watchRegistry)
// claims the nodes that stopped beating and deletes their leased keys.
// Every orphanEvery beats (5 node timeouts) the node whose turn it is
// also deletes the keys of any node gone from the registry: a claim
// whose sweep failed or whose claimer died leaves no key behind for good.
func (l *lessor) beat() {
	defer l.wg.Done()
	every := max(l.nodeTimeout/5, 100*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	// The registry is read beside the beats, not between them: with both
	// in one loop, a beat and a read each answered seconds late (Redis
	// busy with a reconnect storm) put a live node's beats more than the
	// node timeout apart, and the others took it for dead.
	reads := make(chan struct{}, 1)
	l.wg.Add(1)
	go l.watchRegistry(reads, every)
	for tick := 1; ; tick++ {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		// Half the node timeout, not one interval: a node too busy to read
		// its beat's answer within an interval (a reconnect storm keeping
		// its scheduler's queue long) is still alive, and a beat that
		// lands late keeps it so. Redis stamps the beat when it runs it.
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), max(l.nodeTimeout/2, every))
		beat, err := l.nodes.Beat(ctx, l.node)
		cancel()
		switch took := time.Since(start); {
		case err != nil:
			l.log.Warn("server: cannot beat in the node registry", "err", err)
		case beat.Added:
			l.fence()
		case took > l.nodeTimeout/4:
			attrs := []any{"took", took.Round(time.Millisecond), "node_timeout", l.nodeTimeout}
			if beat.Reached > 0 {
				attrs = append(attrs, "reached_store", beat.Reached)
			}
			l.log.Warn("server: a beat in the node registry was answered late; past the node timeout the others take this node for dead", attrs...)
		}
		select {
		case reads <- struct{}{}:
		default: // the last read is still running
		}
		if tick%orphanEvery == 0 {
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				l.takeTurn(&l.nodeOrphans, l.sweepOrphans)
			}()
		}
	}
}

// watchRegistry reads the node registry after each beat and claims the
// nodes that stopped beating, each on a goroutine of its own: a long
// scan must not hold back the next read either.
func (l *lessor) watchRegistry(reads <-chan struct{}, every time.Duration) {
	defer l.wg.Done()
	claiming := make(map[string]bool) // guarded by l.mu
	for {
		select {
		case <-l.stop:
			return
		case <-reads:
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(l.nodeTimeout/2, every))
		_, stale, err := l.nodes.Registered(ctx, l.nodeTimeout)
		cancel()
		if err != nil {
			l.log.Warn("server: cannot read the node registry; claiming nodes that stopped beating waits for the next read", "err", err)
			continue
		}
		for _, n := range stale {
			l.mu.Lock()
			busy := claiming[n]
			claiming[n] = true
			l.mu.Unlock()
			if busy {
				continue
			}
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				l.claim(n)
				l.mu.Lock()
				delete(claiming, n)
				l.mu.Unlock()
			}()
		}
	}
}

// claim deletes the leased keys of stale node n if this node wins it.
func (l *lessor) claim(n string) {
	ctx, cancel := context.WithTimeout(l.ctx, 30*time.Second)
	defer cancel()
	if won, err := l.nodes.Claim(ctx, n, l.nodeTimeout); err != nil || !won {
		return
	}
	if l.onClaim != nil {
		l.onClaim(n)
	}
	l.sweep(ctx, "a node stopped beating; deleting its leased keys", func(lease string) bool { return owner(lease) == n })
}

// sweepOrphans deletes the leased keys of nodes that are gone from the
// registry (claimed, but their sweep did not finish); false when it could
// not scan. A stale node is the claim's: it may beat again before anyone
// claims it, and its clients' keys must live on with it (releaseDead).
func (l *lessor) sweepOrphans() bool {
	ctx, cancel := context.WithTimeout(l.ctx, time.Minute)
	defer cancel()
	alive, stale, err := l.nodes.Registered(ctx, l.nodeTimeout)
	if err != nil {
		return false
	}
	return l.sweep(ctx, "deleting the leased keys of nodes that are gone", func(lease string) bool {
		o := owner(lease)
		return o != "" && o != l.node && !slices.Contains(alive, o) && !slices.Contains(stale, o)
	})
}

// orphanTurn is this node's side of one of the orphan sweeps: safety
// nets for a claimer or an ender that died half-way, which the cluster
// needs run once an interval, not by each of its nodes (each node's three
// scans of every room's keys cost it 12-16 % of a core, idle, at 100,000
// sessions).
type orphanTurn struct {
	name   string // of the turn in the store
	mu     sync.Mutex
	busy   bool // a sweep of this node runs
	failed bool // the last sweep here failed: skip one turn
}

// takeTurn runs sweep, an orphan sweep that reports whether it finished,
// if this node takes the cluster's turn for it (store.Nodes.TakeTurn).
// Every node asks every orphanEvery ticks; the turn lasts one tick less,
// so its holder, asking a little early or late, finds it free again, and
// once the holder is dead another node takes it within an interval. A
// node whose sweep still runs, or whose last one failed (it cannot
// scan: a slow link), does not ask, leaving the turn to the others: a
// sweeper that cannot scan must not stop every sweep (one elected for
// good did, 8697799).
func (l *lessor) takeTurn(t *orphanTurn, sweep func() bool) {
	t.mu.Lock()
	ask := !t.busy && !t.failed
	if !t.busy {
		t.failed = false // asks again next interval
	}
	if ask {
		t.busy = true
	}
	t.mu.Unlock()
	if !ask {
		return
	}
	ok := true
	defer func() {
		t.mu.Lock()
		t.busy, t.failed = false, !ok
		t.mu.Unlock()
	}()
	every := max(l.nodeTimeout/5, 100*time.Millisecond)
	ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
	won, err := l.nodes.TakeTurn(ctx, t.name, l.node, orphanEvery*every-every)
	cancel()
	if err != nil && l.ctx.Err() == nil {
		l.log.Warn("server: cannot take the turn of an orphan sweep; this node skips it", "sweep", t.name, "err", err)
	}
	if won {
		ok = sweep()
	}
}

// sweep deletes the leased keys whose stored lease name matches, each
// only if it is still the version its lease wrote: when two nodes sweep
// the same key, one delete happens. It returns false when the scan
// failed.
func (l *lessor) sweep(ctx context.Context, what string, match func(lease string) bool) bool {
	keys := make(map[roomKey]uint64)
	err := l.st.Leased(ctx, func(room string, kv store.KV) error {
		if match(kv.Lease) {
			keys[roomKey{room, kv.Key}] = kv.ModRev
		}
		return nil
	})
	if len(keys) == 0 && err == nil {
		return true
	}
	l.log.Info("server: "+what, "keys", len(keys), "err", err)
	l.metrics.leasesEnded.Inc()
	l.deleteKeys(keys)
	return err == nil
}

// fence: this node had registered, yet its beat found it unregistered —
// the others took it for dead (it could not beat for the node timeout)
// and deleted its leased keys. Its leases end here too, and onFence
// makes its clients reconnect: their sessions cannot be resumed (except
// on a store with shared sessions, whose grace the claim started), so
// they write what their leases held again.
func (l *lessor) fence() {
	l.log.Error("server: this node was taken for dead by the others (no beat for the node timeout); ending its leases and reconnecting its clients")
	keys := make(map[roomKey]uint64)
	l.mu.Lock()
	for id, ls := range l.leases {
		// A shared session's keys are its record's: the claim started its
		// grace, and its client may resume it on any node.
		if !l.sharedSession(id) {
			for k, rev := range ls.keys {
				keys[k] = rev
			}
		}
		l.dropLocked(id, ls)
	}
	l.mu.Unlock()
	l.deleteKeys(keys)
	if l.onFence != nil {
		l.onFence()
	}
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
			l.dropLocked(id, ls)
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
	l.halt()
	l.wg.Wait()
}
