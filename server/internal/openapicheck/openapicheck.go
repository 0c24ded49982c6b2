// Package openapicheck checks HTTP exchanges against an OpenAPI 3.1
// description: Handler, in front of a test server, checks every request it
// serves and its answer, and fails the test on a mismatch. It is what
// servertest.CheckOpenAPI runs, in a package of its own because the
// internal tests of package server need it too and cannot import
// servertest, which imports server.
//
// Beside OpenAPI it reads two extensions of statecast's openapi.json:
// x-multi-segment on a path parameter (it takes the rest of the path, '/'
// included) and x-sse-events on a text/event-stream answer (the name of
// each event and the schema of its data).
package openapicheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
)

func init() {
	openapi3filter.RegisterBodyDecoder("text/event-stream", openapi3filter.PlainBodyDecoder)
}

// Loader returns a function that loads and validates spec the first time
// it is called, and fails t when spec is not a valid OpenAPI 3.1
// document.
func Loader(spec []byte) func(t testing.TB) *openapi3.T {
	load := sync.OnceValues(func() (*openapi3.T, error) {
		loader := openapi3.NewLoader()
		doc, err := loader.LoadFromData(spec)
		if err != nil {
			return nil, err
		}
		if err := doc.Validate(loader.Context); err != nil {
			return nil, fmt.Errorf("openapi.json is not a valid OpenAPI document: %w", err)
		}
		if !doc.IsOpenAPI31OrLater() {
			return nil, errors.New("openapi.json is not OpenAPI 3.1")
		}
		return doc, nil
	})
	return func(t testing.TB) *openapi3.T {
		t.Helper()
		doc, err := load()
		if err != nil {
			t.Fatal(err)
		}
		return doc
	}
}

// Find finds the operation method and rawPath (as sent: still escaped)
// name, and its path parameters, decoded once as the server decodes them.
// A parameter with x-multi-segment takes the rest of the path, '/'
// included.
func Find(doc *openapi3.T, method, rawPath string) (*routers.Route, map[string]string, bool) {
	segs := strings.Split(rawPath, "/")
	for tmpl, item := range doc.Paths.Map() {
		op := item.GetOperation(method)
		if op == nil {
			continue
		}
		if params, ok := matchPath(item, strings.Split(tmpl, "/"), segs); ok {
			return &routers.Route{Spec: doc, Path: tmpl, PathItem: item, Method: method, Operation: op}, params, true
		}
	}
	return nil, nil, false
}

func matchPath(item *openapi3.PathItem, tmpl, segs []string) (map[string]string, bool) {
	params := map[string]string{}
	for i, t := range tmpl {
		if i >= len(segs) {
			return nil, false
		}
		name, isParam := strings.CutPrefix(t, "{")
		if !isParam {
			if t != segs[i] {
				return nil, false
			}
			continue
		}
		name = strings.TrimSuffix(name, "}")
		v := segs[i]
		if p := item.Parameters.GetByInAndName("path", name); p != nil && p.Extensions["x-multi-segment"] == true && i == len(tmpl)-1 {
			v = strings.Join(segs[i:], "/")
			segs = segs[:i+1]
		}
		if u, err := url.PathUnescape(v); err == nil {
			v = u
		}
		params[name] = v
	}
	return params, len(tmpl) == len(segs)
}

// exchange is one request as the handler read it and its answer.
type exchange struct {
	req    *http.Request
	body   []byte // the request body, as far as the handler read it
	status int
	header http.Header
	resp   []byte // the answer's body, up to maxChecked bytes
	cut    bool   // the answer was longer
}

// checkOpenAPI checks x against the description: a request to an
// operation is valid, or refused (4xx); an answer is one the operation
// documents, its headers and body included; a request that matches no
// operation is refused as a route that does not exist (or answered by
// the middleware that precedes routing: CORS, Host and Origin checks).
func checkOpenAPI(doc *openapi3.T, x exchange) error {
	ctx := context.Background()
	if x.req.Method == http.MethodOptions {
		if x.status != http.StatusNoContent && !isRefusal(x.status) {
			return fmt.Errorf("OPTIONS answered %d, want 204 or a refusal", x.status)
		}
		return nil
	}
	route, params, ok := Find(doc, x.req.Method, x.req.URL.EscapedPath())
	if !ok {
		switch {
		case !isRefusal(x.status):
			return fmt.Errorf("no operation in openapi.json, yet answered %d", x.status)
		case x.req.Method == http.MethodHead:
			return nil // a HEAD answer has no body
		}
		return checkSchema(doc, "Error", x.resp)
	}
	req := x.req.Clone(ctx)
	req.Body = io.NopCloser(bytes.NewReader(x.body))
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	if err := openapi3filter.ValidateRequest(ctx, in); err != nil && x.status < 400 {
		return fmt.Errorf("a request openapi.json does not allow was answered %d: %w", x.status, err)
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: x.status, Header: x.header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, ExcludeResponseBody: x.cut && !isEventStream(x.header)}}
	out.SetBodyBytes(x.resp)
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		return fmt.Errorf("%s %s answered %d: %w", route.Method, route.Path, x.status, err)
	}
	if isEventStream(x.header) {
		return checkEvents(doc, route.Operation.Responses.Status(x.status).Value, x.resp)
	}
	return nil
}

