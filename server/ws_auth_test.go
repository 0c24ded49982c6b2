package server_test

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
)

var hmacSecret = []byte("statecast-test-secret-of-at-least-32-bytes")

// authEnv starts a server that verifies HS256 tokens with no clock leeway,
// so expiry is exact.
func authEnv(t *testing.T) *servertest.Node {
	t.Helper()
	authn, err := auth.New(auth.Config{HMACSecret: hmacSecret, Leeway: -1})
	if err != nil {
		t.Fatal(err)
	}
	return servertest.Start(t, servertest.Options{Server: server.Config{Auth: authn}})
}

func sign(t *testing.T, method jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// allRooms grants read and write on every key of every room.
var allRooms = map[string]any{"grants": []any{map[string]any{"room": "*", "access": "rw"}}}

// tokenFor returns an HS256 token for sub expiring at exp with grants.
func tokenFor(t *testing.T, sub string, exp time.Time, grants map[string]any) string {
	t.Helper()
	return sign(t, jwt.SigningMethodHS256, hmacSecret, jwt.MapClaims{"sub": sub, "exp": exp.Unix(), "statecast": grants})
}

// soon returns an expiry 1 to 2 seconds ahead, on a whole second (JWT
// times are seconds).
func soon() time.Time { return time.Unix(time.Now().Unix()+2, 0) }

var (
	rsaOnce sync.Once
	rsaKey  *rsa.PrivateKey
)

// TestWSAuthConnect: the token in connect decides whether the session
// starts: 4501 for a missing, malformed, forged or not-yet-valid token,
// 4002 for an expired one.
func TestWSAuthConnect(t *testing.T) {
	e := authEnv(t)
	hour := time.Now().Add(time.Hour).Unix()
	good := jwt.MapClaims{"sub": "alice", "exp": hour, "statecast": allRooms}
	with := func(extra jwt.MapClaims) jwt.MapClaims {
		c := jwt.MapClaims{}
		for k, v := range good {
			c[k] = v
		}
		for k, v := range extra {
			if v == nil {
				delete(c, k)
			} else {
				c[k] = v
			}
		}
		return c
	}
	rsaOnce.Do(func() {
		var err error
		if rsaKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			t.Fatal(err)
		}
	})
	cases := []struct {
		name  string
		token func(t *testing.T) string
		code  int
	}{
		{"no token", func(t *testing.T) string { return "" }, int(wire.CloseUnauthorized)},
		{"not a JWT", func(t *testing.T) string { return "not.a.jwt" }, int(wire.CloseUnauthorized)},
		{"bad signature", func(t *testing.T) string {
			return sign(t, jwt.SigningMethodHS256, []byte(strings.Repeat("x", 40)), good)
		}, int(wire.CloseUnauthorized)},
		{"tampered payload", func(t *testing.T) string {
			parts := strings.Split(sign(t, jwt.SigningMethodHS256, hmacSecret, with(jwt.MapClaims{"sub": "bob"})), ".")
			alice := strings.Split(sign(t, jwt.SigningMethodHS256, hmacSecret, good), ".")
			return parts[0] + "." + alice[1] + "." + parts[2]
		}, int(wire.CloseUnauthorized)},
		{"alg none", func(t *testing.T) string {
			return sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, good)
		}, int(wire.CloseUnauthorized)},
		{"RS256 when HS256 is pinned", func(t *testing.T) string {
			return sign(t, jwt.SigningMethodRS256, rsaKey, good)
		}, int(wire.CloseUnauthorized)},
		{"HS512 when HS256 is pinned", func(t *testing.T) string {
			return sign(t, jwt.SigningMethodHS512, hmacSecret, good)
		}, int(wire.CloseUnauthorized)},
		{"no exp", func(t *testing.T) string {
			return sign(t, jwt.SigningMethodHS256, hmacSecret, with(jwt.MapClaims{"exp": nil}))
		}, int(wire.CloseUnauthorized)},
		{"not yet valid", func(t *testing.T) string {
			return sign(t, jwt.SigningMethodHS256, hmacSecret, with(jwt.MapClaims{"nbf": time.Now().Add(time.Minute).Unix()}))
		}, int(wire.CloseUnauthorized)},
		{"issued in the future", func(t *testing.T) string {
			return sign(t, jwt.SigningMethodHS256, hmacSecret, with(jwt.MapClaims{"iat": time.Now().Add(time.Minute).Unix()}))
		}, int(wire.CloseUnauthorized)},
		{"bad grants", func(t *testing.T) string {
			return sign(t, jwt.SigningMethodHS256, hmacSecret, with(jwt.MapClaims{"statecast": map[string]any{
				"grants": []any{map[string]any{"room": "*", "prefx": "a", "access": "rw"}}}}))
		}, int(wire.CloseUnauthorized)},
		{"exp a numeric string", func(t *testing.T) string {
			return sign(t, jwt.SigningMethodHS256, hmacSecret, with(jwt.MapClaims{"exp": strconv.FormatInt(hour, 10)}))
		}, int(wire.CloseUnauthorized)},
		{"exp beyond the year 9999", func(t *testing.T) string {
			return sign(t, jwt.SigningMethodHS256, hmacSecret, with(jwt.MapClaims{"exp": 1e20}))
		}, int(wire.CloseUnauthorized)},
		{"expired", func(t *testing.T) string {
			return sign(t, jwt.SigningMethodHS256, hmacSecret, with(jwt.MapClaims{"exp": time.Now().Add(-time.Minute).Unix()}))
		}, int(wire.CloseTokenExpired)},
	}
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			for _, tc := range cases {
				_, err := client.Dial(servertest.Context(t), e.WS, &client.Options{Codec: codec, Token: tc.token(t)})
				if code := client.CloseCode(err); code != tc.code {
					t.Errorf("%s: Dial = %v (close %d), want close %d", tc.name, err, code, tc.code)
				}
			}
			c := dial(t, e, &client.Options{Codec: codec, Token: sign(t, jwt.SigningMethodHS256, hmacSecret, good)})
			if ms := c.Connected().ExpiresMS; ms < 3590_000 || ms > 3600_000 {
				t.Fatalf("connected expires_ms = %d, want about an hour", ms)
			}
			if _, err := c.Put(servertest.Context(t), "r", "k", 1); err != nil {
				t.Fatal(err)
			}
		})
	}
	if n := e.Counter("statecast_auth_failures_total"); n < float64(2*len(cases)) {
		t.Fatalf("auth failures counted: %v, want at least %d", n, 2*len(cases))
	}
}

