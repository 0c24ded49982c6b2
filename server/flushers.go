package server

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Flushers. A write to a room wakes every idle socket subscribed to it:
// a goroutine started per socket then grew a fresh stack for each of them
// (a write to a room of 100,000 started 100,000 writers, 16-24 % of a
// node's time in stack growth and its page faults). Instead a few warm
// goroutines a node (flushers) take the woken connections in turn and
// send each its frame with a write that does not wait for the socket
// (frameWriter.nowait): an idle socket takes it at once. A connection
// whose socket does not (its tail keeps the rest), or whose frame starts
// a subscription (a snapshot or a replay, which may be large), gets a
// writer goroutine of its own, which waits on its socket as long as the
// write timeout allows and exits once the connection is idle again. A
// flusher whose write must wait after all (more than maxTail left over)
// hands its place to a new flusher before it waits, finishes that one
// connection, and exits: the others never wait behind a socket.
type flushers struct {
	mu      sync.Mutex
	wake    sync.Cond
	queue   []*conn // connections to flush, oldest first; from head on
	head    int
	workers int // flusher goroutines holding a place
	waiting int // of them, waiting for a connection
	stopped bool
	wg      sync.WaitGroup
}

// maxFlushers: flushers never wait on a socket, so one a CPU keeps the
// CPUs busy.
var maxFlushers = runtime.GOMAXPROCS(0)

// maxFlushPasses is how many passes a flusher makes over one connection
// before it queues it again.
const maxFlushPasses = 4

// flusher is one flusher goroutine's place; left: it handed the place
// on, and exits after the connection it is flushing.
type flusher struct{ left atomic.Bool }

// queueFlush hands c, whose flushing flag is set, to a flusher, after
// the connections queued before it. It reports false once the flushers
// are stopped (Shutdown): the caller then starts a writer.
func (s *Server) queueFlush(c *conn) bool {
	f := &s.flushers
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return false
	}
	if f.head > 1024 && f.head > len(f.queue)/2 {
		// A queue that never empties (overload) would keep its front.
		n := copy(f.queue, f.queue[f.head:])
		clear(f.queue[n:])
		f.queue, f.head = f.queue[:n], 0
	}
	f.queue = append(f.queue, c)
	switch {
	case f.waiting > 0:
		f.wake.Signal()
	case f.workers < maxFlushers:
		s.startFlusherLocked()
	}
	return true
}

// startFlusherLocked starts a flusher. Called with flushers.mu held.
func (s *Server) startFlusherLocked() {
	f := &s.flushers
	if f.wake.L == nil {
		f.wake.L = &f.mu
	}
	f.workers++
	f.wg.Add(1)
	go s.flushLoop()
}

// leave hands fl's place to a new flusher when connections wait.
func (s *Server) leave(fl *flusher) {
	if !fl.left.CompareAndSwap(false, true) {
		return
	}
	s.metrics.writers.Inc() // fl is now its connection's writer
	f := &s.flushers
	f.mu.Lock()
	f.workers--
	if f.head < len(f.queue) && !f.stopped {
		s.startFlusherLocked()
	}
	f.mu.Unlock()
}

// flushLoop is one flusher: it flushes queued connections, oldest first,
// until Shutdown stops it.
func (s *Server) flushLoop() {
	f := &s.flushers
	defer f.wg.Done()
	fl := new(flusher)
	var frame []byte
	f.mu.Lock()
	for {
		for f.head == len(f.queue) {
			if f.stopped {
				f.workers--
				f.mu.Unlock()
				return
			}
			f.waiting++
			f.wake.Wait()
			f.waiting--
		}
		c := f.queue[f.head]
		f.queue[f.head] = nil
		if f.head++; f.head == len(f.queue) {
			f.head = 0
			f.queue = f.queue[:0]
			if cap(f.queue) > 4096 {
				f.queue = nil // a burst's queue is not kept
			}
		}
		f.mu.Unlock()
		frame = c.flush(frame, fl)
		if fl.left.Load() {
			return
		}
		f.mu.Lock()
	}
}

