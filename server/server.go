// Package server is statecast's network surface: the WebSocket protocol v1
// (PROTOCOL.md), the HTTP API with Server-Sent Events, JWT auth, leases,
// limits and metrics, on top of a rooms.Engine.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/rooms/filter"
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/store"
)

// Config configures a Server. Zero fields take the documented defaults.
type Config struct {
	Store  store.Store   // required: the durable truth
	Engine *rooms.Engine // required: the room engine on Store

	// Auth verifies tokens. Nil means anonymous access with full rights;
	// the caller (cmd/statecast) allows that only on loopback addresses.
	Auth *auth.Authenticator

	// AllowOrigins are extra Origin host patterns (path.Match syntax)
	// allowed to open WebSockets, to write over HTTP and to read the HTTP
	// API cross-origin (CORS); the request's own host always is.
	AllowOrigins []string
	// AllowHosts are extra Host name patterns (path.Match syntax) served
	// in anonymous mode, besides localhost, *.localhost and IP addresses
	// (origin.go). Unused with Auth.
	AllowHosts []string

	MaxFrameBytes    int64         // largest frame read; default 1 MiB
	MaxSubscriptions int           // per connection; default 256
	MaxPrefixes      int           // key prefixes per subscription; default 64
	MaxConnPrefixes  int           // key prefixes of all a connection's subscriptions; default 1,024
	MaxConnFilters   int           // subscriptions with a filter per connection; default 16
	WriteRate        float64       // writes per second per subject (anonymous: per address); default 200
	WriteBurst       int           // default 2 × WriteRate
	MaxConnections   int           // open TCP connections of the node; default 100,000 (see below)
	MaxConnecting    int           // connects in progress (admit.go); default 128 per CPU, at least 256
	ConnectQueueWait time.Duration // longest a connect past MaxConnecting waits for a place; default 1s, negative: none
	MaxLeases        int           // TTL leases per subject (anonymous: all together); default 1,000
	WriteTimeout     time.Duration // for one frame to a socket; default 10s
	StoreTimeout     time.Duration // for one store write; default 5s
	PingInterval     time.Duration // announced ping_ms; default 25s
	ConnectTimeout   time.Duration // for the connect message; default 10s
	LeaseGrace       time.Duration // session lease grace; default 5s

	// MaxConnections counts every connection accepted by Listener: HTTP,
	// SSE and WebSocket alike. Past it a reserve of 1% (at least 16) is
	// still accepted for /healthz, /readyz and /metrics; other requests on
	// those, WebSocket upgrades too, get 503 (Statecast-Refused: full).
	//
	// MaxConnectionsPerIP bounds the open connections of one client
	// address (an IPv6 /64); past it a socket is closed at accept. Default
	// 1,000; negative: no limit. Loopback clients are exempt (a local
	// reverse proxy, statecast bench) unless LimitLoopback.
	MaxConnectionsPerIP int
	LimitLoopback       bool
	// HTTP timeouts: HTTPHeaderTimeout to read a request's headers
	// (default 10s), HTTPReadTimeout to read a whole request, body
	// included (default 60s), HTTPWriteTimeout to write a response
	// (default 60s), HTTPIdleTimeout for a keep-alive connection between
	// requests (default 120s). SSE streams and WebSockets outlive them:
	// WriteTimeout bounds each of their writes instead.
	HTTPHeaderTimeout, HTTPReadTimeout, HTTPWriteTimeout, HTTPIdleTimeout time.Duration

	// NodeID names this node among the nodes sharing the store (default:
	// random). Each process adds an incarnation to it, so a restarted
	// node is a new one to the others and two processes given the same
	// name cannot take each other's leases. No '/'.
	NodeID string
	// NodeTimeout: on a store that several nodes share (store.Nodes), a
	// node that has not beaten for this long is dead, and one surviving
	// node deletes its leased keys; default 10s. A store shared by
	// several nodes must implement store.Nodes (a wrapper must pass it
	// through): without it every leased key found at start is adopted.
	NodeTimeout time.Duration

	// Validate, when set, asks the application's backend about every
	// write to the rooms its routes cover before it commits (validate.go).
	Validate *hooks.Validator
	// Connect, when set, authenticates a client that presents no token by
	// asking the application's backend with the client's cookies
	// (connect.go); its claims are checked like a token's.
	Connect *hooks.Connector

	// Logger receives lifecycle messages; defaults to discarding.
	Logger *slog.Logger
	// Registerer receives the Prometheus collectors; default: a private
	// registry, served at /metrics.
	Registerer prometheus.Registerer
	// Gatherer serves /metrics; defaults to the private registry.
	Gatherer prometheus.Gatherer
	// Static, when set, serves the demo and other files at /.
	Static http.Handler
	// Webhooks, when set, are the node's webhooks (started by the caller):
	// their metrics join /metrics and the inspector shows them.
	Webhooks *hooks.Webhooks
	// TracerProvider, when set, receives the node's spans (tracing.go);
	// nil: tracing is off and costs nothing.
	TracerProvider trace.TracerProvider
	// AdminToken, when set, lets clients off loopback read the inspector
	// (GET /v1/admin/inspect) with Authorization: Bearer <AdminToken>;
	// loopback clients need none.
	AdminToken string
}

