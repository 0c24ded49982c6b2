package etcd

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/store"
)

type watchServer struct {
	pb.UnimplementedWatchServer
	*Server
}

// watchStream is one Watch RPC: its requests are handled in order on the
// RPC's goroutine; each watch runs on its own goroutine, draining its
// room watcher, and all of them send through send (a gRPC stream takes
// one sender at a time).
type watchStream struct {
	s       *Server
	c       caller
	ctx     context.Context
	stream  pb.Watch_WatchServer
	sendMu  sync.Mutex
	holdsMu sync.Mutex
	holds   map[*budgetHold]struct{} // sent responses still holding budget
	watches map[int64]*watch         // owned by the RPC's goroutine
	conn    *connState               // what all the streams of its connection share
	next    int64                    // the next automatic watch id (etcd's start at 0)
	wg      sync.WaitGroup
}

// watch is one etcd watch on a room watcher.
//
// etcd never skips a revision, and its clients cannot take statecast's
// catch-ups (a coalesced message or a snapshot for a watcher that fell
// behind), so its room watcher is exact: one that falls behind replays
// what it missed from the room's history, paced by this stream's sends.
// Only when the history no longer holds that revision does the watch end
// as etcd's does when its start was compacted: canceled with
// compact_revision, after which the client lists the keys again.
type watch struct {
	id              int64
	sp              span
	epoch           string
	rw              *rooms.Watcher
	prevKV, notify  bool
	noPut, noDelete bool
	last            uint64 // every event up to it has been sent
	synced          bool   // the replay from its start reached the head once
	quiet           bool   // nothing sent since the last progress tick
	// wake is signalled when the watch may have something to do: its
	// room watcher's messages (Notify), a progress request (asked), its
	// progress tick (due), its end (ctx): one channel to wait on.
	wake       chan struct{}
	asked, due atomic.Bool
	ctx        context.Context
	cancel     context.CancelFunc
	done       chan struct{}
}

func (s watchServer) Watch(stream pb.Watch_WatchServer) error {
	c, err := s.caller(stream.Context())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(stream.Context())
	ws := &watchStream{s: s.Server, c: c, ctx: ctx, stream: stream, watches: make(map[int64]*watch), holds: make(map[*budgetHold]struct{}), conn: s.connOf(ctx)}
	defer func() { cancel(); ws.wg.Wait(); ws.releaseHolds(); ws.conn.watches.Add(-int64(len(ws.watches))) }()
	return serveStream(s.Server, ctx, c, stream.Recv, func(r *pb.WatchRequest) error {
		switch {
		case r.GetCreateRequest() != nil:
			ws.create(r.GetCreateRequest())
		case r.GetCancelRequest() != nil:
			ws.cancel(r.GetCancelRequest().WatchId)
		case r.GetProgressRequest() != nil:
			for _, w := range ws.watches {
				w.asked.Store(true)
				w.signal()
			}
		}
		return nil
	})
}

func (ws *watchStream) send(r *pb.WatchResponse) bool {
	ws.sendMu.Lock()
	defer ws.sendMu.Unlock()
	return ws.stream.Send(r) == nil
}

// sendEncoded sends a response already encoded (watchResponse), which
// holds held bytes of the connection's watch budget until it is written.
func (ws *watchStream) sendEncoded(r encoded, held int64) bool {
	var m any = r
	if mem.IsBelowBufferPoolingThreshold(cap(r)) {
		// gRPC does not track a buffer this small (the codec would free
		// it at once): the budget goes back once it is queued, and the
		// stream's write quota bounds how many wait.
		defer ws.conn.queued.Release(held)
	} else if held > 0 {
		h := &budgetHold{ws: ws, n: held}
		ws.holdsMu.Lock()
		ws.holds[h] = struct{}{}
		ws.holdsMu.Unlock()
		m = heldEncoded{r, h.release}
	}
	ws.sendMu.Lock()
	defer ws.sendMu.Unlock()
	return ws.stream.SendMsg(m) == nil
}

