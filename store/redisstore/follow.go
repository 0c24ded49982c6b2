package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/statecast/statecast/store"
)

// Following rooms on Redis: sharded pub/sub for live pushes, the room's
// stream for gaps, a periodic check against meta for whatever pub/sub
// lost. Design: docs/DESIGN.md#how-a-node-follows-a-room; lock order:
// docs/LOCKS.md.

type follow struct {
	s *Store

	mu      sync.RWMutex      // guards the maps and closed
	views   map[string]*view  // by room
	shards  map[string]*shard // by node address ("" for a standalone server)
	chShard map[string]*shard // the shard each subscribed channel is on
	closed  bool

	dmu   sync.Mutex
	dirty map[string]struct{} // rooms to check at once
	kick  chan struct{}
}

// follower is one Follow registration and the position it has seen.
type follower struct {
	fn    func(store.Batch)
	epoch string // "" = the room had no epoch when it registered
	rev   uint64
}

// view is this node's view of one followed room: the position of the
// last batch delivered (or known) and the followers.
type view struct {
	fl   *follow
	room string
	k    roomKeys

	// mu serialises whatever moves the view (pushes, fills, checks,
	// follower changes); it is held while followers' callbacks run and
	// while the view reads Redis.
	mu    sync.Mutex
	dead  bool // no followers left; a new Follow makes a new view
	epoch string
	rev   uint64
	tag   string // tag of revision rev, "" when unknown
	fs    map[*follower]struct{}
	// retired lists the epochs the view left (the last few): a push of
	// one of them was in flight when the check moved on, and is dropped.
	retired []string
}

func (fl *follow) init(s *Store) {
	fl.s = s
	fl.views = map[string]*view{}
	fl.shards = map[string]*shard{}
	fl.chShard = map[string]*shard{}
	fl.dirty = map[string]struct{}{}
	fl.kick = make(chan struct{}, 1)
	s.wg.Add(1)
	go fl.checkLoop()
}

func (fl *follow) close() {
	fl.mu.Lock()
	fl.closed = true
	shards := make([]*shard, 0, len(fl.shards))
	for _, sh := range fl.shards {
		shards = append(shards, sh)
	}
	fl.mu.Unlock()
	for _, sh := range shards {
		sh.close()
	}
}

// opCtx bounds one background Redis operation.
func (fl *follow) opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(fl.s.ctx, fl.s.cfg.WriteTimeout)
}

func (s *Store) Follow(room string, fn func(store.Batch)) (stop func(), err error) {
	if err := store.ValidRoom(room); err != nil {
		return nil, err
	}
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	fl := &s.fol
	k := s.keys(room)
	ctx, cancel := fl.opCtx()
	defer cancel()
	// Batches committed after this read are delivered to fn; those at or
	// before it are not.
	mv, err := s.rc.HMGet(ctx, k.meta, metaFields...).Result()
	if err != nil {
		return nil, fmt.Errorf("store: redis: following room %q: %w", room, err)
	}
	m := parseMeta(mv)
	f := &follower{fn: fn, epoch: m.epoch, rev: m.rev}
	var v *view
	for {
		var created bool
		fl.mu.Lock()
		if fl.closed {
			fl.mu.Unlock()
			return nil, store.ErrClosed
		}
		v = fl.views[room]
		if v == nil {
			v = &view{fl: fl, room: room, k: k, epoch: m.epoch, rev: m.rev, tag: m.tag, fs: map[*follower]struct{}{}}
			fl.views[room] = v
			created = true
		}
		fl.mu.Unlock()
		v.mu.Lock()
		if v.dead { // its last follower just stopped: replace it
			v.mu.Unlock()
			fl.mu.Lock()
			if fl.views[room] == v {
				delete(fl.views, room)
			}
			fl.mu.Unlock()
			continue
		}
		v.fs[f] = struct{}{}
		v.mu.Unlock()
		if created {
			if err := fl.subscribe(ctx, k.ch); err != nil {
				// Not fatal: the periodic check delivers without pushes,
				// and the channel is subscribed again when Redis answers.
				s.log.Warn("store: redis: subscribing to a room failed; falling back to polling until it succeeds", "room", room, "err", err)
			}
		}
		break
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			v.mu.Lock()
			delete(v.fs, f)
			last := len(v.fs) == 0 && !v.dead
			if last {
				v.dead = true
			}
			v.mu.Unlock()
			if !last {
				return
			}
			fl.mu.Lock()
			if fl.views[room] == v {
				delete(fl.views, room)
			}
			fl.mu.Unlock()
			fl.unsubscribe(k.ch)
		})
	}, nil
}

