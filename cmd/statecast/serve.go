package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/trace"

	"github.com/statecast/statecast/cmd/statecast/internal/flags"
	"github.com/statecast/statecast/cmd/statecast/internal/memrelease"
	"github.com/statecast/statecast/cmd/statecast/internal/proc"
	"github.com/statecast/statecast/demo"
	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/etcd"
	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redisstore"
)

// classFlag collects --history-class PREFIX=EVENTS[/AGE[/BYTES]] rules.
type classFlag []store.RoomClass

func (c *classFlag) String() string { return "" }

func (c *classFlag) Set(v string) error {
	prefix, rule, ok := strings.Cut(v, "=")
	if !ok || prefix == "" {
		return fmt.Errorf("want PREFIX=EVENTS[/AGE[/BYTES]], e.g. lobby:=500/10m or doc:=10000/0/8MiB")
	}
	parts := strings.Split(rule, "/")
	if len(parts) > 3 {
		return fmt.Errorf("want PREFIX=EVENTS[/AGE[/BYTES]], got %q", v)
	}
	n, err := strconv.Atoi(parts[0])
	if err != nil || n <= 0 {
		return fmt.Errorf("events must be a positive integer, got %q", parts[0])
	}
	r := store.Retention{MaxEvents: n}
	if len(parts) > 1 && parts[1] != "" && parts[1] != "0" {
		if r.MaxAge, err = time.ParseDuration(parts[1]); err != nil {
			return err
		}
	}
	if len(parts) > 2 {
		var b bytesFlag
		if err := b.Set(parts[2]); err != nil {
			return err
		}
		r.MaxBytes = int64(b)
	}
	*c = append(*c, store.RoomClass{Prefix: prefix, Retention: r})
	return nil
}

// bytesFlag is a size in bytes, with an optional KiB, MiB or GiB suffix.
type bytesFlag int64

func (b *bytesFlag) String() string { return strconv.FormatInt(int64(*b), 10) }

func (b *bytesFlag) Set(v string) error {
	num, mult := v, int64(1)
	for suffix, m := range map[string]int64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if t, ok := strings.CutSuffix(v, suffix); ok {
			num, mult = t, m
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return fmt.Errorf("want a positive size in bytes, optionally with KiB, MiB or GiB, got %q", v)
	}
	*b = bytesFlag(n * mult)
	return nil
}

// webhookFlag collects --webhook PATTERN=URL hooks; one value (the
// environment's) may hold several, separated by spaces.
type webhookFlag []hooks.Route

func (w *webhookFlag) String() string { return "" }

func (w *webhookFlag) Set(v string) error {
	for _, s := range strings.Fields(v) {
		spec, err := hooks.ParseRoute(s)
		if err != nil {
			return err
		}
		*w = append(*w, spec)
	}
	return nil
}

type serveFlags struct {
	addr, data, storeURL, logLevel      string
	logFormat                           string
	etcdAddr                            string
	etcdReplyBytes, etcdWatchBytes      bytesFlag
	etcdIdle                            time.Duration
	etcdProgress                        time.Duration
	etcdDefaultRoom                     string
	redisPrefix, nodeID                 string
	redisCluster                        bool
	redisMinReplicas                    int
	redisReplicaTimeout                 time.Duration
	hmacSecret, hmacSecretFile, pubKey  string
	algs                                flags.List
	issuer, audience                    string
	insecure                            bool
	origins, hosts                      flags.List
	history                             int
	historyAge                          time.Duration
	historyBytes, nodeHistoryBytes      bytesFlag
	queueBytes                          bytesFlag
	classes                             classFlag
	maxFrame, maxValue, maxOps          int
	roomMaxKeys                         int
	roomMaxBytes                        bytesFlag
	maxSubs, maxConns, maxConnsPerIP    int
	maxConnecting                       int
	connectQueueWait                    time.Duration
	maxConnsSet                         bool // --max-connections given (or its variable): not a default to size
	maxPrefixes, maxConnPrefixes        int
	maxConnFilters, maxRoomFilters      int
	maxLeases                           int
	headerTimeout, readTimeout          time.Duration
	httpWriteTimeout, idleTimeout       time.Duration
	writeRate                           float64
	writeTimeout, leaseGrace, pingEvery time.Duration
	syncTimeout                         time.Duration
	nodeTimeout                         time.Duration
	adminToken, adminTokenFile          string
	hookValidate                        flags.List
	hookConnect                         string
	hookSecret, hookSecretFile          string
	hookTimeout                         time.Duration
	demoHooks                           bool
	webhooks                            webhookFlag
	webhookSecret, webhookSecretFile    string
	webhookTimeout, webhookMaxBackoff   time.Duration
	webhookBatch                        int
	releaseIdleMemory                   bool
}

