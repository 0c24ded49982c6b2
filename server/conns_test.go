package server_test

// Connection limits and HTTP timeouts, over sockets opened by hand so that
// each test knows exactly how many connections it holds and what each one
// sends: every kind (HTTP, SSE, WebSocket) counts against one limit, a
// reserve past it still serves health checks, a client address has its
// own limit, a stalled request and an idle keep-alive connection are cut,
// and neither an SSE stream nor a WebSocket inherits those deadlines.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
)

// rawHTTP is one TCP connection speaking HTTP/1.1 by hand.
type rawHTTP struct {
	t  testing.TB
	c  net.Conn
	br *bufio.Reader
	sb *bufio.Reader // the body of an open SSE response
}

func dialHTTP(t testing.TB, e *servertest.Node) *rawHTTP {
	t.Helper()
	c, err := net.Dial("tcp", e.TS.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// Bounds every read: a test fails instead of hanging.
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	return &rawHTTP{t: t, c: c, br: bufio.NewReader(c)}
}

func (r *rawHTTP) send(s string) {
	r.t.Helper()
	if _, err := io.WriteString(r.c, s); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

// get sends GET path and returns the response with its body read, or
// with the body open when it is an event stream.
func (r *rawHTTP) get(path string) (*http.Response, []byte) {
	r.t.Helper()
	return r.do("GET", path, "\r\n")
}

// stalledPut sends a PUT whose body stops after 1 of its 10 bytes.
const stalledPut = "Content-Type: application/json\r\nContent-Length: 10\r\n\r\n1"

// do sends a request, tail being the rest of its headers and its body,
// and reads the response as get does.
func (r *rawHTTP) do(method, path, tail string) (*http.Response, []byte) {
	r.t.Helper()
	r.send(method + " " + path + " HTTP/1.1\r\nHost: " + r.c.RemoteAddr().String() + "\r\n" + tail)
	resp, err := http.ReadResponse(r.br, nil)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	if resp.StatusCode == http.StatusOK && resp.Header.Get("Content-Type") == "text/event-stream" {
		r.sb = bufio.NewReader(resp.Body)
		return resp, nil
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatalf("GET %s: body: %v", path, err)
	}
	return resp, b
}

// watch opens an SSE stream and reads its first event (the reset).
func (r *rawHTTP) watch(room string) {
	r.t.Helper()
	if resp, b := r.get("/v1/rooms/" + room + "/watch"); resp.StatusCode != http.StatusOK {
		r.t.Fatalf("watch: %d %s", resp.StatusCode, b)
	}
	if ev := r.event(); ev != "reset" {
		r.t.Fatalf("first event %q, want reset", ev)
	}
}

// event reads the open stream's next event and returns its name.
func (r *rawHTTP) event() string {
	r.t.Helper()
	name := ""
	for {
		line, err := r.sb.ReadString('\n')
		if err != nil {
			r.t.Fatalf("stream ended: %v", err)
		}
		line = strings.TrimRight(line, "\n")
		if v, ok := strings.CutPrefix(line, "event: "); ok {
			name = v
		}
		if line == "" && name != "" {
			return name
		}
	}
}

// ended reads until the server ends the connection and returns what it
// sent meanwhile; it fails when the connection is still open after 10 s.
func (r *rawHTTP) ended() string {
	r.t.Helper()
	b, err := io.ReadAll(r.br)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		r.t.Fatalf("the connection is still open (read %q)", b)
	}
	return string(b) // EOF, or a reset: both end it
}

// wantStatus checks a response's status.
func wantStatus(t testing.TB, resp *http.Response, body []byte, status int) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("%s: status %d, want %d (%s)", resp.Request.URL, resp.StatusCode, status, body)
	}
}

// wsUpgrade is the rest of a WebSocket upgrade request's head.
const wsUpgrade = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n" +
	"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: statecast.v1.json\r\n\r\n"

// wantFull checks a refusal for a full node: 503, Retry-After,
// Statecast-Refused: full, the unavailable error, and the connection
// closed after it.
func wantFull(t testing.TB, r *rawHTTP, method, path, tail string) {
	t.Helper()
	resp, b := r.do(method, path, tail)
	var body struct{ Error struct{ Code string } }
	_ = json.Unmarshal(b, &body)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || resp.Header.Get("Statecast-Refused") != "full" || body.Error.Code != wire.CodeUnavailable {
		t.Fatalf("%s %s on a full node: %d %v %s, want 503 unavailable with Retry-After and Statecast-Refused: full", method, path, resp.StatusCode, resp.Header, b)
	}
	r.ended()
}

