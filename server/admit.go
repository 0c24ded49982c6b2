package server

import (
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
// node works on at most MaxConnecting connects at a time, and answers any
// other upgrade at once with 503 and Retry-After: cheap for the node
// (nothing is hijacked, no session goroutine starts), and every client
// backs off (a browser sees the failed handshake as 1006).
//
// A WebSocket connect lasts from its upgrade to the answer of its first
// subscription, unless the client keeps the node waiting: a look every
// connectingHold gives the place back when no request of the connection
// is being handled (a socket that sends nothing, a session that
// subscribes to nothing), so that a few silent sockets cannot shut a node
// to connects. An SSE watch's connect lasts while its room loads.

// connectingHold is how often a connecting WebSocket is looked at.
const connectingHold = time.Second

// connectGate counts the connects in progress.
type connectGate struct {
	n     atomic.Int64
	limit int64
}

// enter takes a place, or reports false when every place is taken.
func (g *connectGate) enter() bool {
	if g.n.Add(1) > g.limit {
		g.n.Add(-1)
		return false
	}
	return true
}

func (g *connectGate) leave() { g.n.Add(-1) }

// refuseConnect answers a connect the node has no place for.
func (s *Server) refuseConnect(c echo.Context) error {
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
		c.s.connects.leave()
	}
}
