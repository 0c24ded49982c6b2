package hooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/store"
)

// hook is one configured webhook on this node. Its claim is kept by the
// Webhooks loop; while this node holds it, a run delivers its rooms.
type hook struct {
	w      *Webhooks
	spec   Route
	id     string
	poster poster // signs, bounds the wait, follows no redirect
	stats  hookStats

	mu      sync.Mutex // claim, lost, lastErr and run, for the inspector
	claim   claimState
	lost    bool // the claim was seen taken by another node
	lastErr string
	run     *run // set and cleared by the loop only
}

// hookStats are the hook's counters since the process started.
type hookStats struct {
	revisions, deliveries, failures, retries atomic.Uint64
	snapshots                                [3]atomic.Uint64 // by reasonIndex
	lag                                      prometheus.Histogram
}

var reasons = [3]string{ReasonInitial, ReasonCompacted, ReasonEpoch}

func reasonIndex(r string) int {
	for i, x := range reasons {
		if x == r {
			return i
		}
	}
	return 0
}

func newHook(w *Webhooks, r Route) *hook {
	h := &hook{w: w, spec: r, id: WebhookID(r), poster: newPoster(w.cfg.Secret, w.cfg.Timeout, w.cfg.Client)}
	h.poster.ignoreReply = true
	h.stats.lag = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "statecast_webhook_delivery_seconds", Help: "Time from a revision's commit to its acknowledgement by the hook's receiver.",
		ConstLabels: prometheus.Labels{"hook": h.id}, Buckets: prometheus.ExponentialBuckets(0.001, 2, 18)})
	return h
}

func (h *hook) setErr(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastErr = ""
	if err != nil {
		h.lastErr = err.Error()
	}
}

// claimLost reports whether the claim was taken by another node, seen in
// the internal room or by a conditional write that failed on it.
func (h *hook) claimLost() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost || (h.run != nil && h.run.lost.Load())
}

// start delivers the registered rooms the hook matches, from cursors.
func (h *hook) start(cursors map[string]cursor) {
	r := newRun(h, h.claim.held, cursors)
	h.mu.Lock()
	h.run = r
	h.mu.Unlock()
	// Following thousands of rooms takes a while on Redis: not on the
	// loop, which must keep renewing the claim meanwhile.
	rooms := h.w.registeredRooms(h.spec.Pattern)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for _, room := range rooms {
			if r.ctx.Err() != nil {
				return
			}
			r.add(room)
		}
	}()
}

// match reports whether the hook delivers room.
func (h *hook) match(room string) bool { return auth.MatchRoom(h.spec.Pattern, room) }

// addRoom starts delivering a room registered while the claim is held.
func (h *hook) addRoom(room string) {
	if h.run != nil && h.match(room) {
		h.run.add(room)
	}
}

// release stops the deliveries and forgets the claim.
func (h *hook) release() {
	h.mu.Lock()
	r := h.run
	h.run, h.lost, h.claim.held = nil, false, 0
	h.mu.Unlock()
	if r != nil {
		r.stop()
	}
}

// run delivers a hook's rooms while this node holds its claim (at
// claimRev): a queue of rooms with something to deliver and Workers
// goroutines taking them in turn, one delivery (one POST) at a time, so a
// room never has two deliveries in flight and a slow or failing room holds
// one worker for at most one POST's timeout.
type run struct {
	h        *hook
	claimRev uint64
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	lost     atomic.Bool

	mu    sync.Mutex
	cond  *sync.Cond
	rooms map[string]*roomState
	queue []*roomState
	init  map[string]cursor
}

// roomState is one room of a run; its fields are under run.mu.
type roomState struct {
	name       string
	cur        cursor // acknowledged by the receiver
	stored     cursor // written to the store
	headEpoch  string // from the room's Follow
	head       uint64
	epochCheck bool // read the room's head (epoch, revision) at the next step

	queued, running, dirty bool
	retry                  *time.Timer
	attempts               int
	lastErr                string
	pendingSince           time.Time // commit time of the oldest revision not acknowledged, at most
	stop                   func()
}

func newRun(h *hook, claimRev uint64, cursors map[string]cursor) *run {
	ctx, cancel := context.WithCancel(context.Background())
	r := &run{h: h, claimRev: claimRev, ctx: ctx, cancel: cancel, rooms: make(map[string]*roomState), init: cursors}
	r.cond = sync.NewCond(&r.mu)
	for range h.w.cfg.Workers {
		r.wg.Add(1)
		go r.worker()
	}
	return r
}

