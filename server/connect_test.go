package server_test

// The connect hook (server/connect.go): a client without a token is
// authenticated by the application's backend from its own cookie, and
// the grants it returns are enforced like a token's.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
)

// sessionBackend knows one session cookie, sid=s-alice, for alice, who
// may write her own document room; it refuses every other caller.
func sessionBackend(t *testing.T) (*httptest.Server, *atomic.Int32) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		if err := hooks.VerifySignature(hookSecret, r.Header.Get(hooks.SignatureHeader), body, 0, time.Now()); err != nil {
			t.Errorf("connect hook request: %v", err)
		}
		var req hooks.ConnectRequest
		if err := json.Unmarshal(body, &req); err != nil || (req.Transport != "websocket" && req.Transport != "http") || req.Addr == "" {
			t.Errorf("connect hook body %s", body)
		}
		if c, err := r.Cookie("sid"); err != nil || c.Value != "s-alice" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		_, _ = io.WriteString(w, `{"subject":"alice","expires_in":60,
			"grants":[{"room":"doc:{sub}","access":"rw"},{"room":"doc:*","access":"r"}]}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

func startConnectHooked(t *testing.T, url string) *servertest.Node {
	t.Helper()
	ch, err := hooks.NewConnector(hooks.ConnectorConfig{URL: url, Secret: hookSecret, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return servertest.Start(t, servertest.Options{Server: server.Config{Connect: ch}})
}

// TestConnectHookWebSocket: the upgrade's cookie lets alice in with the
// backend's grants (her room only); no cookie is refused like a bad
// token (4501); a backend that does not answer is 1013, try again.
func TestConnectHookWebSocket(t *testing.T) {
	srv, calls := sessionBackend(t)
	n := startConnectHooked(t, srv.URL)
	ctx := servertest.Context(t)
	c := dial(t, n, &client.Options{HTTPHeader: http.Header{"Cookie": {"sid=s-alice"}}})
	if ms := c.Connected().ExpiresMS; ms <= 0 || ms > 60_000 {
		t.Errorf("expires_ms %d, want the hook's 60 s", ms)
	}
	if _, err := c.Put(ctx, "doc:alice", "title", "mine"); err != nil {
		t.Errorf("alice writing her room: %v", err)
	}
	if _, err := c.Put(ctx, "doc:bob", "title", "mine"); codeOf(err) != wire.CodeForbidden {
		t.Errorf("alice writing bob's room: %v, want forbidden", err)
	}
	if calls.Load() != 1 {
		t.Errorf("the backend was asked %d times, want once per connection", calls.Load())
	}
	for _, h := range []http.Header{nil, {"Cookie": {"sid=forged"}}} {
		if _, err := client.Dial(ctx, n.WS, &client.Options{HTTPHeader: h}); client.CloseCode(err) != int(wire.CloseUnauthorized) {
			t.Errorf("cookie %v: %v, want close 4501", h, err)
		}
	}
	srv.Close()
	if _, err := client.Dial(ctx, n.WS, &client.Options{HTTPHeader: http.Header{"Cookie": {"sid=s-alice"}}}); client.CloseCode(err) != 1013 {
		t.Errorf("backend down: %v, want close 1013 (try again later)", err)
	}
	for outcome, want := range map[string]float64{"allow": 1, "refuse": 2, "error": 1} {
		if got := n.Counter("statecast_hook_connect_total", "outcome", outcome); got != want {
			t.Errorf("connect hook %s count %v, want %v", outcome, got, want)
		}
	}
}

// TestConnectHookHTTP: the same over HTTP: alice's cookie writes her
// room, not bob's; no cookie is 401; a backend down is 503.
func TestConnectHookHTTP(t *testing.T) {
	srv, _ := sessionBackend(t)
	n := startConnectHooked(t, srv.URL)
	ctx := servertest.Context(t)
	alice := &client.HTTP{URL: n.TS.URL, Client: &http.Client{Transport: cookieTransport{n.TS.Client().Transport, "sid=s-alice"}}}
	if _, err := alice.Put(ctx, "doc:alice", "title", json.RawMessage(`"mine"`), nil, ""); err != nil {
		t.Errorf("alice writing her room: %v", err)
	}
	var e *client.Error
	if _, err := alice.Put(ctx, "doc:bob", "title", json.RawMessage(`"mine"`), nil, ""); !errors.As(err, &e) || e.Status != http.StatusForbidden {
		t.Errorf("alice writing bob's room: %v, want 403", err)
	}
	if _, err := n.HTTP.List(ctx, "doc:alice", ""); !errors.As(err, &e) || e.Status != http.StatusUnauthorized {
		t.Errorf("no cookie: %v, want 401", err)
	}
	srv.Close()
	if _, err := alice.List(ctx, "doc:alice", ""); !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable {
		t.Errorf("backend down: %v, want 503", err)
	}
}

// cookieTransport sends cookie with every request.
type cookieTransport struct {
	next   http.RoundTripper
	cookie string
}

func (c cookieTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Cookie", c.cookie)
	return c.next.RoundTrip(r)
}

// TestALateConnectLeavesTheSessionToTheNewerOne: a resume waits on the
// connect hook; its client gives up on it and resumes on another socket,
// getting a new secret; then the hook answers the first. Its resume
// presents the secret the newer one already rotated: it must not take
// the session back (it did: the newer socket was closed as replaced and
// the client's secret was void, so its session ended with its keys).
func TestALateConnectLeavesTheSessionToTheNewerOne(t *testing.T) {
	ch, asked, answer := heldHook(t, 2) // the first resume's
	var logs syncBuffer
	n := servertest.Start(t, servertest.Options{Server: server.Config{Connect: ch, LeaseGrace: time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}})
	ctx := servertest.Context(t)
	c := dial(t, n, nil)
	if _, err := c.Put(ctx, "lobby", "presence/alice", 1, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	first := c.Connected()
	_ = c.Close()

	gaveUp, giveUp := context.WithCancel(ctx)
	dialed := make(chan error, 1)
	go func() {
		c, err := client.Dial(gaveUp, n.WS, &client.Options{Session: first.Session, Resume: first.Resume})
		if err == nil {
			_ = c.Close()
		}
		dialed <- err
	}()
	waitFor(t, 5*time.Second, "the connect hook to be asked", func() bool { return asked.Load() == 2 })
	giveUp()
	if err := <-dialed; err == nil {
		t.Fatal("the resume given up on: connected")
	}
	c = dial(t, n, &client.Options{Session: first.Session, Resume: first.Resume})
	defer c.Close()
	second := c.Connected()
	if !second.Resumed {
		t.Fatalf("the second resume: %+v, want resumed", second)
	}
	close(answer)
	waitFor(t, 5*time.Second, "the late connect's outcome", func() bool {
		select {
		case <-c.Done():
			return true
		default:
			return strings.Contains(logs.String(), "not taking it back")
		}
	})
	select {
	case <-c.Done():
		t.Fatalf("the newer socket was closed: %v", c.Err())
	default:
	}
	_ = c.Close()
	c = dial(t, n, &client.Options{Session: second.Session, Resume: second.Resume})
	if got := c.Connected(); !got.Resumed || got.Session != first.Session {
		t.Fatalf("resuming with the newer secret: %+v, want session %s resumed", got, first.Session)
	}
	if l, err := n.HTTP.List(ctx, "lobby", ""); err != nil || len(l.Items) != 1 {
		t.Fatalf("the session's key: %+v, %v; want it kept", l, err)
	}
}