// TestWSAuthPermissions: subscriptions and writes outside the token's
// grants are answered forbidden; those inside work.
func TestWSAuthPermissions(t *testing.T) {
	e := authEnv(t)
	grants := map[string]any{"grants": []any{
		map[string]any{"room": "lobby:*", "access": "r"},
		map[string]any{"room": "lobby:*", "prefix": "presence/{sub}", "access": "rw"},
		map[string]any{"room": "doc:{sub}", "access": "rw"},
	}}
	admin := dial(t, e, &client.Options{Token: tokenFor(t, "admin", time.Now().Add(time.Hour), allRooms)})
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			ctx := servertest.Context(t)
			c := dial(t, e, &client.Options{Codec: codec, Token: tokenFor(t, "alice", time.Now().Add(time.Hour), grants)})
			h := *e.HTTP
			h.Token = tokenFor(t, "admin", time.Now().Add(time.Hour), allRooms)

			for _, s := range []struct {
				room     string
				prefixes []string
				ok       bool
			}{
				{"lobby:eu", nil, true},
				{"lobby:eu", []string{"presence/", "games/"}, true},
				{"doc:alice", nil, true},
				{"doc:bob", nil, false},
				{"other", nil, false},
			} {
				_, err := c.Subscribe(ctx, s.room, client.SubscribeOptions{Prefixes: s.prefixes})
				if s.ok != (err == nil) || (!s.ok && !errors.Is(err, client.ErrForbidden)) {
					t.Errorf("subscribe %s %v: %v (want allowed: %v)", s.room, s.prefixes, err, s.ok)
				}
			}

			for _, w := range []struct {
				room, key string
				ok        bool
			}{
				{"lobby:eu", "presence/alice", true},
				{"lobby:eu", "presence/alice/status", true},
				{"lobby:eu", "presence/bob", false},
				{"lobby:eu", "games/1", false},
				{"doc:alice", "title", true},
				{"doc:bob", "title", false},
			} {
				_, err := c.Put(ctx, w.room, w.key, codec)
				if w.ok != (err == nil) || (!w.ok && !errors.Is(err, client.ErrForbidden)) {
					t.Errorf("put %s %s: %v (want allowed: %v)", w.room, w.key, err, w.ok)
				}
			}
			if _, err := admin.Put(ctx, "lobby:eu", "presence/bob", "bob"); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Delete(ctx, "lobby:eu", "presence/bob"); !errors.Is(err, client.ErrForbidden) {
				t.Errorf("delete of another's key: %v", err)
			}
			// One forbidden op fails the whole transaction.
			before, err := h.List(ctx, "lobby:eu", "")
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Txn(ctx, "lobby:eu", nil, []wire.TxnOp{
				{Type: "put", Key: "presence/alice", Value: wire.Value(`"txn"`)},
				{Type: "put", Key: "games/2", Value: wire.Value(`1`)}})
			if !errors.Is(err, client.ErrForbidden) {
				t.Errorf("txn with a forbidden op: %v", err)
			}
			if after, err := h.List(ctx, "lobby:eu", ""); err != nil || after.Rev != before.Rev {
				t.Errorf("room at %+v after a refused txn, was at %d (%v)", after, before.Rev, err)
			}
			// The HTTP API wants a token too.
			if _, err := e.HTTP.List(ctx, "lobby:eu", ""); !errors.Is(err, client.ErrUnauthorized) {
				t.Fatalf("HTTP without a token: %v", err)
			}
			it, _, err := h.Get(ctx, "lobby:eu", "presence/alice")
			if err != nil || string(it.Value) != `"`+codec+`"` {
				t.Errorf("presence/alice = %s, %v: the forbidden txn must not apply", it.Value, err)
			}
		})
	}
}

