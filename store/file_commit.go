package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/statecast/statecast/store/internal/groupcommit"
)

// fileReq is one Apply waiting for the committer.
type fileReq struct {
	room  string
	w     Write
	sess  *recordWrite // instead of room and w: a session or lease record to write
	flush bool         // instead of a write: a reader waiting for a checkpoint
	size  int          // bytes it adds to a group
	state groupcommit.Handover
	done  chan struct{}

	// Set by the committer before done is closed.
	res   Result
	err   error
	batch *Batch // committed batch to hand to followers; nil when none
	out   bool   // dropped from the group after a fatal error
}

// newFileReq copies w's values into one allocation: the caller may reuse
// its buffers once Apply returns, while the committed values live on in
// results, history and followers' batches.
func newFileReq(room string, w Write) *fileReq {
	size := 64 + len(room)
	for _, op := range w.Ops {
		size += len(op.Key) + len(op.Value) + 16
	}
	for _, c := range w.Conds {
		size += len(c.Key) + 16
	}
	slab := make([]byte, 0, size)
	ops := make([]Op, len(w.Ops))
	for i, op := range w.Ops {
		if op.Value != nil {
			start := len(slab)
			slab = append(slab, op.Value...)
			op.Value = slab[start:len(slab):len(slab)]
		}
		ops[i] = op
	}
	w.Ops = ops
	w.Conds = append([]Cond(nil), w.Conds...)
	return &fileReq{room: room, w: w, size: size, done: make(chan struct{})}
}

