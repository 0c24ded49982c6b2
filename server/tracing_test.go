package server_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/server/hooks/hookstest"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/store"
)

// headerLog keeps the traceparent of each request a handler saw.
type headerLog struct {
	mu  sync.Mutex
	got []string
}

func (h *headerLog) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		h.got = append(h.got, r.Header.Get("traceparent"))
		h.mu.Unlock()
		next.ServeHTTP(w, r)
	})
}

func (h *headerLog) all() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.got...)
}

// tracedNode starts a node tracing into rec, with a validation hook and a
// webhook on game:* rooms, whose requests' traceparents are logged.
func tracedNode(t *testing.T, rec *tracetest.SpanRecorder) (n *servertest.Node, validated, delivered *headerLog) {
	t.Helper()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	validated, delivered = &headerLog{}, &headerLog{}
	backend := newHookBackend(t, func(hooks.ValidateRequest) (int, string) { return 200, allow })
	front := httptest.NewServer(validated.wrap(http.HandlerFunc(backend.serve)))
	t.Cleanup(front.Close)
	v, err := hooks.NewValidator(hooks.ValidatorConfig{Routes: hooks.Routes{{Pattern: "game:*", URL: front.URL}}, Secret: hookSecret, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte("s")
	receiver := httptest.NewServer(delivered.wrap(&hookstest.Receiver{Secret: secret}))
	t.Cleanup(receiver.Close)
	st := store.NewMemory(store.MemoryConfig{})
	wh, err := hooks.New(st, hooks.Config{Hooks: []hooks.Route{{Pattern: "game:*", URL: receiver.URL}}, Secret: secret, Node: "n1", TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	n = servertest.Start(t, servertest.Options{Store: st, Rooms: rooms.Config{BeforeApply: wh.BeforeApply},
		Server: server.Config{Validate: v, Webhooks: wh, TracerProvider: tp}})
	if err := wh.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wh.Close)
	return n, validated, delivered
}

// spanNamed returns the one ended span called name, failing the test
// when there is not exactly one.
func spanNamed(t *testing.T, rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		var names []string
		for _, s := range rec.Ended() {
			names = append(names, s.Name())
		}
		t.Fatalf("%d spans named %q; ended spans: %v", len(found), name, names)
	}
	return found[0]
}

// waitSpan waits until a span called name has ended.
func waitSpan(t *testing.T, rec *tracetest.SpanRecorder, name string) {
	t.Helper()
	waitFor(t, 10*time.Second, "a span "+name, func() bool {
		for _, s := range rec.Ended() {
			if s.Name() == name {
				return true
			}
		}
		return false
	})
}

// wantChild checks that child is a child of parent in parent's trace.
func wantChild(t *testing.T, child, parent sdktrace.ReadOnlySpan) {
	t.Helper()
	if child.Parent().SpanID() != parent.SpanContext().SpanID() || child.SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Errorf("span %q: parent %s in trace %s, want %q's span %s in trace %s", child.Name(),
			child.Parent().SpanID(), child.SpanContext().TraceID(), parent.Name(), parent.SpanContext().SpanID(), parent.SpanContext().TraceID())
	}
}

// wantTraceparent checks that a request carried sc as its parent.
func wantTraceparent(t *testing.T, what string, got []string, sc trace.SpanContext) {
	t.Helper()
	want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
	for _, g := range got {
		if g == want {
			return
		}
	}
	t.Errorf("%s: traceparents %q, want one %s", what, got, want)
}

// TestTraceHTTPWrite: an HTTP write continues the trace of its
// traceparent: its span is the incoming span's child, the store's apply,
// the validation hook's call and the webhook's delivery are its
// children, and the hook's and the webhook's requests carry their spans
// as traceparent.
func TestTraceHTTPWrite(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	n, validated, delivered := tracedNode(t, rec)
	const incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	req, err := http.NewRequest(http.MethodPut, n.TS.URL+"/v1/rooms/game:1/kv/k", strings.NewReader(`1`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", incoming)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT: %s", resp.Status)
	}
	waitSpan(t, rec, "webhook.deliver")

	put := spanNamed(t, rec, "PUT /v1/rooms/:room/kv/*")
	if put.SpanKind() != trace.SpanKindServer || put.Parent().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" ||
		put.Parent().SpanID().String() != "00f067aa0ba902b7" || !put.Parent().IsRemote() {
		t.Errorf("HTTP span: kind %v, parent %+v: want a server span continuing %s", put.SpanKind(), put.Parent(), incoming)
	}
	apply, hook, deliver := spanNamed(t, rec, "store.apply"), spanNamed(t, rec, "hook.validate"), spanNamed(t, rec, "webhook.deliver")
	for _, child := range []sdktrace.ReadOnlySpan{apply, hook, deliver} {
		wantChild(t, child, put)
	}
	wantTraceparent(t, "validation hook", validated.all(), hook.SpanContext())
	wantTraceparent(t, "webhook", delivered.all(), deliver.SpanContext())
}

// TestTraceWebSocketWrite: a WebSocket write is a span of its own (its
// connect another), with the store's apply and the validation hook's
// call as children.
func TestTraceWebSocketWrite(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	n, validated, _ := tracedNode(t, rec)
	c := dial(t, n, nil)
	if _, err := c.Put(servertest.Context(t), "game:2", "k", 1); err != nil {
		t.Fatal(err)
	}
	waitSpan(t, rec, "ws put")
	spanNamed(t, rec, "ws connect")
	put := spanNamed(t, rec, "ws put")
	if put.SpanKind() != trace.SpanKindServer || put.Parent().IsValid() {
		t.Errorf("ws put: kind %v, parent %+v: want a server span of a trace of its own", put.SpanKind(), put.Parent())
	}
	hook := spanNamed(t, rec, "hook.validate")
	wantChild(t, spanNamed(t, rec, "store.apply"), put)
	wantChild(t, hook, put)
	wantTraceparent(t, "validation hook", validated.all(), hook.SpanContext())
}

// TestTraceOffByDefault: a node without a tracer provider sends no
// traceparent to its hooks, even for a request that carried one.
func TestTraceOffByDefault(t *testing.T) {
	var validated headerLog
	backend := newHookBackend(t, func(hooks.ValidateRequest) (int, string) { return 200, allow })
	front := httptest.NewServer(validated.wrap(http.HandlerFunc(backend.serve)))
	defer front.Close()
	n := startValidated(t, front.URL, 5*time.Second)
	req, _ := http.NewRequest(http.MethodPut, n.TS.URL+"/v1/rooms/game:1/kv/k", strings.NewReader(`1`))
	req.Header.Set("Content-Type", "application/json")
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})), propagation.HeaderCarrier(req.Header))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := validated.all(); len(got) != 1 || got[0] != "" {
		t.Errorf("traceparents sent to the hook: %q, want one request without", got)
	}
}