// budgetHold is the budget one sent response holds. gRPC frees the
// response's buffer once written, but drops, without freeing it, a frame
// whose stream was canceled after SendMsg queued it: so the stream also
// releases what is still held when it ends, and each hold is released
// once, whichever comes first.
type budgetHold struct {
	once sync.Once
	ws   *watchStream
	n    int64
}

func (h *budgetHold) release() {
	h.once.Do(func() {
		h.ws.conn.queued.Release(h.n)
		h.ws.holdsMu.Lock()
		delete(h.ws.holds, h)
		h.ws.holdsMu.Unlock()
	})
}

// releaseHolds releases what the stream's responses still hold (it ended).
func (ws *watchStream) releaseHolds() {
	ws.holdsMu.Lock()
	holds := make([]*budgetHold, 0, len(ws.holds))
	for h := range ws.holds {
		holds = append(holds, h)
	}
	ws.holdsMu.Unlock()
	for _, h := range holds {
		h.release()
	}
}

// create starts a watch, answering created (or created and canceled, as
// etcd answers a watch it cannot start) before any of its events.
func (ws *watchStream) create(cr *pb.WatchCreateRequest) {
	s := ws.s
	refuse := func(err error) {
		ws.send(&pb.WatchResponse{Header: s.header(0), WatchId: -1, Created: true, Canceled: true, CancelReason: status.Convert(err).Message()})
	}
	for id, w := range ws.watches { // those that ended by themselves (compacted)
		select {
		case <-w.done:
			delete(ws.watches, id)
			ws.conn.watches.Add(-1)
		default:
		}
	}
	if len(ws.watches) >= s.maxW || ws.conn.watches.Load() >= int64(s.maxW) {
		refuse(status.Errorf(codes.ResourceExhausted, "statecast: at most %d watches per connection", s.maxW))
		return
	}
	id := cr.WatchId
	if id == 0 {
		for ws.watches[ws.next] != nil {
			ws.next++
		}
		id = ws.next
		ws.next++
	} else if ws.watches[id] != nil {
		refuse(errors.New("statecast: a watch with this id exists on the stream"))
		return
	}
	sp, err := s.parseSpan(cr.Key, cr.RangeEnd)
	if err == nil {
		err = sp.canRead(ws.c)
	}
	if err != nil {
		refuse(err)
		return
	}
	// The head: a watch from now starts after it (a linearizable read,
	// as etcd's), and it is the created answer's revision.
	head, err := s.engine.Get(ws.ctx, sp.room, "", rooms.ReadOptions{Serializable: cr.StartRevision > 0})
	if err != nil {
		refuse(grpcError(err))
		return
	}
	from := head.Rev + 1
	if cr.StartRevision > 0 {
		from = max(roomRev(cr.StartRevision), 1) // etcd's revision 1 is the empty room: no events
	}
	w := &watch{id: id, sp: sp, epoch: head.Epoch, prevKV: cr.PrevKv, notify: cr.ProgressNotify, quiet: true,
		last: from - 1, wake: make(chan struct{}, 1), done: make(chan struct{})}
	for _, f := range cr.Filters {
		w.noPut = w.noPut || f == pb.WatchCreateRequest_NOPUT
		w.noDelete = w.noDelete || f == pb.WatchCreateRequest_NODELETE
	}
	w.ctx, w.cancel = context.WithCancel(ws.ctx)
	if !ws.send(&pb.WatchResponse{Header: s.header(head.Rev), WatchId: id, Created: true}) {
		w.cancel()
		return
	}
	ws.watches[id] = w
	ws.conn.watches.Add(1)
	ws.wg.Add(1)
	go func() {
		defer ws.wg.Done()
		defer close(w.done)
		defer w.cancel()
		if ws.start(w) {
			ws.run(w)
		}
		if w.rw != nil {
			w.rw.Close()
		}
	}()
}

