package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/coder/websocket"
	"go.opentelemetry.io/otel/trace"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// readLoop reads frames and handles their requests in order until the
// connection ends or the reader parks (errParked). Its error says how: an
// *errClose, or the read error. first: bytes read with the upgrade request
// are not in c.br's buffer until the first read, so it does not wait for
// the socket before it.
func (c *conn) readLoop(first bool) error {
	readCtx := c.ctx
	if c.nc != nil {
		// Cancelling c.ctx closes the socket (serve), which ends a read.
		// So ws.Read needs no context: with one it would register and
		// remove a cancellation callback for every frame header and
		// payload.
		readCtx = context.Background()
	}
	for {
		if !first && c.readIdle() && c.waitReadable() {
			return errParked
		}
		first = false
		if err := c.awaitReplyRoom(); err != nil {
			return err
		}
		typ, data, err := c.ws.Read(readCtx)
		if err != nil {
			return err
		}
		c.lastRead.Store(time.Now().UnixNano())
		if typ != c.codec.MessageType() {
			// Each subprotocol has one frame type (PROTOCOL.md §2).
			want := map[websocket.MessageType]string{websocket.MessageText: "text", websocket.MessageBinary: "binary"}
			return closeWith(websocket.StatusUnsupportedData, "%s takes only %s frames", c.codec.Subprotocol(), want[c.codec.MessageType()])
		}
		reqs, err := c.codec.DecodeRequests(data)
		var bad *wire.ValueError
		if err != nil && !errors.As(err, &bad) {
			return closeWith(websocket.StatusInvalidFramePayloadData, "cannot decode message: %v", err)
		}
		// A frame of one request (the usual) has its reply sent by this
		// goroutine; in a frame of several, a slow one (a sub that loads
		// its room) must not hold back the replies of those before it.
		inline := len(reqs) == 1
		c.replying.Store(inline)
		for i := range reqs {
			if c.sess != nil && reqs[i].ID == 0 && wire.Answered(reqs[i].T) {
				// Its reply could name no request: the client would wait forever.
				return closeWith(wire.CloseProtocolError, "%q without an id (ids are integers from 1)", reqs[i].T)
			}
			if e := bad.At(i); e != nil { // a value with no JSON equivalent, a key that is not Unicode
				if c.sess == nil { // as in handleOne: connect comes first
					return closeWith(wire.CloseProtocolError, "the first message must be connect, got %q", reqs[i].T)
				}
				code := wire.CodeInvalidValue
				if errors.Is(e, wire.ErrInvalidKey) {
					code = wire.CodeInvalidKey
				}
				c.replyErr(&reqs[i], newError(code, e.Error()))
				continue
			}
			if err := c.handleOne(&reqs[i]); err != nil {
				return err
			}
		}
		if inline {
			if err := c.sendReplies(); err != nil {
				return err
			}
		}
	}
}

// handleOne handles one request under the inflight lock, so a graceful
// shutdown waits for it to be answered.
func (c *conn) handleOne(r *wire.Request) error {
	c.inflight.Lock()
	defer c.inflight.Unlock()
	if c.stopping {
		if isWrite(r.T) {
			c.replyErr(r, newError(wire.CodeUnavailable, "this connection is closing (reconnect); nothing was written"))
		}
		return nil
	}
	if c.sess == nil && r.T != wire.TConnect {
		return closeWith(wire.CloseProtocolError, "the first message must be connect, got %q", r.T)
	}
	ctx := c.ctx
	if c.s.tracer != nil && r.T != wire.TPing {
		var span trace.Span
		ctx, span = c.traceRequest(r)
		c.reqSpan = span
		defer func() { c.reqSpan = nil; span.End() }()
	}
	switch r.T {
	case wire.TConnect:
		return c.connect(ctx, r)
	case wire.TAuth:
		c.refreshAuth(r)
	case wire.TPing:
		c.reply(&wire.Pong{T: wire.TPong})
	case wire.TSub:
		c.subscribe(ctx, r)
		c.doneConnecting()
	case wire.TUnsub:
		c.unsubscribe(r)
	case wire.TPut, wire.TDel, wire.TTxn:
		c.write(ctx, r)
	default:
		return closeWith(wire.CloseProtocolError, "unknown message type %q", r.T)
	}
	return nil
}

func isWrite(t string) bool { return t == wire.TPut || t == wire.TDel || t == wire.TTxn }

