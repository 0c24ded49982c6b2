package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// The HTTP API: the same rooms, revisions, error codes and value rules as
// the WebSocket protocol, for clients that read and write with plain
// requests (game servers, scripts, the CLI). Watching is Server-Sent
// Events (sse.go). Every route takes a bearer token (httpClaims).
// openapi.json describes it all; its writes take the one write path
// (write.go).

const (
	minLeaseTTL = time.Second
	maxLeaseTTL = time.Hour
	// smallBodyBytes bounds bodies that only carry a few numbers.
	smallBodyBytes = 4 << 10
	// ttlLeasePrefix starts every TTL lease id (lessor.grant). The lease
	// routes accept only those, so they can neither end nor keep alive a
	// WebSocket session's lease, whose id derives from the session id.
	ttlLeasePrefix = "ttl_"
	// sessionLeasePrefix starts a session's lease id: the session id
	// follows it.
	sessionLeasePrefix = "session:"
)

// replyJSON answers 200 with v as compact JSON. Unlike c.JSON it does not
// escape '<', '>' and '&', so values read back with the text they were
// stored with, as over the WebSocket.
func replyJSON(c echo.Context, v any) error {
	b, err := compactJSON(v)
	if err != nil {
		return err
	}
	return c.JSONBlob(http.StatusOK, b)
}

func (s *Server) apiRoutes(g *echo.Group) {
	g.GET("/rooms/:room/kv", s.handleList)
	g.GET("/rooms/:room/kv/*", s.handleGet)
	g.PUT("/rooms/:room/kv/*", s.handlePut)
	g.DELETE("/rooms/:room/kv/*", s.handleDelete)
	g.POST("/rooms/:room/txn", s.handleTxn)
	g.GET("/rooms/:room/watch", s.handleWatch)
	g.POST("/leases", s.handleLeaseGrant)
	g.POST("/leases/:id/keepalive", s.handleLeaseKeepAlive)
	g.DELETE("/leases/:id", s.handleLeaseRevoke)
}

type listReply struct {
	Epoch string      `json:"epoch"`
	Rev   uint64      `json:"rev"`
	Items []wire.Item `json:"items"`
	// More: keys follow; Next is the after of the next page (its rev is
	// Rev), for a paged list.
	More bool   `json:"more,omitempty"`
	Next string `json:"next,omitempty"`
}

// A list reply holds at most maxListBytes of keys and values (counted as
// rooms.ItemBytes): a longer unpaged list is refused with too_large, a
// page ends there. A page holds at most maxListLimit keys, and
// defaultListLimit when a paged list names no limit.
const (
	maxListBytes     = 4 << 20
	maxListLimit     = 10000
	defaultListLimit = 1000
)

type leaseReply struct {
	ID    string `json:"id"`
	TTLMS int64  `json:"ttl_ms"`
}

type revokeReply struct {
	ID   string `json:"id"`
	Keys int    `json:"keys"`
}

// httpClaims returns the claims of the request's bearer token. The
// watch route also takes ?access_token=, since EventSource cannot set
// headers; nothing here logs a token or a URL carrying one.
func (s *Server) httpClaims(c echo.Context, fromQuery bool) (*auth.Claims, error) {
	token := ""
	if scheme, t, ok := strings.Cut(c.Request().Header.Get(echo.HeaderAuthorization), " "); ok && strings.EqualFold(scheme, "Bearer") {
		token = strings.TrimSpace(t)
	}
	if token == "" && fromQuery {
		token = c.QueryParam("access_token")
	}
	r := c.Request()
	claims, err := s.identify(r.Context(), token, r.Header, "http", r.RemoteAddr)
	if err == nil {
		return claims, nil
	}
	s.metrics.authFailures.Inc()
	h := c.Response().Header()
	switch {
	case errors.Is(err, hooks.ErrUnavailable):
		return nil, newError(wire.CodeUnavailable, "the application's connect hook did not answer; retry")
	case errors.Is(err, hooks.ErrRefused):
		h.Set(echo.HeaderWWWAuthenticate, `Bearer`)
		return nil, newError(wire.CodeUnauthorized, "the application did not recognise the session")
	case errors.Is(err, auth.ErrTokenMissing):
		h.Set(echo.HeaderWWWAuthenticate, `Bearer`)
		return nil, newError(wire.CodeUnauthorized, "a bearer token is required")
	case errors.Is(err, auth.ErrTokenExpired):
		h.Set(echo.HeaderWWWAuthenticate, `Bearer error="invalid_token", error_description="token expired"`)
		return nil, newError(wire.CodeUnauthorized, "token expired")
	}
	h.Set(echo.HeaderWWWAuthenticate, `Bearer error="invalid_token"`)
	return nil, newError(wire.CodeUnauthorized, "invalid token: "+err.Error())
}

