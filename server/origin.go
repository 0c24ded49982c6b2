package server

import (
	"mime"
	"net"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"
)

// What a browser may do to this server from another site's page.
//
// DNS rebinding: a page on evil.example whose name the attacker then
// points at 127.0.0.1 talks to a local server as its own origin, so the
// browser lets it read every answer. Its requests carry Host: evil.example
// (and WebSocket upgrades a matching Origin, which the Origin check lets
// through). Without auth nothing else stands in its way, so an anonymous
// server serves only Host names that no attacker can point at it:
// localhost, *.localhost (browsers resolve these themselves), IP addresses
// (a browser sends an IP as Host only after connecting to that IP, so the
// page came from it), and the --allow-host patterns. /healthz and /readyz
// stay open to any Host: they tell nothing, and probes use many names.
//
// CSRF: any page may send a cross-origin write "blind" (without reading
// the answer). PUT and DELETE, and any request with a JSON content type or
// an Authorization header, go through a CORS preflight first, which only
// --allow-origin origins pass. A POST with a form or text/plain body
// does not, and browsers send it with no token (so it works only against
// an anonymous server) but always with an Origin header. So:
//   - a write (any method but GET, HEAD, OPTIONS) whose Origin is present
//     and neither the request's own host nor allowed is refused (403),
//     with or without auth;
//   - a write that carries a body must say Content-Type: application/json
//     (415 otherwise): browsers preflight that type, and one rule for
//     every body is simpler to state than one for POST only.
// Clients that are not browsers send no Origin and are not affected.

// corsMaxAge is how long a browser may cache a preflight's answer, in
// seconds: short, so a changed --allow-origin applies soon.
const corsMaxAge = "600"

// originGuard checks Host, answers CORS preflights and refuses foreign
// writes, before routing.
func (s *Server) originGuard(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r, h := c.Request(), c.Response().Header()
		p := r.URL.Path
		if p == "/healthz" || p == "/readyz" {
			return next(c)
		}
		if !s.authEnabled() && !s.servedHost(r.Host) {
			return echo.NewHTTPError(http.StatusForbidden, "anonymous mode serves only loopback Host names, IP addresses and --allow-host patterns, not "+
				strconv.Quote(r.Host)+": configure auth to serve other names, or add the name with --allow-host")
		}
		origin := r.Header.Get(echo.HeaderOrigin)
		cors := isAPIPath(p)
		if cors {
			h.Add(echo.HeaderVary, echo.HeaderOrigin)
		}
		allowed := origin == "" || originAllowed(origin, r.Host, s.cfg.AllowOrigins)
		if cors && origin != "" && r.Method == http.MethodOptions && r.Header.Get(echo.HeaderAccessControlRequestMethod) != "" {
			if !allowed {
				return echo.NewHTTPError(http.StatusForbidden, "cross-origin requests from "+strconv.Quote(origin)+" are not allowed: start the server with --allow-origin")
			}
			h.Set(echo.HeaderAccessControlAllowOrigin, origin)
			h.Set(echo.HeaderAccessControlAllowMethods, "GET, HEAD, PUT, DELETE, POST")
			h.Set(echo.HeaderAccessControlAllowHeaders, "Authorization, Content-Type, If-Match, Idempotency-Key, Idempotency-Since, Last-Event-ID")
			h.Set(echo.HeaderAccessControlMaxAge, corsMaxAge)
			return c.NoContent(http.StatusNoContent)
		}
		if cors && origin != "" && allowed {
			// No Allow-Credentials: the API takes bearer tokens, not cookies.
			h.Set(echo.HeaderAccessControlAllowOrigin, origin)
			h.Set(echo.HeaderAccessControlExposeHeaders, "X-Statecast-Rev, X-Statecast-Epoch, Retry-After, WWW-Authenticate")
		}
		if isWriteMethod(r.Method) {
			if !allowed {
				return echo.NewHTTPError(http.StatusForbidden, "writes from Origin "+strconv.Quote(origin)+" are refused: start the server with --allow-origin to allow it")
			}
			if hasBody(r) && !isJSON(r.Header.Get(echo.HeaderContentType)) {
				return echo.NewHTTPError(http.StatusUnsupportedMediaType, "a request body must be sent with Content-Type: application/json")
			}
		}
		return next(c)
	}
}

// isAPIPath reports whether p is a route of the HTTP API, the ones CORS
// opens to allowed origins (not the WebSocket, which checks Origin at
// upgrade, nor the inspector).
func isAPIPath(p string) bool {
	return strings.HasPrefix(p, "/v1/") && p != "/v1/ws" && !strings.HasPrefix(p, "/v1/admin/")
}

func isWriteMethod(m string) bool {
	return m != http.MethodGet && m != http.MethodHead && m != http.MethodOptions
}

// hasBody reports whether r carries a body (or may: chunked).
func hasBody(r *http.Request) bool { return r.ContentLength != 0 }

func isJSON(contentType string) bool {
	if contentType == echo.MIMEApplicationJSON {
		return true // the usual one, without parsing it
	}
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == echo.MIMEApplicationJSON
}

// servedHost reports whether an anonymous server answers a request for
// hostport (see the top of this file).
func (s *Server) servedHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if host == "" {
		return false
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") || net.ParseIP(host) != nil {
		return true
	}
	for _, pat := range s.cfg.AllowHosts {
		if ok, _ := path.Match(strings.ToLower(pat), host); ok {
			return true
		}
	}
	return false
}

// originAllowed reports whether a request for host may come from origin:
// the same host, or one matching a pattern. The rule is the WebSocket
// library's (coder/websocket authenticateOrigin), so the WebSocket and the
// HTTP API agree: a pattern with "://" matches scheme://host, else host.
func originAllowed(origin, host string, patterns []string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false // "null" (sandboxed frames, file: pages) included
	}
	if strings.EqualFold(u.Host, host) {
		return true
	}
	for _, pat := range patterns {
		target := u.Host
		if strings.Contains(pat, "://") {
			target = u.Scheme + "://" + u.Host
		}
		if ok, _ := path.Match(strings.ToLower(pat), strings.ToLower(target)); ok {
			return true
		}
	}
	return false
}
