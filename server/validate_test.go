package server_test

// The validation hook (server/validate.go, docs/HOOKS.md) against a real
// HTTP backend on loopback that verifies every request's signature.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store/redisstore"
	"github.com/statecast/statecast/store/redistest"
)

var hookSecret = []byte("test-hook-secret")

// hookBackend is an application backend: it checks each request's
// signature, records it, and answers what decide says.
type hookBackend struct {
	t      testing.TB
	srv    *httptest.Server
	decide func(req hooks.ValidateRequest) (status int, body string)

	mu   sync.Mutex
	reqs []hooks.ValidateRequest
}

func newHookBackend(t testing.TB, decide func(hooks.ValidateRequest) (int, string)) *hookBackend {
	b := &hookBackend{t: t, decide: decide}
	b.srv = httptest.NewServer(http.HandlerFunc(b.serve))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *hookBackend) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if err := hooks.VerifySignature(hookSecret, r.Header.Get(hooks.SignatureHeader), body, 0, time.Now()); err != nil {
		b.t.Errorf("the backend got a request it cannot trust: %v", err)
		http.Error(w, "bad signature", http.StatusForbidden)
		return
	}
	var req hooks.ValidateRequest
	if err := json.Unmarshal(body, &req); err != nil {
		b.t.Errorf("request %s: %v", body, err)
	}
	b.mu.Lock()
	b.reqs = append(b.reqs, req)
	b.mu.Unlock()
	status, reply := b.decide(req)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, reply)
}

func (b *hookBackend) requests() []hooks.ValidateRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]hooks.ValidateRequest(nil), b.reqs...)
}

const allow = `{"allow":true}`

