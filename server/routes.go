package server

import (
	"net/http"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/statecast/statecast/server/wire"
)

// routes builds the echo router: the WebSocket endpoint, the HTTP API,
// health, metrics and the static files.
func (s *Server) routes() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.httpError
	e.Pre(s.originGuard) // Host, CORS and foreign writes: before routing, for every route
	e.GET("/v1/ws", s.handleWS)
	s.apiRoutes(e.Group("/v1"))
	e.GET("/v1/admin/inspect", s.handleInspect)
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
	body := map[string]any{"error": map[string]any{"code": e.Code, "message": e.Message}}
	if e.Code == wire.CodeConflict {
		body["error"].(map[string]any)["key"] = e.Key
		body["error"].(map[string]any)["mod_rev"] = e.ModRev
		body["error"].(map[string]any)["rev"] = e.Rev
	}
	if c.Request().Method == http.MethodHead {
		_ = c.NoContent(status)
		return
	}
	_ = c.JSON(status, body)
}

// statusOf maps a protocol error code to its HTTP status.
func statusOf(e *Error) int {
	switch e.Code {
	case wire.CodeBadRequest, wire.CodeInvalidRoom, wire.CodeInvalidKey, wire.CodeInvalidValue:
		return http.StatusBadRequest
	case wire.CodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case wire.CodeConflict:
		return http.StatusPreconditionFailed
	case wire.CodeUnauthorized:
		return http.StatusUnauthorized
	case wire.CodeForbidden:
		return http.StatusForbidden
	case wire.CodeRateLimited:
		return http.StatusTooManyRequests
	case wire.CodeNotFound:
		return http.StatusNotFound
	case wire.CodeUnavailable:
		return http.StatusServiceUnavailable
	case wire.CodeOutcomeUnknown:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

func codeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusUnsupportedMediaType:
		return wire.CodeBadRequest
	case http.StatusUnauthorized:
		return wire.CodeUnauthorized
	case http.StatusForbidden:
		return wire.CodeForbidden
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		return wire.CodeNotFound
	case http.StatusRequestEntityTooLarge:
		return wire.CodeTooLarge
	case http.StatusTooManyRequests:
		return wire.CodeRateLimited
	case http.StatusServiceUnavailable:
		return wire.CodeUnavailable
	}
	return wire.CodeInternal
}