// pathParam returns a path parameter decoded exactly once. Echo routes on
// the raw (escaped) path whenever it differs from the default encoding,
// and then hands out parameters still escaped; otherwise they are the
// decoded path's. So "a%2Fb" names the key "a/b" and "a%252F" names "a%2F".
func pathParam(c echo.Context, name string) (string, error) {
	v := c.Param(name)
	if c.Request().URL.RawPath == "" {
		return v, nil
	}
	u, err := url.PathUnescape(v)
	if err != nil {
		return "", newError(wire.CodeBadRequest, fmt.Sprintf("path parameter %s is not properly escaped", name))
	}
	return u, nil
}

// httpTarget reads and validates the room and, with key, the key of the path.
func (s *Server) httpTarget(c echo.Context, withKey bool) (room, key string, err error) {
	if room, err = pathParam(c, "room"); err != nil {
		return "", "", err
	}
	if err := store.ValidClientRoom(room); err != nil {
		return "", "", errorOf(err, false)
	}
	if !withKey {
		return room, "", nil
	}
	if key, err = pathParam(c, "*"); err != nil {
		return "", "", err
	}
	if err := s.storeLimits().ValidKey(key); err != nil {
		return "", "", errorOf(err, false)
	}
	return room, key, nil
}

// storeLimits returns the store's write limits, for checks made before a
// request reaches the store (which checks again).
func (s *Server) storeLimits() store.Limits {
	if l, ok := s.store.(interface{ Limits() store.Limits }); ok {
		return l.Limits().WithDefaults()
	}
	return store.Limits{}.WithDefaults()
}

func forbiddenRead(room, what string) *Error {
	return newError(wire.CodeForbidden, fmt.Sprintf("the token does not allow reading %q in room %q", what, room))
}

// readError maps a failed read or watch: an engine or store that is
// closing, or did not answer in time, is unavailable (retry elsewhere),
// not a bug.
func readError(err error) *Error {
	if isUnavailable(err) {
		return newError(wire.CodeUnavailable, "the room is unavailable on this node; retry")
	}
	return errorOf(err, false)
}

