package redisstore

import (
	"context"
	"crypto/tls"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/statecast/statecast/store"
)

// Config configures a Redis store.
type Config struct {
	// URL is redis://[user:password@]host:port[/db] for one server;
	// redis+sentinel://[user:password@]host:port[,host:port...]/master[/db]
	// for the master a set of Sentinels names (rediss+sentinel:// with
	// TLS; see ParseSentinelURL); or, with Cluster, a comma-separated list
	// of cluster nodes (host:port or redis:// URLs) used as seeds.
	URL     string
	Cluster bool
	// MinReplicas, when above 0, makes every write wait (Redis WAIT, after
	// its round trip) until that many replicas of its master hold it, at
	// most ReplicaTimeout (default 1 s); a write they do not all confirm
	// in time is answered as of unknown outcome: it stays committed on the
	// master. docs/OPERATIONS.md#replicas-and-failover says what it
	// guarantees.
	MinReplicas    int
	ReplicaTimeout time.Duration
	// Prefix starts every key of this store ("sc" by default), so several
	// deployments can share a Redis. It must not contain '{' or '}'.
	Prefix    string
	Limits    store.Limits
	Retention store.RetentionPolicy
	// Clock gives commit times (kept at millisecond precision) and the
	// time for age retention; defaults to time.Now.
	Clock  func() time.Time
	Logger *slog.Logger
	// WriteTimeout bounds one write (default 5 s). A write that times out
	// has an unknown outcome; it is never retried.
	WriteTimeout time.Duration
	// CheckInterval is how often followed rooms are compared with Redis to
	// recover lost pushes and epoch changes (default 1 s).
	CheckInterval time.Duration
	// SnapshotPageAbove: a room with more keys than this is snapshotted in
	// HSCAN pages rather than by one HGETALL, which would stall Redis for
	// every room while it runs (default 5,000; tests set 1).
	SnapshotPageAbove int
	// PingInterval is how long a push connection may stay silent before it
	// is pinged; unanswered for another PingInterval, it is rebuilt
	// (default 5 s).
	PingInterval time.Duration
}

// Store is a store.Store on Redis or Redis Cluster shared by many nodes
// (docs/DESIGN.md#several-nodes-on-redis).
type Store struct {
	cfg Config
	wc  redis.UniversalClient // writes: never retried
	rc  redis.UniversalClient // reads, checks and pub/sub
	// hc: the node registry's beats and reads, on connections of their
	// own: queued behind a burst's reads in rc's pool, beats missed the
	// node timeout and live nodes were taken for dead (their clients all
	// reconnecting, a storm feeding itself).
	hc redis.UniversalClient
	// cc: the committers' round trips, never retried, on connections of
	// their own that are refused when they reach a Redis process other
	// than the one the writes were built for (restart.go).
	cc      redis.UniversalClient
	cluster *redis.ClusterClient // rc in cluster mode, for routing
	log     *slog.Logger
	id      string // tag prefix, unique per store
	seq     atomic.Uint64

	// mu guards closed; calls that use the clients hold it for reading,
	// so Close waits for them.
	mu     sync.RWMutex
	closed bool

	ctx    context.Context // cancelled by Close: ends the goroutines
	cancel context.CancelFunc
	wg     sync.WaitGroup

	fol   follow     // see follow.go
	heads headReads  // Head's reads, coalesced (heads.go)
	clock redisClock // this node's clock on Redis's (clock.go)

	cmu        sync.Mutex                   // guards committers
	committers map[*redis.Client]*committer // by master; see commit.go

	// noPublish makes writes skip SPUBLISH (tests: lost pushes).
	noPublish atomic.Bool
	// masters: the processes found behind each master, and how each
	// keeps writes (restart.go).
	masters masters

	// hookGroup is called before each round trip of writes (tests).
	hookGroup atomic.Pointer[func()]
	// hookRelease is called with the ids of each release script (tests).
	hookRelease atomic.Pointer[func(ids int)]
}

var _ store.Store = (*Store)(nil)

const (
	defaultPrefix = "sc"
	metaTTL       = 24 * time.Hour
	pageSize      = 1000
)

var (
	//go:embed lua/retain.lua
	retainLua string
	//go:embed lua/apply.lua
	applyLua string
	//go:embed lua/init.lua
	initLua string
	//go:embed lua/trim.lua
	trimLua string
	//go:embed lua/reepoch.lua
	reepochLua string
	//go:embed lua/run.lua
	runLua string
	//go:embed lua/restart.lua
	restartLua string

	applyScript   = redis.NewScript(retainLua + runLua + applyLua)
	restartScript = redis.NewScript("#!lua\n" + runLua + restartLua)
	initScript    = redis.NewScript(initLua)
	trimScript    = redis.NewScript(retainLua + trimLua)
	reepochScript = redis.NewScript(reepochLua)
)