// add follows room and queues it: its first step finds out what is
// pending. The Webhooks loop and the run's first adder call it; stop waits
// for the adder and runs on the loop.
func (r *run) add(room string) {
	r.mu.Lock()
	if _, ok := r.rooms[room]; ok || r.ctx.Err() != nil {
		r.mu.Unlock()
		return
	}
	c := r.init[room]
	rs := &roomState{name: room, cur: c, stored: c, epochCheck: true}
	r.rooms[room] = rs
	r.mu.Unlock()
	// Follow first, then the first step reads the history: nothing
	// committed in between is missed.
	stop, err := r.h.w.st.Follow(room, func(b store.Batch) { r.onBatch(rs, b) })
	r.mu.Lock()
	if err != nil {
		rs.lastErr = "follow: " + err.Error()
	}
	rs.stop = stop
	r.enqueueLocked(rs)
	r.mu.Unlock()
}

// onBatch notes a committed revision of a room (a Follow callback: it
// must not block).
func (r *run) onBatch(rs *roomState, b store.Batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b.Rev == 0 || (rs.headEpoch != "" && b.Epoch != rs.headEpoch) {
		rs.epochCheck = true // the room's state was replaced
		rs.head = 0
	}
	rs.headEpoch = b.Epoch
	if b.Rev > rs.head {
		if rs.cur.Rev >= rs.head && rs.cur.Epoch == b.Epoch {
			rs.pendingSince = b.Time
		}
		rs.head = b.Rev
	}
	rs.dirty = true
	r.enqueueLocked(rs)
}

func (r *run) enqueueLocked(rs *roomState) {
	if rs.queued || rs.running || rs.retry != nil || r.ctx.Err() != nil {
		return // a running step sees dirty; a retry queues it when due
	}
	rs.queued = true
	r.queue = append(r.queue, rs)
	r.cond.Signal()
}

func (r *run) worker() {
	defer r.wg.Done()
	for {
		r.mu.Lock()
		for len(r.queue) == 0 && r.ctx.Err() == nil {
			r.cond.Wait()
		}
		if r.ctx.Err() != nil {
			r.mu.Unlock()
			return
		}
		rs := r.queue[0]
		r.queue[0] = nil
		r.queue = r.queue[1:]
		rs.queued, rs.running, rs.dirty = false, true, false
		r.mu.Unlock()

		more, err := r.step(rs)

		r.mu.Lock()
		rs.running = false
		switch {
		case r.ctx.Err() != nil:
		case err != nil:
			rs.lastErr = err.Error()
			rs.attempts++
			r.h.stats.retries.Add(1)
			rs.retry = time.AfterFunc(r.backoff(rs.attempts), func() { r.retryDue(rs) })
		default:
			rs.attempts, rs.lastErr = 0, ""
			if more || rs.dirty {
				r.enqueueLocked(rs) // at the back: the other rooms' turn first
			}
		}
		r.mu.Unlock()
	}
}

func (r *run) retryDue(rs *roomState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rs.retry = nil
	r.enqueueLocked(rs)
}

// backoff is exponential with full jitter: uniform in [0, min(max, min·2^n)).
func (r *run) backoff(attempts int) time.Duration {
	cfg := r.h.w.cfg
	d := cfg.MaxBackoff
	if attempts < 30 {
		d = min(cfg.MaxBackoff, cfg.MinBackoff<<(attempts-1))
	}
	return time.Duration(rand.Int64N(int64(d)) + 1)
}

// stop ends the run: the workers finish their POST, the follows and the
// retries stop. What is not acknowledged stays behind the cursors.
func (r *run) stop() {
	r.cancel()
	r.mu.Lock()
	r.cond.Broadcast()
	r.mu.Unlock()
	r.wg.Wait()
	// A Follow callback runs under the store's lock and takes r.mu: the
	// follows stop after r.mu is released.
	var stops []func()
	r.mu.Lock()
	for _, rs := range r.rooms {
		if rs.retry != nil {
			rs.retry.Stop()
		}
		if rs.stop != nil {
			stops = append(stops, rs.stop)
		}
	}
	r.mu.Unlock()
	for _, stop := range stops {
		stop()
	}
}

// step delivers one batch of the room's pending revisions, or a snapshot,
// and moves its cursor. more reports that there is more to deliver.
func (r *run) step(rs *roomState) (more bool, err error) {
	r.mu.Lock()
	cur, stored := rs.cur, rs.stored
	r.mu.Unlock()
	if cur != stored {
		// Acknowledged, but the cursor write failed: write it first.
		return true, r.store(rs, cur)
	}
	d, err := r.next(rs, cur)
	if err != nil || d == nil {
		return false, err
	}
	if len(d.Revisions) > 0 {
		r.mu.Lock()
		if rs.pendingSince.IsZero() {
			rs.pendingSince = time.UnixMilli(d.Revisions[0].TimeMS)
		}
		rs.head = max(rs.head, d.ToRev)
		r.mu.Unlock()
	}
	if err := r.post(d); err != nil {
		r.h.stats.failures.Add(1)
		return false, err
	}
	now := time.Now()
	next := cursor{Epoch: d.Epoch, Rev: d.ToRev}
	r.mu.Lock()
	rs.cur = next
	if rs.headEpoch == "" || (d.Type == TypeSnapshot && rs.headEpoch != d.Epoch) {
		rs.headEpoch, rs.head = d.Epoch, d.ToRev
	}
	rs.head = max(rs.head, d.ToRev)
	if n := len(d.Revisions); n > 0 {
		// The next pending revision was committed after this one.
		rs.pendingSince = time.UnixMilli(d.Revisions[n-1].TimeMS)
	}
	r.mu.Unlock()
	st := &r.h.stats
	st.deliveries.Add(1)
	st.revisions.Add(uint64(len(d.Revisions)))
	if d.Type == TypeSnapshot {
		st.snapshots[reasonIndex(d.Reason)].Add(1)
	}
	for _, rev := range d.Revisions {
		st.lag.Observe(now.Sub(time.UnixMilli(rev.TimeMS)).Seconds())
	}
	return true, r.store(rs, next) // the next step finds whether more is due
}

