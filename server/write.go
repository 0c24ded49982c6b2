package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// The one write path of every surface. A put, del or txn arrives as a
// wire.Request: decoded from a WebSocket frame (handle.go), or read from
// an HTTP request (http.go). admitWrite lets it in, toWrite turns it into
// a store.Write and apply checks and commits that. A lease grant or
// revoke is let in as a write, then goes its own way (leases.go).

// admitWrite refuses a write while the server shuts down, or when its
// writer (claims' subject, else addr) is over the write rate; retry then
// says when the next write would be allowed.
func (s *Server) admitWrite(claims *auth.Claims, addr string) (time.Duration, error) {
	if s.draining.Load() {
		return 0, newError(wire.CodeUnavailable, "server is shutting down; nothing was written")
	}
	ok, retry := s.writeLimits.allow(writerKey(claims, addr))
	if !ok {
		return retry, s.rateLimited()
	}
	return 0, nil
}

// chargeWrite charges writer the rest of w's cost (admitWrite took one
// unit) once the store has planned it: committed, or refused for a
// condition or the room's quota. An invalid or unauthorized write, which
// the store did no work for, costs only its unit.
func (s *Server) chargeWrite(writer string, w store.Write, err error) {
	if err == nil || errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrQuotaExceeded) {
		s.writeLimits.charge(writer, writeCost(w)-1)
	}
}

// write translates r and applies it: the path every put, del and txn
// takes. addr is the client's address, sess the WebSocket session that
// sent r, nil over HTTP. Its error is an *Error.
func (s *Server) write(ctx context.Context, r *wire.Request, claims *auth.Claims, addr string, sess *session) (store.Result, error) {
	lease := ""
	if sess != nil {
		lease = sess.lease
	}
	w, err := toWrite(r, lease)
	if err != nil {
		return store.Result{}, err
	}
	if w, err = scopeWid(w, widScope(claims)); err != nil {
		return store.Result{}, err
	}
	writer := writerKey(claims, addr)
	res, err := s.apply(ctx, r.Room, w, claims, writer, sess)
	s.chargeWrite(writer, w, err)
	if err != nil {
		return res, errorOf(err, true)
	}
	return res, nil
}

// toWrite turns a put, del or txn request into a store write: its
// conditions, its operations with their leases resolved (leaseOf), and
// its write id.
func toWrite(r *wire.Request, session string) (store.Write, error) {
	w := store.Write{Wid: r.Wid, Since: r.Since}
	switch r.T {
	case wire.TPut, wire.TDel:
		typ := "put"
		if r.T == wire.TDel {
			typ = "delete"
		}
		op, err := toOp(wire.TxnOp{Type: typ, Key: r.Key, Value: r.Value, Lease: r.Lease}, session)
		if err != nil {
			return store.Write{}, err
		}
		w.Ops = []store.Op{op}
		if r.IfRev != nil {
			w.Conds = []store.Cond{{Key: r.Key, ModRev: *r.IfRev}}
		}
		return w, nil
	case wire.TTxn:
		for _, cond := range r.If {
			w.Conds = append(w.Conds, store.Cond{Key: cond.Key, ModRev: cond.ModRev})
		}
		for _, o := range r.Ops {
			op, err := toOp(o, session)
			if err != nil {
				return store.Write{}, err
			}
			w.Ops = append(w.Ops, op)
		}
		return w, nil
	}
	return store.Write{}, newError(wire.CodeBadRequest, fmt.Sprintf("%q is not a write", r.T))
}

// toOp turns one operation (a put or del request's, or a txn's) into a
// store operation.
func toOp(o wire.TxnOp, session string) (store.Op, error) {
	typ, err := opType(o)
	if err != nil {
		return store.Op{}, err
	}
	switch typ {
	case "put":
		if o.Value == nil {
			return store.Op{}, newError(wire.CodeBadRequest, fmt.Sprintf("put of %q needs a value", o.Key))
		}
		if o.Lease == keepLease {
			return store.Op{Type: store.OpPut, Key: o.Key, Value: o.Value, KeepLease: true}, nil
		}
		lease, err := leaseOf(o.Lease, session)
		if err != nil {
			return store.Op{}, err
		}
		return store.Op{Type: store.OpPut, Key: o.Key, Value: o.Value, Lease: lease}, nil
	case "delete":
		return store.Op{Type: store.OpDelete, Key: o.Key}, nil
	}
	return store.Op{}, newError(wire.CodeBadRequest, fmt.Sprintf(`unknown txn op type %q (want "put" or "delete")`, typ))
}

// opType returns an operation's type, read from "type", or from "op",
// its older spelling ("put" or "del"), when only that is given.
func opType(o wire.TxnOp) (string, error) {
	switch {
	case o.Op == "":
		return o.Type, nil
	case o.Type != "":
		return "", newError(wire.CodeBadRequest, `a txn op has a "type" ("op" is its older spelling): send one of them`)
	case o.Op == "del":
		return "delete", nil
	case o.Op == "put":
		return "put", nil
	}
	return "", newError(wire.CodeBadRequest, fmt.Sprintf(`unknown txn op %q (want "put" or "del"; or "type": "put" or "delete")`, o.Op))
}