// New connects to Redis (checking that it answers) and starts the
// goroutines that follow rooms. Close it to stop them.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = defaultPrefix
	}
	if strings.ContainsAny(cfg.Prefix, "{}") {
		return nil, fmt.Errorf("store: redis prefix %q must not contain '{' or '}' (they would break the room's hash tag)", cfg.Prefix)
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 5 * time.Second
	}
	if cfg.CheckInterval <= 0 {
		cfg.CheckInterval = time.Second
	}
	if cfg.PingInterval <= 0 {
		cfg.PingInterval = 5 * time.Second
	}
	if cfg.SnapshotPageAbove <= 0 {
		cfg.SnapshotPageAbove = 5000
	}
	if cfg.ReplicaTimeout <= 0 {
		cfg.ReplicaTimeout = time.Second
	}
	if cfg.MinReplicas > 0 && cfg.ReplicaTimeout >= cfg.WriteTimeout {
		return nil, fmt.Errorf("store: redis replica timeout %v must be below the write timeout %v", cfg.ReplicaTimeout, cfg.WriteTimeout)
	}
	s := &Store{cfg: cfg, log: cfg.Logger, id: store.NewEpoch(), committers: map[*redis.Client]*committer{}}
	noMaint := &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	if cfg.Cluster {
		var addrs []string
		var user, pass string
		var tlsConfig *tls.Config
		var files tlsFiles
		for _, a := range strings.Split(cfg.URL, ",") {
			a = strings.TrimSpace(a)
			if a == "" {
				continue
			}
			// The TLS files may follow any seed, the last one included.
			a, f, err := cutTLSParams(a)
			if err != nil {
				return nil, err
			}
			if f.set() {
				files = f
			}
			if strings.Contains(a, "://") {
				o, err := redis.ParseURL(a)
				if err != nil {
					return nil, fmt.Errorf("store: redis cluster node %q: %w", a, err)
				}
				a, user, pass = o.Addr, o.Username, o.Password
				if o.TLSConfig != nil { // rediss://
					tlsConfig = o.TLSConfig
				}
			}
			addrs = append(addrs, a)
		}
		if len(addrs) == 0 {
			return nil, errors.New("store: redis cluster needs at least one node address")
		}
		if err := files.configure(tlsConfig); err != nil {
			return nil, err
		}
		// The write client must not run a script twice: a cluster client
		// retries a failed command up to MaxRedirects times (on a reset or
		// a read timeout too, after the script may have run), so writes
		// get none; Apply reports a redirect as unavailable (nothing ran).
		mk := func(retries, redirects, pool int, writes bool) *redis.ClusterClient {
			return redis.NewClusterClient(&redis.ClusterOptions{
				Addrs: addrs, Username: user, Password: pass, TLSConfig: tlsConfig, PoolSize: pool,
				MaxRetries: retries, MaxRedirects: redirects, ContextTimeoutEnabled: true,
				ReadTimeout: cfg.WriteTimeout, WriteTimeout: cfg.WriteTimeout,
				PoolTimeout: cfg.WriteTimeout / 2,
				DialTimeout: 2 * time.Second, DisableIdentity: true,
				MaintNotificationsConfig: noMaint,
				NewClient: func(opt *redis.Options) *redis.Client { // each master's process, by its address
					opt.OnConnect = s.onConnect(opt.Addr, writes)
					return redis.NewClient(opt)
				},
			})
		}
		s.wc = mk(-1, -1, 0, false)
		s.cc = mk(-1, -1, commitPool, true)
		s.cluster = mk(0, 3, 0, false)
		s.rc = s.cluster
		s.hc = mk(0, 3, registryPool, false)
	} else if IsSentinelURL(cfg.URL) {
		clean, files, err := cutTLSParams(cfg.URL)
		if err != nil {
			return nil, err
		}
		o, err := ParseSentinelURL(clean)
		if err != nil {
			return nil, err
		}
		// The Sentinels are reached with the same TLS settings.
		if err := files.configure(o.TLSConfig); err != nil {
			return nil, err
		}
		o.ContextTimeoutEnabled = true
		o.ReadTimeout, o.WriteTimeout = cfg.WriteTimeout, cfg.WriteTimeout
		o.DialTimeout = 2 * time.Second
		o.PoolTimeout = cfg.WriteTimeout / 2 // as below
		o.DisableIdentity = true
		o.OnConnect = s.onConnect("", false)
		wo, ro, ho, co := *o, *o, *o, *o
		wo.MaxRetries, co.MaxRetries = -1, -1
		ho.PoolSize, co.PoolSize = registryPool, commitPool
		co.OnConnect = s.onConnect("", true)
		// Each client asks the Sentinels for the master, and follows it
		// when they promote another (closing its connections to the old).
		s.wc, s.rc, s.hc = redis.NewFailoverClient(&wo), redis.NewFailoverClient(&ro), redis.NewFailoverClient(&ho)
		s.cc = redis.NewFailoverClient(&co)
	} else {
		clean, files, err := cutTLSParams(cfg.URL)
		if err != nil {
			return nil, err
		}
		o, err := redis.ParseURL(clean)
		if err != nil {
			return nil, fmt.Errorf("store: redis url: %w", err)
		}
		if err := files.configure(o.TLSConfig); err != nil {
			return nil, err
		}
		o.ContextTimeoutEnabled = true
		o.ReadTimeout, o.WriteTimeout = cfg.WriteTimeout, cfg.WriteTimeout
		o.DialTimeout = 2 * time.Second
		// Below the write timeout, so that a write that found no free
		// connection is reported as not sent (ErrPoolTimeout).
		o.PoolTimeout = cfg.WriteTimeout / 2
		o.DisableIdentity = true
		o.MaintNotificationsConfig = noMaint
		o.OnConnect = s.onConnect("", false)
		wo, ro, ho, co := *o, *o, *o, *o
		wo.MaxRetries, co.MaxRetries = -1, -1
		ho.PoolSize, co.PoolSize = registryPool, commitPool
		co.OnConnect = s.onConnect("", true)
		s.wc, s.rc, s.hc, s.cc = redis.NewClient(&wo), redis.NewClient(&ro), redis.NewClient(&ho), redis.NewClient(&co)
	}
	if err := s.rc.Ping(ctx).Err(); err != nil {
		_ = s.wc.Close()
		_ = s.rc.Close()
		_ = s.hc.Close()
		_ = s.cc.Close()
		return nil, fmt.Errorf("store: redis: %w", err)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.fol.init(s)
	return s, nil
}