func (c Config) withDefaults() Config {
	if c.MaxFrameBytes <= 0 {
		c.MaxFrameBytes = 1 << 20
	}
	if c.MaxSubscriptions <= 0 {
		c.MaxSubscriptions = 256
	}
	if c.MaxPrefixes <= 0 {
		c.MaxPrefixes = 64
	}
	if c.MaxConnPrefixes <= 0 {
		c.MaxConnPrefixes = 1024
	}
	if c.MaxConnFilters <= 0 {
		c.MaxConnFilters = 16
	}
	if c.MaxLeases <= 0 {
		c.MaxLeases = 1000
	}
	if c.WriteRate <= 0 {
		c.WriteRate = 200
	}
	if c.WriteBurst <= 0 {
		c.WriteBurst = int(2 * c.WriteRate)
	}
	if c.MaxConnections <= 0 {
		c.MaxConnections = 100_000
	}
	if c.MaxConnecting <= 0 {
		c.MaxConnecting = max(256, 128*runtime.GOMAXPROCS(0))
	}
	if c.ConnectQueueWait == 0 {
		c.ConnectQueueWait = time.Second
	}
	if c.MaxConnectionsPerIP == 0 {
		c.MaxConnectionsPerIP = 1000
	}
	if c.HTTPHeaderTimeout <= 0 {
		c.HTTPHeaderTimeout = 10 * time.Second
	}
	if c.HTTPReadTimeout <= 0 {
		c.HTTPReadTimeout = 60 * time.Second
	}
	if c.HTTPWriteTimeout <= 0 {
		c.HTTPWriteTimeout = 60 * time.Second
	}
	if c.HTTPIdleTimeout <= 0 {
		c.HTTPIdleTimeout = 120 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.StoreTimeout <= 0 {
		c.StoreTimeout = 5 * time.Second
	}
	if c.PingInterval <= 0 {
		c.PingInterval = 25 * time.Second
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = 10 * time.Second
	}
	if c.LeaseGrace <= 0 {
		c.LeaseGrace = 5 * time.Second
	}
	if c.NodeID == "" {
		c.NodeID = randomID("n_")
	}
	if c.NodeTimeout <= 0 {
		c.NodeTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		reg := prometheus.NewRegistry()
		c.Registerer, c.Gatherer = reg, reg
	}
	if c.Gatherer == nil {
		c.Gatherer = prometheus.DefaultGatherer
	}
	return c
}

// Server serves one node. All methods may be called concurrently.
// New starts the lease keeper; Shutdown stops it and every connection.
type Server struct {
	tracer   trace.Tracer  // nil: tracing off (tracing.go)
	connSeq  atomic.Uint64 // numbers the connections in the logs (logs.go)
	cfg      Config
	engine   *rooms.Engine
	store    store.Store
	echo     *echo.Echo
	handler  http.Handler // echo behind guardReserve
	slots    *connSlots   // of the connections accepted by Listener
	metrics  *metrics
	leases   *lessor
	sessions *sessions
	log      *slog.Logger
	// filters compiles the filters of watches, one per expression text, so
	// that watchers with the same filter share its evaluation.
	filters filter.Cache
	// writeLimits is the write rate limit shared by every surface.
	writeLimits *writeLimits
	// hookWaits bounds each writer's writes waiting on the validation hook.
	hookWaits writerWaits
	// rateWaits bounds each writer's etcd writes waiting their turn under
	// the write rate (admitWait).
	rateWaits writerWaits
	// storeDeadline bounds the store call of every write.
	storeDeadline sharedDeadline
	// connects bounds the WebSocket and SSE connects in progress (admit.go).
	connects connectGate

	draining atomic.Bool // refuse new writes and connections
	connWG   sync.WaitGroup
	// idle waits on the sockets of idle connections (poller_linux.go),
	// started by the first that parks; nil when it could not start.
	idleOnce sync.Once
	idle     *idlePoller
	beats    heartbeats // the WebSockets' heartbeat sweep (heartbeat.go)
	wakes    wakes      // the goroutines of woken readers (wakes.go)
	flushers flushers   // the goroutines that send bursts to idle sockets (flushers.go)
	mu       sync.Mutex
	conns    map[*conn]struct{}
}

// New returns a Server. It recovers the leases a previous process left in
// the store, and on a store with store.Sessions its sessions: their keys
// are deleted after the lease grace unless their client resumes its
// session first.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Store == nil || cfg.Engine == nil {
		return nil, errors.New("server: Config.Store and Config.Engine are required")
	}
	cfg = cfg.withDefaults()
	s := &Server{
		cfg: cfg, engine: cfg.Engine, store: cfg.Store, log: cfg.Logger,
		conns:       make(map[*conn]struct{}),
		writeLimits: newWriteLimits(cfg.WriteRate, cfg.WriteBurst),
		connects: connectGate{limit: int64(cfg.MaxConnecting), wait: cfg.ConnectQueueWait,
			perClient: perClientPlaces(cfg), limitLoopback: cfg.LimitLoopback},
		wakes: wakes{ch: make(chan *conn), stop: make(chan struct{})},
	}
	m, err := newMetrics(cfg.Registerer, cfg.Engine)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	// A filter's worst case is estimated over the largest key and value
	// the store takes (--max-value).
	l := s.storeLimits()
	s.filters.Bounds = filter.Bounds{MaxKeyBytes: l.MaxKeyBytes, MaxValueBytes: l.MaxValueBytes}
	if err := registerHooks(cfg); err != nil {
		return nil, err
	}
	if cfg.Webhooks != nil {
		if err := cfg.Registerer.Register(cfg.Webhooks); err != nil {
			return nil, err
		}
	}
	if err := cfg.Registerer.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "statecast_connecting",
		Help: "WebSocket and SSE connects in progress, bounded by --max-connecting (past it: 503, counted in statecast_connections_rejected_total{reason=\"connecting\"})."},
		func() float64 { return float64(s.connects.n.Load()) })); err != nil {
		return nil, err
	}
	if err := cfg.Registerer.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "statecast_connect_queue",
		Help: "Connects past --max-connecting waiting for a place (at most 4 a place, each for up to --connect-queue-wait; then 503)."},
		func() float64 { return float64(s.connects.queued()) })); err != nil {
		return nil, err
	}
	s.slots = newConnSlots(cfg, m)
	if strings.Contains(cfg.NodeID, "/") || len(cfg.NodeID) > 64 {
		return nil, fmt.Errorf("server: node id %q: at most 64 bytes and no '/'", cfg.NodeID)
	}
	node := cfg.NodeID + "." + randomID("")[:8]
	s.leases = newLessor(cfg.Engine, cfg.Store, node, cfg.NodeTimeout, cfg.Logger, m)
	s.leases.onFence = s.fenced
	s.leases.maxOwned = cfg.MaxLeases
	// Sessions outlive the process on a store that keeps them. On a store
	// several nodes share, the store's records are the sessions and any
	// node resumes any session (session_shared.go); one that keeps no
	// shared sessions keeps them per node, in memory.
	kept, _ := cfg.Store.(store.Sessions)
	shared, _ := cfg.Store.(store.SharedSessions)
	if s.leases.nodes != nil {
		kept = nil
	}
	s.sessions = newSessions(s.leases, cfg.LeaseGrace, kept, cfg.StoreTimeout, cfg.Logger)
	if s.leases.nodes != nil && shared != nil {
		s.sessions.startShared(shared, node, max(cfg.NodeTimeout/5, 100*time.Millisecond))
	}
	if err := s.leases.recover(ctx, cfg.LeaseGrace); err != nil {
		s.sessions.close()
		s.leases.close()
		return nil, err
	}
	if err := s.sessions.load(ctx); err != nil {
		s.sessions.close()
		s.leases.close()
		return nil, err
	}
	if cfg.TracerProvider != nil {
		s.tracer = cfg.TracerProvider.Tracer(tracerName)
	}
	s.echo = s.routes()
	s.handler = s.guardReserve(s.echo)
	return s, nil
}

