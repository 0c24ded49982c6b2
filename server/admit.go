package server

import (
	"container/list"
	"context"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
)

// Connect admission. A node that all the clients of a dead node reconnect
// to at once (or the node restarted last in a rolling deploy) would take
// on every connect together: thousands of session takes and room loads
// queued in its store client and its scheduler, each timing out late, and
// its own beats in the node registry running seconds late, so that the
// other nodes take it for dead and close what it had just taken on. So a
// node works on at most MaxConnecting connects at a time; another upgrade
// waits a moment for a place (below) and is then answered 503 with
// Retry-After: cheap for the node (nothing is hijacked, no session
// goroutine starts), and every client backs off (a browser sees the
// failed handshake as 1006).
//
// A WebSocket connect lasts from its upgrade to the answer of its first
// subscription, unless the client keeps the node waiting: a look every
// connectingHold gives the place back when no request of the connection
// is being handled (a socket that sends nothing, a session that
// subscribes to nothing), so that a few silent sockets cannot shut a node
// to connects. An SSE watch's connect lasts while its room loads.

// connectingHold is how often a connecting WebSocket is looked at.
const connectingHold = time.Second

// Past MaxConnecting a connect waits, in arrival order, for a place a
// finishing connect hands over, for up to ConnectQueueWait; only then is
// it refused. In a reconnect storm the node's places free up every few
// milliseconds: a client refused at once would sit out its Retry-After
// (a second or two) while the node had a place for it long before, and
// come back into the next crowd. At most queuePerPlace waiters a place,
// so that the queue holds no more than the node works off in about a
// wait; past it the connect is refused at once.
const queuePerPlace = 4

// connectGate counts the connects in progress and queues those past its
// limit.
type connectGate struct {
	n     atomic.Int64 // places taken
	limit int64
	wait  time.Duration // longest a connect queues; 0: none

	mu      sync.Mutex
	waiters list.List // of *waiter, oldest first
	closed  bool      // the node is shutting down: no more waiting

	// The places (taken or waited for) of each client address: at most
	// perClient, so that one client cannot hold the node's places with
	// sockets that say nothing (a look gives a silent socket's place back
	// only after connectingHold: a few hundred upgrades a second, which
	// need no token, would shut the node to every other connect).
	// Loopback clients (a local proxy) are not counted unless
	// LimitLoopback.
	perClient     int
	limitLoopback bool
	clientMu      sync.Mutex
	byClient      map[netip.Addr]int
}

// perClientPlaces is a client address's share of a node's connect places:
// an eighth; none when the per-address limits are off
// (MaxConnectionsPerIP), as behind a load balancer whose address every
// client shares.
func perClientPlaces(cfg Config) int {
	if cfg.MaxConnectionsPerIP <= 0 {
		return 0
	}
	return max(4, cfg.MaxConnecting/8)
}

// enterFrom takes a place for a connect from remote (a host:port), as
// enter, unless its address holds perClient places already; leave gives
// it back, once.
func (g *connectGate) enterFrom(ctx context.Context, remote string) (leave func(), ok bool) {
	key, counted := netip.Addr{}, false
	if ap, err := netip.ParseAddrPort(remote); err == nil && g.perClient > 0 {
		key, counted = clientKey(ap.Addr(), g.limitLoopback)
	}
	if counted {
		g.clientMu.Lock()
		if g.byClient[key] >= g.perClient {
			g.clientMu.Unlock()
			return nil, false
		}
		if g.byClient == nil {
			g.byClient = make(map[netip.Addr]int)
		}
		g.byClient[key]++
		g.clientMu.Unlock()
	}
	release := func() {
		if !counted {
			return
		}
		g.clientMu.Lock()
		if n := g.byClient[key] - 1; n > 0 {
			g.byClient[key] = n
		} else {
			delete(g.byClient, key)
		}
		g.clientMu.Unlock()
	}
	if !g.enter(ctx) {
		release()
		return nil, false
	}
	var once sync.Once
	return func() { once.Do(func() { g.leave(); release() }) }, true
}