// Head reads the room's committed position from its meta: one HMGET.
//
// A Redis that lost its last writes (a crash under appendfsync everysec, a
// failover to a replica that had not received them) comes back behind
// what this node delivered, in the same epoch, and would reuse those
// revisions for other writes. Head is what a linearizable read waits for,
// so it must never hand such a position out: when meta is behind the
// view's position recorded before the read (or at it with another
// write's tag), the room starts a new epoch first (divergedLocked), its
// followers are told, and Head answers the new epoch's head.
func (s *Store) Head(ctx context.Context, room string) (epoch string, rev uint64, err error) {
	if err := store.ValidRoom(room); err != nil {
		return "", 0, err
	}
	if err := s.begin(); err != nil {
		return "", 0, err
	}
	defer s.mu.RUnlock()
	return s.heads.read(ctx, room, s.readHead, s.spawn)
}

// readHead is one read of Head.
func (s *Store) readHead(ctx context.Context, room string) (epoch string, rev uint64, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.WriteTimeout)
	defer cancel()
	v, seen := s.fol.position(room) // before the read: meta can only be at or past it
	k := s.keys(room)
	for try := 0; try < 2; try++ {
		mv, err := s.rc.HMGet(ctx, k.meta, metaFields...).Result()
		if err != nil {
			return "", 0, fmt.Errorf("store: redis: reading the head of room %q: %w", room, err)
		}
		m := parseMeta(mv)
		if p := s.readRun(ctx, k); restartedRoom(m, p.run) {
			if m, err = s.restartedMeta(ctx, room, k, p); err != nil {
				return "", 0, err
			}
		}
		if v == nil || !seen.lostBy(m) {
			return m.epoch, m.rev, nil
		}
		if try > 0 {
			break // still the lost epoch: no new one could be started
		}
		v.mu.Lock()
		if !v.dead && v.epoch == seen.epoch {
			v.divergedLocked(fmt.Sprintf("redis is at revision %d, behind revision %d delivered", m.rev, seen.rev))
		}
		v.mu.Unlock()
	}
	return "", 0, fmt.Errorf("store: redis: room %q: its history diverged from what this node delivered and no new epoch could be started", room)
}

// spawn runs f on a goroutine of the store's, which Close waits for. The
// caller holds s.mu for reading (begin), so Close has not begun waiting,
// or is itself such a goroutine (a read handing over to the next), whose
// own count keeps the wait from ending first.
func (s *Store) spawn(f func(ctx context.Context)) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f(s.ctx)
	}()
}

// viewPos is a view's position: the last batch it delivered.
type viewPos struct {
	epoch, tag string
	rev        uint64
}