// TestWSAuthRefreshMessage: with 30 s or less left on its token, the
// session is asked for a new one at once.
func TestWSAuthRefreshMessage(t *testing.T) {
	e := authEnv(t)
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			refresh := make(chan wire.Message, 4)
			exp := time.Now().Add(20 * time.Second)
			c := dial(t, e, &client.Options{Codec: codec, Token: tokenFor(t, "alice", exp, allRooms),
				OnMessage: func(m wire.Message) { refresh <- m }})
			if ms := c.Connected().ExpiresMS; ms <= 18_000 || ms > 20_000 {
				t.Fatalf("connected expires_ms = %d, want about 20 s", ms)
			}
			select {
			case m := <-refresh:
				if m.T != wire.TRefresh || m.ExpiresMS <= 0 || m.ExpiresMS > 20_000 {
					t.Fatalf("got %+v, want refresh with expires_ms of at most 20 s", m)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("no refresh message for a token with 20 s left")
			}
			// Refreshed with a long token: no further refresh.
			if err := c.Auth(servertest.Context(t), tokenFor(t, "alice", time.Now().Add(time.Hour), allRooms)); err != nil {
				t.Fatal(err)
			}
			if err := c.Ping(servertest.Context(t)); err != nil {
				t.Fatal(err)
			}
			select {
			case m := <-refresh:
				t.Fatalf("unexpected %+v after a refresh", m)
			default:
			}
		})
	}
}

// TestWSAuthExpiry: a session whose token expires is closed with 4002 at
// the expiry, unless a refresh with the same subject came first; refused
// refreshes do not extend it.
func TestWSAuthExpiry(t *testing.T) {
	t.Parallel() // waits on wall-clock time (timeouts, grace, expiry)
	e := authEnv(t)
	ctx := servertest.Context(t)

	exp := soon()
	expiring := dial(t, e, &client.Options{Token: tokenFor(t, "alice", exp, allRooms)})
	refreshed := dial(t, e, &client.Options{Codec: "msgpack", Token: tokenFor(t, "alice", exp, allRooms)})
	for _, bad := range []struct {
		name, token string
	}{
		{"another subject", tokenFor(t, "mallory", time.Now().Add(time.Hour), allRooms)},
		{"expired", tokenFor(t, "alice", time.Now().Add(-time.Minute), allRooms)},
		{"forged", sign(t, jwt.SigningMethodHS256, []byte(strings.Repeat("y", 32)), jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(time.Hour).Unix()})},
		{"empty", ""},
	} {
		if err := expiring.Auth(ctx, bad.token); !errors.Is(err, client.ErrUnauthorized) {
			t.Errorf("refresh with a token of %s: %v, want unauthorized", bad.name, err)
		}
	}
	if _, err := expiring.Put(ctx, "r", "still", 1); err != nil {
		t.Fatalf("the session after refused refreshes: %v", err)
	}
	if err := refreshed.Auth(ctx, tokenFor(t, "alice", time.Now().Add(time.Hour), allRooms)); err != nil {
		t.Fatal(err)
	}

	code := waitDone(t, expiring, 10*time.Second)
	if now := time.Now(); now.Before(exp) {
		t.Fatalf("closed at %v, before the expiry %v", now, exp)
	}
	if code != int(wire.CloseTokenExpired) {
		t.Fatalf("expired session closed with %d (%v), want 4002", code, expiring.Err())
	}
	time.Sleep(200 * time.Millisecond) // on purpose: past the old expiry
	if err := refreshed.Ping(ctx); err != nil {
		t.Fatalf("refreshed session: %v", err)
	}
	if _, err := refreshed.Put(ctx, "r", "k", 1); err != nil {
		t.Fatalf("refreshed session: %v", err)
	}
}

