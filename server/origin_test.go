package server

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server/auth"
)

// hostOf returns the test server's host:port.
func (e *apiEnv) hostOf(t testing.TB) string {
	u, err := url.Parse(e.hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// TestAnonymousHostNames: without auth, a request naming the server by a
// name that DNS rebinding could point at it is refused on every route but
// the health checks; loopback names, IP addresses and --allow-host
// patterns are served. With auth, any Host is.
func TestAnonymousHostNames(t *testing.T) {
	e := newAPIEnv(t, apiOpts{cfg: Config{AllowHosts: []string{"*.lan"}}})
	_, port, _ := strings.Cut(e.hostOf(t), ":")
	for _, host := range []string{"evil.example", "evil.example:" + port, "localhost.evil.example", "lan", "127.0.0.1.nip.io:" + port} {
		e.do(t, "GET", "/v1/rooms/r/kv", "", "Host", host).wantErr(t, 403, "forbidden")
		e.do(t, "PUT", "/v1/rooms/r/kv/k", "1", "Host", host).wantErr(t, 403, "forbidden")
		e.do(t, "GET", "/v1/rooms/r/watch", "", "Host", host).wantErr(t, 403, "forbidden")
		e.do(t, "GET", "/metrics", "", "Host", host).wantErr(t, 403, "forbidden")
		e.do(t, "GET", "/healthz", "", "Host", host).want(t, 200, nil)
	}
	b := e.do(t, "GET", "/v1/rooms/r/kv", "", "Host", "evil.example").wantErr(t, 403, "forbidden")
	if !strings.Contains(b.Error.Message, "--allow-host") {
		t.Errorf("message %q does not say what to configure", b.Error.Message)
	}
	for _, host := range []string{"localhost", "localhost:" + port, "LOCALHOST.", "app.localhost:" + port,
		"127.0.0.1:" + port, "127.1.2.3", "[::1]:" + port, "192.0.2.7:" + port, "box.lan:" + port} {
		e.do(t, "PUT", "/v1/rooms/r/kv/k", "1", "Host", host).want(t, 200, nil)
	}

	a, err := auth.New(auth.Config{HMACSecret: apiTestSecret})
	if err != nil {
		t.Fatal(err)
	}
	authed := newAPIEnv(t, apiOpts{auth: a})
	tok := apiToken(t, time.Hour, map[string]string{"room": "*", "access": "rw"})
	authed.do(t, "PUT", "/v1/rooms/r/kv/k", "1", "Host", "statecast.example", "Authorization", "Bearer "+tok).want(t, 200, nil)
}

// hostTransport sends every request with Host set to host.
type hostTransport struct{ host string }

func (h hostTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Host = h.host
	return http.DefaultTransport.RoundTrip(r)
}

// TestAnonymousWebSocketRebinding: a page rebound to the server opens a
// WebSocket with its own name as Host and Origin, which the Origin check
// alone lets through; the Host check refuses it.
func TestAnonymousWebSocketRebinding(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	_, port, _ := strings.Cut(e.hostOf(t), ":")
	wsURL := "ws" + strings.TrimPrefix(e.hs.URL, "http") + "/v1/ws"
	dial := func(host string) (*websocket.Conn, *http.Response, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return websocket.Dial(ctx, wsURL, &websocket.DialOptions{
			Subprotocols: []string{"statecast.v1.json"},
			HTTPClient:   &http.Client{Transport: hostTransport{host}},
			HTTPHeader:   http.Header{"Origin": {"http://" + host}},
		})
	}
	ws, resp, err := dial("evil.example:" + port)
	if err == nil {
		ws.CloseNow()
		t.Fatal("a WebSocket for Host evil.example was opened")
	}
	if resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("upgrade for Host evil.example: %v %v, want 403", resp, err)
	}
	ws, _, err = dial("localhost:" + port)
	if err != nil {
		t.Fatalf("upgrade for Host localhost: %v", err)
	}
	ws.CloseNow()
}

// TestCrossOriginWrites: a write from a foreign Origin is refused (403),
// with or without auth, whatever its content type; a write body must be
// application/json (415), so a browser always preflights it. Same-origin
// pages, --allow-origin origins and clients that send no Origin write.
func TestCrossOriginWrites(t *testing.T) {
	e := newAPIEnv(t, apiOpts{cfg: Config{AllowOrigins: []string{"app.example"}}})
	self := "http://" + e.hostOf(t)
	txn := `{"ops":[{"type":"put","key":"k","value":1}]}`
	for _, origin := range []string{"http://evil.example", "null", "http://app.example.evil.example"} {
		for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "application/json"} {
			e.do(t, "POST", "/v1/rooms/r/txn", txn, "Origin", origin, "Content-Type", ct).wantErr(t, 403, "forbidden")
			e.do(t, "PUT", "/v1/rooms/r/kv/k", "1", "Origin", origin, "Content-Type", ct).wantErr(t, 403, "forbidden")
		}
		e.do(t, "DELETE", "/v1/rooms/r/kv/k", "", "Origin", origin).wantErr(t, 403, "forbidden")
		e.do(t, "POST", "/v1/leases", `{"ttl_ms":5000}`, "Origin", origin).wantErr(t, 403, "forbidden")
	}
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "", "application/jsonx"} {
		e.do(t, "POST", "/v1/rooms/r/txn", txn, "Content-Type", ct).wantErr(t, 415, "bad_request")
		e.do(t, "PUT", "/v1/rooms/r/kv/k", "1", "Content-Type", ct).wantErr(t, 415, "bad_request")
		e.do(t, "POST", "/v1/leases", `{"ttl_ms":5000}`, "Content-Type", ct).wantErr(t, 415, "bad_request")
	}
	if l, err := e.eng.List(context.Background(), "r", "", rooms.ReadOptions{}); err != nil || len(l.Items) != 0 {
		t.Fatalf("refused writes were applied: %+v %v", l, err)
	}
	e.do(t, "PUT", "/v1/rooms/r/kv/k", "1", "Content-Type", "application/json; charset=utf-8").want(t, 200, nil)
	e.do(t, "POST", "/v1/rooms/r/txn", txn, "Origin", self).want(t, 200, nil)
	r := e.do(t, "POST", "/v1/rooms/r/txn", txn, "Origin", "https://app.example").want(t, 200, nil)
	if got := r.header.Get("Access-Control-Allow-Origin"); got != "https://app.example" {
		t.Errorf("Access-Control-Allow-Origin %q for an allowed origin", got)
	}
	e.do(t, "DELETE", "/v1/rooms/r/kv/k", "").want(t, 200, nil) // no body, no content type needed

	a, err := auth.New(auth.Config{HMACSecret: apiTestSecret})
	if err != nil {
		t.Fatal(err)
	}
	authed := newAPIEnv(t, apiOpts{auth: a})
	bearer := "Bearer " + apiToken(t, time.Hour, map[string]string{"room": "*", "access": "rw"})
	authed.do(t, "PUT", "/v1/rooms/r/kv/k", "1", "Authorization", bearer, "Origin", "http://evil.example").wantErr(t, 403, "forbidden")
	authed.do(t, "PUT", "/v1/rooms/r/kv/k", "1", "Authorization", bearer, "Content-Type", "text/plain").wantErr(t, 415, "bad_request")
	authed.do(t, "PUT", "/v1/rooms/r/kv/k", "1", "Authorization", bearer).want(t, 200, nil)
}