// fenced runs when the other nodes took this one for dead and deleted its
// leased keys: every client reconnects (1012) and, its session gone,
// writes again what its leases held.
func (s *Server) fenced() {
	for _, c := range s.connList() {
		go c.stop("this node lost its place among the nodes; reconnect")
	}
}

// Handler returns the HTTP handler of every route.
// Serve it with HTTPServer and Listener for the connection limits and
// the HTTP timeouts.
func (s *Server) Handler() http.Handler { return s.handler }

// Shutdown stops the node gracefully: new writes are refused with
// unavailable, every connection flushes what it has queued and is closed
// with 1012 (reconnect elsewhere), then the lease keeper stops. No
// session ends and no leased key is deleted: a session's grace starts at
// the next start, whose clients resume it (on a store with
// store.Sessions) or whose recovery ends it. Writes
// already taken are answered or failed before their socket closes, so no
// acknowledged write is lost and no unacknowledged one is reported done.
// It does not close the engine or the store.
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	s.connects.close()
	// First, so that the sockets closing below do not start their
	// sessions' grace: a session ends only when its client has not come
	// back within the grace after the next start.
	s.sessions.close()
	conns := s.connList()
	// All connections flush and close at once: one peer that does not
	// answer the close handshake must not hold up the others.
	for _, c := range conns {
		go c.shutdown()
	}
	done := make(chan struct{})
	go func() { s.connWG.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
		for _, c := range conns {
			c.drop() // out of time: drop whoever is left
		}
		<-done
	}
	s.idleOnce.Do(func() {}) // none starts after this
	if s.idle != nil {
		s.idle.stop()
	}
	s.stopHeartbeats()
	s.stopReaders()
	s.stopFlushers()
	s.leases.close()
	s.leases.keepTTL()
	return err
}