// Limits returns the limits the store enforces (with defaults filled in).
func (s *Store) Limits() store.Limits { return s.cfg.Limits.WithDefaults() }

type roomKeys struct{ meta, kv, log, wids, ch string }

func (s *Store) keys(room string) roomKeys {
	base := s.cfg.Prefix + ":{" + room + "}:"
	return roomKeys{base + "meta", base + "kv", base + "log", base + "wids", base + "ch"}
}

// roomOfChannel inverts keys(room).ch.
func (s *Store) roomOfChannel(ch string) (string, bool) {
	r, ok := strings.CutPrefix(ch, s.cfg.Prefix+":{")
	if !ok {
		return "", false
	}
	return strings.CutSuffix(r, "}:ch")
}

// writeErr is the error of a write that got no reply: unavailable when
// Redis certainly ran none of it, else of unknown outcome.
func writeErr(room string, err error) error {
	if notSent(err) {
		return fmt.Errorf("%w: redis write to room %q: %v", store.ErrUnavailable, room, err)
	}
	return fmt.Errorf("store: redis write to room %q (outcome unknown): %w", room, err)
}

// readErr is the error of a read: store.ErrUnavailable when Redis could
// not be reached or did not answer in time (a read changes nothing, so
// it may be retried; a node answers it unavailable, not internal).
func readErr(err error) error {
	var ne net.Error
	if err == nil || errors.Is(err, store.ErrUnavailable) {
		return err
	}
	if notSent(err) || errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	return err
}

// notSent reports whether a write failed before Redis ran any of it: no
// connection could be dialled or none was free in time (the write client
// never retries, so the error is that of its only attempt), or the
// cluster redirected or refused it. Any other failure (a reset, a timeout
// while waiting for the reply) may have come after Redis ran the script.
func notSent(err error) bool {
	var oe *net.OpError
	if errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrClosed) || errors.Is(err, errNewProcess) || errors.As(err, &oe) && oe.Op == "dial" {
		return true
	}
	// Replies that refuse the command before running it: a cluster's, and
	// NOSCRIPT (after the write was sent again with EVAL, see commit.go).
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		for _, p := range []string{"MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN", "NOSCRIPT"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
	}
	return false
}

// begin checks that the store is open; on success the caller holds s.mu
// for reading and must RUnlock it.
func (s *Store) begin() error {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return store.ErrClosed
	}
	return nil
}

// cutoff is the age retention bound of ret at now in unix ms: entries
// committed before it are expired (now - t > MaxAge). ok is false when
// there is no age limit.
func cutoff(ret store.Retention, now time.Time) (ms int64, ok bool) {
	if ret.MaxAge <= 0 {
		return 0, false
	}
	age := ret.MaxAge.Milliseconds()
	if age == 0 {
		age = 1
	}
	return now.UnixMilli() - age, true
}

