package server

import (
	"net/http"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/statecast/statecast/server/wire"
)

// routes builds the echo router: the WebSocket endpoint, the HTTP API
// and its description (openapi.json), health, metrics and the static
// files.
func (s *Server) routes() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.httpError
	e.Pre(s.originGuard) // Host, CORS and foreign writes: before routing, for every route
	if s.tracer != nil {
		e.Use(s.traceHTTP) // after routing: the span is named by the route
	}
	e.GET("/v1/ws", s.handleWS)
	s.apiRoutes(e.Group("/v1"))
	e.GET("/v1/admin/inspect", s.handleInspect)
	e.GET("/v1/admin/backup", s.handleBackup)
	e.GET("/v1/openapi.json", handleOpenAPI)
	e.GET("/healthz", func(c echo.Context) error { return c.String(http.StatusOK, "ok\n") })
	e.GET("/readyz", func(c echo.Context) error {
		if s.draining.Load() {
			return c.String(http.StatusServiceUnavailable, "shutting down\n")
		}
		return c.String(http.StatusOK, "ready\n")
	})
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(s.cfg.Gatherer, promhttp.HandlerOpts{})))
	if s.cfg.Static != nil {
		e.GET("/*", echo.WrapHandler(s.cfg.Static))
	}
	return e
}

// httpError writes every HTTP error as {"error":{"code","message"}}.
func (s *Server) httpError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	status, e := http.StatusInternalServerError, errorOf(err, false)
	var he *echo.HTTPError
	if asHTTPError(err, &he) {
		status = he.Code
		e = &Error{Code: codeForStatus(status), Message: http.StatusText(status)}
		if msg, ok := he.Message.(string); ok {
			e.Message = msg
		}
	} else {
		status = statusOf(e)
	}
	s.logHTTPFailure(c, status, e)
	body := map[string]any{"error": map[string]any{"code": e.Code, "message": e.Message}}
	if e.Line > 0 {
		body["error"].(map[string]any)["line"] = e.Line
		body["error"].(map[string]any)["column"] = e.Column
	}
	if e.Code == wire.CodeConflict {
		if e.Epoch != "" {
			// Its revisions are of this epoch: a client tells them from the
			// same numbers of another (PROTOCOL.md, continuity or reset).
			setPosition(c, e.Epoch, e.Rev)
		}
		body["error"].(map[string]any)["key"] = e.Key
		body["error"].(map[string]any)["mod_rev"] = e.ModRev
		body["error"].(map[string]any)["rev"] = e.Rev
	}
	if e.Code == wire.CodeWidReused {
		body["error"].(map[string]any)["rev"] = e.Rev
	}
	// Every 429 says when to retry; one not from the write rate (the
	// validation hook's bound) after a second.
	if status == http.StatusTooManyRequests && c.Response().Header().Get("Retry-After") == "" {
		c.Response().Header().Set("Retry-After", "1")
	}
	if c.Request().Method == http.MethodHead {
		_ = c.NoContent(status)
		return
	}
	_ = c.JSON(status, body)
}

// errorStatuses is the one table of error codes and HTTP statuses. An
// error answers with its code's first status (statusOf); an error raised
// with a status (by the router, a middleware or the WebSocket upgrade)
// gets that status's first code (codeForStatus). Codes not listed are
// 500s.
var errorStatuses = []struct {
	code   string
	status int
}{
	{wire.CodeBadRequest, http.StatusBadRequest},
	{wire.CodeInvalidRoom, http.StatusBadRequest},
	{wire.CodeInvalidKey, http.StatusBadRequest},
	{wire.CodeInvalidValue, http.StatusBadRequest},
	{wire.CodeInvalidFilter, http.StatusBadRequest},
	{wire.CodeBadRequest, http.StatusUnsupportedMediaType},
	{wire.CodeUnauthorized, http.StatusUnauthorized},
	{wire.CodeForbidden, http.StatusForbidden},
	{wire.CodeNotFound, http.StatusNotFound},
	{wire.CodeNotFound, http.StatusMethodNotAllowed},
	{wire.CodeConflict, http.StatusPreconditionFailed},
	{wire.CodeWidReused, http.StatusUnprocessableEntity},
	{wire.CodeTooLarge, http.StatusRequestEntityTooLarge},
	{wire.CodeQuotaExceeded, http.StatusInsufficientStorage},
	{wire.CodeRateLimited, http.StatusTooManyRequests},
	{wire.CodeTooManySubs, http.StatusTooManyRequests},
	{wire.CodeInternal, http.StatusInternalServerError},
	{wire.CodeUnavailable, http.StatusServiceUnavailable},
	{wire.CodeOutcomeUnknown, http.StatusGatewayTimeout},
}

// statusOf maps a protocol error code to its HTTP status.
func statusOf(e *Error) int {
	for _, row := range errorStatuses {
		if row.code == e.Code {
			return row.status
		}
	}
	return http.StatusInternalServerError
}

// codeForStatus maps an HTTP status to its protocol error code.
func codeForStatus(status int) string {
	for _, row := range errorStatuses {
		if row.status == status {
			return row.code
		}
	}
	return wire.CodeInternal
}