// waiter is a connect queued for a place.
type waiter struct {
	done   chan struct{} // closed when it leaves the queue
	handed bool          // with a place (else the gate closed); set before done closes
}

// enter takes a place, waiting for one in the queue when every place is
// taken, and reports false when none came within the wait, ctx ended
// first (the client went away), or the gate closed.
func (g *connectGate) enter(ctx context.Context) bool {
	if g.tryEnter() {
		return true
	}
	g.mu.Lock()
	// Under mu, where leave hands places over: a place freed since
	// tryEnter is taken here, not lost to an empty queue.
	if g.waiters.Len() == 0 && g.tryEnter() {
		g.mu.Unlock()
		return true
	}
	if g.closed || g.wait <= 0 || int64(g.waiters.Len()) >= queuePerPlace*g.limit {
		g.mu.Unlock()
		return false
	}
	w := &waiter{done: make(chan struct{})}
	e := g.waiters.PushBack(w)
	g.mu.Unlock()

	t := time.NewTimer(g.wait)
	defer t.Stop()
	select {
	case <-w.done:
		return w.handed
	case <-t.C:
	case <-ctx.Done():
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-w.done:
		if w.handed { // handed a place as the wait ended: give it on
			g.handOn()
		}
	default:
		g.waiters.Remove(e)
	}
	return false
}

// tryEnter takes a place if one is free. n never goes past the limit,
// even for a moment: a place freed while connects queue is handed over,
// so a queue means every place is taken and newcomers cannot pass it.
func (g *connectGate) tryEnter() bool {
	for {
		v := g.n.Load()
		if v >= g.limit {
			return false
		}
		if g.n.CompareAndSwap(v, v+1) {
			return true
		}
	}
}

// leave gives a place back: to the first waiter, if any.
func (g *connectGate) leave() {
	g.mu.Lock()
	g.handOn()
	g.mu.Unlock()
}

// handOn passes a place that is being given back to the first waiter, or
// frees it. Called with mu held.
func (g *connectGate) handOn() {
	if f := g.waiters.Front(); f != nil {
		w := g.waiters.Remove(f).(*waiter)
		w.handed = true
		close(w.done)
		return
	}
	g.n.Add(-1)
}

// close refuses every waiter and every later connect past the limit.
func (g *connectGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	for f := g.waiters.Front(); f != nil; f = g.waiters.Front() {
		close(g.waiters.Remove(f).(*waiter).done)
	}
}

// queued counts the connects waiting for a place.
func (g *connectGate) queued() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiters.Len()
}

// refuseConnect answers a connect the node has no place for, unless its
// client went away while it queued; one the shutdown took from the queue
// is told to go elsewhere.
func (s *Server) refuseConnect(c echo.Context) error {
	if c.Request().Context().Err() != nil {
		return nil
	}
	if s.draining.Load() {
		return echo.NewHTTPError(http.StatusServiceUnavailable, "server is shutting down; connect to another node")
	}
	s.metrics.rejected.WithLabelValues("connecting").Inc()
	answerUnavailable(c.Response(), refusedConnecting, "too many clients connecting to this node at once; retry after Retry-After")
	return nil
}

// holdConnecting marks c, which took a place of the gate, as connecting,
// and starts the looks that give the place back while c is silent.
func (c *conn) holdConnecting() {
	c.connecting.Store(true)
	var look func()
	look = func() {
		if !c.connecting.Load() {
			return
		}
		if !c.inflight.TryLock() { // a request is being handled
			time.AfterFunc(connectingHold, look)
			return
		}
		c.inflight.Unlock()
		c.doneConnecting()
	}
	time.AfterFunc(connectingHold, look)
}

// doneConnecting gives c's place back, once.
func (c *conn) doneConnecting() {
	if c.connecting.CompareAndSwap(true, false) {
		c.leaveConnect()
	}
}