// poller returns the idle poller, starting it on first use; nil where
// there is none: readers then wait on their own goroutines.
func (s *Server) poller() *idlePoller {
	s.idleOnce.Do(func() {
		p, err := newIdlePoller()
		if err != nil {
			s.log.Warn("server: idle connections keep a goroutine each", "err", err)
			return
		}
		s.idle = p
	})
	return s.idle
}

// connsFull reports whether MaxConnections WebSockets are open (a server
// served without Listener; with it, guardReserve refuses what is past the
// limit before the handler).
func (s *Server) connsFull() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns) >= s.cfg.MaxConnections
}

// addConn registers a WebSocket, or refuses it (4004) when the node is
// full: its socket was accepted into the reserve past MaxConnections, or,
// served without Listener, MaxConnections WebSockets are open (a node
// that filled during the handshake; a full one refuses the upgrade with
// 503 before it).
func (s *Server) addConn(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sc, _ := c.nc.(*slotConn)
	if s.draining.Load() || len(s.conns) >= s.cfg.MaxConnections || (sc != nil && sc.overLimit) {
		return false
	}
	if sc != nil {
		sc.setKind(kindWS)
	}
	s.conns[c] = struct{}{}
	s.connWG.Add(1)
	return true
}

// connList returns the open connections.
func (s *Server) connList() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	return conns
}

func (s *Server) removeConn(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.connWG.Done()
}
