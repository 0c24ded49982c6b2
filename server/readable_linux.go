//go:build linux && !386

package server

import (
	"net"
	"syscall"
)

// readBufferSize: the websocket read copies from readAhead's pooled
// buffer, so its own buffer needs no room (16 is bufio's least).
const readBufferSize = 16

// waitReadable waits until the reader's socket has bytes to read (or is
// closed), and reports whether it handed the wait to the server's idle
// poller instead: the reader goroutine must then return at once, and the
// poller starts another when the socket has bytes (poller_linux.go), so an
// idle connection holds no goroutine. Without the poller the reader waits
// here rather than inside the websocket library's read path, whose depth
// keeps an 8 KiB goroutine stack; at this depth the runtime shrinks it to
// 4 KiB. It returns at once when the socket is not a plain one (a TLS or
// wrapped connection may hold bytes the kernel does not).
//
// The wait's own reads take what arrived (readAhead), so the websocket
// read that follows finds it without a syscall: a message costs a read
// that finds the socket empty and one that takes it, as a plain Go read
// does, where a peek took three.
func (c *conn) waitReadable() (parked bool) {
	var sc syscall.Conn
	switch nc := c.nc.(type) {
	case *net.TCPConn:
		sc = nc
	case *slotConn:
		sc = nc.TCPConn
	case *net.UnixConn:
		sc = nc
	default:
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	// A read that finds the socket empty (EAGAIN) parks it, or makes
	// RawConn.Read wait for the runtime's poller, which is edge-triggered,
	// so every wait follows a read that found the socket empty.
	_ = rc.Read(func(fd uintptr) bool {
		if c.readAhead(fd) {
			return true
		}
		parked = c.park(rc, fd)
		return parked
	})
	return parked
}

// park hands the reader's empty socket fd to the idle poller and reports
// whether the reader goroutine must now return. A reader is woken by the
// poller's event or by the socket's close (wakeReader): a close that came
// before parked was set woke no one, so the socket is looked at once more
// after it is armed.
func (c *conn) park(rc syscall.RawConn, fd uintptr) bool {
	p := c.s.poller()
	if p == nil || (!c.polled && p.register(c, fd) != nil) {
		return false
	}
	c.parked.Store(true)
	if p.arm(c, fd) != nil || rc.Control(func(uintptr) {}) != nil {
		// Not parked, or closed meanwhile: go on reading here, unless a
		// wake-up already started another reader.
		return !c.parked.CompareAndSwap(true, false)
	}
	return true
}

// readAhead is one look of waitReadable at the socket fd: it reads what
// the socket holds into c.sock's head and reports whether the wait is
// over. Bytes, EOF and an error end it: the websocket read that follows
// takes the bytes, or meets the EOF or error itself. Once a close
// handshake owns the read buffer, it takes nothing and ends the wait:
// the handshake reads the socket itself.
func (c *conn) readAhead(fd uintptr) bool {
	c.brMu.Lock()
	defer c.brMu.Unlock()
	if c.wsClosing {
		return true
	}
	p := readAheads.Get().(*[]byte)
	for {
		n, err := syscall.Read(int(fd), *p)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			readAheads.Put(p)
			return false
		case n > 0:
			c.sock.setHead(p, n)
			return true
		}
		readAheads.Put(p)
		return true
	}
}