func (f *File) Apply(ctx context.Context, room string, w Write) (Result, error) {
	if err := f.cfg.Limits.Validate(room, w); err != nil {
		return Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	return f.submit(ctx, newFileReq(room, w))
}

// submit queues req for the committer and waits for its outcome.
func (f *File) submit(ctx context.Context, req *fileReq) (Result, error) {
	f.mu.RLock()
	if f.closed {
		f.mu.RUnlock()
		return Result{}, ErrClosed
	}
	select {
	case f.reqs <- req:
		f.mu.RUnlock()
	case <-ctx.Done():
		f.mu.RUnlock()
		return Result{}, ctx.Err()
	}
	select {
	case <-req.done:
	case <-ctx.Done():
		if req.state.Abandon() {
			return Result{}, ctx.Err() // the committer will skip it
		}
		<-req.done // already taken: its outcome is at most one commit away
	}
	return req.res, req.err
}

// run is the committer: it gathers whatever is queued into one group,
// applies it to the open transaction and logs it, and checkpoints that
// transaction when it is due or a reader needs it, until Close closes reqs
// and the queue is drained.
func (f *File) run() {
	defer close(f.done)
	group := make([]*fileReq, 0, maxGroupWrites)
	var flushes []*fileReq
	due := time.NewTimer(time.Hour)
	due.Stop()
	armed := false
	for {
		var first *fileReq
		select {
		case r, ok := <-f.reqs:
			if !ok {
				f.checkpoint()
				if f.tx != nil { // broken: nothing more may be committed
					_ = f.tx.Rollback()
					f.tx = nil
				}
				return
			}
			first = r
		case <-due.C:
			armed = false
			f.checkpoint()
			continue
		}
		if h := f.hookGroup.Load(); h != nil {
			(*h)()
		}
		group = append(group[:0], first)
		size := first.size
	fill:
		for len(group) < maxGroupWrites && size < maxGroupBytes {
			select {
			case r, ok := <-f.reqs:
				if !ok {
					break fill // closed: commit this group, then the loop ends
				}
				group = append(group, r)
				size += r.size
			default:
				break fill
			}
		}
		writes := group[:0]
		for _, r := range group {
			if r.flush {
				flushes = append(flushes, r)
			} else {
				writes = append(writes, r)
			}
		}
		if len(writes) > 0 {
			f.commitGroup(writes)
		}
		switch {
		case len(flushes) > 0 || f.wal.off >= walCheckpointAt:
			f.checkpoint()
			for _, r := range flushes {
				r.err = f.flushErr
				close(r.done)
			}
			clear(flushes)
			flushes = flushes[:0]
		case f.tx != nil && !armed:
			due.Reset(f.every)
			armed = true
		}
		clear(group)
	}
}

// errNoChange rolls back a group that wrote nothing (only conflicts and
// no-op writes), saving an fsync; its results stand.
var errNoChange = errors.New("store: group changed nothing")

// fatalError marks a failure inside the transaction after a write began
// mutating it: the transaction must be rolled back, and the group retried
// without that write.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

// commitGroup applies the group's live writes to the open transaction and
// logs their changes in one record (one fdatasync), then hands the
// committed batches to followers and answers every writer.
func (f *File) commitGroup(group []*fileReq) {
	live := make([]*fileReq, 0, len(group))
	for _, r := range group {
		if r.state.Take() {
			live = append(live, r)
		}
	}
	if len(live) == 0 {
		return // every write was abandoned by its caller
	}
	for {
		var bad *fileReq
		err := f.apply(recordSize(live), func(c *changes) error {
			changed := false
			for _, r := range live {
				if r.out {
					continue
				}
				ch, err := f.applyOne(c, r)
				if err != nil {
					bad = r
					return err
				}
				changed = changed || ch
			}
			if !changed {
				return errNoChange
			}
			if h := f.hookCommit.Load(); h != nil {
				return (*h)()
			}
			return nil
		})
		if bad != nil {
			// Only bad fails; the others are planned again on the rebuilt
			// transaction, since this one held part of bad.
			f.log.Error("store: write failed inside a commit; retrying its group without it", "room", bad.room, "err", err)
			bad.out, bad.res, bad.batch = true, Result{}, nil
			bad.err = fmt.Errorf("store: write to room %q: %w", bad.room, errors.Unwrap(err))
			continue
		}
		switch {
		case err == nil:
			f.commits.Add(1)
		case errors.Is(err, errNoChange):
			err = nil
		default:
			f.log.Error("store: commit failed", "writes", len(live), "err", err)
			err = fmt.Errorf("store: commit: %w", err)
			for _, r := range live {
				if !r.out {
					r.res, r.err, r.batch = Result{}, err, nil
				}
			}
		}
		break
	}
	f.deliver(live)
	for _, r := range live {
		close(r.done)
	}
}

// apply runs fn on the open transaction (beginning one) and logs what it
// changed. When fn fails the transaction is rebuilt without its changes;
// when logging fails the store refuses writes from then on.
func (f *File) apply(size int, fn func(*changes) error) error {
	if f.broken != nil {
		return f.broken
	}
	if f.tx == nil {
		tx, err := f.db.Begin(true)
		if err != nil {
			return err
		}
		f.tx = tx
	}
	c := &changes{tx: f.tx, buf: make([]byte, 0, size)}
	err := fn(c)
	if err == nil {
		if err = f.wal.append(c.buf); err == nil {
			f.logged = append(f.logged, c.buf)
			f.dirty.Store(true)
			return nil
		}
		return f.walFailed(err)
	}
	if len(c.buf) > 0 {
		f.rebuild()
	}
	return err
}

// walFailed handles a failed append: the record may still reach the disk
// whole (a failed fdatasync says nothing of which pages were written), so
// it is killed by a checkpoint of the answered writes with the log's next
// generation before the writers are told their write failed. From then on
// the store refuses writes. When even that commit fails the store is
// broken, and the write's outcome is unknown.
func (f *File) walFailed(err error) error {
	f.log.Error("store: write-ahead log failed; refusing writes until a restart", "err", err)
	f.broken = fmt.Errorf("%w: %v", errWALFailed, err)
	f.rebuild()
	if f.broken != nil && !errors.Is(f.broken, errWALFailed) {
		return fmt.Errorf("%w; the write's outcome is unknown", f.broken)
	}
	if f.tx == nil {
		tx, berr := f.db.Begin(true)
		if berr != nil {
			f.fail(fmt.Errorf("store: kill the failed log record: %w", berr))
			return fmt.Errorf("%w; the write's outcome is unknown", f.broken)
		}
		f.tx = tx
	}
	f.dirty.Store(true) // commit even an empty transaction: it carries the generation
	if !f.checkpoint() {
		return fmt.Errorf("%w; the write's outcome is unknown", f.broken)
	}
	return f.broken
}

// recordSize guesses the bytes of a group's log record, so that it is
// allocated once: a write's values go in twice (its keys' records and the
// log's batch, which holds previous values too), with its room's metadata.
func recordSize(group []*fileReq) int {
	n := 0
	for _, r := range group {
		n += 2*r.size + 256
	}
	return n
}

// rebuild rolls the open transaction back and replays the records logged
// since the checkpoint into a new one: the state every answered write had
// committed on.
func (f *File) rebuild() {
	if f.tx != nil {
		_ = f.tx.Rollback()
		f.tx = nil
	}
	if len(f.logged) == 0 {
		return
	}
	tx, err := f.db.Begin(true)
	for _, rec := range f.logged {
		if err != nil {
			break
		}
		err = replay(tx, rec)
	}
	if err == nil {
		f.tx = tx
	} else {
		if tx != nil {
			_ = tx.Rollback()
		}
		f.fail(fmt.Errorf("store: rebuild the open transaction from the write-ahead log: %w", err))
	}
}

// checkpoint commits the open transaction, with the log's next generation,
// and starts the log again; false when it failed. A failed commit breaks
// the store (fail-stop, as etcd does on a failed fsync): bbolt may show its
// new meta page, the next generation's number with it, while the disk may
// or may not have it, so neither replaying the log on it nor writing more
// records of its generation is safe. A restart recovers from the disk.
func (f *File) checkpoint() bool {
	if f.tx == nil {
		return f.broken == nil
	}
	if !f.dirty.Load() {
		_ = f.tx.Rollback() // only groups that changed nothing
		f.tx = nil
		return true
	}
	err := f.tx.Bucket(bucketMeta).Put(keyWalGen, binary.BigEndian.AppendUint64(nil, f.wal.gen+1))
	if h := f.hookCheckpoint.Load(); h != nil && err == nil {
		err = (*h)()
	}
	if err != nil {
		_ = f.tx.Rollback()
	} else {
		// A reader may not begin while bbolt's new meta page is visible
		// but not yet durable: it could see what a crash undoes.
		f.commitMu.Lock()
		err = f.tx.Commit() // rolls back by itself on failure
		f.commitMu.Unlock()
	}
	if err != nil {
		f.tx = nil
		f.fail(fmt.Errorf("store: checkpoint: %w", err))
		return false
	}
	f.tx, f.flushErr = nil, nil
	clear(f.logged)
	f.logged = f.logged[:0]
	f.wal.restart(f.wal.gen + 1)
	f.dirty.Store(false)
	f.checkpoints.Add(1)
	return true
}

// fail makes the store refuse writes, and reads that need the open
// transaction: its state can no longer be trusted to be what was answered.
func (f *File) fail(err error) {
	f.log.Error("store: refusing writes and reads until a restart", "err", err)
	if f.tx != nil {
		_ = f.tx.Rollback()
		f.tx = nil
	}
	f.broken, f.flushErr = err, err
}

// deliver calls followers with the group's batches: group order is commit
// order, so each room's batches arrive in revision order.
func (f *File) deliver(live []*fileReq) {
	f.fmu.Lock()
	defer f.fmu.Unlock()
	for _, r := range live {
		if r.batch == nil {
			continue
		}
		for fn := range f.followers[r.room] {
			(*fn)(*r.batch)
		}
	}
}

// applyOne plans r against the transaction's current state (which includes
// the group's earlier writes) and, when it changes something, writes it.
// r's own failures (a condition, a corrupt record read while planning) are
// set on r and return nil; an error returned means the transaction was
// left half-written and must be rolled back.
func (f *File) applyOne(c *changes, r *fileReq) (changed bool, fatal error) {
	r.res, r.err, r.batch = Result{}, nil, nil
	if r.sess != nil {
		return r.sess.apply(c)
	}
	rooms := c.tx.Bucket(bucketRooms)
	rb := rooms.Bucket([]byte(r.room))
	m := roomMeta{oldest: 1}
	var kvb, logb, widb *bolt.Bucket
	if rb != nil {
		var err error
		if m, err = readWindow(rb); err != nil {
			r.err = fmt.Errorf("room %q: %w", r.room, err)
			return false, nil
		}
		kvb, logb, widb = rb.Bucket(bucketKV), rb.Bucket(bucketLog), rb.Bucket(bucketWids)
	}
	// The ids of the logged batches oldest..head are in widb (this
	// transaction's earlier writes included).
	if rev, dup, err := seenWid(r.w, m.oldest, func(wid string) (uint64, string, bool, error) {
		return storedWid(rb, widb, wid)
	}); dup || err != nil {
		r.res, r.err = Result{Epoch: f.epoch, Rev: rev, Dup: dup}, err
		return false, nil
	}
	events, err := plan(r.w, f.epoch, m.head, func(key string) (KV, bool, error) {
		if kvb == nil {
			return KV{}, false, nil
		}
		v := kvb.Get([]byte(key))
		if v == nil {
			return KV{}, false, nil
		}
		kv, err := decodeKV(key, v)
		if err != nil {
			return KV{}, false, fmt.Errorf("room %q key %q: %w", r.room, key, err)
		}
		return kv, true, nil
	})
	if err != nil {
		r.err = err
		var ce *ConflictError
		if errors.As(err, &ce) {
			r.res = Result{Epoch: f.epoch, Rev: m.head}
		}
		return false, nil
	}
	if len(events) == 0 {
		r.res = Result{Epoch: f.epoch, Rev: m.head}
		return false, nil
	}
	usage, err := roomUsage(rb, kvb, m.head)
	if err != nil {
		r.err = fmt.Errorf("room %q: %w", r.room, err)
		return false, nil
	}
	after := usage.after(events)
	if err := f.cfg.Limits.checkQuota(usage, after); err != nil {
		r.err = err
		return false, nil
	}

	// Decide everything that can fail on bad data before the first write.
	now := f.cfg.Clock()
	b := Batch{
		Epoch:  f.epoch,
		Rev:    m.head + 1,
		Time:   time.Unix(now.Unix(), int64(now.Nanosecond())), // as a decoded batch will read
		Events: events,
	}
	rec := encodeBatch(&b)
	oldHead, oldOldest := m.head, m.oldest
	m.head, m.events, m.bytes = b.Rev, m.events+uint64(len(events)), m.bytes+uint64(len(rec))
	old := logHeader(logb)
	m, err = retained(m, f.cfg.Retention.For(r.room), b.Time, func(rev uint64) (time.Time, uint64, uint64, error) {
		if rev == b.Rev {
			return b.Time, uint64(len(events)), uint64(len(rec)), nil
		}
		return old(rev)
	})
	if err != nil {
		r.err = fmt.Errorf("room %q: %w", r.room, err)
		return false, nil
	}
	logged := m.oldest <= b.Rev // retention may drop even the new batch
	forget, err := droppedWids(widb, logb, oldOldest, min(m.oldest-1, oldHead))
	if err != nil {
		r.err = fmt.Errorf("room %q: %w", r.room, err)
		return false, nil
	}

	if err := f.writeRoom(c, r, roomWrite{
		rb: rb, events: events, batch: &b, rec: rec, logged: logged,
		meta: m, after: after, dropFrom: oldOldest, dropTo: min(m.oldest-1, oldHead), forget: forget,
	}); err != nil {
		return false, &fatalError{err}
	}
	r.res = Result{Epoch: f.epoch, Rev: b.Rev, Events: events}
	r.batch = &b
	return true, nil
}

// storedWid looks a write id up in a room's wids bucket (nil: none yet),
// with its fingerprint ("" when written by an older binary).
func storedWid(rb, widb *bolt.Bucket, wid string) (uint64, string, bool, error) {
	if widb == nil {
		return 0, "", false, nil
	}
	v := widb.Get([]byte(wid))
	if v == nil {
		return 0, "", false, nil
	}
	rev, n := binary.Uvarint(v)
	if n != len(v) {
		return 0, "", false, fmt.Errorf("%w: write id %q has a bad revision", ErrCorrupt, wid)
	}
	var fp string
	if fpb := rb.Bucket(bucketFps); fpb != nil {
		fp = string(fpb.Get([]byte(wid)))
	}
	return rev, fp, true, nil
}

// droppedWids reads the write ids of the logged revisions from..to, which
// retention is about to delete: their ids go with them. A room that never
// had a write id (no wids bucket) reads nothing.
func droppedWids(widb, logb *bolt.Bucket, from, to uint64) ([]string, error) {
	if widb == nil {
		return nil, nil
	}
	var out []string
	for rev := from; rev <= to; rev++ {
		wid, err := decodeBatchWid(logb.Get(revKey(rev)))
		if err != nil {
			return nil, fmt.Errorf("revision %d: %w", rev, err)
		}
		if wid != "" {
			out = append(out, wid)
		}
	}
	return out, nil
}

// roomWrite is what applyOne decided a write changes in its room.
type roomWrite struct {
	rb               *bolt.Bucket // nil: not created yet
	events           []Event
	batch            *Batch
	rec              []byte // the batch's log record
	logged           bool   // retention keeps the batch itself
	meta             roomMeta
	after            Usage
	dropFrom, dropTo uint64   // log records retention drops (none when dropFrom > dropTo)
	forget           []string // their write ids
}

// writeRoom makes the changes rw describes, creating the room's buckets on
// their first use.
func (f *File) writeRoom(c *changes, r *fileReq, rw roomWrite) error {
	room := [][]byte{bucketRooms, []byte(r.room)}
	sub := func(name []byte) [][]byte { return append(room[:2:2], name) }
	if rw.rb == nil {
		if _, err := c.createBucket(room[:1], room[1]); err != nil {
			return err
		}
		for _, name := range [][]byte{bucketKV, bucketLog} {
			if _, err := c.createBucket(room, name); err != nil {
				return err
			}
		}
		rw.rb, _ = bucketAt(c.tx, room)
	}
	for i := range rw.events {
		ev := &rw.events[i]
		var err error
		if ev.Type == OpPut {
			err = c.put(sub(bucketKV), []byte(ev.KV.Key), encodeKV(&ev.KV))
		} else {
			err = c.delete(sub(bucketKV), []byte(ev.KV.Key))
		}
		if err != nil {
			return err
		}
	}
	if rw.logged {
		if err := c.put(sub(bucketLog), revKey(rw.batch.Rev), rw.rec); err != nil {
			return err
		}
		if wid := r.w.Wid; wid != "" {
			for _, name := range [][]byte{bucketWids, bucketFps} {
				if rw.rb.Bucket(name) == nil {
					if _, err := c.createBucket(room, name); err != nil {
						return err
					}
				}
			}
			if err := c.put(sub(bucketWids), []byte(wid), binary.AppendUvarint(nil, rw.batch.Rev)); err != nil {
				return err
			}
			if err := c.put(sub(bucketFps), []byte(wid), []byte(fingerprint(r.w))); err != nil {
				return err
			}
		}
	}
	for rev := rw.dropFrom; rev <= rw.dropTo; rev++ {
		if err := c.delete(sub(bucketLog), revKey(rev)); err != nil {
			return err
		}
	}
	hasFps := rw.rb.Bucket(bucketFps) != nil
	for _, wid := range rw.forget {
		if err := c.delete(sub(bucketWids), []byte(wid)); err != nil {
			return err
		}
		if hasFps {
			if err := c.delete(sub(bucketFps), []byte(wid)); err != nil {
				return err
			}
		}
	}
	for _, kv := range []struct{ k, v []byte }{
		{keyRoomMeta, encodeMeta(rw.meta)},
		{keyUsage, encodeUsage(rw.batch.Rev, rw.after)},
		// In the same transaction as the log it measures, so a crash never
		// leaves the two out of step.
		{keyLogBytes, encodeLogBytes(rw.meta)},
	} {
		if err := c.put(room, kv.k, kv.v); err != nil {
			return err
		}
	}
	return nil
}
