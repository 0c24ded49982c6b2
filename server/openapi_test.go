package server

// The HTTP API's description, openapi.json, checked against the server:
// every route of the router is an operation of it and every operation a
// route. Every request the tests send to a test server, with its answer,
// is checked against it too (openapicheck.Handler, which newAPIEnv and
// servertest.Start put in front of their servers).

import (
	"bytes"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/statecast/statecast/server/internal/openapicheck"
)

// loadOpenAPI returns openapi.json, loaded and validated once.
var loadOpenAPI = openapicheck.Loader(openAPI)

// TestOpenAPIDescribesEveryRoute: the router's routes and the
// description's operations are the same set, and the served document is
// the committed file.
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	doc := loadOpenAPI(t)
	e := newAPIEnv(t, apiOpts{}) // no static files: their "/*" is not an API route
	routes := e.srv.routes().Routes()
	for _, r := range routes {
		if _, _, ok := openapicheck.Find(doc, r.Method, samplePath(r.Path)); !ok {
			t.Errorf("route %s %s is not in openapi.json", r.Method, r.Path)
		}
	}
	for tmpl, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			p := samplePath(tmpl)
			if !slices.ContainsFunc(routes, func(r *echo.Route) bool { return r.Method == method && routePattern(r.Path).MatchString(p) }) {
				t.Errorf("openapi.json has %s %s, which the router does not", method, tmpl)
			}
		}
	}
	r := e.do(t, "GET", "/v1/openapi.json", "").want(t, 200, nil)
	if !bytes.Equal(r.body, openAPI) || r.header.Get("Content-Type") != "application/json" {
		t.Errorf("GET /v1/openapi.json: %s, %d bytes; want the committed file as application/json", r.header.Get("Content-Type"), len(r.body))
	}
}

// samplePath fills a route's parameters (echo's :name and *, or the
// description's {name}) with sample values.
func samplePath(p string) string {
	return regexp.MustCompile(`:[a-z]+|\{[a-z]+\}|\*`).ReplaceAllString(p, "x")
}

// routePattern matches the paths an echo route serves.
func routePattern(p string) *regexp.Regexp {
	q := regexp.QuoteMeta(p)
	q = regexp.MustCompile(`:[a-z]+`).ReplaceAllString(q, `[^/]+`)
	return regexp.MustCompile("^" + strings.ReplaceAll(q, `\*`, ".*") + "$")
}