func (s *Store) Apply(ctx context.Context, room string, w store.Write) (store.Result, error) {
	if err := s.cfg.Limits.Validate(room, w); err != nil {
		return store.Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.Result{}, err
	}
	if err := s.begin(); err != nil {
		return store.Result{}, err
	}
	defer s.mu.RUnlock()
	k := s.keys(room)
	ret := s.cfg.Retention.For(room)
	now := s.cfg.Clock()
	cut := ""
	if ms, ok := cutoff(ret, now); ok {
		cut = strconv.FormatInt(ms, 10)
	}
	ch := k.ch
	if s.noPublish.Load() {
		ch = ""
	}
	tag := s.id + "." + strconv.FormatUint(s.seq.Add(1), 36)
	since := ""
	if w.Since != nil {
		since = strconv.FormatUint(*w.Since, 10)
	}
	// The write's arguments of apply.lua (the room's are added by its
	// committer, commit.go).
	fp := ""
	if w.Wid != "" {
		fp = w.Fingerprint
		if fp == "" {
			fp = store.FingerprintOf(w)
		}
	}
	args := make([]any, 0, 8+2*len(w.Conds)+4*len(w.Ops))
	args = append(args, strconv.FormatInt(now.UnixMilli(), 10), tag, w.Wid, since, fp, w.LegacyWid, len(w.Conds))
	for _, c := range w.Conds {
		args = append(args, c.Key, strconv.FormatUint(c.ModRev, 10))
	}
	args = append(args, len(w.Ops))
	// The values are copied (into one slab): a write may still be on its way
	// to Redis after Apply returned (its outcome unknown), and the caller
	// may reuse its buffers by then.
	size, vals := 64+len(room), 0
	for _, op := range w.Ops {
		size += len(op.Key) + len(op.Lease) + 16
		vals += len(op.Value)
	}
	for _, c := range w.Conds {
		size += len(c.Key) + 16
	}
	size += vals
	slab := make([]byte, 0, vals)
	for _, op := range w.Ops {
		t := "P"
		if op.Type == store.OpDelete {
			t = "D"
		}
		// A put's flags follow its type (apply.lua).
		if op.KeepLease {
			t += "l"
		}
		if op.KeepValue {
			t += "v"
		}
		if op.MustExist {
			t += "e"
		}
		start := len(slab)
		slab = append(slab, op.Value...)
		args = append(args, t, op.Key, slab[start:len(slab):len(slab)], op.Lease)
	}
	view, before := s.fol.position(room) // what this node had delivered before the commit
	reply, err := s.submit(ctx, &req{
		room: room, keys: []string{k.meta, k.kv, k.log, k.wids}, maxEvents: ret.MaxEvents, maxBytes: ret.MaxBytes, cut: cut, ch: ch,
		args: args, size: size, done: make(chan struct{}),
	})
	if err != nil {
		return store.Result{}, err
	}
	str := func(i int) string {
		if i < len(reply) {
			if s, ok := reply[i].(string); ok {
				return s
			}
		}
		return ""
	}
	rev, _ := strconv.ParseUint(str(2), 10, 64)
	if st := str(0); st != "OK" && view != nil && before.epoch == str(1) && rev < before.rev {
		// A refusal or no-op checked against a room Redis holds at a
		// revision below one this node delivered: Redis lost writes. Its
		// position names no write of the lost tail: the room starts its
		// new epoch first, which holds what the reply was checked against.
		m, err := s.newEpochAfterLoss(ctx, room, view, before, fmt.Sprintf("a write was answered %s at revision %d, below the revision delivered", st, rev))
		if err != nil {
			return store.Result{}, fmt.Errorf("store: redis write to room %q: %w", room, err)
		}
		if st == "DUP" { // the id's revision is of the lost epoch's log
			return store.Result{}, fmt.Errorf("store: redis write to room %q (outcome unknown): its write id was found in the history of an epoch that lost writes", room)
		}
		reply[1], rev = m.epoch, m.rev
	}
	switch str(0) {
	case "OK":
		b, err := decodeBatch(str(3))
		if err != nil {
			return store.Result{}, fmt.Errorf("store: redis write to room %q committed at rev %d but its batch is unreadable: %w", room, rev, err)
		}
		if view != nil && before.epoch == b.Epoch && before.rev >= b.Rev {
			return s.reusedRev(ctx, room, view, before, b)
		}
		return store.Result{Epoch: b.Epoch, Rev: b.Rev, Events: b.Events}, nil
	case "NOOP":
		return store.Result{Epoch: str(1), Rev: rev}, nil
	case "CONFLICT":
		mr, _ := strconv.ParseUint(str(4), 10, 64)
		return store.Result{}, &store.ConflictError{Key: str(3), ModRev: mr, Rev: rev, Epoch: str(1)}
	case "DUP":
		at, _ := strconv.ParseUint(str(3), 10, 64)
		return store.Result{Epoch: str(1), Rev: at, Dup: true}, nil
	case "REUSED":
		at, _ := strconv.ParseUint(str(3), 10, 64)
		return store.Result{}, &store.WidReusedError{Rev: at}
	case "UNKNOWN":
		return store.Result{}, fmt.Errorf("%w (oldest retained revision %s, write first sent after %s)", store.ErrWidCompacted, str(3), since)
	case "MISSING":
		return store.Result{}, &store.KeyNotFoundError{Key: str(3)}
	case "QUOTA":
		keys, _ := strconv.ParseInt(str(3), 10, 64)
		n, _ := strconv.ParseInt(str(4), 10, 64)
		q := s.cfg.Limits.WithDefaults()
		return store.Result{}, &store.QuotaError{Keys: keys, Bytes: n, MaxKeys: int64(q.MaxRoomKeys), MaxBytes: q.MaxRoomBytes}
	case "ERR": // its XADD failed: nothing of it was written
		return store.Result{}, fmt.Errorf("store: redis write to room %q (outcome unknown): %s", room, str(1))
	}
	return store.Result{}, fmt.Errorf("store: redis write to room %q: unexpected reply %v", room, reply)
}