func isUnavailable(err error) bool {
	for _, e := range []error{rooms.ErrClosed, rooms.ErrRoomReset, rooms.ErrUnsynced, store.ErrClosed, store.ErrUnavailable, context.DeadlineExceeded, context.Canceled} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (s *Server) handleList(c echo.Context) error {
	claims, err := s.httpClaims(c, false)
	if err != nil {
		return err
	}
	room, _, err := s.httpTarget(c, false)
	if err != nil {
		return err
	}
	prefix := c.QueryParam("prefix")
	if err := s.checkPrefixParam(prefix); err != nil {
		return err
	}
	if !claims.CanRead(room, prefix) {
		return forbiddenRead(room, prefix)
	}
	ro, err := readOptions(c)
	if err != nil {
		return err
	}
	f, err := s.compileFilter(c.QueryParam("filter"))
	if err != nil {
		return err
	}
	o, paged, err := pageOptions(c)
	if err != nil {
		return err
	}
	if f != nil {
		o.Keep = func(kv store.KV) bool { return f.Match(kv.Key, kv.Value) }
	}
	p, err := s.engine.ListPage(c.Request().Context(), room, prefix, o, ro)
	var ce *store.CompactedError
	switch {
	case errors.As(err, &ce):
		return newError(wire.CodeNotFound, fmt.Sprintf("revision %d of room %q is no longer retained (the oldest is %d): list again from the first page", o.Rev, room, ce.Oldest))
	case errors.Is(err, rooms.ErrFutureRevision):
		return newError(wire.CodeBadRequest, fmt.Sprintf("rev %d is past the room's head", o.Rev))
	case err != nil:
		return readError(err)
	case p.More && !paged:
		return newError(wire.CodeTooLarge, fmt.Sprintf("the list exceeds %d bytes: page it with ?limit=N, then after=<next>&rev=<rev> of each reply (PROTOCOL.md, HTTP list pages)", maxListBytes))
	}
	setPosition(c, p.Epoch, p.Rev)
	reply := listReply{Epoch: p.Epoch, Rev: p.Rev, More: p.More}
	if p.More {
		reply.Next = p.Items[len(p.Items)-1].Key
	}
	return replyList(c, reply, p.Items)
}

// replyList writes reply with items, encoded by hand into one buffer of
// about their size: a page may be megabytes, and encoding/json would
// grow its buffer by doubling and copy each value once more.
func replyList(c echo.Context, reply listReply, items []store.KV) error {
	reply.Items = []wire.Item{}
	shell, err := compactJSON(reply)
	if err != nil {
		return err
	}
	at := bytes.Index(shell, []byte(`"items":[]`)) + len(`"items":[`) // no string holds an unescaped quote
	n := len(shell) + 32*len(items)
	for _, kv := range items {
		n += rooms.ItemBytes(kv)
	}
	b := append(make([]byte, 0, n), shell[:at]...)
	for i, kv := range items {
		if i > 0 {
			b = append(b, ',')
		}
		it := wireItem(kv)
		b = wire.AppendItemJSON(b, &it)
	}
	return c.JSONBlob(http.StatusOK, append(b, shell[at:]...))
}

// pageOptions reads a list's paging (PROTOCOL.md, HTTP list pages): limit, after and
// rev; paged reports whether any was given. An unpaged list is read whole
// up to maxListBytes.
func pageOptions(c echo.Context) (o rooms.PageOptions, paged bool, err error) {
	o.MaxBytes = maxListBytes
	o.After = c.QueryParam("after")
	if v := c.QueryParam("rev"); v != "" {
		if o.Rev, err = strconv.ParseUint(v, 10, 64); err != nil || o.Rev == 0 {
			return o, true, newError(wire.CodeBadRequest, "rev must be a revision (a positive integer), the rev of the list's first page")
		}
	}
	paged = o.After != "" || o.Rev != 0
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			return o, true, newError(wire.CodeBadRequest, fmt.Sprintf("limit must be from 1 to %d keys", maxListLimit))
		}
		o.Limit, paged = n, true
	} else if paged {
		o.Limit = defaultListLimit
	}
	return o, paged, nil
}

// readOptions reads a GET's consistency (PROTOCOL.md §9): linearizable by
// default; ?consistency=serializable serves this node's view at once,
// and ?min_rev=N makes it at least as fresh as a position already seen.
func readOptions(c echo.Context) (rooms.ReadOptions, error) {
	var ro rooms.ReadOptions
	switch c.QueryParam("consistency") {
	case "", "linearizable", "l":
	case "serializable", "s":
		ro.Serializable = true
	default:
		return ro, newError(wire.CodeBadRequest, "consistency must be linearizable (the default) or serializable")
	}
	if v := c.QueryParam("min_rev"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return ro, newError(wire.CodeBadRequest, "min_rev must be a revision (an unsigned integer)")
		}
		ro.MinRev = n
		// A linearizable read is at least as fresh as any min_rev: it
		// stays one; a serializable one waits for it.
	}
	return ro, nil
}

// checkPrefixParam validates a key prefix; "" means every key.
func (s *Server) checkPrefixParam(p string) error {
	if p == "" {
		return nil
	}
	if err := s.storeLimits().ValidKey(p); err != nil {
		return newError(wire.CodeInvalidKey, "prefix: "+err.Error())
	}
	return nil
}

func (s *Server) handleGet(c echo.Context) error {
	claims, err := s.httpClaims(c, false)
	if err != nil {
		return err
	}
	room, key, err := s.httpTarget(c, true)
	if err != nil {
		return err
	}
	if !claims.CanRead(room, key) {
		return forbiddenRead(room, key)
	}
	ro, err := readOptions(c)
	if err != nil {
		return err
	}
	snap, err := s.engine.Get(c.Request().Context(), room, key, ro)
	if err != nil {
		return readError(err)
	}
	setPosition(c, snap.Epoch, snap.Rev)
	if len(snap.Items) == 0 {
		return newError(wire.CodeNotFound, fmt.Sprintf("key %q does not exist in room %q", key, room))
	}
	return replyJSON(c, wireItem(snap.Items[0]))
}