// start opens the room watcher from w.last + 1; false when the watch
// ended (canceled, compacted).
func (ws *watchStream) start(w *watch) bool {
	rw, err := ws.s.engine.Watch(w.ctx, w.sp.room, rooms.WatchOptions{Prefixes: []string{w.sp.prefix()},
		From: &rooms.Position{Epoch: w.epoch, Rev: w.last + 1}, FailIfCompacted: true, Exact: true, Notify: w.signal})
	var ce *store.CompactedError
	switch {
	case errors.As(err, &ce):
		ws.send(&pb.WatchResponse{Header: ws.s.header(w.last), WatchId: w.id, Canceled: true, CompactRevision: etcdRev(ce.Oldest)})
		return false
	case errors.Is(err, rooms.ErrEpochMismatch):
		ws.end(w, "statecast: the room's history was lost and started again (a new epoch): list the keys again")
		return false
	case err != nil:
		if w.ctx.Err() == nil {
			ws.end(w, status.Convert(grpcError(err)).Message())
		}
		return false
	}
	w.rw, w.synced = rw, false
	return true
}

func (ws *watchStream) end(w *watch, reason string) {
	ws.send(&pb.WatchResponse{Header: ws.s.header(w.last), WatchId: w.id, Canceled: true, CancelReason: reason})
}

// run sends w's events until it is canceled or its stream ends. A watch
// asking for progress that sent nothing for a whole interval is told its
// revision, as etcd tells its watches every 10 minutes.
func (ws *watchStream) run(w *watch) {
	var buf []rooms.Message
	defer context.AfterFunc(w.ctx, w.signal)()
	var tick *time.Timer
	if w.notify {
		tick = time.AfterFunc(ws.s.progress, w.tick)
		defer tick.Stop()
	}
	for {
		msgs, err := w.rw.Drain(buf[:0])
		if err != nil {
			if w.ctx.Err() != nil {
				return
			}
			// The room was reset on this node (a gap in the store's
			// tail), or the history no longer holds what a watcher that
			// fell behind missed: continue from the history, or end
			// with compact_revision (start).
			w.rw.Close()
			if !ws.start(w) {
				w.rw = nil
				return
			}
			continue
		}
		ok, restarted := ws.deliver(w, msgs)
		if !ok {
			return
		}
		buf = msgs[:0]
		if len(msgs) > 0 || restarted {
			continue
		}
		switch {
		case w.ctx.Err() != nil:
			return
		case w.asked.Swap(false):
			if !ws.progressNow(w) {
				return
			}
		case w.due.Swap(false):
			if w.quiet && !ws.progressNow(w) {
				return
			}
			w.quiet = true
			tick.Reset(ws.s.progress)
		default:
			<-w.wake
		}
	}
}

// signal wakes w's run; it never blocks (the room calls it under its lock).
func (w *watch) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// tick marks w's progress interval as gone by.
func (w *watch) tick() {
	if w.ctx.Err() == nil {
		w.due.Store(true)
		w.signal()
	}
}

// maxBatchBytes bounds the keys and values of one response: consecutive
// revisions go out together, as etcd batches them, up to it. Each watch
// waiting for its stream's send holds one such batch, so it bounds what a
// client that stops reading holds (256 watches × 64 KiB); 1 MiB batches
// were no faster (BenchmarkWatchStream: 0.83–1.0 M events/s either way).
const maxBatchBytes = 64 << 10

