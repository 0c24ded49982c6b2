package hooks

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/store"
)

// WebhookID names a webhook (a Route of --webhook) in the store, the
// headers and the metrics: a hash of its pattern and URL, so every node
// configured alike agrees on it, and a hook whose URL changes starts over
// with cursors of its own.
func WebhookID(r Route) string {
	h := sha256.Sum256([]byte(r.Pattern + "=" + r.URL))
	return hex.EncodeToString(h[:6])
}

// Config configures the webhooks of a node. Zero fields take the
// documented defaults.
type Config struct {
	Hooks  []Route // --webhook: rooms matching Pattern go to URL (ParseRoute)
	Secret []byte  // HMAC key of the signatures; required
	// Node names this node in the claims it takes (for the inspector).
	Node string
	// Shared: several nodes share the store (store.Nodes). A claim held by
	// another node is then taken over only once it has not been renewed
	// for ClaimTimeout; on a store of one node it is taken at start.
	Shared       bool
	ClaimTimeout time.Duration // default 10s; the holder renews every ClaimTimeout/5
	Timeout      time.Duration // of one POST, default 10s
	MaxEvents    int           // per POST, default 1,000 (a bigger revision still goes whole)
	MaxBytes     int           // of events per POST (store.EventBytes), default 1 MiB
	Workers      int           // rooms of a hook delivered at once, default 16
	MinBackoff   time.Duration // first retry within this, default 100ms
	MaxBackoff   time.Duration // retries at most this far apart, default 30s
	Client       *http.Client  // default: one of its own (newPoster)
	Logger       *slog.Logger
	// TracerProvider, when set, receives a span per POST (trace.go).
	TracerProvider trace.TracerProvider
}