// TestCORS: --allow-origin opens the HTTP API and SSE to those origins
// (preflight and response headers); other origins get no CORS headers
// and a refused preflight.
func TestCORS(t *testing.T) {
	e := newAPIEnv(t, apiOpts{cfg: Config{AllowOrigins: []string{"*.app.example"}}})
	const allowed, foreign = "https://web.app.example", "https://evil.example"
	preflight := func(origin string) apiResp {
		return e.do(t, "OPTIONS", "/v1/rooms/r/kv/k", "", "Origin", origin,
			"Access-Control-Request-Method", "PUT", "Access-Control-Request-Headers", "authorization,content-type,if-match")
	}
	r := preflight(allowed).want(t, 204, nil)
	for h, want := range map[string]string{
		"Access-Control-Allow-Origin": allowed, "Access-Control-Max-Age": corsMaxAge, "Vary": "Origin",
	} {
		if got := r.header.Get(h); got != want {
			t.Errorf("preflight %s = %q, want %q", h, got, want)
		}
	}
	for _, m := range []string{"PUT", "DELETE", "POST"} {
		if !strings.Contains(r.header.Get("Access-Control-Allow-Methods"), m) {
			t.Errorf("Access-Control-Allow-Methods %q lacks %s", r.header.Get("Access-Control-Allow-Methods"), m)
		}
	}
	for _, h := range []string{"Authorization", "Content-Type", "If-Match", "Idempotency-Key", "Idempotency-Since", "Last-Event-ID"} {
		if !strings.Contains(r.header.Get("Access-Control-Allow-Headers"), h) {
			t.Errorf("Access-Control-Allow-Headers %q lacks %s", r.header.Get("Access-Control-Allow-Headers"), h)
		}
	}
	if r.header.Get("Access-Control-Allow-Credentials") != "" {
		t.Error("credentials allowed: the API takes bearer tokens, not cookies")
	}
	r = preflight(foreign)
	r.wantErr(t, 403, "forbidden")
	if got := r.header.Get("Access-Control-Allow-Origin"); got != "" {
		t.Errorf("foreign preflight: Access-Control-Allow-Origin %q", got)
	}

	e.do(t, "PUT", "/v1/rooms/r/kv/k", "1").want(t, 200, nil)
	r = e.do(t, "GET", "/v1/rooms/r/kv/k", "", "Origin", allowed).want(t, 200, nil)
	if r.header.Get("Access-Control-Allow-Origin") != allowed || !strings.Contains(r.header.Get("Access-Control-Expose-Headers"), "X-Statecast-Rev") {
		t.Errorf("GET from an allowed origin: headers %v", r.header)
	}
	r = e.do(t, "GET", "/v1/rooms/r/kv/k", "", "Origin", foreign).want(t, 200, nil)
	if got := r.header.Get("Access-Control-Allow-Origin"); got != "" || r.header.Get("Vary") != "Origin" {
		t.Errorf("GET from a foreign origin: Access-Control-Allow-Origin %q, Vary %q", got, r.header.Get("Vary"))
	}

	// SSE: the stream's headers, then hang up.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", e.hs.URL+"/v1/rooms/r/watch", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Origin", allowed)
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != allowed {
		t.Errorf("watch from an allowed origin: %d, Access-Control-Allow-Origin %q", resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"))
	}
}

// TestHTTPWriteRateLimit: HTTP writes take from the same bucket as
// WebSocket writes (per address when anonymous): over it, 429 with
// Retry-After in whole seconds, and nothing is written.
func TestHTTPWriteRateLimit(t *testing.T) {
	e := newAPIEnv(t, apiOpts{cfg: Config{WriteRate: 0.5, WriteBurst: 3}})
	for i := range 3 {
		e.do(t, "PUT", "/v1/rooms/r/kv/k"+strconv.Itoa(i), "1").want(t, 200, nil)
	}
	for _, w := range [][3]string{
		{"PUT", "/v1/rooms/r/kv/over", "1"},
		{"DELETE", "/v1/rooms/r/kv/k0", ""},
		{"POST", "/v1/rooms/r/txn", `{"ops":[{"type":"put","key":"over","value":1}]}`},
		{"POST", "/v1/leases", `{"ttl_ms":10000}`},
		{"DELETE", "/v1/leases/ttl_x", ""},
	} {
		r := e.do(t, w[0], w[1], w[2])
		r.wantErr(t, 429, "rate_limited")
		if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 || s > 2 {
			t.Errorf("%s %s: Retry-After %q, want 1 or 2 (seconds, rounded up)", w[0], w[1], r.header.Get("Retry-After"))
		}
	}
	if l, err := e.eng.List(context.Background(), "r", "", rooms.ReadOptions{}); err != nil || len(l.Items) != 3 {
		t.Fatalf("rate-limited writes were applied: %+v %v", l, err)
	}
	e.do(t, "GET", "/v1/rooms/r/kv", "").want(t, 200, nil) // reads are not limited
	// The WebSocket of the same address shares the bucket.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(e.hs.URL, "http")+"/v1/ws", &websocket.DialOptions{Subprotocols: []string{"statecast.v1.json"}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	for _, m := range []string{`{"t":"connect"}`, `{"t":"put","id":1,"room":"r","key":"ws","value":1}`} {
		if err := ws.Write(ctx, websocket.MessageText, []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	for {
		_, b, err := ws.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), `"id":1`) {
			if !strings.Contains(string(b), `"code":"rate_limited"`) {
				t.Fatalf("WebSocket write after the HTTP writes used the bucket: %s", b)
			}
			return
		}
	}
}

