package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/statecast/statecast/server/wire"
)

// Connection accounting. Every accepted TCP connection holds a slot until
// its socket closes, whatever it carries: HTTP requests (and keep-alive
// idle time between them), an SSE stream or a WebSocket. The listener
// refuses what is over the limits at accept time, before a request is
// read, so a flood of sockets cannot exhaust the node's file descriptors.
//
// Past MaxConnections a reserve of connections is still accepted, so that
// /healthz, /readyz and /metrics answer when the node is full: on these
// any other request, a WebSocket upgrade too, is answered 503 with
// Retry-After and Statecast-Refused: full. Each serves one request and
// closes.
// Past the reserve, and past the per-address limit, the socket is closed
// as soon as it is accepted, without a byte.

// reserveOf is how many connections past the limit are accepted for
// health checks and metrics.
func reserveOf(limit int) int { return max(limit/100, 16) }

// FDsNeeded is how many file descriptors the connections of a node with
// this connection limit may hold (the limit plus the reserve).
func FDsNeeded(maxConnections int) int { return maxConnections + reserveOf(maxConnections) }

// Listener wraps ln with the connection limits: serve HTTPServer on it.
func (s *Server) Listener(ln net.Listener) net.Listener {
	return &limitListener{Listener: ln, s: s}
}

// HTTPServer returns the http.Server to serve s on (with Listener).
func (s *Server) HTTPServer() *http.Server {
	return &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: s.cfg.HTTPHeaderTimeout,
		// The whole request, body included: a stalled body ties up a
		// socket and a goroutine. net/http clears this deadline once the
		// body is read (an SSE stream outlives it) and at a WebSocket's
		// hijack (TestSSEOutlivesHTTPTimeouts, TestWSOutlivesHTTPTimeouts).
		ReadTimeout: s.cfg.HTTPReadTimeout,
		// A response the client does not take (a large list) would hold
		// its socket and memory forever. An SSE stream moves this
		// deadline at each write (sse.go flush); a WebSocket's hijack
		// clears it.
		WriteTimeout:   s.cfg.HTTPWriteTimeout,
		IdleTimeout:    s.cfg.HTTPIdleTimeout,
		MaxHeaderBytes: 64 << 10,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if sc, ok := c.(*slotConn); ok {
				return context.WithValue(ctx, slotKey{}, sc)
			}
			return ctx
		},
		// Accept errors (EMFILE: net/http retries with a backoff of up to
		// 1 s) and bad handshakes go to the log, not to stderr.
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
}

type slotKey struct{}

// slotOf returns the slot of the request's connection, or nil when it
// was not accepted by Listener.
func slotOf(ctx context.Context) *slotConn {
	sc, _ := ctx.Value(slotKey{}).(*slotConn)
	return sc
}

// guardReserve answers the requests that arrive on connections accepted
// past the limit: health checks and metrics are served, anything else gets
// 503, a WebSocket upgrade too. Such a connection serves one request: it
// must not keep its place.
//
// An upgrade is refused before the handshake rather than accepted and
// closed with 4004: in a reconnect storm the clients that fit nowhere
// try the full nodes again and again (40,000 times a step of a rolling
// restart of six nodes of 19,548), and a handshake with its close
// handshake cost a node 490 µs, about as much as a session that connects
// and subscribes, against 180 µs for the 503. A browser sees 1006 instead
// of 4004, and backs off alike.
func (s *Server) guardReserve(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc := slotOf(r.Context())
		if sc == nil || !sc.overLimit {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Connection", "close")
		// Nor may it wait for a body: net/http would read what is left
		// of one (a stalled one: until the read timeout) before closing.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now())
		switch r.URL.Path {
		case "/healthz", "/readyz", "/metrics":
			next.ServeHTTP(w, r)
			return
		}
		s.refuseFull(w)
	})
}

// refuseFull answers a request the node has no connection for; a
// draining node says so instead (its clients go elsewhere at once), as
// it does to every connect.
func (s *Server) refuseFull(w http.ResponseWriter) {
	if s.draining.Load() {
		answerUnavailable(w, "", "server is shutting down; connect to another node")
		return
	}
	s.metrics.rejected.WithLabelValues("full").Inc()
	answerUnavailable(w, refusedFull, "server full: too many connections; retry later, on another node if you can")
}

// Why a node answered 503, in its Statecast-Refused header: a client that
// picks its node (not one behind a load balancer) tries another when the
// node is full, and the same one after Retry-After when it is busy
// connecting others.
const (
	refusedFull       = "full"
	refusedConnecting = "connecting"
)

// answerUnavailable answers 503 with Retry-After: 1 and an error body,
// bypassing the error handler and its log line: the node refuses these
// by the thousand under load (past the limits, past --max-connecting),
// and the metrics count them.
func answerUnavailable(w http.ResponseWriter, refused, message string) {
	w.Header().Set("Retry-After", "1")
	if refused != "" {
		w.Header().Set("Statecast-Refused", refused)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusServiceUnavailable)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": wire.CodeUnavailable, "message": message}})
}