func (c Config) withDefaults() Config {
	if c.ClaimTimeout <= 0 {
		c.ClaimTimeout = 10 * time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.MaxEvents <= 0 {
		c.MaxEvents = 1000
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = 1 << 20
	}
	if c.Workers <= 0 {
		c.Workers = 16
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = max(30*time.Second, c.MinBackoff)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Webhooks delivers the hooks of one node. New, then Start; BeforeApply
// must run before every write the node commits (rooms.Config.BeforeApply).
type Webhooks struct {
	cfg   Config
	st    store.Store
	hooks []*hook

	mu sync.Mutex
	// registered holds the rooms known to be in the registry, in the
	// internal room's epoch (a new epoch empties the registry).
	registered map[string]struct{}
	epoch      string
	events     []store.Batch // from the internal room's Follow, for the loop
	wake       chan struct{}

	// tracer: nil with tracing off; traced: the spans of the writes this
	// node committed to hooked rooms (trace.go).
	tracer trace.Tracer
	traced traced

	stopFollow func()
	cancel     context.CancelFunc
	done       chan struct{}
}

// New checks cfg and returns the node's webhooks, not yet started.
func New(st store.Store, cfg Config) (*Webhooks, error) {
	if len(cfg.Secret) == 0 {
		return nil, errors.New("hooks: webhooks need a secret (--webhook-secret-file)")
	}
	cfg = cfg.withDefaults()
	w := &Webhooks{cfg: cfg, st: st, registered: make(map[string]struct{}), wake: make(chan struct{}, 1), done: make(chan struct{})}
	if cfg.TracerProvider != nil {
		w.tracer = cfg.TracerProvider.Tracer("github.com/statecast/statecast/server/hooks")
	}
	seen := make(map[string]bool)
	for _, r := range cfg.Hooks {
		if err := auth.CheckRoomPattern(r.Pattern); err != nil {
			return nil, fmt.Errorf("hooks: webhook %s=%s: %v", r.Pattern, r.URL, err)
		}
		if seen[WebhookID(r)] {
			return nil, fmt.Errorf("hooks: webhook %s=%s given twice", r.Pattern, r.URL)
		}
		seen[WebhookID(r)] = true
		w.hooks = append(w.hooks, newHook(w, r))
	}
	return w, nil
}

// IfAny returns w when it has hooks, else nil (nothing to show).
func (w *Webhooks) IfAny() *Webhooks {
	if len(w.hooks) == 0 {
		return nil
	}
	return w
}

// matches reports whether a hook delivers room.
func (w *Webhooks) matches(room string) bool {
	for _, h := range w.hooks {
		if h.match(room) {
			return true
		}
	}
	return false
}

// BeforeApply records room in the registry before its first write through
// this node, when a hook matches it: the claim holder of each hook follows
// the registered rooms, so a revision committed anywhere is delivered. An
// error fails the write (nothing is committed that the hooks could miss).
func (w *Webhooks) BeforeApply(ctx context.Context, room string) error {
	// matches first: with no hook (the default) every write skips the rest.
	if !w.matches(room) || store.ValidRoom(room) != nil {
		return nil // the store refuses an invalid room; nothing to register
	}
	w.mu.Lock()
	_, ok := w.registered[room]
	epoch := w.epoch
	w.mu.Unlock()
	if ok {
		return nil
	}
	if err := register(ctx, w.st, room); err != nil {
		return fmt.Errorf("%w (webhook registry: %v)", store.ErrUnavailable, err)
	}
	w.mu.Lock()
	if w.epoch == epoch {
		w.registered[room] = struct{}{}
	}
	w.mu.Unlock()
	return nil
}

// Start loads the registry and the claims, then runs the claims and the
// deliveries until Close.
func (w *Webhooks) Start(ctx context.Context) error {
	if len(w.hooks) == 0 {
		close(w.done)
		return nil
	}
	stop, err := w.st.Follow(InternalRoom, w.onInternal)
	if err != nil {
		return err
	}
	w.stopFollow = stop
	rev, err := w.load(ctx)
	if err != nil {
		stop()
		return err
	}
	lctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	go w.loop(lctx, rev)
	return nil
}

// onInternal queues the internal room's batches for the loop (Follow
// callbacks must not block nor call the store).
func (w *Webhooks) onInternal(b store.Batch) {
	w.mu.Lock()
	w.events = append(w.events, b)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// load reads the internal room whole: the registry and the claims. It
// returns the revision read, after which the followed batches apply.
func (w *Webhooks) load(ctx context.Context) (uint64, error) {
	snap, err := w.st.Snapshot(ctx, InternalRoom, "")
	if err != nil {
		return 0, err
	}
	w.mu.Lock()
	w.epoch = snap.Epoch
	clear(w.registered)
	for _, kv := range snap.Items {
		if r, ok := strings.CutPrefix(kv.Key, roomKeyPrefix); ok {
			w.registered[r] = struct{}{}
		}
	}
	w.mu.Unlock()
	now := time.Now()
	for _, h := range w.hooks {
		h.claim.reset(now)
		for _, kv := range snap.Items {
			h.observe(store.Event{Type: store.OpPut, KV: kv}, now)
		}
	}
	return snap.Rev, nil
}

// registeredRooms returns the registered rooms that pattern matches.
func (w *Webhooks) registeredRooms(pattern string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for r := range w.registered {
		if auth.MatchRoom(pattern, r) {
			out = append(out, r)
		}
	}
	return out
}

// loop applies the internal room's changes and renews or takes the claims
// every ClaimTimeout/5.
func (w *Webhooks) loop(ctx context.Context, rev uint64) {
	defer close(w.done)
	tick := time.NewTicker(max(w.cfg.ClaimTimeout/5, 20*time.Millisecond))
	defer tick.Stop()
	defer func() {
		for _, h := range w.hooks {
			h.release()
		}
	}()
	w.claims(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
			rev = w.apply(ctx, rev)
		case <-tick.C:
			w.claims(ctx)
		}
	}
}

// apply handles the followed batches of the internal room after rev.
func (w *Webhooks) apply(ctx context.Context, rev uint64) uint64 {
	w.mu.Lock()
	evs := w.events
	w.events = nil
	epoch := w.epoch
	w.mu.Unlock()
	now := time.Now()
	for _, b := range evs {
		if b.Epoch != epoch {
			// The internal room's state was lost (a Redis flushed): the
			// registry and the claims start again from the store.
			w.cfg.Logger.Warn("webhooks: the registry's state was lost; reloading it", "epoch", b.Epoch)
			return w.reload(ctx)
		}
		if b.Rev <= rev {
			continue
		}
		rev = b.Rev
		for _, ev := range b.Events {
			if r, ok := strings.CutPrefix(ev.KV.Key, roomKeyPrefix); ok && ev.Type == store.OpPut {
				w.mu.Lock()
				w.registered[r] = struct{}{}
				w.mu.Unlock()
				for _, h := range w.hooks {
					h.addRoom(r)
				}
				continue
			}
			for _, h := range w.hooks {
				h.observe(ev, now)
			}
		}
	}
	for _, h := range w.hooks {
		if h.claimLost() {
			h.release()
		}
	}
	return rev
}

// reload reads the internal room again after its epoch changed, and
// registers again the rooms this node knew, which their next writes
// through this node would not (their registration is cached).
func (w *Webhooks) reload(ctx context.Context) uint64 {
	w.mu.Lock()
	known := make([]string, 0, len(w.registered))
	for r := range w.registered {
		known = append(known, r)
	}
	w.events = nil
	w.mu.Unlock()
	for {
		rev, err := w.load(ctx)
		if err == nil {
			for _, r := range known {
				if err := w.BeforeApply(ctx, r); err != nil {
					w.cfg.Logger.Warn("webhooks: could not register a room again", "room", r, "err", err)
				}
			}
			for _, h := range w.hooks {
				h.release() // the claim went with the state; take it again
			}
			return rev
		}
		w.cfg.Logger.Warn("webhooks: reading the registry", "err", err)
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(time.Second):
		}
	}
}

// Close stops every delivery; what was not acknowledged is delivered
// again from the cursors by whichever node claims the hooks next.
func (w *Webhooks) Close() {
	if w.cancel == nil {
		return
	}
	w.cancel()
	<-w.done
	w.stopFollow()
}