// meta is a room's meta hash as read by HMGET metaFields.
type meta struct {
	epoch string // "" when meta is missing
	rev   uint64
	floor uint64
	tag   string
	run   string // the Redis process that last wrote or checked it (restart.go)
}

var metaFields = []string{"rev", "epoch", "floor", "tag", "run"}

func parseMeta(v []any) meta {
	get := func(i int) string {
		if i < len(v) {
			if s, ok := v[i].(string); ok {
				return s
			}
		}
		return ""
	}
	var m meta
	m.rev, _ = strconv.ParseUint(get(0), 10, 64)
	m.epoch = get(1)
	m.floor, _ = strconv.ParseUint(get(2), 10, 64)
	if m.floor == 0 {
		m.floor = 1
	}
	m.tag = get(3)
	m.run = get(4)
	return m
}

// initRoom gives a room without meta an epoch (lua/init.lua).
func (s *Store) initRoom(ctx context.Context, k roomKeys) (epoch string, rev uint64, err error) {
	v, err := initScript.Run(ctx, s.rc, []string{k.meta, k.kv, k.log, k.wids}, store.NewEpoch(), metaTTL.Milliseconds(), s.readRun(ctx, k).run).StringSlice()
	if err != nil {
		return "", 0, fmt.Errorf("store: redis: creating the epoch of a room: %w", err)
	}
	if len(v) != 2 {
		return "", 0, fmt.Errorf("store: redis: init returned %v", v)
	}
	rev, _ = strconv.ParseUint(v[1], 10, 64)
	return v[0], rev, nil
}

// entryRev parses a stream ID "<rev>-0".
func entryRev(id string) uint64 {
	i := strings.IndexByte(id, '-')
	if i < 0 {
		i = len(id)
	}
	r, _ := strconv.ParseUint(id[:i], 10, 64)
	return r
}

func entryField(m redis.XMessage, f string) string {
	s, _ := m.Values[f].(string)
	return s
}

// expired reports whether entry m is older than ret allows at now.
func expired(m redis.XMessage, ret store.Retention, now time.Time) bool {
	cut, ok := cutoff(ret, now)
	if !ok {
		return false
	}
	t, err := strconv.ParseInt(entryField(m, "t"), 10, 64)
	return err == nil && t < cut
}

// trim applies retention to the room's log on read (lua/trim.lua) and
// returns its oldest replayable revision.
func (s *Store) trim(ctx context.Context, room string, k roomKeys, now time.Time) (uint64, error) {
	ret := s.cfg.Retention.For(room)
	cut, _ := cutoff(ret, now)
	v, err := trimScript.Run(ctx, s.rc, []string{k.meta, k.log, k.wids}, strconv.FormatInt(cut, 10), ret.MaxEvents, ret.MaxBytes).Text()
	if err != nil {
		return 0, fmt.Errorf("store: redis: trimming room %q: %w", room, err)
	}
	return strconv.ParseUint(v, 10, 64)
}