// TestWSAuthRefreshPermissions: a refreshed token's grants apply to new
// requests; existing subscriptions stay.
func TestWSAuthRefreshPermissions(t *testing.T) {
	e := authEnv(t)
	ctx := servertest.Context(t)
	only := func(room string) map[string]any {
		return map[string]any{"grants": []any{map[string]any{"room": room, "access": "rw"}}}
	}
	hour := time.Now().Add(time.Hour)
	c := dial(t, e, &client.Options{Token: tokenFor(t, "alice", hour, only("a"))})
	admin := dial(t, e, &client.Options{Codec: "msgpack", Token: tokenFor(t, "root", hour, allRooms)})
	sub, err := c.Subscribe(ctx, "a", client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v := client.NewView()
	applyUntil(t, sub, v, func(m wire.Message) bool { return m.T == wire.TSnapshot })

	if err := c.Auth(ctx, tokenFor(t, "alice", hour, only("b"))); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "a", "k", 1); !errors.Is(err, client.ErrForbidden) {
		t.Fatalf("write under the old grant after the refresh: %v", err)
	}
	if _, err := c.Subscribe(ctx, "a", client.SubscribeOptions{}); !errors.Is(err, client.ErrForbidden) {
		t.Fatalf("subscribe under the old grant after the refresh: %v", err)
	}
	if _, err := c.Put(ctx, "b", "k", 1); err != nil {
		t.Fatalf("write under the new grant: %v", err)
	}
	rev, err := admin.Put(ctx, "a", "k", "admin")
	if err != nil {
		t.Fatal(err)
	}
	applyUntil(t, sub, v, func(m wire.Message) bool { return m.Rev == rev })
	if string(v.Items["k"].Value) != `"admin"` {
		t.Fatalf("existing subscription after the refresh: %+v", v.Items)
	}
}