func waitSockets(t testing.TB, e *servertest.Node, n float64, labels ...string) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("statecast_sockets %v = %v", labels, n), func() bool {
		return e.Counter("statecast_sockets", labels...) == n
	})
}

// TestHTTPStalledBodyCut: a request whose body stops coming is cut at the
// read timeout and nothing is written.
func TestHTTPStalledBodyCut(t *testing.T) {
	e := servertest.Start(t, servertest.Options{Server: server.Config{HTTPReadTimeout: 200 * time.Millisecond}})
	r := dialHTTP(t, e)
	r.send("PUT /v1/rooms/r/kv/k HTTP/1.1\r\nHost: " + r.c.RemoteAddr().String() + "\r\n" + stalledPut)
	r.ended()
	waitSockets(t, e, 0)
	if _, _, err := e.HTTP.Get(servertest.Context(t), "r", "k"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("the stalled PUT: %v, want not found", err)
	}
}

// TestHTTPIdleKeepAliveClosed: a keep-alive connection with no request is
// closed after the idle timeout.
func TestHTTPIdleKeepAliveClosed(t *testing.T) {
	e := servertest.Start(t, servertest.Options{Server: server.Config{HTTPIdleTimeout: 200 * time.Millisecond}})
	r := dialHTTP(t, e)
	resp, b := r.get("/healthz")
	wantStatus(t, resp, b, http.StatusOK)
	if resp.Close {
		t.Fatal("the server did not keep the connection alive")
	}
	r.ended()
	waitSockets(t, e, 0)
}

// TestHTTPUnreadResponseCut: a client that does not read its response
// (a large list) is dropped at the write timeout.
func TestHTTPUnreadResponseCut(t *testing.T) {
	t.Parallel() // waits on wall-clock time (timeouts, grace, expiry)
	e := servertest.Start(t, servertest.Options{Server: server.Config{HTTPWriteTimeout: 200 * time.Millisecond}, SendBuffer: 64 << 10})
	c := dialCodec(t, e, "json")
	big := strings.Repeat("x", 250<<10)
	for i := range 10 { // a 2.5 MB list
		if _, err := c.Put(servertest.Context(t), "r", fmt.Sprint("k", i), big); err != nil {
			t.Fatal(err)
		}
	}
	r := dialHTTP(t, e)
	_ = r.c.(*net.TCPConn).SetReadBuffer(16 << 10)
	r.send("GET /v1/rooms/r/kv HTTP/1.1\r\nHost: " + r.c.RemoteAddr().String() + "\r\n\r\n")
	waitSockets(t, e, 1, "kind", "http")
	waitSockets(t, e, 0, "kind", "http") // never read: the server gave up
}

// TestConnLimitCountsEveryKind: an HTTP keep-alive connection, an SSE
// stream and a WebSocket fill a node limited to 3; past it, requests get
// 503, WebSocket upgrades too (before the handshake, with
// Statecast-Refused: full), but health checks and metrics still answer.
func TestConnLimitCountsEveryKind(t *testing.T) {
	e := servertest.Start(t, servertest.Options{Server: server.Config{MaxConnections: 3}})
	h := dialHTTP(t, e)
	resp, b := h.get("/v1/rooms/r/kv")
	wantStatus(t, resp, b, http.StatusOK)
	s := dialHTTP(t, e)
	s.watch("r")
	ws := dialCodec(t, e, "json")
	for _, kind := range []string{"http", "sse", "ws"} {
		waitSockets(t, e, 1, "kind", kind)
	}

	wantFull(t, dialHTTP(t, e), "GET", "/v1/rooms/r/watch", "\r\n")
	wantFull(t, dialHTTP(t, e), "GET", "/v1/rooms/r/kv", "\r\n")
	// Nor does it wait for a stalled body (the read timeout is 60 s).
	wantFull(t, dialHTTP(t, e), "PUT", "/v1/rooms/r/kv/k", stalledPut)
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		r := dialHTTP(t, e)
		resp, b := r.get(path)
		wantStatus(t, resp, b, http.StatusOK)
		r.ended() // a reserve connection serves one request
	}
	// Also a request to the WebSocket path that is no upgrade: it would
	// otherwise be answered 426 on a connection kept open.
	wantFull(t, dialHTTP(t, e), "GET", "/v1/ws", "\r\n")
	wantFull(t, dialHTTP(t, e), "GET", "/v1/ws", wsUpgrade)
	if c, err := client.Dial(servertest.Context(t), e.WS, nil); !errors.Is(err, client.ErrUnavailable) {
		if err == nil {
			c.CloseNow()
		}
		t.Fatalf("a WebSocket on a full node: %v, want its upgrade refused (503 unavailable)", err)
	}
	if n := e.Counter("statecast_connections_rejected_total", "reason", "full"); n != 6 {
		t.Errorf("rejected full = %v, want 6", n)
	}

	// The three still work, and a closed one frees its slot.
	if _, err := ws.Put(servertest.Context(t), "r", "k", 1); err != nil {
		t.Fatal(err)
	}
	if ev := s.event(); ev != "put" {
		t.Fatalf("stream event %q, want put", ev)
	}
	h.c.Close()
	waitSockets(t, e, 2)
	resp, b = dialHTTP(t, e).get("/v1/rooms/r/kv")
	wantStatus(t, resp, b, http.StatusOK)
}

