//go:build linux && !386

package server

import (
	"net"
	"syscall"
)

// waitReadable parks the reader until its socket has bytes to read (or is
// closed), with a shallow stack. The reader of an idle connection waits
// here rather than inside the websocket library's read path, whose depth
// keeps an 8 KiB goroutine stack; at this depth the runtime shrinks it to
// 4 KiB. It returns at once when the socket is not a plain one (a TLS or
// wrapped connection may hold bytes the kernel does not).
//
// The wait's own reads take what arrived (readAhead), so the websocket
// read that follows finds it without a syscall: a message costs a read
// that finds the socket empty and one that takes it, as a plain Go read
// does, where a peek took three.
func (c *conn) waitReadable() {
	var sc syscall.Conn
	switch nc := c.nc.(type) {
	case *net.TCPConn:
		sc = nc
	case *slotConn:
		sc = nc.TCPConn
	case *net.UnixConn:
		sc = nc
	default:
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	// A read that finds the socket empty (EAGAIN) makes RawConn.Read wait
	// for the poller, which is edge-triggered, so every wait follows a
	// read that found the socket empty.
	_ = rc.Read(c.readAhead)
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