// store writes the room's cursor under the claim. A conflict on the claim
// ends the run: another node delivers the hook now.
//
// A stop does not cancel it: what the receiver acknowledged is recorded,
// so the next holder does not send it again.
func (r *run) store(rs *roomState, c cursor) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), r.h.w.cfg.Timeout)
	defer cancel()
	err := writeCursor(ctx, r.h.w.st, r.h.id, rs.name, r.claimRev, c)
	var conflict *store.ConflictError
	if errors.As(err, &conflict) && conflict.Key == claimKey(r.h.id) {
		r.lost.Store(true)
		r.cancel()
		return err
	}
	if err == nil {
		r.mu.Lock()
		rs.stored = c
		r.mu.Unlock()
	}
	return err
}

// next reads what follows cur: the next revisions (at most MaxEvents
// events and MaxBytes, whole revisions, at least one), a snapshot when
// they cannot be replayed, or nil when the room is delivered. A room's
// first step, and its first after an epoch notice, reads its head first:
// for the lag, and to find an epoch change that its history cannot show
// (a new epoch not yet past the cursor).
func (r *run) next(rs *roomState, cur cursor) (*Delivery, error) {
	cfg, st := r.h.w.cfg, r.h.w.st
	r.mu.Lock()
	check := rs.epochCheck
	rs.epochCheck = false
	r.mu.Unlock()
	if check {
		epoch, rev, err := head(r.ctx, st, rs.name)
		if err != nil {
			r.mu.Lock()
			rs.epochCheck = true
			r.mu.Unlock()
			return nil, err
		}
		r.mu.Lock()
		if rs.headEpoch == "" || rs.headEpoch == epoch {
			rs.headEpoch, rs.head = epoch, max(rs.head, rev)
		}
		r.mu.Unlock()
		if cur.Epoch != "" && epoch != "" && epoch != cur.Epoch {
			return r.snapshot(rs, ReasonEpoch)
		}
	}
	batches, err := st.History(r.ctx, rs.name, cur.Rev+1, cfg.MaxEvents)
	if errors.Is(err, store.ErrCompacted) {
		if cur.Epoch == "" {
			return r.snapshot(rs, ReasonInitial)
		}
		return r.snapshot(rs, ReasonCompacted)
	}
	if err != nil || len(batches) == 0 {
		return nil, err
	}
	if cur.Epoch != "" && batches[0].Epoch != cur.Epoch {
		return r.snapshot(rs, ReasonEpoch)
	}
	size, n := int64(0), 0
	for ; n < len(batches); n++ {
		for i := range batches[n].Events {
			size += store.EventBytes(&batches[n].Events[i])
		}
		if n > 0 && size > int64(cfg.MaxBytes) {
			break
		}
	}
	return revisionsDelivery(r.h.id, rs.name, batches[:n]), nil
}

func (r *run) snapshot(rs *roomState, reason string) (*Delivery, error) {
	snap, err := r.h.w.st.Snapshot(r.ctx, rs.name, "")
	if err != nil {
		return nil, err
	}
	return snapshotDelivery(r.h.id, rs.name, reason, snap), nil
}

// head returns the room's current epoch and revision, cheaply: the
// store's head where it has one (Redis), else an empty snapshot (no key
// holds a NUL byte).
func head(ctx context.Context, st store.Store, room string) (string, uint64, error) {
	if h, ok := st.(store.Heads); ok {
		return h.Head(ctx, room)
	}
	snap, err := st.Snapshot(ctx, room, "\x00")
	return snap.Epoch, snap.Rev, err
}

// post sends d, signed, and waits for a 2xx within Timeout.
func (r *run) post(d *Delivery) error {
	body, err := json.Marshal(d)
	if err != nil {
		return err
	}
	ctx, span := r.startDelivery(d)
	status, _, err := r.h.poster.post(ctx, r.h.spec.URL, body,
		http.Header{DeliveryHeader: {d.Key()}, HookHeader: {r.h.id}})
	if err == nil && status/100 != 2 {
		err = fmt.Errorf("receiver answered %d %s", status, http.StatusText(status))
	}
	endDelivery(span, err)
	return err
}
