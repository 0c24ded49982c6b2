//go:build linux && !386

package server

import (
	"net"
	"syscall"
	"unsafe"
)

// waitReadable parks the calling goroutine until nc has bytes to read (or
// is closed), with a shallow stack. The reader of an idle connection
// waits here rather than inside the websocket library's read path, whose
// depth keeps an 8 KiB goroutine stack; at this depth the runtime shrinks
// it to 4 KiB. It returns at once when nc is not a plain socket (a TLS
// or wrapped connection may hold bytes the kernel does not).
func waitReadable(nc net.Conn) {
	var sc syscall.Conn
	switch c := nc.(type) {
	case *net.TCPConn:
		sc = c
	case *slotConn:
		sc = c.TCPConn
	case *net.UnixConn:
		sc = c
	default:
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	// A non-blocking MSG_PEEK consumes nothing; EAGAIN makes RawConn.Read
	// wait for the poller, which is edge-triggered, so every wait follows
	// a read that found the socket empty. Data, EOF or an error end the
	// wait: the websocket read that follows reports them.
	_ = rc.Read(func(fd uintptr) bool {
		var b byte
		_, _, errno := syscall.Syscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b)), 1,
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		return errno != syscall.EAGAIN
	})
}
