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
	sess  *sessionWrite // instead of room and w: a session record to write
	size  int           // bytes it adds to a group
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

// run is the committer: it gathers whatever is queued into one group and
// commits it, until Close closes reqs and the queue is drained.
func (f *File) run() {
	defer close(f.done)
	group := make([]*fileReq, 0, maxGroupWrites)
	for first := range f.reqs {
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
		f.commitGroup(group)
		clear(group)
	}
}

// update runs fn in a write transaction and commits it unless fn fails.
// The commit (page writes, fsyncs) holds commitMu so that no reader starts
// while the new meta page is visible but not yet durable.
func (f *File) update(fn func(*bolt.Tx) error) error {
	tx, err := f.db.Begin(true)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	f.commitMu.Lock()
	defer f.commitMu.Unlock()
	return tx.Commit() // rolls back by itself on failure
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

// commitGroup runs the group's live writes in one transaction, then hands
// the committed batches to followers and answers every writer.
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
		err := f.update(func(tx *bolt.Tx) error {
			changed := false
			for _, r := range live {
				if r.out {
					continue
				}
				c, err := f.applyOne(tx, r)
				if err != nil {
					bad = r
					return err
				}
				changed = changed || c
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
			// Only bad fails; the others are planned again in a fresh
			// transaction, since this one is gone.
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
func (f *File) applyOne(tx *bolt.Tx, r *fileReq) (changed bool, fatal error) {
	r.res, r.err, r.batch = Result{}, nil, nil
	if r.sess != nil {
		return r.sess.apply(tx)
	}
	rooms := tx.Bucket(bucketRooms)
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
	events, err := plan(r.w, m.head, func(key string) (KV, bool, error) {
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

	if rb == nil {
		if rb, err = rooms.CreateBucket([]byte(r.room)); err != nil {
			return false, &fatalError{err}
		}
		if kvb, err = rb.CreateBucket(bucketKV); err != nil {
			return false, &fatalError{err}
		}
		if logb, err = rb.CreateBucket(bucketLog); err != nil {
			return false, &fatalError{err}
		}
	}
	for i := range events {
		ev := &events[i]
		if ev.Type == OpPut {
			err = kvb.Put([]byte(ev.KV.Key), encodeKV(&ev.KV))
		} else {
			err = kvb.Delete([]byte(ev.KV.Key))
		}
		if err != nil {
			return false, &fatalError{err}
		}
	}
	if logged {
		if err := logb.Put(revKey(b.Rev), rec); err != nil {
			return false, &fatalError{err}
		}
		if err := rememberWid(rb, &widb, r.w, b.Rev); err != nil {
			return false, &fatalError{err}
		}
	}
	for rev := oldOldest; rev < m.oldest && rev <= oldHead; rev++ {
		if err := logb.Delete(revKey(rev)); err != nil {
			return false, &fatalError{err}
		}
	}
	fpb := rb.Bucket(bucketFps)
	for _, wid := range forget {
		if err := widb.Delete([]byte(wid)); err != nil {
			return false, &fatalError{err}
		}
		if fpb != nil {
			if err := fpb.Delete([]byte(wid)); err != nil {
				return false, &fatalError{err}
			}
		}
	}
	if err := rb.Put(keyRoomMeta, encodeMeta(m)); err != nil {
		return false, &fatalError{err}
	}
	if err := rb.Put(keyUsage, encodeUsage(b.Rev, after)); err != nil {
		return false, &fatalError{err}
	}
	// In the same transaction as the log it measures, so a crash never
	// leaves the two out of step.
	if err := rb.Put(keyLogBytes, encodeLogBytes(m)); err != nil {
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

// rememberWid records that w's id ("" for none) committed at rev, with
// its fingerprint, creating the room's buckets on their first use.
func rememberWid(rb *bolt.Bucket, widb **bolt.Bucket, w Write, rev uint64) error {
	if w.Wid == "" {
		return nil
	}
	if *widb == nil {
		b, err := rb.CreateBucket(bucketWids)
		if err != nil {
			return err
		}
		*widb = b
	}
	if err := (*widb).Put([]byte(w.Wid), binary.AppendUvarint(nil, rev)); err != nil {
		return err
	}
	fpb, err := rb.CreateBucketIfNotExists(bucketFps)
	if err != nil {
		return err
	}
	return fpb.Put([]byte(w.Wid), []byte(fingerprint(w)))
}
