package server

import (
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/statecast/statecast/server/wire"
)

// Heartbeats. One goroutine of the node looks at every WebSocket once a
// tick: it closes with 4000 one whose socket has not taken a frame within
// the write timeout (a slow consumer), with 4005 one whose connect did not
// come in time and with 4001 one that sent nothing for two ping
// intervals, gives back the reply buffer of one idle for a ping interval
// and lets a writer goroutine idle for two looks exit. A runtime timer per
// connection did the same; at 16,000 idle connections their firings (a
// goroutine each) and the timer heap they kept large cost about a fifth
// of the node's idle CPU.
type heartbeats struct {
	once, stopOnce sync.Once
	stop, done     chan struct{}
}

// heartbeatTick is how often the connections are looked at: a fifth of
// the shortest of the ping interval, the connect timeout and the write
// timeout, at most a second (a close comes at most a tick late).
func heartbeatTick(cfg Config) time.Duration {
	return min(time.Second, max(min(cfg.PingInterval, cfg.ConnectTimeout, cfg.WriteTimeout)/5, time.Millisecond))
}

// startHeartbeats starts the sweep on the first connection.
func (s *Server) startHeartbeats() {
	s.beats.once.Do(func() {
		s.beats.stop, s.beats.done = make(chan struct{}), make(chan struct{})
		go s.sweepHeartbeats(heartbeatTick(s.cfg))
	})
}

// stopHeartbeats ends the sweep (Shutdown, after the connections).
func (s *Server) stopHeartbeats() {
	s.beats.once.Do(func() {}) // none starts after this
	s.beats.stopOnce.Do(func() {
		if s.beats.stop != nil {
			close(s.beats.stop)
			<-s.beats.done
		}
	})
}

func (s *Server) sweepHeartbeats(tick time.Duration) {
	defer close(s.beats.done)
	t := time.NewTicker(tick)
	defer t.Stop()
	var conns []*conn
	for {
		select {
		case <-s.beats.stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		conns = conns[:0]
		for c := range s.conns {
			conns = append(conns, c)
		}
		s.mu.Unlock()
		now := time.Now()
		for _, c := range conns {
			c.checkHeartbeat(now)
		}
		clear(conns)
	}
}

// checkHeartbeat is one look at c (sweeper goroutine only).
func (c *conn) checkHeartbeat(now time.Time) {
	if c.ctx.Err() != nil {
		return
	}
	if w := c.writeStart.Load(); w != 0 && now.UnixNano()-w > int64(c.s.cfg.WriteTimeout) && c.writeLate.CompareAndSwap(false, true) {
		c.writeTimedOut()
		return
	}
	iv := c.s.cfg.PingInterval
	c.mu.Lock()
	connected, writing := c.sess != nil, c.writerOn
	c.mu.Unlock()
	if writing {
		c.lookAtWriter()
	}
	switch {
	case !connected && now.Sub(c.opened) > c.s.cfg.ConnectTimeout:
		c.closeLate(wire.CloseConnectTimeout, "no connect message in time")
	case now.Sub(time.Unix(0, c.lastRead.Load())) > 2*iv:
		c.closeLate(wire.CloseHeartbeatTimeout, "nothing received for two ping intervals")
	case now.Sub(c.trimmed) >= iv:
		c.trimmed = now
		c.trimIdle()
	}
}

// closeLate closes c once for a heartbeat, on a goroutine of its own:
// closeWS waits for the close handshake.
func (c *conn) closeLate(code websocket.StatusCode, reason string) {
	if c.beatClosed.CompareAndSwap(false, true) {
		go c.closeWS(code, reason)
	}
}