// TestConnLimitReserveFull: past the limit and its reserve (16 at least),
// a connection is closed at accept without an answer.
func TestConnLimitReserveFull(t *testing.T) {
	e := servertest.Start(t, servertest.Options{Server: server.Config{MaxConnections: 1}})
	for range 1 + 16 {
		dialHTTP(t, e) // silent: held until the header timeout
	}
	waitSockets(t, e, 17)
	r := dialHTTP(t, e)
	r.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	if got := r.ended(); got != "" {
		t.Fatalf("past the reserve: answered %q, want a closed connection", got)
	}
	if n := e.Counter("statecast_connections_rejected_total", "reason", "reserve_full"); n != 1 {
		t.Errorf("rejected reserve_full = %v, want 1", n)
	}
}

// TestConnLimitPerIP: one address holds at most MaxConnectionsPerIP
// connections; loopback is exempt unless LimitLoopback.
func TestConnLimitPerIP(t *testing.T) {
	t.Run("limited", func(t *testing.T) {
		e := servertest.Start(t, servertest.Options{Server: server.Config{MaxConnectionsPerIP: 2, LimitLoopback: true}})
		a, b := dialHTTP(t, e), dialHTTP(t, e)
		for _, r := range []*rawHTTP{a, b} {
			resp, body := r.get("/healthz")
			wantStatus(t, resp, body, http.StatusOK)
		}
		c := dialHTTP(t, e)
		c.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		if got := c.ended(); got != "" {
			t.Fatalf("third connection from one address: answered %q, want it closed", got)
		}
		if n := e.Counter("statecast_connections_rejected_total", "reason", "per_ip"); n != 1 {
			t.Errorf("rejected per_ip = %v, want 1", n)
		}
		a.c.Close()
		waitSockets(t, e, 1)
		resp, body := dialHTTP(t, e).get("/healthz")
		wantStatus(t, resp, body, http.StatusOK)
	})
	t.Run("loopback exempt", func(t *testing.T) {
		e := servertest.Start(t, servertest.Options{Server: server.Config{MaxConnectionsPerIP: 2}})
		for range 3 {
			resp, body := dialHTTP(t, e).get("/healthz")
			wantStatus(t, resp, body, http.StatusOK)
		}
	})
}

// shortHTTPTimeouts are HTTP timeouts far shorter than the tests below
// (not the header timeout: a loaded machine may take that long to send
// a request's headers).
var shortHTTPTimeouts = server.Config{HTTPReadTimeout: 250 * time.Millisecond,
	HTTPWriteTimeout: 250 * time.Millisecond, HTTPIdleTimeout: 250 * time.Millisecond}

// TestSSEOutlivesHTTPTimeouts: the request's timeouts do not end an SSE
// stream.
func TestSSEOutlivesHTTPTimeouts(t *testing.T) {
	e := servertest.Start(t, servertest.Options{Server: shortHTTPTimeouts})
	s := dialHTTP(t, e)
	s.watch("r")
	ws := dialCodec(t, e, "json")
	for i := range 8 { // 800 ms: three read timeouts
		time.Sleep(100 * time.Millisecond)
		if _, err := ws.Put(servertest.Context(t), "r", "k", i); err != nil {
			t.Fatal(err)
		}
		if ev := s.event(); ev != "put" {
			t.Fatalf("event %d: %q, want put", i, ev)
		}
	}
	waitSockets(t, e, 1, "kind", "sse")
}

// TestWSOutlivesHTTPTimeouts: a WebSocket does not inherit the request's
// deadlines (net/http clears them at the hijack).
func TestWSOutlivesHTTPTimeouts(t *testing.T) {
	e := servertest.Start(t, servertest.Options{Server: shortHTTPTimeouts})
	c := dialCodec(t, e, "json")
	time.Sleep(800 * time.Millisecond) // three read and idle timeouts
	if _, err := c.Put(servertest.Context(t), "r", "k", 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(servertest.Context(t)); err != nil {
		t.Fatal(err)
	}
	waitSockets(t, e, 1, "kind", "ws")
}