// ifMatch reads the optional If-Match header: the mod_rev the key must
// have (0 = must not exist), a put or del's if_rev. A quoted entity tag
// ("57") is accepted too.
func ifMatch(c echo.Context) (*uint64, error) {
	h := c.Request().Header.Get("If-Match")
	if h == "" {
		return nil, nil
	}
	v := strings.TrimSpace(h)
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
	}
	rev, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return nil, newError(wire.CodeBadRequest, "If-Match must be a key's mod_rev (an unsigned integer; 0 = must not exist)")
	}
	return &rev, nil
}

// readBody reads at most limit bytes of the request body; more is
// too_large.
func readBody(c echo.Context, limit int64) ([]byte, error) {
	r := c.Request()
	if n := r.ContentLength; n >= 0 && n <= min(limit, 64<<10) {
		// The usual body, of a length known to be within the limit: read
		// into a buffer of its size (io.ReadAll starts at 512 bytes). A
		// larger one grows as it arrives: a client that only declares a
		// length gets no big buffer held for it.
		b := make([]byte, n)
		if _, err := io.ReadFull(r.Body, b); err != nil {
			return nil, newError(wire.CodeBadRequest, "cannot read the request body")
		}
		return b, nil
	}
	b, err := io.ReadAll(http.MaxBytesReader(c.Response().Writer, r.Body, limit))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, newError(wire.CodeTooLarge, fmt.Sprintf("request body exceeds the limit of %d bytes", limit))
	case err != nil:
		return nil, newError(wire.CodeBadRequest, "cannot read the request body")
	}
	return b, nil
}

// httpWriter authenticates a write and lets it in.
func (s *Server) httpWriter(c echo.Context) (*auth.Claims, error) {
	claims, err := s.httpClaims(c, false)
	if err != nil {
		return nil, err
	}
	return claims, s.httpAdmitWrite(c, claims)
}

// httpAdmitWrite lets a write in (admitWrite): over the write rate, 429
// with Retry-After in whole seconds (at least 1).
func (s *Server) httpAdmitWrite(c echo.Context, claims *auth.Claims) error {
	retry, err := s.admitWrite(claims, c.Request().RemoteAddr)
	var e *Error
	if errors.As(err, &e) && e.Code == wire.CodeRateLimited {
		c.Response().Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(retry.Seconds())))))
	}
	return err
}

// httpWrite sends r, with the request's write id, through the one write
// path (write.go) and answers {"rev"}, with "dup":true when the id had
// committed.
func (s *Server) httpWrite(c echo.Context, claims *auth.Claims, r *wire.Request) error {
	var err error
	if r.Wid, r.Since, err = idempotency(c.Request().Header); err != nil {
		return err
	}
	res, err := s.write(c.Request().Context(), r, claims, c.Request().RemoteAddr, nil)
	if err != nil {
		return err
	}
	return revReply(c, res)
}

// revReply answers a write {"rev":N}, with "dup":true when a repeated
// Idempotency-Key applied nothing now. Built here: encoding/json took
// about a tenth of the handler's time for it.
func revReply(c echo.Context, res store.Result) error {
	setPosition(c, res.Epoch, res.Rev)
	b := make([]byte, 0, 40)
	b = append(b, `{"rev":`...)
	b = strconv.AppendUint(b, res.Rev, 10)
	if res.Dup {
		b = append(b, `,"dup":true`...)
	}
	return c.JSONBlob(http.StatusOK, append(b, '}'))
}

// idempotency reads a write's id from the Idempotency-Key header (as is,
// or quoted as a structured-field string) and, optionally, the revision
// seen before it was first sent from Idempotency-Since: the wid and since
// of a WebSocket write (PROTOCOL.md §6).
func idempotency(h http.Header) (wid string, since *uint64, err error) {
	keys := h.Values("Idempotency-Key")
	s := h.Get("Idempotency-Since")
	switch {
	case len(keys) == 0 && s != "":
		return "", nil, newError(wire.CodeBadRequest, "Idempotency-Since needs an Idempotency-Key")
	case len(keys) == 0:
		return "", nil, nil
	case len(keys) > 1:
		return "", nil, newError(wire.CodeBadRequest, "one Idempotency-Key at most")
	}
	wid = keys[0]
	if len(wid) >= 2 && wid[0] == '"' && wid[len(wid)-1] == '"' {
		wid = wid[1 : len(wid)-1]
	}
	if err := store.ValidWid(wid); err != nil {
		return "", nil, newError(wire.CodeBadRequest, "Idempotency-Key: "+err.Error())
	}
	if s == "" {
		return wid, nil, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return "", nil, newError(wire.CodeBadRequest, "Idempotency-Since must be a revision (an unsigned integer)")
	}
	return wid, &n, nil
}