// startValidated starts a node whose rooms game:* are validated by url.
func startValidated(t testing.TB, url string, timeout time.Duration) *servertest.Node {
	t.Helper()
	v, err := hooks.NewValidator(hooks.ValidatorConfig{
		Routes: hooks.Routes{{Pattern: "game:*", URL: url}}, Secret: hookSecret, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	return servertest.Start(t, servertest.Options{Server: server.Config{Validate: v}})
}

// codeOf is the code of a server's error reply, "" for anything else.
func codeOf(err error) string {
	var e *client.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// TestValidateAllow: an allowed write commits, over WebSocket and HTTP,
// and the backend saw its subject, room, ops and the current mod_revs;
// rooms no route covers are not sent.
func TestValidateAllow(t *testing.T) {
	b := newHookBackend(t, func(hooks.ValidateRequest) (int, string) { return 200, allow })
	n := startValidated(t, b.srv.URL, time.Second)
	ctx := servertest.Context(t)
	c := dial(t, n, nil)
	rev, err := c.Put(ctx, "game:1", "state", map[string]int{"turn": 1})
	if err != nil {
		t.Fatalf("WebSocket put: %v", err)
	}
	if _, err := n.HTTP.Put(ctx, "game:1", "state", json.RawMessage(`{"turn":2}`), nil, ""); err != nil {
		t.Fatalf("HTTP put: %v", err)
	}
	if _, err := c.Put(ctx, "lobby:1", "x", 1); err != nil {
		t.Fatal(err)
	}
	reqs := b.requests()
	if len(reqs) != 2 {
		t.Fatalf("the backend got %d requests, want 2 (lobby:1 is not validated): %+v", len(reqs), reqs)
	}
	first, second := reqs[0], reqs[1]
	if first.Room != "game:1" || len(first.Ops) != 1 || first.Ops[0].Type != "put" || first.Ops[0].Key != "state" ||
		string(first.Ops[0].Value) != `{"turn":1}` || first.ModRevs["state"] != 0 || first.Session == "" {
		t.Errorf("first request %+v: want a put of state from a WebSocket session, state absent", first)
	}
	if second.ModRevs["state"] != rev || second.Session != "" {
		t.Errorf("second request %+v: want state at mod_rev %d, over HTTP (no session)", second, rev)
	}
	it, _, err := n.HTTP.Get(ctx, "game:1", "state")
	if err != nil || string(it.Value) != `{"turn":2}` {
		t.Errorf("state = %s, %v; want the second write", it.Value, err)
	}
	if got := n.Counter("statecast_hook_validate_total", "outcome", "allow"); got != 2 {
		t.Errorf("allow count %v, want 2", got)
	}
}

// TestValidateRefuse: a refusal reaches the client as forbidden with the
// backend's message, on both surfaces, and nothing is written.
func TestValidateRefuse(t *testing.T) {
	b := newHookBackend(t, func(hooks.ValidateRequest) (int, string) {
		return 200, `{"allow":false,"message":"only the host may start the game"}`
	})
	n := startValidated(t, b.srv.URL, time.Second)
	ctx := servertest.Context(t)
	_, err := dial(t, n, nil).Delete(ctx, "game:1", "state")
	var e *client.Error
	if !errors.As(err, &e) || e.Code != wire.CodeForbidden || e.Message != "only the host may start the game" {
		t.Errorf("WebSocket: %v; want forbidden with the backend's message", err)
	}
	_, err = n.HTTP.Put(ctx, "game:1", "state", json.RawMessage(`1`), nil, "")
	if !errors.As(err, &e) || e.Code != wire.CodeForbidden || e.Status != http.StatusForbidden || e.Message != "only the host may start the game" {
		t.Errorf("HTTP: %v (%+v); want 403 forbidden with the backend's message", err, e)
	}
	if l, err := n.HTTP.List(ctx, "game:1", ""); err != nil || l.Rev != 0 {
		t.Errorf("room at %+v, %v: want nothing written", l, err)
	}
	if got := n.Counter("statecast_hook_validate_total", "outcome", "refuse"); got != 2 {
		t.Errorf("refuse count %v, want 2", got)
	}
}

// TestValidateUnavailable: a backend that answers too late, cannot be
// reached, fails or answers nonsense makes the write unavailable, and
// nothing is written.
func TestValidateUnavailable(t *testing.T) {
	release := make(chan struct{})
	slow := newHookBackend(t, func(hooks.ValidateRequest) (int, string) {
		<-release
		return 200, allow
	})
	t.Cleanup(func() { close(release) }) // before slow.srv.Close (cleanups run last first)
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	failing := newHookBackend(t, func(hooks.ValidateRequest) (int, string) { return 500, allow })
	nonsense := newHookBackend(t, func(hooks.ValidateRequest) (int, string) { return 200, `{"ok":true}` })
	for _, c := range []struct{ name, url string }{
		{"timeout", slow.srv.URL}, {"unreachable", gone.URL}, {"500", failing.srv.URL}, {"bad reply", nonsense.srv.URL},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := startValidated(t, c.url, 200*time.Millisecond)
			ctx := servertest.Context(t)
			start := time.Now()
			_, err := dial(t, n, nil).Put(ctx, "game:1", "k", 1)
			if codeOf(err) != wire.CodeUnavailable {
				t.Errorf("WebSocket: %v, want unavailable", err)
			}
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("the write took %v: the hook's timeout is 200ms", took)
			}
			_, err = n.HTTP.Put(ctx, "game:1", "k", json.RawMessage(`1`), nil, "")
			var e *client.Error
			if !errors.As(err, &e) || e.Code != wire.CodeUnavailable || e.Status != http.StatusServiceUnavailable {
				t.Errorf("HTTP: %v, want 503 unavailable", err)
			}
			if l, err := n.HTTP.List(ctx, "game:1", ""); err != nil || l.Rev != 0 {
				t.Errorf("room at %+v, %v: want nothing written", l, err)
			}
			if got := n.Counter("statecast_hook_validate_total", "outcome", "error"); got != 2 {
				t.Errorf("error count %v, want 2", got)
			}
		})
	}
}