// limitListener admits connections under the limits and closes the rest.
type limitListener struct {
	net.Listener
	s *Server
	// noReserve closes a connection past the limit too: its protocol has
	// no health check for the reserve to keep answering (GRPCListener).
	noReserve bool
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			// net/http retries a temporary error (EMFILE) after a backoff.
			return nil, err
		}
		tc, ok := c.(*net.TCPConn)
		if !ok {
			return c, nil // only TCP connections are counted
		}
		sc := l.s.slots.admit(tc)
		switch {
		case sc == nil:
			_ = tc.Close()
		case sc.overLimit && l.noReserve:
			_ = sc.Close()
		default:
			return sc, nil
		}
	}
}

// connKind is what a connection carries, for the metrics.
type connKind int

const (
	kindHTTP connKind = iota
	kindSSE
	kindWS
)

func (k connKind) String() string { return [...]string{"http", "sse", "ws"}[k] }

// connSlots counts the open connections, in all and per client address.
type connSlots struct {
	limit, reserve int
	perIP          int // <= 0: none
	limitLoopback  bool
	m              *metrics

	mu   sync.Mutex
	open int
	byIP map[netip.Addr]int
}

func newConnSlots(cfg Config, m *metrics) *connSlots {
	return &connSlots{limit: cfg.MaxConnections, reserve: reserveOf(cfg.MaxConnections),
		perIP: cfg.MaxConnectionsPerIP, limitLoopback: cfg.LimitLoopback, m: m, byIP: make(map[netip.Addr]int)}
}

// ipKey is the address a connection counts against, and whether it
// counts at all. An IPv6 client usually holds a whole /64: that is its
// address here. Loopback clients (a local proxy, statecast bench) are not
// limited unless LimitLoopback.
func (cs *connSlots) ipKey(tc *net.TCPConn) (netip.Addr, bool) {
	ta, ok := tc.RemoteAddr().(*net.TCPAddr)
	if !ok || cs.perIP <= 0 {
		return netip.Addr{}, false
	}
	return clientKey(ta.AddrPort().Addr(), cs.limitLoopback)
}

// clientKey is the address a client's limits count against (its /64 for
// IPv6), and whether they apply: not to loopback unless limitLoopback.
func clientKey(ip netip.Addr, limitLoopback bool) (netip.Addr, bool) {
	ip = ip.Unmap()
	if !ip.IsValid() || ip.IsLoopback() && !limitLoopback {
		return netip.Addr{}, false
	}
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		ip = p.Addr()
	}
	return ip, true
}

// admit takes a slot for tc, or returns nil (and counts why) when tc must
// be closed.
func (cs *connSlots) admit(tc *net.TCPConn) *slotConn {
	ip, perIP := cs.ipKey(tc)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if perIP && cs.byIP[ip] >= cs.perIP {
		cs.m.rejected.WithLabelValues("per_ip").Inc()
		return nil
	}
	if cs.open >= cs.limit+cs.reserve {
		cs.m.rejected.WithLabelValues("reserve_full").Inc()
		return nil
	}
	cs.open++
	if perIP {
		cs.byIP[ip]++
	}
	cs.m.sockets[kindHTTP].Inc()
	return &slotConn{TCPConn: tc, slots: cs, ip: ip, perIP: perIP, overLimit: cs.open > cs.limit}
}

func (cs *connSlots) release(c *slotConn) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.open--
	if c.perIP {
		if n := cs.byIP[c.ip] - 1; n > 0 {
			cs.byIP[c.ip] = n
		} else {
			delete(cs.byIP, c.ip)
		}
	}
}

// slotConn is an admitted connection; closing it frees its slot. It
// embeds the *net.TCPConn so that net/http keeps its fast paths
// (ReadFrom: sendfile; CloseWrite) and waitReadable its socket.
type slotConn struct {
	*net.TCPConn
	slots     *connSlots
	ip        netip.Addr
	perIP     bool // counted against ip
	overLimit bool // accepted into the reserve

	mu     sync.Mutex
	kind   connKind
	closed bool
}

func (c *slotConn) Close() error {
	err := c.TCPConn.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		c.slots.m.sockets[c.kind].Dec()
		c.slots.release(c)
	}
	return err
}

// setKind records what the connection now carries.
func (c *slotConn) setKind(k connKind) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.kind == k {
		return
	}
	c.slots.m.sockets[c.kind].Dec()
	c.slots.m.sockets[k].Inc()
	c.kind = k
}

// streaming counts the request's connection as an SSE stream until the
// returned function runs.
func (s *Server) streaming(r *http.Request) (done func()) {
	sc := slotOf(r.Context())
	if sc == nil {
		return func() {}
	}
	sc.setKind(kindSSE)
	return func() { sc.setKind(kindHTTP) }
}