// deliver sends msgs; ok is false when the watch ended, restarted when a
// snapshot made it start a new room watcher (the rest of msgs is dropped).
//
// The events a batch holds count in the connection's MaxWatchBytes from
// before they are converted until gRPC has written them (budgetHold). A
// watch that finds no room waits, reading nothing from its room watcher, as etcd moves a
// watcher its client does not keep up with to unsynced: the room's
// queue of it fills, and it catches up from the history when there is
// room again (see watch). A client that never reads holds that budget,
// not a batch per watch.
func (ws *watchStream) deliver(w *watch, msgs []rooms.Message) (ok, restarted bool) {
	var batch [][]byte // marshaled events
	var held int64     // of the connection's budget, by batch
	size := 0
	flush := func() bool {
		if len(batch) == 0 {
			return true
		}
		resp := watchResponse(ws.s.header(w.last), w.id, batch)
		batch, size = nil, 0
		sent := ws.sendEncoded(resp, held) // released once written
		held, w.quiet = 0, false
		return sent
	}
	defer func() { ws.conn.queued.Release(held) }()
	for _, m := range msgs {
		if m.Kind == rooms.KindEvents {
			n := min(w.eventBytes(m.Change), ws.s.maxWatchQ)
			if !ws.conn.queued.TryAcquire(n) {
				// Send what this watch holds before waiting: the others
				// may be waiting for it.
				if !flush() || ws.conn.queued.Acquire(w.ctx, n) != nil {
					return false, false
				}
			}
			held += n
			for _, ev := range w.events(m.Change, &ws.conn.events) {
				batch = append(batch, ev)
				size += len(ev)
			}
			w.last = m.Rev
			if size >= maxBatchBytes && !flush() {
				return false, false
			}
			continue
		}
		if !flush() {
			return false, false
		}
		switch m.Kind {
		case rooms.KindSynced:
			// Caught up, with revisions that did not concern it gone by
			// meanwhile: a watch asking for progress is told it stands at
			// the synced revision, as the room's marks tell it of those
			// that go by once it is live.
			before := w.last
			w.last, w.synced = max(w.last, m.Rev), true
			if w.notify && w.last > before && !ws.sendProgress(w, w.last) {
				return false, false
			}
		case rooms.KindProgress:
			w.last = max(w.last, m.Rev)
			if w.notify && !ws.sendProgress(w, w.last) {
				return false, false
			}
		default:
			// A catch-up, which an exact watcher started with
			// FailIfCompacted is never sent: start again from the history
			// rather than pass it on.
			w.rw.Close()
			if !ws.start(w) {
				w.rw = nil
				return false, false
			}
			return true, true
		}
	}
	return flush(), false
}

// eventBytes is what the events of ch that w selects take in a response,
// counted before they are converted.
func (w *watch) eventBytes(ch *rooms.Change) int64 {
	var n int64
	for _, ev := range ch.Events {
		if !w.selects(ev) {
			continue
		}
		n += kvBytes(w.sp.room, ev.KV, false)
		if w.prevKV && ev.Prev != nil {
			n += kvBytes(w.sp.room, *ev.Prev, false)
		}
	}
	return n
}

// progressNow answers a progress request: every event up to the head
// read now has been sent once the watcher has nothing more to drain, if
// it is synced: a watcher that fell behind replays (WatchOptions.Exact)
// until it is live with an empty queue, so one drain is not enough. One
// still replaying from its start reports what it has sent.
func (ws *watchStream) progressNow(w *watch) bool {
	head, err := ws.s.engine.Get(w.ctx, w.sp.room, "", rooms.ReadOptions{Serializable: true})
	if err != nil {
		return w.ctx.Err() == nil
	}
	for {
		msgs, err := w.rw.Drain(nil)
		if err != nil {
			return true // run ends or restarts the watcher
		}
		if len(msgs) == 0 {
			break
		}
		ok, restarted := ws.deliver(w, msgs)
		if !ok || restarted {
			return ok
		}
	}
	rev := w.last
	if w.synced && head.Epoch == w.epoch {
		rev = max(rev, head.Rev)
	}
	return rev == 0 || ws.sendProgress(w, rev)
}

// sendProgress tells w it stands at rev: a response with no events.
func (ws *watchStream) sendProgress(w *watch, rev uint64) bool {
	w.quiet = false
	return ws.send(&pb.WatchResponse{Header: ws.s.header(rev), WatchId: w.id})
}