// TestValidateRace: the backend allows a write only after another write
// changed the key it was asked about; the validated write must then fail
// conflict (it is conditional on the mod_rev the backend saw), so of the
// two writes exactly one commits.
func TestValidateRace(t *testing.T) {
	asked := make(chan struct{})
	proceed := make(chan struct{})
	b := newHookBackend(t, func(req hooks.ValidateRequest) (int, string) {
		if string(req.Ops[0].Value) == `"validated"` {
			close(asked)
			<-proceed
		}
		return 200, allow
	})
	n := startValidated(t, b.srv.URL, 5*time.Second)
	ctx := servertest.Context(t)
	if _, err := n.HTTP.Put(ctx, "game:1", "seat", json.RawMessage(`"free"`), nil, ""); err != nil {
		t.Fatal(err)
	}
	validated := make(chan error, 1)
	go func() {
		_, err := dial(t, n, nil).Put(ctx, "game:1", "seat", "validated")
		validated <- err
	}()
	select {
	case <-asked:
	case <-ctx.Done():
		t.Fatal("the backend was never asked")
	}
	other, err := n.HTTP.Put(ctx, "game:1", "seat", json.RawMessage(`"other"`), nil, "")
	if err != nil {
		t.Fatalf("the concurrent write: %v", err)
	}
	close(proceed)
	err = <-validated
	var e *client.Error
	if !errors.As(err, &e) || e.Code != wire.CodeConflict || e.Key != "seat" || e.ModRev != other {
		t.Errorf("the validated write: %v; want conflict on seat at mod_rev %d", err, other)
	}
	if it, _, err := n.HTTP.Get(ctx, "game:1", "seat"); err != nil || string(it.Value) != `"other"` || it.ModRev != other {
		t.Errorf("seat = %+v, %v; want only the other write committed", it, err)
	}
}

// TestValidateTxn: a transaction with the client's own condition and a
// session-leased put is sent with its conds, its ops as spelt ("session")
// and the mod_rev of every key; a condition that already fails is a
// conflict without asking the backend.
func TestValidateTxn(t *testing.T) {
	b := newHookBackend(t, func(hooks.ValidateRequest) (int, string) { return 200, allow })
	n := startValidated(t, b.srv.URL, time.Second)
	ctx := servertest.Context(t)
	base, err := n.HTTP.Put(ctx, "game:1", "turn", json.RawMessage(`1`), nil, "")
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, n, nil)
	conds := []wire.Cond{{Key: "turn", ModRev: base}}
	ops := []wire.TxnOp{{Type: "put", Key: "turn", Value: wire.Value(`2`)}, {Type: "put", Key: "me", Value: wire.Value(`"here"`), Lease: "session"}, {Type: "delete", Key: "gone"}}
	if _, err := c.Txn(ctx, "game:1", conds, ops); err != nil {
		t.Fatal(err)
	}
	reqs := b.requests()
	last := reqs[len(reqs)-1]
	want := map[string]uint64{"turn": base, "me": 0, "gone": 0}
	if len(last.Conds) != 1 || last.Conds[0] != (hooks.Cond{Key: "turn", ModRev: base}) || len(last.Ops) != 3 ||
		last.Ops[1].Lease != "session" || last.Ops[2].Type != "delete" || len(last.ModRevs) != 3 {
		t.Errorf("request %+v", last)
	}
	for k, v := range want {
		if last.ModRevs[k] != v {
			t.Errorf("mod_revs[%s] = %d, want %d", k, last.ModRevs[k], v)
		}
	}
	asked := len(b.requests())
	if _, err := c.Txn(ctx, "game:1", conds, ops); codeOf(err) != wire.CodeConflict {
		t.Errorf("txn on a changed key: %v, want conflict", err)
	}
	if len(b.requests()) != asked {
		t.Error("the backend was asked about a write whose own condition failed")
	}
}