// position returns room's view (nil when not followed) and its position.
func (fl *follow) position(room string) (*view, viewPos) {
	fl.mu.Lock()
	v := fl.views[room]
	fl.mu.Unlock()
	if v == nil {
		return nil, viewPos{}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.dead || v.epoch == "" {
		return nil, viewPos{}
	}
	return v, viewPos{epoch: v.epoch, tag: v.tag, rev: v.rev}
}

// lostBy reports whether meta m, read after p was recorded, shows that
// Redis lost what p delivered: the same epoch, behind p, or at p with
// another write's tag.
func (p viewPos) lostBy(m meta) bool {
	return m.epoch == p.epoch && (m.rev < p.rev || m.rev == p.rev && p.tag != "" && m.tag != "" && m.tag != p.tag)
}

// CatchUp checks the room against Redis at once (a fill from the stream
// when its view is behind), as for a lost push.
func (s *Store) CatchUp(room string) { s.fol.markDirty(room) }

// --- delivery -------------------------------------------------------------

// deliverLocked hands b to every follower that has not seen it and moves
// the view to it.
func (v *view) deliverLocked(b batch) {
	for f := range v.fs {
		if f.epoch == b.Epoch && b.Rev <= f.rev {
			continue
		}
		f.epoch, f.rev = b.Epoch, b.Rev
		f.fn(b.Batch)
	}
	v.epoch, v.rev, v.tag = b.Epoch, b.Rev, b.tag
}

// adoptLocked sets the epoch of a view that had none (the room had no
// meta when it was followed) without delivering anything: the room was at
// rev 0 in it.
func (v *view) adoptLocked(epoch string) {
	v.epoch = epoch
	for f := range v.fs {
		if f.epoch == "" {
			f.epoch, f.rev = epoch, 0
		}
	}
}

// epochChangedLocked moves the view to epoch e, whose head is rev. Every
// follower of another epoch gets an epoch notice, Batch{Epoch: e} (Rev 0,
// no events): whatever it holds from its epoch is void. It then gets the
// batches of e from the first one retained, so a consumer that already
// loaded a snapshot in e (and ignores the notice: rev 0 is behind it) misses
// nothing. The view sits at the oldest position of its followers; the
// caller fills it up to rev.
func (v *view) epochChangedLocked(e string, rev uint64, tag string) {
	v.fl.s.log.Warn("store: redis: room changed epoch (its state was lost or replaced)", "room", v.room, "old_epoch", v.epoch, "old_rev", v.rev, "epoch", e, "rev", rev)
	if v.epoch != "" {
		v.retired = append(v.retired, v.epoch)
		if len(v.retired) > 8 {
			v.retired = v.retired[1:]
		}
	}
	notice := store.Batch{Epoch: e}
	low := rev
	for f := range v.fs {
		if f.epoch != e {
			if f.epoch != "" {
				f.fn(notice)
			}
			f.epoch, f.rev = e, 0
		}
		low = min(low, f.rev)
	}
	v.epoch, v.rev, v.tag = e, low, ""
	if low == rev {
		v.tag = tag
	}
}

// push handles a batch received by pub/sub.
func (v *view) push(b batch) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.dead || slices.Contains(v.retired, b.Epoch) {
		return
	}
	switch {
	case v.epoch == "":
		v.adoptLocked(b.Epoch)
	case b.Epoch != v.epoch:
		if b.Rev == 0 {
			return
		}
		v.epochChangedLocked(b.Epoch, b.Rev-1, "")
	}
	if b.Rev <= v.rev {
		return // duplicate
	}
	if b.Rev > v.rev+1 && !v.fillLocked(b.Rev-1) {
		v.fl.markDirty(v.room) // the check fills it, b included
		return
	}
	if b.Rev <= v.rev {
		return
	}
	if b.Rev == v.rev+1 && v.tag != "" && b.prevTag != v.tag {
		v.divergedLocked("a pushed revision does not follow the last one delivered")
		return
	}
	v.deliverLocked(b)
}

// fillLocked delivers the revisions after v.rev up to to from the stream.
// It returns false when it could not (Redis unavailable, the epoch changed
// meanwhile, Redis behind the view): the caller leaves that to the check.
// Revisions the stream no longer holds are skipped: the next batch
// delivered then shows the gap, and a follower resyncs.
func (v *view) fillLocked(to uint64) bool {
	s := v.fl.s
	for v.rev < to {
		ctx, cancel := v.fl.opCtx()
		var (
			metaCmd *redis.SliceCmd
			logCmd  *redis.XMessageSliceCmd
		)
		_, err := s.rc.TxPipelined(ctx, func(p redis.Pipeliner) error {
			metaCmd = p.HMGet(ctx, v.k.meta, metaFields...)
			logCmd = p.XRangeN(ctx, v.k.log, fmt.Sprintf("%d-0", v.rev+1), fmt.Sprintf("%d-0", to), pageSize)
			return nil
		})
		cancel()
		if err != nil {
			if s.ctx.Err() == nil {
				s.log.Warn("store: redis: filling a gap from the stream failed", "room", v.room, "from", v.rev+1, "to", to, "err", err)
			}
			return false
		}
		m := parseMeta(metaCmd.Val())
		if m.epoch != v.epoch || m.rev < to {
			return false
		}
		entries := logCmd.Val()
		if len(entries) == 0 {
			if m.floor > to {
				// Nothing of this epoch up to to was ever logged: it began
				// at a revision past it (reepoch.lua). Whoever is behind
				// it came from another epoch and got its notice.
				v.rev = to
				v.tag = ""
				if to == m.rev {
					v.tag = m.tag
				}
				return true
			}
			// apply.lua always keeps the newest entry: an empty range up
			// to the head means the log is not the one the view followed.
			v.divergedLocked("the stream holds nothing up to its head")
			return false
		}
		for _, e := range entries {
			b, err := decodeBatch(entryField(e, "d"))
			if err != nil || b.Epoch != v.epoch {
				s.log.Error("store: redis: unreadable stream entry", "room", v.room, "id", e.ID, "err", err)
				return false
			}
			if b.Rev <= v.rev {
				continue
			}
			if b.Rev == v.rev+1 && v.tag != "" && b.prevTag != v.tag {
				v.divergedLocked("the stream does not continue the last revision delivered")
				return false
			}
			v.deliverLocked(b)
		}
	}
	return true
}

