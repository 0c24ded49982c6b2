package hooks

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// maxTraced bounds the writes whose span a node remembers for the
// webhook deliveries that carry them (Webhooks.Traced).
const maxTraced = 4096

// maxLinks bounds the spans a delivery's span links to besides its parent.
const maxLinks = 32

// traced remembers, by room and revision, the span of the request that
// committed a revision on this node: the delivery of that revision, on
// this node, is a child of it. Oldest first out past maxTraced.
type traced struct {
	mu    sync.Mutex
	spans map[roomRev]trace.SpanContext
	order []roomRev // a ring of the keys of spans
	next  int
	// applying counts, by room, the traced writes this node is committing
	// whose revision is not added yet; settled is closed (and replaced)
	// when one is: a delivery can follow the store faster than the write's
	// own return, and then waits for it (awaitWrites).
	applying map[string]int
	settled  chan struct{}
}

// maxTraceWait bounds how long a delivery waits for the writes to its room
// in progress here to note their spans.
const maxTraceWait = 100 * time.Millisecond

// begin notes a traced write to room in progress; end, its end.
func (t *traced) begin(room string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.applying == nil {
		t.applying, t.settled = make(map[string]int), make(chan struct{})
	}
	t.applying[room]++
}

func (t *traced) end(room string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.applying[room]--; t.applying[room] <= 0 {
		delete(t.applying, room)
	}
	close(t.settled)
	t.settled = make(chan struct{})
}

// awaitWrites waits, up to maxTraceWait, until no traced write to room is
// in progress on this node.
func (t *traced) awaitWrites(room string) {
	deadline := time.NewTimer(maxTraceWait)
	defer deadline.Stop()
	for {
		t.mu.Lock()
		n, settled := t.applying[room], t.settled
		t.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-settled:
		case <-deadline.C:
			return
		}
	}
}

type roomRev struct {
	room string
	rev  uint64
}

func (t *traced) add(room string, rev uint64, sc trace.SpanContext) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.spans == nil {
		t.spans, t.order = make(map[roomRev]trace.SpanContext), make([]roomRev, 0, maxTraced)
	}
	k := roomRev{room, rev}
	if len(t.order) < maxTraced {
		t.order = append(t.order, k)
	} else {
		delete(t.spans, t.order[t.next])
		t.order[t.next] = k
		t.next = (t.next + 1) % maxTraced
	}
	t.spans[k] = sc
}

// of returns the spans of room's revisions from..to that this node
// remembers, in revision order.
func (t *traced) of(room string, from, to uint64) []trace.SpanContext {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []trace.SpanContext
	for rev := from; rev <= to && len(t.spans) > 0 && len(out) <= maxLinks; rev++ {
		if sc, ok := t.spans[roomRev{room, rev}]; ok {
			out = append(out, sc)
		}
	}
	return out
}

// Tracing notes that the request of ctx's span is committing a write to
// room; the function it returns, called once the write's outcome is
// known, notes the revision it committed (ok) so that its webhook delivery
// from this node continues its trace. A delivery of room's revisions that
// finds no span waits for the writes in progress here to note theirs.
// Called only with tracing on (Config.TracerProvider).
func (w *Webhooks) Tracing(ctx context.Context, room string) (committed func(rev uint64, ok bool)) {
	sc := trace.SpanContextFromContext(ctx)
	if w.tracer == nil || !w.matches(room) || !sc.IsValid() {
		return func(uint64, bool) {}
	}
	w.traced.begin(room)
	return func(rev uint64, ok bool) {
		if ok {
			w.traced.add(room, rev, sc)
		}
		w.traced.end(room)
	}
}

// startDelivery starts the span of d's POST: a child of the span of the
// first of its revisions committed through this node, linked to the
// others; nil with tracing off.
func (r *run) startDelivery(d *Delivery) (context.Context, trace.Span) {
	w := r.h.w
	if w.tracer == nil {
		return r.ctx, nil
	}
	ctx := r.ctx
	var links []trace.Link
	if d.Type == TypeRevisions {
		scs := w.traced.of(d.Room, d.FromRev, d.ToRev)
		if len(scs) == 0 {
			w.traced.awaitWrites(d.Room)
			scs = w.traced.of(d.Room, d.FromRev, d.ToRev)
		}
		if len(scs) > 0 {
			ctx = trace.ContextWithSpanContext(ctx, scs[0])
		}
		for _, sc := range scs[min(1, len(scs)):] {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	return w.tracer.Start(ctx, "webhook.deliver", trace.WithSpanKind(trace.SpanKindClient), trace.WithLinks(links...),
		trace.WithAttributes(attribute.String("statecast.hook", r.h.id), attribute.String("statecast.room", d.Room),
			attribute.Int64("statecast.from_rev", int64(d.FromRev)), attribute.Int64("statecast.to_rev", int64(d.ToRev))))
}

// endDelivery ends span (nil: tracing off), failed when err is not nil.
func endDelivery(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "delivery failed")
	}
	span.End()
}
