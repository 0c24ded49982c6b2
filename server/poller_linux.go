//go:build linux && !386

package server

import (
	"maps"
	"os"
	"slices"
	"sync"
	"syscall"
)

// idlePoller waits on the sockets of idle WebSocket connections with one
// epoll instance, so that an idle connection holds no goroutine (and no
// goroutine stack, 4 KiB): its reader parks the socket here and returns,
// and the poller starts a reader again when the socket has bytes, or an
// end (EOF, reset). A socket is armed for one event (EPOLLONESHOT) and
// level-triggered, so bytes that arrived before it was armed wake it too.
//
// The epoll instance is itself waited on by the Go runtime's poller (an
// epoll fd is readable while it has events), so the poller is an ordinary
// goroutine that Close stops, not a thread blocked in epoll_wait.
type idlePoller struct {
	ep *os.File // the epoll instance
	rc syscall.RawConn
	mu sync.Mutex
	// conns are the connections whose socket was ever parked, by id (the
	// event's data): a stale event of a connection that ended finds none.
	conns map[uint64]*conn
	done  chan struct{} // closed when run returns
}

func newIdlePoller() (*idlePoller, error) {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	// Non-blocking, so that os.NewFile hands it to the runtime's poller.
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, os.NewSyscallError("fcntl", err)
	}
	ep := os.NewFile(uintptr(fd), "epoll")
	rc, err := ep.SyscallConn()
	if err != nil {
		ep.Close()
		return nil, err
	}
	p := &idlePoller{ep: ep, rc: rc, conns: make(map[uint64]*conn), done: make(chan struct{})}
	go p.run()
	return p, nil
}

// run starts the reader of each connection whose socket has an event,
// until stop.
func (p *idlePoller) run() {
	defer close(p.done)
	events := make([]syscall.EpollEvent, 128)
	for {
		n := 0
		var werr error
		err := p.rc.Read(func(fd uintptr) bool {
			n, werr = syscall.EpollWait(int(fd), events, 0)
			if werr == syscall.EINTR {
				n, werr = 0, nil
			}
			return n > 0 || werr != nil // none: the runtime waits for one
		})
		if err != nil || werr != nil {
			// Closed by stop (every connection has ended), or epoll
			// failed: wake every parked reader, which then waits on its
			// own from now on (park finds the poller closed).
			p.ep.Close()
			p.wakeAll()
			return
		}
		for _, ev := range events[:n] {
			p.mu.Lock()
			c := p.conns[eventID(ev)]
			p.mu.Unlock()
			if c != nil {
				c.wakeReader()
			}
		}
	}
}

func (p *idlePoller) wakeAll() {
	p.mu.Lock()
	conns := slices.Collect(maps.Values(p.conns))
	p.mu.Unlock()
	for _, c := range conns {
		c.wakeReader()
	}
}

// stop stops run; called when no connection is left.
func (p *idlePoller) stop() {
	p.ep.Close()
	<-p.done
}

// register adds socket fd of c to the epoll set, not yet waited for: an
// event before arm finds c not parked and is dropped. Called by c's reader
// before it first parks, so that c.polled is set before any other reader
// can run.
func (p *idlePoller) register(c *conn, fd uintptr) error {
	p.mu.Lock()
	p.conns[c.id] = c
	p.mu.Unlock()
	if err := p.ctl(syscall.EPOLL_CTL_ADD, c.id, fd); err != nil {
		p.forget(c)
		return err
	}
	c.polled = true
	return nil
}

// arm waits for one readable event (or an end) of c's registered socket.
func (p *idlePoller) arm(c *conn, fd uintptr) error {
	return p.ctl(syscall.EPOLL_CTL_MOD, c.id, fd)
}

func (p *idlePoller) ctl(op int, id uint64, fd uintptr) error {
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT, Fd: int32(id), Pad: int32(id >> 32)}
	var err error
	// Through the RawConn: the epoll fd cannot be closed (and its number
	// reused) under the call.
	if cerr := p.rc.Control(func(ep uintptr) { err = syscall.EpollCtl(int(ep), op, int(fd), &ev) }); cerr != nil {
		return cerr
	}
	return err
}

// forget drops c, which has ended; the kernel drops its socket from the
// epoll set when the socket is closed.
func (p *idlePoller) forget(c *conn) {
	p.mu.Lock()
	delete(p.conns, c.id)
	p.mu.Unlock()
}

func eventID(ev syscall.EpollEvent) uint64 {
	return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
}