// divergedLocked handles a room whose Redis history no longer contains
// what this node delivered (a failover lost acknowledged writes, and
// revisions may have been reused): it starts a new epoch for the room
// (lua/reepoch.lua), so every node and client resyncs, and gives the
// followers an epoch notice.
func (v *view) divergedLocked(why string) {
	s := v.fl.s
	ctx, cancel := v.fl.opCtx()
	defer cancel()
	for attempt := 0; attempt < 3; attempt++ {
		mv, err := s.rc.HMGet(ctx, v.k.meta, metaFields...).Result()
		if err != nil {
			break
		}
		m := parseMeta(mv)
		if m.epoch == "" {
			e, r, err := s.initRoom(ctx, v.k)
			if err != nil {
				break
			}
			v.epochChangedLocked(e, r, "")
			v.fillLocked(r)
			return
		}
		if m.epoch != v.epoch { // someone (another node) already moved on
			v.epochChangedLocked(m.epoch, m.rev, m.tag)
			v.fillLocked(m.rev)
			return
		}
		s.log.Error("store: redis: room history diverged from what this node delivered; starting a new epoch", "room", v.room, "why", why,
			"epoch", v.epoch, "delivered_rev", v.rev, "redis_rev", m.rev)
		out, err := reepochScript.Run(ctx, s.rc, []string{v.k.meta, v.k.log, v.k.wids}, m.epoch, fmt.Sprint(m.rev), m.tag, store.NewEpoch()).StringSlice()
		if err != nil || len(out) != 3 {
			break
		}
		if out[0] != "" && out[0] != v.epoch {
			var r uint64
			fmt.Sscan(out[1], &r)
			v.epochChangedLocked(out[0], r, out[2])
			v.fillLocked(r)
			return
		}
	}
	v.fl.markDirty(v.room) // try again at the next check
}

// --- checking -------------------------------------------------------------

func (fl *follow) markDirty(room string) {
	fl.dmu.Lock()
	fl.dirty[room] = struct{}{}
	fl.dmu.Unlock()
	select {
	case fl.kick <- struct{}{}:
	default:
	}
}

// checkLoop checks every followed room each CheckInterval, and the rooms
// marked dirty at once.
func (fl *follow) checkLoop() {
	defer fl.s.wg.Done()
	t := time.NewTicker(fl.s.cfg.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-fl.s.ctx.Done():
			return
		case <-t.C:
			fl.dmu.Lock()
			clear(fl.dirty)
			fl.dmu.Unlock()
			fl.mu.RLock()
			views := make([]*view, 0, len(fl.views))
			for _, v := range fl.views {
				views = append(views, v)
			}
			fl.mu.RUnlock()
			fl.check(views)
		case <-fl.kick:
			fl.dmu.Lock()
			rooms := fl.dirty
			fl.dirty = map[string]struct{}{}
			fl.dmu.Unlock()
			var views []*view
			fl.mu.RLock()
			for r := range rooms {
				if v := fl.views[r]; v != nil {
					views = append(views, v)
				}
			}
			fl.mu.RUnlock()
			fl.check(views)
		}
	}
}

