package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/server/wire"
)

// TestServeValidationHook: the real binary with --hook-validate and a
// secret file asks a backend on loopback, which verifies the signature,
// about every write to game:* rooms: a refusal reaches the client as
// forbidden with the backend's message and writes nothing, an allowed
// write commits, /metrics counts both. The lobby demo's own backend
// (--demo-hooks, on by default) lets only a game's host close it.
func TestServeValidationHook(t *testing.T) {
	secret := []byte("e2e-hook-secret")
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := hooks.VerifySignature(secret, r.Header.Get(hooks.SignatureHeader), body, 0, time.Now()); err != nil {
			t.Errorf("backend: %v", err)
			w.WriteHeader(http.StatusForbidden)
			return
		}
		var req hooks.ValidateRequest
		_ = json.Unmarshal(body, &req)
		if req.Ops[0].Type == "delete" {
			_, _ = io.WriteString(w, `{"allow":false,"message":"the game is not over"}`)
			return
		}
		_, _ = io.WriteString(w, `{"allow":true}`)
	}))
	defer backend.Close()
	file := filepath.Join(t.TempDir(), "hook-secret")
	if err := os.WriteFile(file, append(secret, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	n := &mnNode{name: "hooks", redisURL: "memory", extra: []string{
		"--hook-validate", "game:*=" + backend.URL, "--hook-secret-file", file, "--hook-timeout", "1s"}}
	n.start(t)
	t.Cleanup(n.stop)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	h := &client.HTTP{URL: n.HTTP()}
	if _, err := h.Put(ctx, "game:1", "state", json.RawMessage(`"playing"`), nil, ""); err != nil {
		t.Fatalf("allowed put: %v", err)
	}
	var e *client.Error
	if _, err := h.Delete(ctx, "game:1", "state", nil); !errors.As(err, &e) || e.Status != http.StatusForbidden || e.Message != "the game is not over" {
		t.Errorf("refused delete: %v, want 403 with the backend's message", err)
	}
	if it, _, err := h.Get(ctx, "game:1", "state"); err != nil || string(it.Value) != `"playing"` {
		t.Errorf("state = %s, %v; want it still there", it.Value, err)
	}
	for outcome, want := range map[string]float64{"allow": 1, "refuse": 1} {
		if got, err := n.metric(`statecast_hook_validate_total{outcome="` + outcome + `"}`); err != nil || got != want {
			t.Errorf("%s: %v, %v; want %v", outcome, got, err, want)
		}
	}

	// The lobby demo: Ann hosts a game, Ben may not close it, Ann may.
	ann, err := client.Dial(ctx, n.WS(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ann.CloseNow()
	ben, err := client.Dial(ctx, n.WS(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ben.CloseNow()
	gameValue := map[string]string{"name": "Dune", "host": "Ann", "hostSession": ann.Connected().Session}
	if _, err := ann.Put(ctx, "lobby:demo", "games/g1", gameValue, client.WithLease("session")); err != nil {
		t.Fatalf("Ann creating her game: %v", err)
	}
	if _, err := ben.Delete(ctx, "lobby:demo", "games/g1"); !errors.As(err, &e) || e.Code != wire.CodeForbidden || e.Message != "Only the host, Ann, may close “Dune”." {
		t.Errorf("Ben closing Ann's game: %v, want forbidden with the lobby backend's message", err)
	}
	if _, err := ben.Put(ctx, "lobby:demo", "games/g2", gameValue); !errors.As(err, &e) || e.Code != wire.CodeForbidden || !strings.Contains(e.Message, "hostSession") {
		t.Errorf("Ben creating a game in Ann's name: %v, want forbidden", err)
	}
	if _, err := ann.Delete(ctx, "lobby:demo", "games/g1"); err != nil {
		t.Errorf("Ann closing her game: %v", err)
	}
}

// The hook flags are checked before the node serves: a hook without a
// secret to sign with, or a route that is not PATTERN=URL, is an error.
func TestServeHookFlags(t *testing.T) {
	for want, f := range map[string]serveFlags{
		"secret":   {hookValidate: []string{"game:*=http://127.0.0.1:9/v"}},
		"secret ":  {hookConnect: "http://127.0.0.1:9/c"},
		"PATTERN=": {hookValidate: []string{"game:*"}, hookSecret: "s"},
	} {
		f.addr, f.storeURL, f.history = "127.0.0.1:0", "memory", 100
		if err := run(f); err == nil || !strings.Contains(err.Error(), strings.TrimSpace(want)) {
			t.Errorf("%+v: %v, want an error naming %q", f, err, want)
		}
	}
}