// TestValidateWid: a resent write id that committed answers its original
// revision (dup) without asking the backend again, which would now
// refuse it.
func TestValidateWid(t *testing.T) {
	var mu sync.Mutex
	calls := 0
	b := newHookBackend(t, func(hooks.ValidateRequest) (int, string) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls > 1 {
			return 200, `{"allow":false,"message":"asked twice"}`
		}
		return 200, allow
	})
	n := startValidated(t, b.srv.URL, time.Second)
	put := func() (int, string) {
		req, _ := http.NewRequestWithContext(servertest.Context(t), http.MethodPut, n.TS.URL+"/v1/rooms/game:1/kv/k", strings.NewReader(`1`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "w-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(body))
	}
	if status, body := put(); status != 200 || body != `{"rev":1}` {
		t.Fatalf("first: %d %s", status, body)
	}
	if status, body := put(); status != 200 || body != `{"rev":1,"dup":true}` {
		t.Errorf("resent: %d %s, want the original revision, dup", status, body)
	}
	if len(b.requests()) != 1 {
		t.Errorf("the backend was asked %d times, want once", len(b.requests()))
	}
}

// TestValidateClientGone: a client that gives up while the backend
// thinks leaves nothing written.
func TestValidateClientGone(t *testing.T) {
	release := make(chan struct{})
	b := newHookBackend(t, func(hooks.ValidateRequest) (int, string) {
		<-release
		return 200, allow
	})
	t.Cleanup(func() { close(release) })
	n := startValidated(t, b.srv.URL, 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := n.HTTP.Put(ctx, "game:1", "k", json.RawMessage(`1`), nil, ""); err == nil {
		t.Fatal("the put returned before the backend answered")
	}
	waitFor(t, 5*time.Second, "the hook call to end", func() bool {
		return n.Counter("statecast_hook_validate_total", "outcome", "error") == 1
	})
	if l, err := n.HTTP.List(servertest.Context(t), "game:1", ""); err != nil || l.Rev != 0 {
		t.Errorf("room at %+v, %v: want nothing written", l, err)
	}
}

// TestValidateAcrossNodes: two nodes on one Redis validate game:* with
// one backend. A write held by the backend on node A loses to a write to
// the same key through node B (conflict); a write id committed through A
// and resent to B is answered dup without asking the backend again.
func TestValidateAcrossNodes(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t, redistest.Options{})
	ctx := servertest.Context(t)
	asked := make(chan struct{})
	proceed := make(chan struct{})
	b := newHookBackend(t, func(req hooks.ValidateRequest) (int, string) {
		if string(req.Ops[0].Value) == `"held"` {
			close(asked)
			<-proceed
		}
		return 200, allow
	})
	node := func() *servertest.Node {
		st, err := redisstore.New(ctx, redisstore.Config{URL: rs.URL(), Prefix: "vh"})
		if err != nil {
			t.Fatal(err)
		}
		v, err := hooks.NewValidator(hooks.ValidatorConfig{Routes: hooks.Routes{{Pattern: "game:*", URL: b.srv.URL}}, Secret: hookSecret})
		if err != nil {
			t.Fatal(err)
		}
		return servertest.Start(t, servertest.Options{Store: st, Server: server.Config{Validate: v}})
	}
	na, nb := node(), node()

	held := make(chan error, 1)
	go func() {
		_, err := dial(t, na, nil).Put(ctx, "game:1", "seat", "held")
		held <- err
	}()
	<-asked
	other, err := nb.HTTP.Put(ctx, "game:1", "seat", json.RawMessage(`"other"`), nil, "")
	if err != nil {
		t.Fatal(err)
	}
	close(proceed)
	var e *client.Error
	if err := <-held; !errors.As(err, &e) || e.Code != wire.CodeConflict || e.ModRev != other {
		t.Errorf("the held write on A: %v; want conflict at mod_rev %d", err, other)
	}

	wid := func(n *servertest.Node) string {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, n.TS.URL+"/v1/rooms/game:1/kv/k", strings.NewReader(`1`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "across-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return strings.TrimSpace(string(body))
	}
	first := wid(na)
	before := len(b.requests())
	if again := wid(nb); again != strings.TrimSuffix(first, "}")+`,"dup":true}` {
		t.Errorf("resent to B: %s, want %s with dup", again, first)
	}
	if len(b.requests()) != before {
		t.Error("the backend was asked about a resent write id that had committed")
	}
}