func (s *Store) Snapshot(ctx context.Context, room, prefix string) (_ store.Snapshot, err error) {
	defer func() { err = readErr(err) }()
	if err := store.ValidRoom(room); err != nil {
		return store.Snapshot{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.Snapshot{}, err
	}
	if err := s.begin(); err != nil {
		return store.Snapshot{}, err
	}
	defer s.mu.RUnlock()
	k := s.keys(room)
	now := s.cfg.Clock()
	ret := s.cfg.Retention.For(room)
	// One round trip (meta and HLEN) picks the way: a node snapshots a
	// room once when it loads it, however many clients then watch it.
	if snap, ok, err := s.snapshotPaged(ctx, room, prefix, k, now); ok || err != nil {
		return snap, err
	}
	for attempt := 0; ; attempt++ {
		var (
			metaCmd  *redis.SliceCmd
			kvCmd    *redis.MapStringStringCmd
			firstCmd *redis.XMessageSliceCmd
		)
		_, err := s.rc.TxPipelined(ctx, func(p redis.Pipeliner) error {
			metaCmd = p.HMGet(ctx, k.meta, metaFields...)
			kvCmd = p.HGetAll(ctx, k.kv)
			firstCmd = p.XRangeN(ctx, k.log, "-", "+", 1)
			return nil
		})
		if err != nil {
			return store.Snapshot{}, fmt.Errorf("store: redis snapshot of room %q: %w", room, err)
		}
		m := parseMeta(metaCmd.Val())
		if p := s.readRun(ctx, k); restartedRoom(m, p.run) {
			if attempt >= 3 {
				return store.Snapshot{}, fmt.Errorf("store: redis snapshot of room %q: Redis keeps restarting", room)
			}
			if err := s.afterRestart(ctx, room, k, p); err != nil {
				return store.Snapshot{}, err
			}
			continue
		}
		if m.epoch == "" {
			// Never written, or its state is gone: give it an epoch, so
			// the one reported here is the one its first write carries.
			epoch, rev, err := s.initRoom(ctx, k)
			if err != nil {
				return store.Snapshot{}, err
			}
			if rev == 0 {
				return store.Snapshot{Epoch: epoch, Rev: 0, Oldest: 1}, nil
			}
			if attempt >= 3 {
				return store.Snapshot{}, fmt.Errorf("store: redis snapshot of room %q: the room keeps changing epoch", room)
			}
			continue // written meanwhile: read it
		}
		snap := store.Snapshot{Epoch: m.epoch, Rev: m.rev, Oldest: m.rev + 1}
		for key, rec := range kvCmd.Val() {
			if !strings.HasPrefix(key, prefix) {
				continue
			}
			kv, err := decodeKV(key, rec)
			if err != nil {
				return store.Snapshot{}, fmt.Errorf("store: redis room %q key %q: %w", room, key, err)
			}
			snap.Items = append(snap.Items, kv)
		}
		sort.Slice(snap.Items, func(i, j int) bool { return snap.Items[i].Key < snap.Items[j].Key })
		if first := firstCmd.Val(); len(first) > 0 {
			switch r := entryRev(first[0].ID); {
			case r < m.floor:
				snap.Oldest = max(m.floor, m.rev+1)
			case expired(first[0], ret, now):
				oldest, err := s.trim(ctx, room, k, now)
				if err != nil {
					return store.Snapshot{}, err
				}
				// Writes after the MULTI may have moved it past rev+1;
				// rev+1 is then as far as this snapshot can say.
				snap.Oldest = min(oldest, m.rev+1)
			default:
				snap.Oldest = r
			}
		}
		return snap, nil
	}
}

// snapshotPaged snapshots a room of more than SnapshotPageAbove keys in
// short steps: HSCAN pages of the kv hash (Redis serves other rooms
// between them), then the revisions committed meanwhile, read from the
// stream and applied on top, in order: every key changed during the scan
// ends at its value at the head read after it, and every other key was
// returned by HSCAN (which returns each element present throughout at
// least once; a key returned twice keeps its newest record). ok is false
// when the room is small, not
// written, or the stream no longer holds what the scan overlapped (the
// caller then reads it in one MULTI).
func (s *Store) snapshotPaged(ctx context.Context, room, prefix string, k roomKeys, now time.Time) (snap store.Snapshot, ok bool, err error) {
	var (
		metaCmd *redis.SliceCmd
		lenCmd  *redis.IntCmd
	)
	if _, err := s.rc.TxPipelined(ctx, func(p redis.Pipeliner) error {
		metaCmd = p.HMGet(ctx, k.meta, metaFields...)
		lenCmd = p.HLen(ctx, k.kv)
		return nil
	}); err != nil {
		return store.Snapshot{}, false, fmt.Errorf("store: redis snapshot of room %q: %w", room, err)
	}
	m0 := parseMeta(metaCmd.Val())
	// A room a new Redis process has not checked is left to the MULTI.
	if m0.epoch == "" || lenCmd.Val() <= int64(s.cfg.SnapshotPageAbove) || restartedRoom(m0, s.readRun(ctx, k).run) {
		return store.Snapshot{}, false, nil
	}
	items := make(map[string]store.KV)
	match := globEscape(prefix) + "*"
	for cursor := uint64(0); ; {
		page, next, err := s.rc.HScan(ctx, k.kv, cursor, match, pageSize).Result()
		if err != nil {
			return store.Snapshot{}, false, fmt.Errorf("store: redis snapshot of room %q: %w", room, err)
		}
		for i := 0; i+1 < len(page); i += 2 {
			kv, err := decodeKV(page[i], page[i+1])
			if err != nil {
				return store.Snapshot{}, false, fmt.Errorf("store: redis room %q key %q: %w", room, page[i], err)
			}
			if old, seen := items[kv.Key]; !seen || kv.ModRev > old.ModRev {
				items[kv.Key] = kv
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	batches, retry, err := s.history(ctx, room, k, m0.rev+1, 0, now)
	if retry || errors.Is(err, store.ErrCompacted) {
		return store.Snapshot{}, false, nil
	}
	if err != nil {
		return store.Snapshot{}, false, err
	}
	head := m0.rev
	for _, b := range batches {
		if b.Epoch != m0.epoch {
			return store.Snapshot{}, false, nil // the state was lost meanwhile
		}
		head = b.Rev
		for _, ev := range b.Events {
			if !strings.HasPrefix(ev.KV.Key, prefix) {
				continue
			}
			if cur, seen := items[ev.KV.Key]; seen && cur.ModRev >= b.Rev {
				continue
			}
			if ev.Type == store.OpDelete {
				delete(items, ev.KV.Key)
			} else {
				items[ev.KV.Key] = ev.KV
			}
		}
	}
	snap = store.Snapshot{Epoch: m0.epoch, Rev: head, Items: make([]store.KV, 0, len(items))}
	for _, kv := range items {
		snap.Items = append(snap.Items, kv)
	}
	sort.Slice(snap.Items, func(i, j int) bool { return snap.Items[i].Key < snap.Items[j].Key })
	// The oldest replayable revision, read after the scan (it only grows),
	// as Snapshot reads it.
	var m1 *redis.SliceCmd
	var first *redis.XMessageSliceCmd
	if _, err := s.rc.TxPipelined(ctx, func(p redis.Pipeliner) error {
		m1 = p.HMGet(ctx, k.meta, metaFields...)
		first = p.XRangeN(ctx, k.log, "-", "+", 1)
		return nil
	}); err != nil {
		return store.Snapshot{}, false, fmt.Errorf("store: redis snapshot of room %q: %w", room, err)
	}
	m := parseMeta(m1.Val())
	if m.epoch != m0.epoch {
		return store.Snapshot{}, false, nil
	}
	oldest := m.rev + 1
	if f := first.Val(); len(f) > 0 {
		switch r := entryRev(f[0].ID); {
		case r < m.floor: // only the kept newest entry is below the floor
			oldest = max(m.floor, m.rev+1)
		case expired(f[0], s.cfg.Retention.For(room), now):
			if oldest, err = s.trim(ctx, room, k, now); err != nil {
				return store.Snapshot{}, false, err
			}
		default:
			oldest = r
		}
	}
	snap.Oldest = min(oldest, head+1)
	return snap, true, nil
}

func (s *Store) History(ctx context.Context, room string, from uint64, limit int) (_ []store.Batch, err error) {
	defer func() { err = readErr(err) }()
	if err := store.ValidRoom(room); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	k := s.keys(room)
	now := s.cfg.Clock()
	for attempt := 0; ; attempt++ {
		out, retry, err := s.history(ctx, room, k, from, limit, now)
		switch {
		case !retry:
			return out, err
		case attempt >= 3 && err == nil:
			return nil, fmt.Errorf("store: redis history of room %q: its oldest entries keep expiring", room)
		case attempt >= 3:
			return nil, err
		case err == nil: // the oldest entries expired: trim, then read again
			if _, err := s.trim(ctx, room, k, now); err != nil {
				return nil, err
			}
		}
	}
}

// history reads History once. retry is set when the read must be redone:
// the oldest entries expired (err is nil: trim first), or the epoch
// changed between pages (err says so).
func (s *Store) history(ctx context.Context, room string, k roomKeys, from uint64, limit int, now time.Time) (out []store.Batch, retry bool, err error) {
	ret := s.cfg.Retention.For(room)
	page := int64(pageSize)
	if limit > 0 && int64(limit) < page {
		page = int64(limit)
	}
	var (
		m      meta
		next   = from
		events = 0
	)
	for first := true; ; first = false {
		var (
			metaCmd *redis.SliceCmd
			logCmd  *redis.XMessageSliceCmd
		)
		end := "+"
		if !first {
			end = strconv.FormatUint(m.rev, 10) + "-0"
		}
		_, err := s.rc.TxPipelined(ctx, func(p redis.Pipeliner) error {
			metaCmd = p.HMGet(ctx, k.meta, metaFields...)
			logCmd = p.XRangeN(ctx, k.log, strconv.FormatUint(next, 10)+"-0", end, page)
			return nil
		})
		if err != nil {
			return nil, false, fmt.Errorf("store: redis history of room %q: %w", room, err)
		}
		cur := parseMeta(metaCmd.Val())
		if first {
			m = cur
			if m.epoch == "" { // never written (or lost): rev 0, Oldest 1
				if from < 1 {
					return nil, false, &store.CompactedError{Oldest: 1}
				}
				return nil, false, nil
			}
			if from > m.rev {
				return nil, false, nil
			}
		} else if cur.epoch != m.epoch {
			return nil, true, fmt.Errorf("store: redis history of room %q: the epoch changed while reading", room)
		}
		entries := logCmd.Val()
		for len(entries) > 0 && entryRev(entries[0].ID) < m.floor {
			entries = entries[1:]
		}
		if first && len(entries) > 0 && expired(entries[0], ret, now) {
			return nil, true, nil
		}
		if len(entries) == 0 || entryRev(entries[0].ID) != next {
			oldest := m.rev + 1
			if len(entries) > 0 {
				oldest = entryRev(entries[0].ID)
			}
			return nil, false, &store.CompactedError{Oldest: oldest}
		}
		for _, e := range entries {
			r := entryRev(e.ID)
			if r != next { // a hole inside the log: never written by apply.lua
				return nil, false, fmt.Errorf("store: redis room %q: log skips from revision %d to %d", room, next, r)
			}
			b, err := decodeBatch(entryField(e, "d"))
			if err != nil {
				return nil, false, fmt.Errorf("store: redis room %q revision %d: %w", room, r, err)
			}
			if b.Epoch != m.epoch || b.Rev != r {
				return nil, false, fmt.Errorf("store: redis room %q: log entry %s holds epoch %q rev %d, meta says epoch %q", room, e.ID, b.Epoch, b.Rev, m.epoch)
			}
			if limit > 0 && events > 0 && events+len(b.Events) > limit {
				return out, false, nil
			}
			out = append(out, b.Batch)
			events += len(b.Events)
			next = r + 1
			if next > m.rev {
				return out, false, nil
			}
		}
	}
}

func (s *Store) Leased(ctx context.Context, fn func(room string, kv store.KV) error) error {
	if err := s.begin(); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	// One SCAN over the meta keys (on every master), then each room's kv:
	// this runs at start-up and in the lease sweeps of server/leases.go.
	names, err := s.roomNames(ctx)
	if err != nil {
		return err
	}
	for _, room := range names {
		// In HSCAN pages: this also runs while the nodes serve (sweeps of
		// dead nodes' keys), and one HGETALL of a big room stalls Redis.
		all := make(map[string]string)
		for cursor := uint64(0); ; {
			page, next, err := s.rc.HScan(ctx, s.keys(room).kv, cursor, "", pageSize).Result()
			if err != nil {
				return fmt.Errorf("store: redis: reading room %q: %w", room, err)
			}
			for i := 0; i+1 < len(page); i += 2 {
				all[page[i]] = page[i+1]
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
		keys := make([]string, 0, len(all))
		for key := range all {
			keys = append(keys, key)
		}
		sort.Strings(keys)
		for _, key := range keys {
			kv, err := decodeKV(key, all[key])
			if err != nil {
				return fmt.Errorf("store: redis room %q key %q: %w", room, key, err)
			}
			if kv.Lease == "" {
				continue
			}
			if err := fn(room, kv); err != nil {
				return err
			}
		}
	}
	return ctx.Err()
}

// globEscape escapes the glob characters of SCAN MATCH.
func globEscape(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if strings.IndexByte(`*?[]\`, c) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	return b.String()
}

// Close stops following, waits for calls in flight and closes the
// connections.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return store.ErrClosed
	}
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.fol.close()
	s.wg.Wait()
	err := errors.Join(s.wc.Close(), s.rc.Close(), s.hc.Close(), s.cc.Close())
	return err
}

// reusedRev answers a write that Redis committed at a revision this node
// had already delivered for another write, in the same epoch: Redis lost
// its last writes (a crash, a failover to a replica behind it). That
// numbering is not answered to anyone: the room starts a new epoch first
// (divergedLocked), whose state holds the write, and the write is
// answered at the new epoch's head, so no client is told a revision that
// names two writes.
func (s *Store) reusedRev(ctx context.Context, room string, v *view, before viewPos, b batch) (store.Result, error) {
	m, err := s.newEpochAfterLoss(ctx, room, v, before, fmt.Sprintf("a write committed at revision %d, which this node had delivered for another write", b.Rev))
	if err != nil {
		return store.Result{}, fmt.Errorf("store: redis write to room %q (committed; outcome unknown to the client): %w", room, err)
	}
	return store.Result{Epoch: m.epoch, Rev: m.rev, Events: b.Events}, nil
}

// newEpochAfterLoss starts the new epoch of a room whose Redis state is
// behind what this node delivered of epoch before.epoch (unless another
// node did already) and returns the room's meta in it.
func (s *Store) newEpochAfterLoss(ctx context.Context, room string, v *view, before viewPos, why string) (meta, error) {
	v.mu.Lock()
	if !v.dead && v.epoch == before.epoch {
		v.divergedLocked(why)
	}
	v.mu.Unlock()
	mv, err := s.rc.HMGet(ctx, s.keys(room).meta, metaFields...).Result()
	if err != nil {
		return meta{}, fmt.Errorf("its room lost writes and its new epoch could not be read: %w", err)
	}
	m := parseMeta(mv)
	if m.epoch == before.epoch {
		return meta{}, errors.New("its room lost writes and no new epoch could be started")
	}
	return m, nil
}