// check compares the views with their rooms' meta (one pipelined HMGET per
// room) and repairs what differs.
func (fl *follow) check(views []*view) {
	type probe struct {
		v          *view
		epoch, tag string
		rev        uint64
		cmd        *redis.SliceCmd
	}
	for len(views) > 0 {
		n := min(len(views), 500)
		chunk := views[:n]
		views = views[n:]
		probes := make([]*probe, 0, n)
		for _, v := range chunk {
			v.mu.Lock()
			if !v.dead {
				// Recorded before the read: meta can only be at or past it.
				probes = append(probes, &probe{v: v, epoch: v.epoch, rev: v.rev, tag: v.tag})
			}
			v.mu.Unlock()
		}
		if len(probes) == 0 {
			continue
		}
		ctx, cancel := fl.opCtx()
		_, err := fl.s.rc.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, pr := range probes {
				pr.cmd = p.HMGet(ctx, pr.v.k.meta, metaFields...)
			}
			return nil
		})
		cancel()
		if err != nil && fl.s.ctx.Err() == nil {
			fl.s.log.Debug("store: redis: checking followed rooms failed", "err", err)
		}
		for _, pr := range probes {
			if pr.cmd.Err() != nil {
				continue
			}
			m := parseMeta(pr.cmd.Val())
			if p := fl.s.readRun(fl.s.ctx, pr.v.k); restartedRoom(m, p.run) {
				// A new Redis process: the room's new epoch first, then
				// its meta as it is now.
				ctx, cancel := fl.opCtx()
				mv, err := fl.s.restartedMeta(ctx, pr.v.room, pr.v.k, p)
				cancel()
				if err != nil {
					continue
				}
				m = mv
			}
			v := pr.v
			v.mu.Lock()
			if !v.dead && v.epoch == pr.epoch && v.rev == pr.rev && v.tag == pr.tag {
				v.reconcileLocked(m)
			}
			v.mu.Unlock()
		}
	}
}

// reconcileLocked moves the view to meta m read after its position.
func (v *view) reconcileLocked(m meta) {
	switch {
	case m.epoch == "":
		if v.epoch == "" {
			return // still never written
		}
		// The room's state is gone (FLUSHALL, restart without persistence,
		// expiry): give it its new epoch and tell the followers.
		ctx, cancel := v.fl.opCtx()
		e, r, err := v.fl.s.initRoom(ctx, v.k)
		cancel()
		if err != nil {
			return
		}
		v.epochChangedLocked(e, r, "")
		if v.rev < r {
			v.fillLocked(r)
		}
	case v.epoch == "":
		v.adoptLocked(m.epoch)
		if m.rev > v.rev {
			v.fillLocked(m.rev)
		} else {
			v.tag = m.tag
		}
	case m.epoch != v.epoch:
		v.epochChangedLocked(m.epoch, m.rev, m.tag)
		if v.rev < m.rev {
			v.fillLocked(m.rev)
		}
	case m.rev > v.rev:
		v.fillLocked(m.rev)
	case m.rev < v.rev:
		v.divergedLocked(fmt.Sprintf("redis is at revision %d, behind revision %d delivered", m.rev, v.rev))
	case v.tag != "" && m.tag != v.tag:
		v.divergedLocked("the head revision was rewritten")
	}
}

// --- pub/sub --------------------------------------------------------------

// shard is one SSUBSCRIBE connection: to the standalone server, or to
// one cluster master for the channels of the slots it serves.
type shard struct {
	fl   *follow
	addr string
	node *redis.Client

	mu     sync.Mutex // guards the fields below; held across (un)subscribing
	closed bool
	ps     *redis.PubSub // nil while no channel is subscribed
	chans  map[string]int
	wake   chan struct{}
}