// connect authenticates the session and takes over a previous one when
// its resume secret matches.
func (c *conn) connect(ctx context.Context, r *wire.Request) error {
	if c.sess != nil {
		return closeWith(wire.CloseProtocolError, "connect sent twice")
	}
	claims, err := c.s.identify(ctx, r.Token, c.hookHeader, "websocket", c.addr)
	c.hookHeader = nil // asked once: the cookies are not kept for the socket's life
	if err != nil {
		c.s.metrics.authFailures.Inc()
		return connectRefusal(err)
	}
	c.claims.Store(claims)
	sess, secret, resumed, old, err := c.s.sessions.open(c, r.Session, r.Resume, claims.Subject, c.opened)
	if old != nil {
		go old.end(wire.CloseSessionReplaced, "session taken over by another connection")
	}
	c.mu.Lock()
	c.sess = sess // even on err: the session detaches when this socket ends
	// Anonymous clients are sent no ids (server/wids.go).
	if claims.Subject != "" {
		c.wscope = widScope(claims)
	}
	c.mu.Unlock()
	if errors.Is(err, store.ErrStaleTake) {
		// Its client has most likely given up on this socket already.
		c.s.log.Info("server: a connect was read before a later one of its session took the session over; not taking it back",
			"session", r.Session, "conn", c.id)
		return closeWith(websocket.StatusInternalError, "a later connect took this session over; reconnect")
	}
	if err != nil {
		// A secret the store does not hold could not resume after a
		// restart, and a resume the store did not answer may have taken
		// the session: the client reconnects with the secret it presented.
		return closeWith(websocket.StatusInternalError, "the session store did not answer; reconnect")
	}
	msg := &wire.Connected{T: wire.TConnected, V: c.codec.Version(), Session: sess.id, Resume: secret, Resumed: resumed,
		PingMS: c.s.cfg.PingInterval.Milliseconds(), LeaseGraceMS: c.s.cfg.LeaseGrace.Milliseconds()}
	if c.s.authEnabled() {
		msg.ExpiresMS = time.Until(claims.Expiry).Milliseconds()
		c.watchExpiry(claims)
	}
	c.reply(msg)
	return nil
}

// verify returns the claims of token, or anonymous claims when the server
// has no auth configured.
func (s *Server) verify(token string) (*auth.Claims, error) {
	if !s.authEnabled() {
		return auth.Anonymous(), nil
	}
	return s.cfg.Auth.Verify(token)
}

// validUntil is when Verify stops accepting the token of claims: its exp
// plus the leeway. A session ends then, so a token accepted over HTTP is
// accepted by a WebSocket too, and the other way round.
func (s *Server) validUntil(claims *auth.Claims) time.Time {
	return claims.Expiry.Add(s.cfg.Auth.Leeway())
}

// watchExpiry asks for a refresh 30 s before the token's exp and ends
// the session when the token is no longer valid (exp plus the leeway):
// the leeway absorbs clock skew and a late refresh, never a difference
// between surfaces.
func (c *conn) watchExpiry(claims *auth.Claims) {
	c.addTimer(time.AfterFunc(max(time.Until(claims.Expiry)-30*time.Second, 0), func() {
		if c.claims.Load() == claims {
			c.reply(&wire.Refresh{T: wire.TRefresh, ExpiresMS: time.Until(claims.Expiry).Milliseconds()})
		}
	}))
	c.addTimer(time.AfterFunc(time.Until(c.s.validUntil(claims)), func() {
		if c.claims.Load() == claims {
			go c.end(wire.CloseTokenExpired, "token expired")
		}
	}))
}

func (c *conn) refreshAuth(r *wire.Request) {
	if c.s.cfg.Auth == nil {
		c.reply(&wire.OK{T: wire.TOK, ID: r.ID})
		return
	}
	claims, err := c.s.cfg.Auth.Verify(r.Token)
	if err != nil {
		c.s.metrics.authFailures.Inc()
		c.replyErr(r, newError(wire.CodeUnauthorized, err.Error()))
		return
	}
	if old := c.claims.Load(); old.Subject != claims.Subject {
		c.replyErr(r, newError(wire.CodeUnauthorized, "a refreshed token must have the same subject"))
		return
	}
	c.claims.Store(claims)
	c.watchExpiry(claims)
	c.reply(&wire.OK{T: wire.TOK, ID: r.ID})
}