// keyWrite reads what a PUT (t = put) or DELETE (del) of one key
// shares: its writer's claims, the room and key, and If-Match.
func (s *Server) keyWrite(c echo.Context, t string) (*auth.Claims, *wire.Request, error) {
	claims, err := s.httpWriter(c)
	if err != nil {
		return nil, nil, err
	}
	room, key, err := s.httpTarget(c, true)
	if err != nil {
		return nil, nil, err
	}
	ifRev, err := ifMatch(c)
	if err != nil {
		return nil, nil, err
	}
	return claims, &wire.Request{T: t, Room: room, Key: key, IfRev: ifRev}, nil
}

func (s *Server) handlePut(c echo.Context) error {
	claims, r, err := s.keyWrite(c, wire.TPut)
	if err != nil {
		return err
	}
	body, err := readBody(c, int64(s.storeLimits().MaxValueBytes))
	if err != nil {
		return err
	}
	if r.Value, err = wire.ValueFromJSON(body); err != nil {
		return newError(wire.CodeInvalidValue, "the body must be one JSON value: "+err.Error())
	}
	if c.Request().URL.RawQuery != "" { // parsing none still costs a map
		r.Lease = c.QueryParam("lease")
	}
	return s.httpWrite(c, claims, r)
}

func (s *Server) handleDelete(c echo.Context) error {
	claims, r, err := s.keyWrite(c, wire.TDel)
	if err != nil {
		return err
	}
	// A missing key writes nothing; the store answers with the head.
	return s.httpWrite(c, claims, r)
}

// txnBody is the WebSocket txn request's shape.
type txnBody struct {
	If  []wire.Cond  `json:"if"`
	Ops []wire.TxnOp `json:"ops"`
}

func (s *Server) handleTxn(c echo.Context) error {
	claims, err := s.httpWriter(c)
	if err != nil {
		return err
	}
	room, _, err := s.httpTarget(c, false)
	if err != nil {
		return err
	}
	// A transaction sent over a WebSocket must fit one frame; the same
	// bound applies here.
	body, err := readBody(c, s.cfg.MaxFrameBytes)
	if err != nil {
		return err
	}
	var t txnBody
	if err := wire.UnmarshalRequestJSON(body, &t); err != nil {
		switch {
		case errors.Is(err, wire.ErrInvalidValue):
			return newError(wire.CodeInvalidValue, err.Error())
		case errors.Is(err, wire.ErrInvalidKey):
			return newError(wire.CodeInvalidKey, err.Error())
		}
		return newError(wire.CodeBadRequest, `the body must be {"if":[{"key","mod_rev"}],"ops":[{"type":"put"|"delete","key","value"?,"lease"?}]}`)
	}
	return s.httpWrite(c, claims, &wire.Request{T: wire.TTxn, Room: room, If: t.If, Ops: t.Ops})
}