// events returns the events of ch that w selects, each marshaled.
// selects says whether w sends ev: its key in the span, and not of a
// type its filters drop. What it does not send it does not count either:
// a filtered watch that counted the puts it drops held budget for an
// empty batch, and waited for that budget itself.
func (w *watch) selects(ev store.Event) bool {
	return w.sp.has(ev.KV.Key) && !(ev.Type == store.OpPut && w.noPut) && !(ev.Type != store.OpPut && w.noDelete)
}

func (w *watch) events(ch *rooms.Change, cache *eventCache) [][]byte {
	var out [][]byte
	var all [][]byte
	for i, ev := range ch.Events {
		if !w.selects(ev) {
			continue
		}
		if all == nil {
			if all = cache.convert(ch, w.sp.pre, w.prevKV); all == nil {
				all = make([][]byte, len(ch.Events)) // too large to keep: this watch's own
			}
		}
		if all[i] == nil {
			all[i] = etcdEvent(ev, w.sp.pre, w.prevKV)
		}
		out = append(out, all[i])
	}
	return out
}

// eventCache holds the etcd form of the last few changes a connection's
// watches converted, marshaled, so that the watches of one key (a
// client's recipes and observers often watch it several times over)
// convert and marshal each event once; responses share the bytes.
type eventCache struct {
	mu   sync.Mutex
	ents [4]cachedEvents
	next int
}

type cachedEvents struct {
	ch     *rooms.Change
	pre    string
	prevKV bool
	evs    [][]byte
}

// cachedBytes bounds the keys and values of a change whose events a
// connection keeps marshaled: the copy stays until four newer changes
// replace it, outside any budget, and for a large change marshaling is
// mostly copying anyway, which each watch then does for itself.
const cachedBytes = 16 << 10

// convert returns every event of ch in etcd's form, marshaled, keys
// prefixed with pre, with the previous values when prevKV; nil for a
// change larger than cachedBytes.
func (c *eventCache) convert(ch *rooms.Change, pre string, prevKV bool) [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.ents {
		if e.ch == ch && e.pre == pre && e.prevKV == prevKV {
			return e.evs
		}
	}
	n := 0
	for _, ev := range ch.Events {
		n += len(ev.KV.Key) + len(ev.KV.Value)
		if prevKV && ev.Prev != nil {
			n += len(ev.Prev.Value)
		}
	}
	if n > cachedBytes {
		return nil
	}
	evs := make([][]byte, len(ch.Events))
	for i, ev := range ch.Events {
		evs[i] = etcdEvent(ev, pre, prevKV)
	}
	c.ents[c.next] = cachedEvents{ch: ch, pre: pre, prevKV: prevKV, evs: evs}
	c.next = (c.next + 1) % len(c.ents)
	return evs
}

// etcdEvent is ev in etcd's form, marshaled.
func etcdEvent(ev store.Event, pre string, prevKV bool) []byte {
	var e *mvccpb.Event
	if ev.Type == store.OpPut {
		e = &mvccpb.Event{Type: mvccpb.Event_PUT, Kv: toKV(pre, ev.KV, false)}
	} else {
		// etcd's tombstone: the key and the delete's revision.
		e = &mvccpb.Event{Type: mvccpb.Event_DELETE, Kv: &mvccpb.KeyValue{Key: []byte(pre + etcdKey(ev.KV.Key)), ModRevision: keyRev(ev.KV.ModRev)}}
	}
	if prevKV && ev.Prev != nil {
		e.PrevKv = toKV(pre, *ev.Prev, false)
	}
	b, err := proto.Marshal(e)
	if err != nil { // a KeyValue of bytes and numbers always marshals
		panic("etcd: cannot marshal an event: " + err.Error())
	}
	return b
}

// cancel ends watch id at the client's request; nothing of it is sent
// after the canceled answer.
func (ws *watchStream) cancel(id int64) {
	w := ws.watches[id]
	if w == nil {
		return
	}
	delete(ws.watches, id)
	ws.conn.watches.Add(-1)
	w.cancel()
	<-w.done
	ws.send(&pb.WatchResponse{Header: ws.s.header(w.last), WatchId: id, Canceled: true})
}