func TestWriteLimitsBounded(t *testing.T) {
	// Buckets that have refilled are dropped as others are used.
	l := newWriteLimits(1e9, 1)
	for i := range 1000 {
		if ok, _ := l.allow(strconv.Itoa(i)); !ok {
			t.Fatal("a fresh bucket refused a write")
		}
	}
	if n := l.len(); n > 10 {
		t.Errorf("%d idle buckets kept", n)
	}
	// However many writers, at most maxWriteLimiters buckets. The clock
	// stands still: none of them has refilled.
	l = newWriteLimits(1, 1)
	frozen := time.Now()
	l.now = func() time.Time { return frozen }
	for i := range maxWriteLimiters + 100 {
		l.allow(strconv.Itoa(i))
	}
	if n := l.len(); n != maxWriteLimiters {
		t.Errorf("%d buckets, want %d", n, maxWriteLimiters)
	}
	if ok, retry := l.allow(strconv.Itoa(maxWriteLimiters + 99)); ok || retry <= 0 || retry > time.Second {
		t.Errorf("a recent writer over its limit: ok %v, retry %v", ok, retry)
	}
}

func TestWriterKey(t *testing.T) {
	for _, c := range []struct {
		claims *auth.Claims
		addr   string
		want   string
	}{
		{&auth.Claims{Subject: "alice"}, "127.0.0.1:1", "sub:alice"},
		{nil, "192.0.2.7:40000", "ip:192.0.2.7"},
		{&auth.Claims{}, "192.0.2.7:40000", "ip:192.0.2.7"},
		{nil, "[2001:db8:1:2:3:4:5:6]:1", "ip:2001:db8:1:2::/64"},
		{nil, "[2001:db8:1:2:ff::1]:2", "ip:2001:db8:1:2::/64"},
	} {
		if got := writerKey(c.claims, c.addr); got != c.want {
			t.Errorf("writerKey(%v, %q) = %q, want %q", c.claims, c.addr, got, c.want)
		}
	}
}