// keepLease, as a put's lease, keeps the key's current lease binding
// (none for a key without one, or a new key). The store reads the binding
// in the write's atomic step. Keeping a binding needs no right on its
// lease, whoever holds it: it neither lengthens the lease nor binds
// anything new to it (PROTOCOL.md §7).
const keepLease = "keep"

// leaseOf resolves the lease a put names. "session" is the writing
// WebSocket session's own lease (there is none over HTTP); any other id
// must be a TTL lease, so a write can never bind a key to another
// session's lease.
func leaseOf(l, session string) (string, error) {
	switch {
	case l == "" || strings.HasPrefix(l, ttlLeasePrefix):
		return l, nil
	case l == "session" && session != "":
		return session, nil
	}
	return "", newError(wire.CodeNotFound, fmt.Sprintf(`no lease %q: a put takes a TTL lease id from POST /v1/leases, "session" over a WebSocket, or "keep"`, l))
}

// apply checks permissions and leases, asks the validation hook when one
// covers room (validate.go), then commits w to room; a key
// bound to the writer's session sess (nil over HTTP) commits after the
// session's record (sessions.keep). writer names the client (writerKey).
func (s *Server) apply(ctx context.Context, room string, w store.Write, claims *auth.Claims, writer string, sess *session) (store.Result, error) {
	if err := store.ValidClientRoom(room); err != nil {
		return store.Result{}, err
	}
	for i, op := range w.Ops {
		if !claims.CanWrite(room, op.Key) {
			return store.Result{}, newError(wire.CodeForbidden, fmt.Sprintf("the token does not allow writing %q in room %q", op.Key, room))
		}
		// Each lease once (on Redis a check is a round trip).
		if op.Lease != "" && !slices.ContainsFunc(w.Ops[:i], func(o store.Op) bool { return o.Lease == op.Lease }) {
			if err := s.leaseUsable(ctx, op.Lease, claims); err != nil {
				return store.Result{}, err
			}
		}
	}
	for _, cond := range w.Conds {
		if !claims.CanRead(room, cond.Key) {
			return store.Result{}, newError(wire.CodeForbidden, fmt.Sprintf("the token does not allow reading %q in room %q", cond.Key, room))
		}
	}
	if s.cfg.Validate.Matches(room) {
		checked, dup, err := s.validated(ctx, room, w, claims, writer, sess)
		switch {
		case err != nil:
			return store.Result{}, err
		case dup != nil:
			return *dup, nil
		}
		w = checked
	}
	bound := sess != nil && slices.ContainsFunc(w.Ops, func(op store.Op) bool { return op.Lease == sess.lease })
	// The store keeps a lease under its node's name; the caller's Write is
	// left as it was.
	if slices.ContainsFunc(w.Ops, func(op store.Op) bool { return op.Lease != "" }) {
		w.Ops = slices.Clone(w.Ops)
		for i := range w.Ops {
			if w.Ops[i].Lease != "" {
				w.Ops[i].Lease = s.leases.stored(w.Ops[i].Lease)
			}
		}
	}
	if bound {
		if err := s.sessions.keep(sess); err != nil {
			return store.Result{}, newError(wire.CodeUnavailable, "cannot save the session that the write binds a key to; nothing was written")
		}
	}
	// A write the client gave up on still runs to its end: its outcome is
	// decided by the store, not by who is still listening. The store has
	// StoreTimeout for it.
	start := time.Now()
	_, span := s.startSpan(ctx, "store.apply", trace.SpanKindInternal, room)
	var traced func(rev uint64, ok bool)
	if span != nil && s.cfg.Webhooks != nil {
		traced = s.cfg.Webhooks.Tracing(ctx, room)
	}
	res, err := s.engine.Apply(s.storeDeadline.after(start, s.cfg.StoreTimeout), room, w)
	s.metrics.observeWrite(start, err)
	if span != nil {
		span.SetAttributes(attrRev.Int64(int64(res.Rev)))
		endSpan(span, err)
		if traced != nil {
			traced(res.Rev, err == nil)
		}
	}
	if err != nil {
		return res, err
	}
	for _, ev := range res.Events {
		if ev.Type == store.OpPut && ev.KV.Lease != "" {
			s.leases.attach(s.leases.local(ev.KV.Lease), room, ev.KV.Key, ev.KV.ModRev)
		}
	}
	return res, nil
}

// sharedDeadline hands out contexts that end a timeout after a given
// time, one shared by all the calls that start within a tenth of the
// timeout: a call is bounded by at least 0.9 and at most 1 × the timeout.
// A context of its own per write cost a timer per write (about 2.5 % of
// the node's CPU per write); and a store bounding its own calls sees that
// this bound comes first (redisstore.submit). Its contexts carry nothing
// but the deadline.
type sharedDeadline struct {
	cur atomic.Pointer[deadlineCtx]
}

type deadlineCtx struct {
	context.Context
	end time.Time
}

// after returns a context that ends between 0.9 and 1 × timeout after now.
func (d *sharedDeadline) after(now time.Time, timeout time.Duration) context.Context {
	if c := d.cur.Load(); c != nil && c.end.Sub(now) >= timeout-timeout/10 {
		return c.Context
	}
	end := now.Add(timeout)
	ctx, cancel := context.WithDeadline(context.Background(), end)
	_ = cancel // it ends by itself at end; the calls sharing it keep it until then
	d.cur.Store(&deadlineCtx{Context: ctx, end: end})
	return ctx
}