func (c *conn) subscribe(ctx context.Context, r *wire.Request) {
	if err := store.ValidClientRoom(r.Room); err != nil {
		c.replyErr(r, errorOf(err, false))
		return
	}
	claims := c.claims.Load()
	if err := c.s.checkWatch(claims, r.Room, r.Prefixes, r.Keys); err != nil {
		c.replyErr(r, errorOf(err, false))
		return
	}
	s := &sub{id: r.ID, room: r.Room, prev: r.Prev, nprefix: max(len(r.Prefixes)+len(r.Keys), 1)}
	if r.Filter != "" {
		s.nfilter = 1
	}
	// The prefix and filter budgets are taken before the watch starts and
	// given back when the subscription ends, so concurrent subs cannot
	// overshoot them.
	c.mu.Lock()
	_, dup := c.subs[r.ID]
	n := len(c.subs)
	overPrefixes := c.prefixes+s.nprefix > c.s.cfg.MaxConnPrefixes
	overFilters := c.filters+s.nfilter > c.s.cfg.MaxConnFilters
	if !dup && n < c.s.cfg.MaxSubscriptions && !overPrefixes && !overFilters {
		c.prefixes += s.nprefix
		c.filters += s.nfilter
	}
	c.mu.Unlock()
	switch {
	case dup:
		c.replyErr(r, newError(wire.CodeBadRequest, fmt.Sprintf("subscription %d already exists", r.ID)))
		return
	case n >= c.s.cfg.MaxSubscriptions:
		c.replyErr(r, newError(wire.CodeTooManySubs, fmt.Sprintf("at most %d subscriptions per connection", c.s.cfg.MaxSubscriptions)))
		return
	case overPrefixes:
		c.replyErr(r, newError(wire.CodeTooLarge, fmt.Sprintf("at most %d key prefixes over all the subscriptions of a connection", c.s.cfg.MaxConnPrefixes)))
		return
	case overFilters:
		c.replyErr(r, newError(wire.CodeTooManySubs, fmt.Sprintf("at most %d subscriptions with a filter per connection", c.s.cfg.MaxConnFilters)))
		return
	}
	// From here a refusal gives the budget back.
	refuse := func(err error) {
		c.mu.Lock()
		c.releaseLocked(s)
		c.mu.Unlock()
		c.replyErr(r, errorOf(err, false))
	}
	// Compiled once the cheap checks passed: a connection at its limits
	// cannot make the server compile.
	f, err := c.s.compileFilter(r.Filter)
	if err != nil {
		refuse(err)
		return
	}
	opts := rooms.WatchOptions{Prefixes: r.Prefixes, Keys: r.Keys, Filter: f, Notify: func() { c.markReady(s) }}
	if r.From != nil {
		opts.From = &rooms.Position{Epoch: r.From.Epoch, Rev: r.From.Rev}
	}
	wctx, cancel := context.WithTimeout(ctx, c.s.cfg.StoreTimeout)
	w, err := c.s.engine.Watch(wctx, r.Room, opts)
	cancel()
	if err != nil {
		refuse(readError(err)) // as an SSE watch's: a room load that timed out is unavailable
		return
	}
	s.w = w
	c.s.metrics.countStart(opts.From)
	// The ok goes out before any message of the subscription: the writer
	// holds back a sub until it is active.
	c.mu.Lock()
	if c.subs == nil { // the connection ended meanwhile
		c.mu.Unlock()
		w.Close()
		return
	}
	c.subs[r.ID] = s
	c.pending, _ = c.codec.Append(c.pending, &wire.OK{T: wire.TOK, ID: r.ID})
	s.active.Store(true)
	c.repliedLocked()
	c.mu.Unlock()
	c.s.metrics.subscriptions.Inc()
}

// releaseLocked gives back the prefix and filter budget of s.
func (c *conn) releaseLocked(s *sub) {
	c.prefixes -= s.nprefix
	c.filters -= s.nfilter
}

// compileFilter compiles a watch's filter expression; "" is none.
func (s *Server) compileFilter(src string) (rooms.Filter, error) {
	if src == "" {
		return nil, nil // a nil interface, not a nil *filter.Filter
	}
	f, err := s.filters.Get(src)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// checkWatch validates what a watch of room selects: its key prefixes
// ("" = the whole room) and exact keys, at most MaxPrefixes together, each
// a valid key, all of them readable with claims; none of either is the
// whole room. Without the bound one request could make every later event
// and replay of the room test thousands of prefixes.
func (s *Server) checkWatch(claims *auth.Claims, room string, prefixes, keys []string) error {
	if n := len(prefixes) + len(keys); n > s.cfg.MaxPrefixes {
		return newError(wire.CodeTooLarge, fmt.Sprintf("a watch may name at most %d key prefixes (exact keys count as prefixes), got %d", s.cfg.MaxPrefixes, n))
	}
	for _, p := range prefixes {
		if err := s.checkPrefixParam(p); err != nil {
			return err
		}
	}
	for _, k := range keys {
		if err := s.storeLimits().ValidKey(k); err != nil {
			return newError(wire.CodeInvalidKey, "key: "+err.Error())
		}
	}
	readable := append(slices.Clone(prefixes), keys...)
	if len(readable) == 0 {
		readable = []string{""}
	}
	for _, p := range readable {
		if !claims.CanRead(room, p) {
			return forbiddenRead(room, p)
		}
	}
	return nil
}

func (c *conn) unsubscribe(r *wire.Request) {
	c.mu.Lock()
	s := c.subs[r.Sub]
	if s != nil {
		delete(c.subs, r.Sub)
		s.gone.Store(true)
		c.releaseLocked(s)
	}
	c.mu.Unlock()
	if s == nil {
		c.replyErr(r, newError(wire.CodeNotFound, fmt.Sprintf("no subscription %d", r.Sub)))
		return
	}
	// Close before the ok: the writer drains what the watcher still holds
	// ahead of the ok, and nothing of it after.
	s.w.Close()
	c.s.metrics.subscriptions.Dec()
	c.reply(&wire.OK{T: wire.TOK, ID: r.ID})
}

// write applies a put, del or txn through the one write path (write.go).
func (c *conn) write(ctx context.Context, r *wire.Request) {
	claims := c.claims.Load()
	if _, err := c.s.admitWrite(claims, c.addr); err != nil {
		c.replyErr(r, errorOf(err, false))
		return
	}
	res, err := c.s.write(ctx, r, claims, c.addr, c.sess)
	if err != nil {
		c.replyErr(r, errorOf(err, true))
		return
	}
	c.reply(&wire.OK{T: wire.TOK, ID: r.ID, Rev: res.Rev, Dup: res.Dup})
}