func (s *Server) handleLeaseGrant(c echo.Context) error {
	// A grant holds memory until its TTL ends: it counts as a write.
	claims, err := s.httpWriter(c)
	if err != nil {
		return err
	}
	body, err := readBody(c, smallBodyBytes)
	if err != nil {
		return err
	}
	var req struct {
		TTLMS int64 `json:"ttl_ms"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return newError(wire.CodeBadRequest, `the body must be {"ttl_ms":N}`)
	}
	if req.TTLMS < minLeaseTTL.Milliseconds() || req.TTLMS > maxLeaseTTL.Milliseconds() {
		return newError(wire.CodeBadRequest, fmt.Sprintf("ttl_ms must be between %d and %d", minLeaseTTL.Milliseconds(), maxLeaseTTL.Milliseconds()))
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StoreTimeout)
	defer cancel()
	id, ok, err := s.leases.grant(ctx, time.Duration(req.TTLMS)*time.Millisecond, claims.Subject)
	if err != nil {
		return s.leaseStoreErr("grant", err)
	}
	if !ok {
		return newError(wire.CodeTooLarge, fmt.Sprintf("at most %d TTL leases per subject: revoke one or let one expire", s.cfg.MaxLeases))
	}
	return replyJSON(c, leaseReply{ID: id, TTLMS: req.TTLMS})
}

func noLease(id string) *Error {
	return newError(wire.CodeNotFound, fmt.Sprintf("lease %q does not exist or has ended", id))
}

// leaseStoreErr is the answer when the store that keeps the leases (on
// Redis) failed during op; the store's own error is logged, not sent.
func (s *Server) leaseStoreErr(op string, err error) *Error {
	s.cfg.Logger.Warn("server: the store failed during a lease "+op, "err", err)
	switch {
	case errors.Is(err, store.ErrClosed):
		return newError(wire.CodeUnavailable, "server is shutting down")
	case (op == "grant" || op == "revoke") && errors.Is(err, context.DeadlineExceeded):
		return newError(wire.CodeOutcomeUnknown, fmt.Sprintf("the store did not confirm the lease %s in time; it may or may not have happened", op))
	}
	return newError(wire.CodeUnavailable, fmt.Sprintf("the store that keeps the leases did not answer; nothing changed: retry the %s", op))
}

// leaseUsable says whether claims' subject may write under lease id.
func (s *Server) leaseUsable(ctx context.Context, id string, claims *auth.Claims) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
	defer cancel()
	u, err := s.leases.usable(ctx, id, claims.Subject)
	if err != nil {
		return s.leaseStoreErr("check", err)
	}
	if u != leaseOK {
		return leaseErr(id, u)
	}
	return nil
}

// leaseErr is the answer to a lease that cannot be used: not found, or
// forbidden when another subject granted it. Forbidden rather than not
// found (as etcd answers permission denied): ids are unguessable, so
// saying the lease exists tells a caller that holds one nothing new, and
// a client that sent the wrong token learns why.
func leaseErr(id string, u leaseUse) *Error {
	if u == leaseNotOwner {
		return newError(wire.CodeForbidden, fmt.Sprintf("lease %q belongs to another subject: only the subject that granted it may keep it alive, revoke it or write under it", id))
	}
	return noLease(id)
}

// leaseID reads the TTL lease named in the path and the caller's claims;
// an id that cannot be a TTL lease is simply not found.
func (s *Server) leaseID(c echo.Context) (string, *auth.Claims, error) {
	claims, err := s.httpClaims(c, false)
	if err != nil {
		return "", nil, err
	}
	id, err := pathParam(c, "id")
	if err != nil {
		return "", nil, err
	}
	if !strings.HasPrefix(id, ttlLeasePrefix) {
		return "", nil, noLease(id)
	}
	return id, claims, nil
}

func (s *Server) handleLeaseKeepAlive(c echo.Context) error {
	id, claims, err := s.leaseID(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StoreTimeout)
	defer cancel()
	ttl, u, err := s.leases.keepAlive(ctx, id, claims.Subject)
	if err != nil {
		return s.leaseStoreErr("keep-alive", err)
	}
	if u != leaseOK {
		return leaseErr(id, u)
	}
	return replyJSON(c, leaseReply{ID: id, TTLMS: ttl.Milliseconds()})
}

func (s *Server) handleLeaseRevoke(c echo.Context) error {
	id, claims, err := s.leaseID(c)
	if err != nil {
		return err
	}
	// A revoke deletes the lease's keys: it counts as a write. A
	// keep-alive does not, so writing hard cannot expire one's own lease.
	if err := s.httpAdmitWrite(c, claims); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), s.cfg.StoreTimeout)
	defer cancel()
	n, u, err := s.leases.revoke(ctx, id, claims.Subject)
	if err != nil {
		return s.leaseStoreErr("revoke", err)
	}
	if u != leaseOK {
		return leaseErr(id, u)
	}
	return replyJSON(c, revokeReply{ID: id, Keys: n})
}

// setPosition puts the room position a reply speaks of in its headers:
// X-Statecast-Rev, and X-Statecast-Epoch, without which a client could
// not tell a revision that continues what it saw from one of a room whose
// state was lost and started again (a new epoch reuses revision numbers).
func setPosition(c echo.Context, epoch string, rev uint64) {
	h := c.Response().Header()
	h.Set("X-Statecast-Rev", strconv.FormatUint(rev, 10))
	if epoch != "" {
		h.Set("X-Statecast-Epoch", epoch)
	}
}
