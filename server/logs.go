package server

import (
	"context"
	"log/slog"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/statecast/statecast/server/wire"
)

// Log lines of a connection or request carry its ids as attributes:
// conn (this node's number of the socket or stream), session and subject
// once known, room where one is. A connection's logger is built when it
// logs, from what it holds: one kept per connection would cost every
// idle socket some 700 bytes.

// connName names connection number id in the node's logs.
func connName(id uint64) string { return "c" + strconv.FormatUint(id, 10) }

// logger returns the connection's logger. Not with c.mu held.
func (c *conn) logger() *slog.Logger {
	c.mu.Lock()
	sess := c.sess
	c.mu.Unlock()
	if sess == nil {
		return c.s.log.With("conn", connName(c.id))
	}
	return c.s.log.With("conn", connName(c.id), "session", sess.id, "subject", c.claims.Load().Subject)
}

// serverSide reports whether a request failing with code is the node's
// or the store's failure rather than the client's: those are logged at
// warn, the client's at debug.
func serverSide(code string) bool {
	return code == wire.CodeInternal || code == wire.CodeUnavailable || code == wire.CodeOutcomeUnknown
}

// failureLevel is the level of the line of a request that failed with e
// (status: its HTTP status, 0 for a WebSocket request).
func failureLevel(e *Error, status int) slog.Level {
	if serverSide(e.Code) || status >= 500 {
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

// failureAttrs are the attributes of that line: the error sent and, when
// the node or the store failed, why.
func failureAttrs(e *Error, attrs ...any) []any {
	attrs = append(attrs, "code", e.Code, "reason", e.Message)
	if e.cause != nil {
		attrs = append(attrs, "err", e.cause)
	}
	return attrs
}

// logFailure logs r, a request of the connection, failed with e.
func (c *conn) logFailure(r *wire.Request, e *Error) {
	level := failureLevel(e, 0)
	if !c.s.log.Enabled(context.Background(), level) {
		return
	}
	attrs := []any{"req", r.T}
	if r.Room != "" {
		attrs = append(attrs, "room", r.Room)
	}
	c.logger().Log(context.Background(), level, "request failed", failureAttrs(e, attrs...)...)
}

// httpLog returns the logger of an HTTP request: its method and path
// (never the query, which may carry a token), its room, and its subject
// when it carries a valid token. The claims of a request are kept
// nowhere (that cost an allocation per request): its token is verified
// again, for a line that needs it.
func (s *Server) httpLog(c echo.Context) *slog.Logger {
	r := c.Request()
	attrs := httpAttrs(c)
	if scheme, token, ok := strings.Cut(r.Header.Get(echo.HeaderAuthorization), " "); ok && strings.EqualFold(scheme, "Bearer") && s.authEnabled() {
		if claims, err := s.verify(strings.TrimSpace(token)); err == nil {
			attrs = append(attrs, "subject", claims.Subject)
		}
	}
	return s.log.With(attrs...)
}

// httpAttrs are the attributes of an HTTP request's lines but its
// subject: method, path and room.
func httpAttrs(c echo.Context) []any {
	r := c.Request()
	attrs := []any{"method", r.Method, "path", r.URL.Path}
	if room := c.Param("room"); room != "" {
		attrs = append(attrs, "room", room)
	}
	return attrs
}

// logHTTPFailure logs an HTTP request answered status with e.
func (s *Server) logHTTPFailure(c echo.Context, status int, e *Error) {
	level := failureLevel(e, status)
	if !s.log.Enabled(context.Background(), level) {
		return
	}
	s.httpLog(c).Log(context.Background(), level, "request failed", failureAttrs(e, "status", status)...)
}
