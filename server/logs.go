package server

import (
	"context"
	"log/slog"

	"github.com/labstack/echo/v4"

	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/wire"
)

// Log lines of a connection or request carry its ids as attributes:
// conn (this node's id of the socket or stream), session and subject
// once known, room where one is. A WebSocket keeps its logger in the
// conn; what the connection's requests call (the write path, the
// validation hook) finds it in their context.

type logKey struct{}

// withLog returns ctx carrying l for the calls a request makes.
func withLog(ctx context.Context, l *slog.Logger) context.Context {
	return context.WithValue(ctx, logKey{}, l)
}

// requestLog returns the logger of ctx's connection, or (an HTTP
// request, which builds none unless it logs) the server's with the
// subject of claims.
func (s *Server) requestLog(ctx context.Context, claims *auth.Claims) *slog.Logger {
	if l, ok := ctx.Value(logKey{}).(*slog.Logger); ok {
		return l
	}
	return s.log.With("subject", claims.Subject)
}

// connID names a connection in the node's logs: random, so the lines of
// one socket can be told apart across restarts and nodes.
func connID() string { return randomID("c_")[:14] }

// serverSide reports whether a request failing with code is the node's
// or the store's failure rather than the client's: those are logged at
// warn, the client's at debug.
func serverSide(code string) bool {
	return code == wire.CodeInternal || code == wire.CodeUnavailable || code == wire.CodeOutcomeUnknown
}

// logFailure logs a request of a connection that failed with e.
func logFailure(l *slog.Logger, t, room string, e *Error) {
	level := slog.LevelDebug
	if serverSide(e.Code) {
		level = slog.LevelWarn
	}
	if !l.Enabled(context.Background(), level) {
		return
	}
	attrs := []any{"req", t, "code", e.Code, "reason", e.Message}
	if room != "" {
		attrs = append(attrs, "room", room)
	}
	if e.cause != nil {
		attrs = append(attrs, "err", e.cause)
	}
	l.Log(context.Background(), level, "request failed", attrs...)
}

// httpLog returns the logger of an HTTP request: its method and path
// (never the query, which may carry a token) and its room. The subject
// is added by the lines that have the claims: an HTTP request keeps
// them nowhere (that cost an allocation per request).
func (s *Server) httpLog(c echo.Context) *slog.Logger {
	r := c.Request()
	attrs := []any{"method", r.Method, "path", r.URL.Path}
	if room := c.Param("room"); room != "" {
		attrs = append(attrs, "room", room)
	}
	return s.log.With(attrs...)
}

// logHTTPFailure logs an HTTP request answered with an error: at warn
// when the node or the store failed (5xx), else at debug.
func (s *Server) logHTTPFailure(c echo.Context, status int, e *Error) {
	level := slog.LevelDebug
	if status >= 500 {
		level = slog.LevelWarn
	}
	if !s.log.Enabled(context.Background(), level) {
		return
	}
	attrs := []any{"status", status, "code", e.Code, "reason", e.Message}
	if e.cause != nil {
		attrs = append(attrs, "err", e.cause)
	}
	s.httpLog(c).Log(context.Background(), level, "request failed", attrs...)
}