// isRefusal reports whether status is one a request to no operation may
// get: no such route or method, or refused before routing.
func isRefusal(status int) bool {
	return slices.Contains([]int{http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusUnsupportedMediaType}, status)
}

func isEventStream(h http.Header) bool {
	return strings.HasPrefix(h.Get("Content-Type"), "text/event-stream")
}

// checkSchema checks a JSON body against a schema of the components.
func checkSchema(doc *openapi3.T, name string, body []byte) error {
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("body %.200q is not JSON: %w", body, err)
	}
	if err := doc.Components.Schemas[name].Value.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
		return fmt.Errorf("body %.200s is not a %s: %w", body, name, err)
	}
	return nil
}

// checkEvents checks each whole Server-Sent Event of stream: its name is
// one of the response's x-sse-events and its data that event's schema.
func checkEvents(doc *openapi3.T, resp *openapi3.Response, stream []byte) error {
	events, _ := resp.Extensions["x-sse-events"].(map[string]any)
	blocks := strings.Split(string(stream), "\n\n")
	for _, block := range blocks[:len(blocks)-1] { // the last is cut or empty
		var name, data string
		for line := range strings.SplitSeq(block, "\n") {
			if v, ok := strings.CutPrefix(line, "event: "); ok {
				name = v
			}
			if v, ok := strings.CutPrefix(line, "data: "); ok {
				data = v
			}
		}
		if name == "" && data == "" {
			continue // a comment: keep-alive
		}
		ref, _ := events[name].(map[string]any)["$ref"].(string)
		schema, ok := strings.CutPrefix(ref, "#/components/schemas/")
		if !ok {
			return fmt.Errorf("event %q is not in x-sse-events", name)
		}
		if err := checkSchema(doc, schema, []byte(data)); err != nil {
			return fmt.Errorf("event %s: %w", name, err)
		}
	}
	return nil
}

// maxChecked bounds the answer body kept for the check: a longer JSON
// answer is checked without its body, a longer stream up to there.
const maxChecked = 4 << 20

// Handler serves h, checking every request and answer against doc
// (checkOpenAPI); a mismatch fails t.
func Handler(t testing.TB, doc *openapi3.T, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := &teeBody{ReadCloser: r.Body}
		r.Body = body
		rec := &answerRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		if rec.status == 0 && r.Context().Err() != nil {
			return // the client went away before any answer
		}
		x := exchange{req: r, body: body.read.Bytes(), status: rec.status, header: rec.header, resp: rec.body.Bytes(), cut: rec.cut}
		if x.status == 0 {
			x.status, x.header = http.StatusOK, w.Header().Clone()
		}
		if err := checkOpenAPI(doc, x); err != nil {
			t.Errorf("%s %s: %v", r.Method, r.URL.RequestURI(), err)
		}
	})
}

// teeBody keeps what the handler reads of a request body.
type teeBody struct {
	io.ReadCloser
	read bytes.Buffer
}

func (b *teeBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.read.Write(p[:n])
	return n, err
}

// answerRecorder passes an answer through and keeps its status, headers
// and body. Flush, Hijack and deadlines reach the connection through
// Unwrap.
type answerRecorder struct {
	http.ResponseWriter
	status int
	header http.Header
	body   bytes.Buffer
	cut    bool
}

func (a *answerRecorder) Unwrap() http.ResponseWriter { return a.ResponseWriter }

func (a *answerRecorder) WriteHeader(status int) {
	if a.status == 0 {
		a.status, a.header = status, a.ResponseWriter.Header().Clone()
	}
	a.ResponseWriter.WriteHeader(status)
}

func (a *answerRecorder) Write(p []byte) (int, error) {
	if a.status == 0 {
		a.WriteHeader(http.StatusOK)
	}
	if a.body.Len()+len(p) > maxChecked {
		a.cut = true
	} else {
		a.body.Write(p)
	}
	return a.ResponseWriter.Write(p)
}