// shardFor returns the shard serving channel ch, creating it (and its
// receiver) when needed.
func (fl *follow) shardFor(ctx context.Context, ch string) (*shard, error) {
	addr, node := "", (*redis.Client)(nil)
	if fl.s.cluster != nil {
		c, err := fl.s.cluster.MasterForKey(ctx, ch)
		if err != nil {
			return nil, err
		}
		addr, node = c.Options().Addr, c
	} else {
		node = fl.s.rc.(*redis.Client)
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.closed {
		return nil, store.ErrClosed
	}
	sh := fl.shards[addr]
	if sh == nil {
		sh = &shard{fl: fl, addr: addr, node: node, chans: map[string]int{}, wake: make(chan struct{}, 1)}
		fl.shards[addr] = sh
		fl.s.wg.Add(1)
		go sh.run()
	}
	return sh, nil
}

// subscribe adds one reference to channel ch.
func (fl *follow) subscribe(ctx context.Context, ch string) error {
	fl.mu.RLock()
	sh := fl.chShard[ch]
	fl.mu.RUnlock()
	if sh == nil {
		var err error
		if sh, err = fl.shardFor(ctx, ch); err != nil {
			return err
		}
	}
	err := sh.add(ctx, ch, 1)
	fl.mu.Lock()
	if fl.chShard[ch] == nil && !errors.Is(err, store.ErrClosed) {
		fl.chShard[ch] = sh
	}
	fl.mu.Unlock()
	return err
}

// unsubscribe drops one reference to channel ch.
func (fl *follow) unsubscribe(ch string) {
	fl.mu.RLock()
	sh := fl.chShard[ch]
	fl.mu.RUnlock()
	if sh == nil {
		return
	}
	sh.remove(ch, 1)
	fl.mu.Lock()
	if fl.chShard[ch] == sh && !sh.wants(ch) {
		delete(fl.chShard, ch)
	}
	fl.mu.Unlock()
}

func (sh *shard) add(ctx context.Context, ch string, n int) error {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closed {
		return store.ErrClosed
	}
	sh.chans[ch] += n
	if sh.chans[ch] > n {
		return nil // subscribed already
	}
	if sh.ps == nil {
		sh.ps = sh.node.SSubscribe(ctx)
		select {
		case sh.wake <- struct{}{}:
		default:
		}
	}
	return sh.ps.SSubscribe(ctx, ch)
}

// remove drops n references to ch and returns those left.
func (sh *shard) remove(ch string, n int) int {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closed || sh.chans[ch] == 0 {
		return 0
	}
	sh.chans[ch] -= n
	if left := sh.chans[ch]; left > 0 {
		return left
	}
	delete(sh.chans, ch)
	if sh.ps == nil {
		return 0
	}
	if len(sh.chans) == 0 {
		_ = sh.ps.Close() // an idle node keeps no connection
		sh.ps = nil
		return 0
	}
	ctx, cancel := sh.fl.opCtx()
	defer cancel()
	if err := sh.ps.SUnsubscribe(ctx, ch); err != nil {
		sh.fl.s.log.Debug("store: redis: unsubscribing failed", "channel", ch, "err", err)
	}
	return 0
}

func (sh *shard) wants(ch string) bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.chans[ch] > 0
}

func (sh *shard) current(ps *redis.PubSub) bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.ps == ps && !sh.closed
}

func (sh *shard) close() {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.closed = true
	if sh.ps != nil {
		_ = sh.ps.Close()
		sh.ps = nil
	}
}

