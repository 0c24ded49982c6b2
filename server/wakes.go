package server

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Woken readers. An idle connection's reader parks (poller_linux.go) and
// a new one is started when its socket has bytes: on an idle node that
// is each client's ping, one per ping interval per connection. A fresh
// goroutine per wake-up paid its start and the growth of its stack every
// time (about a tenth of an idle node's CPU at 16,000 connections), so
// woken readers run on goroutines kept warm: a few wait for the next
// wake-up, the others exit when their connection parks again.
type wakes struct {
	ch   chan *conn // unbuffered: taken only by a waiting worker
	idle atomic.Int32
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

// maxIdleReaders is how many reader goroutines wait for a wake-up.
var maxIdleReaders = int32(2 * runtime.GOMAXPROCS(0))

// runReader runs c's reader on a waiting worker, or a new one.
func (s *Server) runReader(c *conn) {
	select {
	case s.wakes.ch <- c:
	default:
		s.wakes.wg.Add(1)
		go s.readerWorker(c)
	}
}

func (s *Server) readerWorker(c *conn) {
	defer s.wakes.wg.Done()
	for {
		c.read(false)
		if s.wakes.idle.Add(1) > maxIdleReaders {
			s.wakes.idle.Add(-1)
			return
		}
		select {
		case c = <-s.wakes.ch:
			s.wakes.idle.Add(-1)
		case <-s.wakes.stop:
			s.wakes.idle.Add(-1)
			return
		}
	}
}

// stopReaders ends the waiting workers (Shutdown, after the connections).
func (s *Server) stopReaders() {
	s.wakes.once.Do(func() { close(s.wakes.stop) })
	s.wakes.wg.Wait()
}