func serve(args []string) error {
	var f serveFlags
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.StringVar(&f.addr, "addr", "127.0.0.1:8080", "listen address HOST:PORT")
	fs.StringVar(&f.etcdAddr, "etcd-addr", "", "also serve etcd's v3 gRPC API on HOST:PORT (e.g. 127.0.0.1:2379): etcdctl and etcd clients read, write, lease and watch rooms as keys /<room>/<key> (docs/ETCD.md); off by default")
	f.etcdReplyBytes, f.etcdWatchBytes = 16<<20, 4<<20
	fs.Var(&f.etcdReplyBytes, "etcd-max-reply-bytes", "keys and values of one etcd reply (a Range, a Txn's ranges): past it a Range with a limit pages, anything else is ResourceExhausted; 16 replies this size are built and sent at once at most")
	fs.Var(&f.etcdWatchBytes, "etcd-max-watch-bytes", "events the etcd watches of one connection may hold unsent; past it they wait, then catch up from the room's history")
	fs.StringVar(&f.etcdDefaultRoom, "etcd-default-room", "", "with --etcd-addr: the room of every etcd key that names no other room (not /<room>/…), so etcd clients have etcd's one keyspace (etcdctl put foo bar, get --prefix \"\", compaction); off by default")
	fs.DurationVar(&f.etcdIdle, "etcd-idle-timeout", 2*time.Minute, "an etcd connection with no request in flight this long (a watch is one) is sent GOAWAY")
	fs.DurationVar(&f.etcdProgress, "etcd-progress-interval", 10*time.Minute, "an etcd watch created with progress_notify that sent nothing this long is told its revision (etcd: --experimental-watch-progress-notify-interval)")
	fs.StringVar(&f.data, "data", "./data", "directory of the embedded file store")
	fs.StringVar(&f.storeURL, "store", "file", "store: file, memory (ephemeral), or a redis:// or redis+sentinel:// URL (several nodes share it)")
	fs.BoolVar(&f.redisCluster, "redis-cluster", false, "the --store URL lists Redis Cluster seed nodes, comma-separated")
	fs.StringVar(&f.redisPrefix, "redis-prefix", "sc", "prefix of every Redis key of this deployment")
	fs.IntVar(&f.redisMinReplicas, "redis-min-replicas", 0, "acknowledge a write once this many Redis replicas hold it (WAIT); one they do not confirm in time is answered outcome_unknown (0: do not wait)")
	fs.DurationVar(&f.redisReplicaTimeout, "redis-replica-timeout", time.Second, "how long a write waits for --redis-min-replicas replicas")
	fs.StringVar(&f.nodeID, "node-id", "", "this node's name among the nodes sharing a store (default: random per start)")
	fs.DurationVar(&f.nodeTimeout, "node-timeout", 10*time.Second, "on a shared store, a node silent this long is dead and a survivor deletes its leased keys")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error (docs/OPERATIONS.md, Logs)")
	fs.StringVar(&f.logFormat, "log-format", "text", "text (key=value) or json (one object per line)")
	fs.StringVar(&f.hmacSecret, "jwt-hmac-secret", "", "HMAC secret for JWTs (prefer --jwt-hmac-secret-file)")
	fs.StringVar(&f.hmacSecretFile, "jwt-hmac-secret-file", "", "file holding the HMAC secret for JWTs")
	fs.StringVar(&f.pubKey, "jwt-public-key-file", "", "PEM file of RSA, ECDSA or Ed25519 public keys for JWTs")
	fs.Var(&f.algs, "jwt-alg", "allowed JWT algorithms (default: the natural ones of the configured keys)")
	fs.StringVar(&f.issuer, "jwt-issuer", "", "required JWT iss")
	fs.StringVar(&f.audience, "jwt-audience", "", "required JWT aud")
	fs.BoolVar(&f.insecure, "insecure-no-auth", false, "allow anonymous access on a non-loopback address")
	fs.Var(&f.origins, "allow-origin", "extra Origin host patterns allowed to open WebSockets, write over HTTP and read the HTTP API cross-origin (CORS)")
	fs.Var(&f.hosts, "allow-host", "without auth: extra Host name patterns served, besides localhost, *.localhost and IP addresses (DNS rebinding guard)")
	fs.IntVar(&f.history, "history", store.DefaultMaxEvents, "events of history retained per room")
	fs.DurationVar(&f.historyAge, "history-age", 0, "also drop history older than this (0 = no age limit)")
	f.historyBytes, f.nodeHistoryBytes, f.queueBytes = store.DefaultMaxBytes, 512<<20, 4<<20
	fs.Var(&f.historyBytes, "history-bytes", "bytes of history retained per room: keys, values and previous values, plus 160 per event in memory, the encoded log records in the file store, the stream entries in Redis (KiB, MiB, GiB suffixes)")
	fs.Var(&f.classes, "history-class", "retention of rooms named PREFIX*: PREFIX=EVENTS[/AGE[/BYTES]], AGE 0 for none, BYTES defaulting to --history-bytes (repeatable)")
	fs.Var(&f.nodeHistoryBytes, "history-node-bytes", "bytes of history retained by all loaded rooms together, cached encodings included; over it the oldest history is dropped first (resumes from there get a snapshot)")
	fs.Var(&f.queueBytes, "watch-queue-bytes", "bytes of events a subscription may have waiting before it is parked as slow and later caught up by one coalesced message")
	fs.IntVar(&f.maxFrame, "max-frame", 1<<20, "largest WebSocket frame read, in bytes")
	fs.IntVar(&f.maxValue, "max-value", 256<<10, "largest value, in bytes")
	fs.IntVar(&f.maxOps, "max-ops", 256, "operations and conditions of one write (a transaction, an etcd DeleteRange of a range)")
	fs.IntVar(&f.roomMaxKeys, "room-max-keys", 100_000, "keys one room may hold: a write past it is refused (quota_exceeded, HTTP 507; etcd: database space exceeded); deletes always commit")
	f.roomMaxBytes = 64 << 20
	fs.Var(&f.roomMaxBytes, "room-max-bytes", "bytes of keys and values one room may hold, as --room-max-keys (KiB, MiB, GiB suffixes)")
	fs.IntVar(&f.maxSubs, "max-subscriptions", 256, "subscriptions per connection")
	fs.IntVar(&f.maxPrefixes, "max-prefixes", 64, "key prefixes per watch (WebSocket sub or SSE)")
	fs.IntVar(&f.maxConnPrefixes, "max-conn-prefixes", 1024, "key prefixes over all the subscriptions of one WebSocket")
	fs.IntVar(&f.maxRoomFilters, "max-room-filters", 256, "distinct filters (by text) watching one room on this node: each is evaluated once per event of the room, under its lock")
	fs.IntVar(&f.maxConnFilters, "max-conn-filters", 16, "subscriptions with a filter on one WebSocket (each distinct filter costs an evaluation per event of its room)")
	fs.IntVar(&f.maxLeases, "max-leases", 1000, "TTL leases per token subject (without auth: all clients together)")
	fs.IntVar(&f.maxConns, "max-connections", 100_000, "open connections per server: HTTP, SSE and WebSocket (1% more are kept for /healthz, /readyz, /metrics)")
	fs.IntVar(&f.maxConnecting, "max-connecting", 0, "WebSocket and SSE connects in progress at once (session, first subscription); past it a connect queues (--connect-queue-wait), then 503 with Retry-After; 0: 128 per CPU, at least 256")
	fs.DurationVar(&f.connectQueueWait, "connect-queue-wait", time.Second, "how long a connect past --max-connecting waits, first come first served, for a place (at most 4 waiting a place); 0: none, 503 at once")
	fs.IntVar(&f.maxConnsPerIP, "max-connections-per-ip", 1000, "open connections per client address (IPv6: per /64); 0: no limit; loopback clients are exempt")
	fs.DurationVar(&f.headerTimeout, "http-header-timeout", 10*time.Second, "an HTTP request's headers must arrive within this")
	fs.DurationVar(&f.readTimeout, "http-read-timeout", 60*time.Second, "a whole HTTP request, body included, must arrive within this")
	fs.DurationVar(&f.httpWriteTimeout, "http-write-timeout", 60*time.Second, "an HTTP response (not an SSE stream) must be taken by the client within this")
	fs.DurationVar(&f.idleTimeout, "http-idle-timeout", 120*time.Second, "an idle keep-alive HTTP connection is closed after this")
	fs.Float64Var(&f.writeRate, "write-rate", 200, "writes per second per token subject (without auth: per client address), over WebSockets and HTTP together; burst twice that. A write the store takes (committed, conflict, quota) counts one per op, or per 64 KiB of keys and values when that is more")
	fs.DurationVar(&f.writeTimeout, "write-timeout", 10*time.Second, "a socket that does not take a frame within this is closed (4000)")
	fs.DurationVar(&f.syncTimeout, "sync-timeout", 5*time.Second, "longest wait of a linearizable read, or of a write's reply, for this node's view to reach the store's revision (a read past it: 503 unavailable)")
	fs.DurationVar(&f.leaseGrace, "lease-grace", 5*time.Second, "how long a session's leases outlive its socket")
	fs.DurationVar(&f.pingEvery, "ping-interval", 25*time.Second, "client ping interval announced to clients")
	fs.StringVar(&f.adminToken, "admin-token", "", "bearer token for the inspector (/v1/admin/inspect) off loopback (prefer --admin-token-file)")
	fs.StringVar(&f.adminTokenFile, "admin-token-file", "", "file holding the inspector's admin token")
	fs.Var(&f.hookValidate, "hook-validate", "ROOM_PATTERN=URL: before a write to a matching room commits, ask the application's backend at URL (repeatable; the first matching pattern wins; docs/HOOKS.md)")
	fs.StringVar(&f.hookConnect, "hook-connect", "", "URL of the application's backend that authenticates clients without a token from their Cookie header and returns their grants")
	fs.StringVar(&f.hookSecret, "hook-secret", "", "secret that signs every hook request (Statecast-Signature; prefer --hook-secret-file)")
	fs.StringVar(&f.hookSecretFile, "hook-secret-file", "", "file holding the hook secret")
	fs.DurationVar(&f.hookTimeout, "hook-timeout", hooks.DefaultTimeout, "longest wait for a hook's answer (past it the write or connection fails unavailable)")
	fs.BoolVar(&f.demoHooks, "demo-hooks", true, "run the lobby demo's backend on a loopback port and validate writes to "+demo.LobbyHookRooms+" rooms with it (only the host may close a game)")
	fs.Var(&f.webhooks, "webhook", "POST the committed revisions of the rooms matching PATTERN to URL: PATTERN=URL, e.g. 'doc:*=https://app.internal/hooks/doc' (repeatable; docs/OPERATIONS.md, Webhooks)")
	fs.StringVar(&f.webhookSecret, "webhook-secret", "", "HMAC-SHA256 key that signs every webhook POST (prefer --webhook-secret-file; default: the --hook-secret)")
	fs.StringVar(&f.webhookSecretFile, "webhook-secret-file", "", "file holding the webhooks' signing key")
	fs.DurationVar(&f.webhookTimeout, "webhook-timeout", 10*time.Second, "a webhook POST not answered 2xx within this is retried")
	fs.DurationVar(&f.webhookMaxBackoff, "webhook-max-backoff", 30*time.Second, "longest wait between two attempts of a webhook delivery (exponential backoff with full jitter)")
	fs.IntVar(&f.webhookBatch, "webhook-batch", 1000, "most events per webhook POST (whole revisions; one larger revision still goes alone)")
	fs.BoolVar(&f.releaseIdleMemory, "release-idle-memory", true, "when the node is idle and its heap holds much more than is live (after a connect burst), return the spare to the system, so RSS follows what the connections hold")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	fs.Visit(func(fl *flag.Flag) { f.maxConnsSet = f.maxConnsSet || fl.Name == "max-connections" })
	return run(f)
}