// rebuild replaces a failed PubSub with a new connection subscribed to
// every wanted channel, one SSUBSCRIBE per slot (a cluster refuses one
// over several slots; go-redis's own resubscribe sends them all at once).
// In a cluster, channels whose slot moved go to their new master's shard.
// Every channel's confirmation then triggers a check of its room.
func (sh *shard) rebuild(old *redis.PubSub) {
	fl := sh.fl
	ctx, cancel := fl.opCtx()
	defer cancel()
	var moved []string
	if cl := fl.s.cluster; cl != nil {
		cl.ReloadState(ctx)
		sh.mu.Lock()
		chans := make([]string, 0, len(sh.chans))
		for ch := range sh.chans {
			chans = append(chans, ch)
		}
		sh.mu.Unlock()
		for _, ch := range chans {
			if c, err := cl.MasterForKey(ctx, ch); err == nil && c.Options().Addr != sh.addr {
				moved = append(moved, ch)
			}
		}
	}
	sh.mu.Lock()
	if sh.closed || sh.ps != old {
		sh.mu.Unlock()
		return
	}
	_ = old.Close()
	sh.ps = nil
	counts := map[string]int{}
	for _, ch := range moved {
		if n := sh.chans[ch]; n > 0 {
			counts[ch] = n
			delete(sh.chans, ch)
		}
	}
	if len(sh.chans) > 0 {
		sh.ps = sh.node.SSubscribe(ctx)
		for _, group := range slotGroups(sh.chans) {
			if err := sh.ps.SSubscribe(ctx, group...); err != nil {
				fl.s.log.Debug("store: redis: resubscribing failed", "node", sh.addr, "err", err)
				break // the receiver sees the failure and rebuilds again
			}
		}
	}
	sh.mu.Unlock()
	for ch, n := range counts {
		other, err := fl.shardFor(ctx, ch)
		if err == nil {
			fl.mu.Lock()
			fl.chShard[ch] = other
			fl.mu.Unlock()
			err = other.add(ctx, ch, n)
		}
		if err != nil {
			fl.s.log.Warn("store: redis: moving a channel to its new master failed", "channel", ch, "err", err)
		}
		if room, ok := fl.s.roomOfChannel(ch); ok {
			fl.markDirty(room)
		}
	}
}

// run receives the shard's pushes until the store closes.
func (sh *shard) run() {
	fl := sh.fl
	s := fl.s
	defer s.wg.Done()
	var backoff time.Duration
	pinged := false
	for {
		sh.mu.Lock()
		ps := sh.ps
		sh.mu.Unlock()
		if ps == nil {
			select {
			case <-s.ctx.Done():
				return
			case <-sh.wake:
				pinged = false
				continue
			}
		}
		msg, err := ps.ReceiveTimeout(s.ctx, s.cfg.PingInterval)
		if s.ctx.Err() != nil {
			return
		}
		if err != nil {
			if !sh.current(ps) {
				continue // closed or replaced meanwhile
			}
			if isNetTimeout(err) && !pinged {
				pinged = true
				if err := ps.Ping(s.ctx); err == nil {
					continue
				}
			}
			s.log.Debug("store: redis: push connection failed; rebuilding it", "node", sh.addr, "err", err)
			if backoff > 0 {
				select {
				case <-s.ctx.Done():
					return
				case <-time.After(backoff):
				}
			}
			backoff = min(max(2*backoff, 50*time.Millisecond), time.Second)
			sh.rebuild(ps)
			pinged = false
			continue
		}
		backoff, pinged = 0, false
		switch m := msg.(type) {
		case *redis.Message:
			fl.onMessage(m.Channel, m.Payload)
		case *redis.Subscription:
			switch m.Kind {
			case "ssubscribe":
				if room, ok := s.roomOfChannel(m.Channel); ok {
					fl.markDirty(room) // catch up on what was written before
				}
			case "sunsubscribe":
				if sh.wants(m.Channel) { // the server dropped it: its slot moved
					sh.rebuild(ps)
				}
			}
		}
	}
}

func (fl *follow) onMessage(ch, payload string) {
	room, ok := fl.s.roomOfChannel(ch)
	if !ok {
		return
	}
	fl.mu.RLock()
	v := fl.views[room]
	fl.mu.RUnlock()
	if v == nil {
		return
	}
	b, err := decodeBatch(payload)
	if err != nil {
		fl.s.log.Error("store: redis: unreadable push; reading the stream instead", "room", room, "err", err)
		fl.markDirty(room)
		return
	}
	v.push(b)
}

func isNetTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// slotGroups groups channels by cluster slot, at most 500 per group.
func slotGroups(chans map[string]int) [][]string {
	bySlot := map[uint16][]string{}
	for ch := range chans {
		sl := slot(ch)
		bySlot[sl] = append(bySlot[sl], ch)
	}
	var out [][]string
	for _, g := range bySlot {
		slices.Sort(g)
		for len(g) > 0 {
			n := min(len(g), 500)
			out = append(out, g[:n])
			g = g[n:]
		}
	}
	return out
}

// slot is the cluster slot of key: CRC16 (XMODEM) of its hash tag.
func slot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}