// stopFlushers ends the flushers (Shutdown, after the connections, which
// flush what they queued before they end).
func (s *Server) stopFlushers() {
	f := &s.flushers
	f.mu.Lock()
	f.stopped = true
	if f.wake.L != nil {
		f.wake.Broadcast()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// flush sends c's queue on flusher fl, in frames built in frame's buffer,
// which it returns for the next connection. It lets c go once nothing is
// queued, or hands it to a writer goroutine of its own (see flushers).
func (c *conn) flush(frame []byte, fl *flusher) []byte {
	for pass := 0; ; pass++ {
		if pass == maxFlushPasses {
			// Refilled as fast as it is sent (a busy room): to the back
			// of the queue, so that it does not hold up the others.
			c.mu.Lock()
			if !c.s.queueFlush(c) {
				c.toWriterLocked()
			}
			c.mu.Unlock()
			break
		}
		if !tryLockBriefly(&c.sendMu) {
			// The reader is sending its replies: a writer waits for it,
			// not a flusher.
			c.mu.Lock()
			c.toWriterLocked()
			c.mu.Unlock()
			break
		}
		c.mu.Lock()
		if c.fw.blocked() || c.startsSubLocked() {
			c.toWriterLocked()
			c.mu.Unlock()
			c.sendMu.Unlock()
			break
		}
		c.mu.Unlock()
		var closing bool
		var err error
		frame, closing, err = c.flushPass(frame, fl)
		c.sendMu.Unlock()
		// Let go only with sendMu released: a flusher that took c again
		// at once would otherwise find it held and start a writer.
		c.mu.Lock()
		if err != nil {
			c.stopped = true
		}
		// A tail goes to a writer even when closing: it has the write
		// timeout to send it, the close handshake less.
		if err != nil || (!c.fw.blocked() && (closing || len(c.pending) == 0 && len(c.ready) == 0)) {
			c.flushing = false
			c.writing.Done()
			c.mu.Unlock()
			if err != nil {
				c.cancel()
			}
			break
		}
		c.mu.Unlock()
	}
	if releaseFrame(frame) || cap(frame) > keptFrame {
		frame = nil
	}
	return frame
}

// tryLockBriefly takes mu if it is free or freed within a few yields:
// the sweep's look at an idle connection (trimIdle) and a retiring writer
// hold it for a moment, a reader sending its replies may hold it long.
func tryLockBriefly(mu *sync.Mutex) bool {
	for range 3 {
		if mu.TryLock() {
			return true
		}
		runtime.Gosched()
	}
	return mu.TryLock()
}

// flushPass sends what c has queued, with writes that do not wait.
// Called with c.sendMu held.
func (c *conn) flushPass(frame []byte, fl *flusher) ([]byte, bool, error) {
	c.flusher.Store(fl)
	c.fw.nowait.Store(true)
	// A control frame of the websocket library (a pong, a close) being
	// written with waiting holds fw.mu, and the library's frame lock that
	// this pass's writes need: the flusher would wait behind it, so it
	// gives its place on first. (Writes that begin from now on see nowait:
	// they wait only through onWait, which does the same.)
	if !c.fw.mu.TryLock() {
		c.s.leave(fl)
	} else {
		c.fw.mu.Unlock()
	}
	frame, closing, err := c.collect(frame[:0], c.send)
	if err == nil && len(frame) > 0 {
		err = c.send(frame)
	}
	// Cleared under fw.mu, before the caller reads blocked(): a pong the
	// library wrote meanwhile without waiting has its tail in place by then.
	c.fw.mu.Lock()
	c.fw.nowait.Store(false)
	c.fw.mu.Unlock()
	c.flusher.Store(nil)
	return frame, closing, err
}

// flusherWaits is c's socket writer's onWait: the write of the flusher
// flushing c must wait for the socket, so that flusher gives its place to
// another first. (A pong written while a flusher waits to write calls
// it too: that flusher waits behind it.)
func (c *conn) flusherWaits() {
	if fl := c.flusher.Load(); fl != nil {
		c.s.leave(fl)
	}
}

// startsSubLocked reports whether a ready subscription has its first
// messages to send. Called with c.sendMu and c.mu held.
func (c *conn) startsSubLocked() bool {
	for _, s := range c.ready {
		if !s.started {
			return true
		}
	}
	return false
}

// toWriterLocked hands c from its flusher to a writer goroutine of its
// own, which takes over the flush's place in c.writing. Called with c.mu
// held.
func (c *conn) toWriterLocked() {
	c.flushing = false
	c.startWriterLocked(false)
}