// parseFlags parses args, then sets what they left out from the
// environment (flags.FromEnv). help reports -h: the usage was printed.
func parseFlags(fs *flag.FlagSet, args []string) (help bool, err error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return true, nil
		}
		return false, err
	}
	return false, flags.FromEnv(fs)
}

func run(f serveFlags) error {
	log, err := newLogger(f.logFormat, f.logLevel)
	if err != nil {
		return err
	}
	authn, err := authenticator(f)
	if err != nil {
		return err
	}
	for _, addr := range []string{f.addr, f.etcdAddr} {
		if addr != "" && authn == nil && f.hookConnect == "" && !f.insecure && !isLoopback(addr) {
			return fmt.Errorf("refusing to listen on %s without auth: configure --jwt-hmac-secret-file or --jwt-public-key-file, or pass --insecure-no-auth", addr)
		}
	}
	adminToken, err := secret(f.adminToken, f.adminTokenFile)
	if err != nil {
		return err
	}
	if f.releaseIdleMemory {
		r := memrelease.Start(memrelease.DefaultPeriod, func(spare, live uint64) {
			log.Debug("returned the spare heap to the system", "spare_bytes", spare, "live_bytes", live)
		})
		defer r.Stop()
	}
	for i := range f.classes {
		if f.classes[i].Retention.MaxBytes == 0 {
			f.classes[i].Retention.MaxBytes = int64(f.historyBytes)
		}
	}
	retention := store.RetentionPolicy{Default: store.Retention{MaxEvents: f.history, MaxAge: f.historyAge, MaxBytes: int64(f.historyBytes)}, Classes: f.classes}
	if f.etcdDefaultRoom != "" {
		if err := store.ValidClientRoom(f.etcdDefaultRoom); err != nil {
			return fmt.Errorf("--etcd-default-room: %w", err)
		}
	}
	if f.maxOps < 0 {
		return fmt.Errorf("--max-ops must not be negative (0: the default), got %d", f.maxOps)
	}
	if f.roomMaxKeys < 0 || f.roomMaxBytes < 0 {
		return fmt.Errorf("--room-max-keys and --room-max-bytes must not be negative (0: the default), got %d and %d", f.roomMaxKeys, f.roomMaxBytes)
	}
	limits := store.Limits{MaxValueBytes: f.maxValue, MaxOps: f.maxOps, MaxRoomKeys: f.roomMaxKeys, MaxRoomBytes: int64(f.roomMaxBytes)}
	tp, err := startTracing(context.Background())
	if err != nil {
		return err
	}
	var tracer trace.TracerProvider // nil, not a nil *TracerProvider: off
	if tp != nil {
		tracer = tp
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tp.Shutdown(ctx); err != nil {
				log.Warn("tracing: cannot export the last spans", "err", err)
			}
		}()
		log.Info("tracing: exporting spans over OTLP (OTEL_* variables)")
	}
	st, where, err := openStore(f, retention, limits, log)
	if err != nil {
		return err
	}
	defer st.Close()
	wh, err := webhooks(f, st, log, tracer)
	if err != nil {
		return err
	}
	engine := rooms.New(st, rooms.Config{Retention: retention, HistoryBytes: int64(f.nodeHistoryBytes), SyncTimeout: f.syncTimeout, MaxFilters: f.maxRoomFilters,
		QueueBytes: int64(f.queueBytes), Logger: log, Prepare: server.PrepareChange, BeforeApply: wh.BeforeApply})
	defer engine.Close()

	validator, connector, stopHooks, err := hookConfig(f, engine, log)
	if err != nil {
		return err
	}
	defer stopHooks()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	perIP := f.maxConnsPerIP
	if perIP <= 0 {
		perIP = -1 // server.Config: negative is no limit
	}
	// The node's own metrics, and the Go runtime's and the process's:
	// CPU, goroutines, heap, and how long runnable goroutines wait for a
	// CPU (go_sched_latencies_seconds: a node short of cores in a
	// reconnect storm shows it first; its beats wait too).
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsScheduler)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := server.New(ctx, server.Config{
		Registerer: reg, Gatherer: reg,
		Store: st, Engine: engine, Auth: authn, AllowOrigins: f.origins, AllowHosts: f.hosts,
		MaxFrameBytes: int64(f.maxFrame), MaxSubscriptions: f.maxSubs, MaxPrefixes: f.maxPrefixes, MaxConnPrefixes: f.maxConnPrefixes, MaxConnFilters: f.maxConnFilters,
		MaxConnections: fitConnections(f.maxConns, f.maxConnsSet, log), MaxConnectionsPerIP: perIP, MaxConnecting: f.maxConnecting, ConnectQueueWait: queueWait(f.connectQueueWait), MaxLeases: f.maxLeases,
		HTTPHeaderTimeout: f.headerTimeout, HTTPReadTimeout: f.readTimeout,
		HTTPWriteTimeout: f.httpWriteTimeout, HTTPIdleTimeout: f.idleTimeout,
		WriteRate: f.writeRate, WriteTimeout: f.writeTimeout, LeaseGrace: f.leaseGrace, PingInterval: f.pingEvery,
		NodeID: f.nodeID, NodeTimeout: f.nodeTimeout,
		Logger: log, Static: http.FileServerFS(demo.Files), AdminToken: adminToken,
		Validate: validator, Connect: connector, Webhooks: wh.IfAny(), TracerProvider: tracer,
	})
	if err != nil {
		return err
	}
	if err := wh.Start(ctx); err != nil {
		return err
	}
	defer wh.Close()
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return err
	}
	errc := make(chan error, 2)
	// The etcd API drains beside the HTTP server (its watches and
	// keep-alives end while the lease manager still runs), or at return.
	stopEtcd := func(context.Context) {}
	if f.etcdAddr != "" {
		// Announced before the HTTP address, which tests and scripts
		// wait for: by then the etcd API is up too.
		eln, err := net.Listen("tcp", f.etcdAddr)
		if err != nil {
			return err
		}
		es := etcd.New(etcd.Config{Node: srv, Name: f.nodeID + "@" + eln.Addr().String(), MaxWatches: f.maxSubs,
			MaxReplyBytes: int(f.etcdReplyBytes), MaxWatchBytes: int(f.etcdWatchBytes), IdleTimeout: f.etcdIdle, DefaultRoom: f.etcdDefaultRoom, ProgressInterval: f.etcdProgress, Logger: log})
		fmt.Printf("statecast: etcd v3 API on %s\n", eln.Addr())
		go func() { errc <- es.Serve(eln) }()
		var once sync.Once
		stopEtcd = func(ctx context.Context) { once.Do(func() { es.Stop(ctx) }) }
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			stopEtcd(sctx)
		}()
	}
	hs := srv.HTTPServer()
	fmt.Printf("statecast listening on http://%s (store: %s)\n", ln.Addr(), where)
	if authn == nil && connector == nil {
		fmt.Println("statecast: no auth configured: anonymous clients may read and write every room")
		fmt.Println("statecast: anonymous mode answers only Host names localhost, *.localhost, IP addresses and --allow-host patterns")
	}
	go func() { errc <- hs.Serve(srv.Listener(ln)) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: flushing connections")
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	etcdStopped := make(chan struct{})
	go func() { stopEtcd(sctx); close(etcdStopped) }()
	defer func() { <-etcdStopped }()
	_ = srv.Shutdown(sctx)
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// webhooks returns the node's webhooks (none configured: a Webhooks that
// delivers nothing).
func webhooks(f serveFlags, st store.Store, log *slog.Logger, tracer trace.TracerProvider) (*hooks.Webhooks, error) {
	key, err := secret(f.webhookSecret, f.webhookSecretFile)
	if err != nil {
		return nil, err
	}
	if key == "" { // the other hooks' secret signs them too
		if key, err = secret(f.hookSecret, f.hookSecretFile); err != nil {
			return nil, err
		}
	}
	if len(f.webhooks) == 0 {
		key = "unused"
	}
	node := f.nodeID
	if node == "" {
		host, _ := os.Hostname()
		node = fmt.Sprintf("%s.%d", host, os.Getpid())
	}
	_, shared := st.(store.Nodes)
	return hooks.New(st, hooks.Config{Hooks: f.webhooks, Secret: []byte(key), Node: node, Shared: shared,
		ClaimTimeout: f.nodeTimeout, Timeout: f.webhookTimeout, MaxBackoff: f.webhookMaxBackoff, MaxEvents: f.webhookBatch, Logger: log, TracerProvider: tracer})
}

// fdHeadroom is the file descriptors kept for what is not a client
// connection: the store's files, a Redis pool, the log.
const fdHeadroom = 256

// fitConnections returns the connection limit to use: want, or less when
// the file limit (raised to its hard limit first) cannot hold that many
// connections and their reserve. Past it accept fails for everyone
// (EMFILE), health checks included. A default want is sized to the limit
// quietly; only a configured one that cannot be met is warned about.
func fitConnections(want int, configured bool, log *slog.Logger) int {
	limit, err := proc.RaiseNofile() // Go raised it at start already, on Linux
	if err != nil || limit > math.MaxInt32 {
		return want
	}
	avail := int(limit) - fdHeadroom
	if server.FDsNeeded(want) <= avail {
		return want
	}
	n := max(avail*100/101, 1)
	for n > 1 && server.FDsNeeded(n) > avail {
		n--
	}
	if configured {
		log.Warn("the file limit is too low for --max-connections: lowering it; raise RLIMIT_NOFILE (ulimit -n, LimitNOFILE=) for more",
			"max_connections", want, "nofile", limit, "using", n)
	} else {
		log.Info("connections limited by the file limit", "max_connections", n, "nofile", limit)
	}
	return n
}

func openStore(f serveFlags, ret store.RetentionPolicy, limits store.Limits, log *slog.Logger) (store.Store, string, error) {
	switch {
	case f.storeURL == "file":
		path := filepath.Join(f.data, "statecast.db")
		st, err := store.OpenFile(store.FileConfig{Path: path, Retention: ret, Limits: limits, Logger: log})
		return st, "file " + path, err
	case f.storeURL == "memory":
		return store.NewMemory(store.MemoryConfig{Retention: ret, Limits: limits, HistoryBytes: int64(f.nodeHistoryBytes)}), "memory (ephemeral)", nil
	case strings.HasPrefix(f.storeURL, "redis://"), strings.HasPrefix(f.storeURL, "rediss://"), redisstore.IsSentinelURL(f.storeURL):
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		st, err := redisstore.New(ctx, redisstore.Config{URL: f.storeURL, Cluster: f.redisCluster,
			MinReplicas: f.redisMinReplicas, ReplicaTimeout: f.redisReplicaTimeout,
			Prefix: f.redisPrefix, Retention: ret, Limits: limits, Logger: log})
		what := "redis " + redactURL(f.storeURL)
		if f.redisCluster {
			what = "redis cluster " + redactURL(f.storeURL)
		}
		if f.redisMinReplicas > 0 {
			what += fmt.Sprintf(" (writes wait for %d replicas)", f.redisMinReplicas)
		}
		return st, what, err
	}
	return nil, "", fmt.Errorf("unknown --store %q: want file, memory, a redis:// or a redis+sentinel:// URL", f.storeURL)
}

func authenticator(f serveFlags) (*auth.Authenticator, error) {
	cfg := auth.Config{Algorithms: f.algs, Issuer: f.issuer, Audience: f.audience}
	switch {
	case f.hmacSecretFile != "":
		b, err := os.ReadFile(f.hmacSecretFile)
		if err != nil {
			return nil, err
		}
		cfg.HMACSecret = []byte(strings.TrimSpace(string(b)))
	case f.hmacSecret != "":
		cfg.HMACSecret = []byte(f.hmacSecret)
	}
	if f.pubKey != "" {
		b, err := os.ReadFile(f.pubKey)
		if err != nil {
			return nil, err
		}
		cfg.PublicKeyPEM = b
	}
	if !cfg.Enabled() {
		return nil, nil
	}
	return auth.New(cfg)
}

// secret returns the contents of file (trimmed) when given, else value.
func secret(value, file string) (string, error) {
	if file == "" {
		return value, nil
	}
	b, err := os.ReadFile(file)
	return strings.TrimSpace(string(b)), err
}

// isLoopback reports whether addr only listens on a loopback interface.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// newLogger returns the node's logger, writing to stderr in format.
func newLogger(format, level string) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: parseLevel(level)}
	switch format {
	case "text", "": // "": run's callers that set no format
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("unknown --log-format %q: want text or json", format)
}

func parseLevel(s string) slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return slog.LevelInfo
	}
	return l
}

// redactURL hides the passwords in a store URL (or a comma-separated
// list of them: cluster seeds) before it is logged.
func redactURL(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			if _, ok := u.User.Password(); ok {
				parts[i] = u.Redacted()
			}
		}
	}
	return strings.Join(parts, ",")
}

// queueWait maps --connect-queue-wait to server.Config, where zero is the
// default and negative is none.
func queueWait(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}