// TestWSAuthLeaseOwner: a TTL lease belongs to the subject that granted
// it. Another subject, even one allowed to write every key, can neither
// keep it alive, revoke it nor bind keys to it, over HTTP or WebSocket.
func TestWSAuthLeaseOwner(t *testing.T) {
	e := authEnv(t)
	ctx := servertest.Context(t)
	hour := time.Now().Add(time.Hour)
	alice, bob := *e.HTTP, *e.HTTP
	alice.Token, bob.Token = tokenFor(t, "alice", hour, allRooms), tokenFor(t, "bob", hour, allRooms)
	id, err := alice.GrantLease(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Put(ctx, "r", "presence/alice", json.RawMessage(`1`), nil, id); err != nil {
		t.Fatal(err)
	}
	bobWS := dial(t, e, &client.Options{Token: bob.Token})
	for name, err := range map[string]error{
		"keep-alive": bob.KeepAlive(ctx, id),
		"revoke":     bob.Revoke(ctx, id),
		"HTTP put":   func() error { _, err := bob.Put(ctx, "r", "k", json.RawMessage(`1`), nil, id); return err }(),
		"HTTP txn": func() error {
			_, err := bob.Txn(ctx, "r", nil, []wire.TxnOp{{Type: "put", Key: "k", Value: wire.Value(`1`), Lease: id}})
			return err
		}(),
		"WebSocket put": func() error { _, err := bobWS.Put(ctx, "r", "k", 1, client.WithLease(id)); return err }(),
	} {
		if !errors.Is(err, client.ErrForbidden) {
			t.Errorf("%s of alice's lease by bob: %v, want forbidden", name, err)
		}
	}
	if l, err := alice.List(ctx, "r", ""); err != nil || len(l.Items) != 1 || l.Items[0].Key != "presence/alice" {
		t.Fatalf("after bob's attempts: %+v, %v; want alice's key alone", l, err)
	}
	// Keeping the binding is not writing under the lease: bob may write
	// the key (his token grants it) and it still ends with alice's lease.
	if _, err := bobWS.Put(ctx, "r", "presence/alice", "bob", client.WithLease(client.KeepLease)); err != nil {
		t.Fatalf("bob's put keeping alice's lease: %v", err)
	}
	aliceWS := dial(t, e, &client.Options{Token: alice.Token})
	if _, err := aliceWS.Put(ctx, "r", "presence/alice2", 1, client.WithLease(id)); err != nil {
		t.Fatal(err)
	}
	if err := alice.KeepAlive(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := alice.Revoke(ctx, id); err != nil {
		t.Fatal(err)
	}
	if l, err := alice.List(ctx, "r", ""); err != nil || len(l.Items) != 0 {
		t.Fatalf("after alice's revoke: %+v, %v; want no key", l, err)
	}
}

// TestWSAuthResumeOtherSubject: a session's resume secret does not carry
// it to another subject: that connect gets a new session, and the owner
// keeps its connection and can still resume later.
func TestWSAuthResumeOtherSubject(t *testing.T) {
	e := authEnv(t)
	hour := time.Now().Add(time.Hour)
	connect := func(r *rawConn, sub, session, resume string) rawMsg {
		t.Helper()
		r.send(&wire.Request{T: wire.TConnect, Token: tokenFor(t, sub, hour, allRooms), Session: session, Resume: resume})
		m := r.next()
		if m.T != wire.TConnected {
			t.Fatalf("%s: got %+v, want connected", sub, m)
		}
		return m
	}
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			a := dialRaw(t, e, codec)
			first := connect(a, "alice", "", "")
			a.send(&wire.Request{T: wire.TPut, ID: 1, Room: "r", Key: "presence/" + codec, Value: wire.Value(`1`), Lease: "session"})
			if m := a.reply(1); m.T != wire.TOK {
				t.Fatalf("put: %+v", m)
			}

			m := connect(dialRaw(t, e, codec), "mallory", first.Session, first.Resume)
			if m.Resumed || m.Session == first.Session {
				t.Fatalf("mallory with alice's resume secret: %+v, want a new session", m.Message)
			}
			a.send(&wire.Request{T: wire.TPing, ID: 2})
			if m := a.next(); m.T != wire.TPong {
				t.Fatalf("alice after mallory's attempt: %+v, want pong", m)
			}

			// Alice reconnects with her secret, which mallory's attempt
			// did not use up.
			_ = a.ws.CloseNow()
			m = connect(dialRaw(t, e, codec), "alice", first.Session, first.Resume)
			if !m.Resumed || m.Session != first.Session {
				t.Fatalf("alice resuming: %+v, want her session resumed", m.Message)
			}
		})
	}
}

// TestWSAuthLeewayAgrees: a token past its exp but within the leeway is
// accepted by HTTP and by a WebSocket alike; the session ends (4002) when
// the leeway has passed, and from then on HTTP refuses the token too.
func TestWSAuthLeewayAgrees(t *testing.T) {
	t.Parallel() // waits on wall-clock time (timeouts, grace, expiry)
	authn, err := auth.New(auth.Config{HMACSecret: hmacSecret, Leeway: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e := servertest.Start(t, servertest.Options{Server: server.Config{Auth: authn}})
	ctx := servertest.Context(t)
	tok := tokenFor(t, "alice", time.Unix(time.Now().Unix()-1, 0), allRooms) // 1 to 2 s ago
	h := *e.HTTP
	h.Token = tok
	if _, err := h.List(ctx, "r", ""); err != nil {
		t.Fatalf("HTTP within the leeway: %v", err)
	}
	c := dial(t, e, &client.Options{Token: tok})
	if ms := c.Connected().ExpiresMS; ms > 0 || ms < -5000 {
		t.Fatalf("connected expires_ms = %d within the leeway, want the time since exp (refresh now)", ms)
	}
	if _, err := c.Put(ctx, "r", "k", 1); err != nil {
		t.Fatalf("WebSocket within the leeway: %v", err)
	}
	if code := waitDone(t, c, 10*time.Second); code != int(wire.CloseTokenExpired) {
		t.Fatalf("closed with %d (%v), want 4002", code, c.Err())
	}
	if _, err := h.List(ctx, "r", ""); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("HTTP once the session ended: %v, want unauthorized", err)
	}
}
