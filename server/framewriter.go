package server

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
)

// libraryWriteBuffer is the size of the write buffer the websocket library
// gets: an idle connection holds it for its lifetime, so it is as small as
// bufio allows. The library writes a frame's header into it and then the
// payload, which passes the buffer: the buffer's first 16 bytes go out in
// one write and the rest in another. frameWriter, under the buffer, sends
// both in one syscall.
const libraryWriteBuffer = 16

// frameWriter is a socket as the websocket library's write buffer writes
// it. It follows the frames going through it (the library writes whole
// frames, under its frame lock), and holds back a small first piece of a
// frame that continues, to send it with the rest: with writev where the
// socket has it, so the payload is not copied, else joined into one write.
// A piece that completes its frames goes out at once, so nothing waits on
// bytes that will not come.
type frameWriter struct {
	net.Conn
	vec bool // the socket takes net.Buffers in one writev

	// The frame being written: its header bytes seen so far (hdrLen of
	// them), and the payload bytes still to come once the header is whole.
	hdr    [maxFrameHeader]byte
	hdrLen int
	left   uint64

	held    [libraryWriteBuffer]byte
	heldLen int
	vecs    [2][]byte   // held and the write that follows, for writev
	bufs    net.Buffers // over vecs; on fw, as WriteTo takes its address

	// Writes that must not wait (a flusher's, flushers.go) are made while
	// nowait is set: what the socket does not take at once waits in tail,
	// which every later write sends first, and which the connection's own
	// writer goroutine sends, waiting as long as the socket needs
	// (flushTail). rc is the socket's, nil where it has none: then every
	// write waits. mu orders the writes with flushTail; tailLen is
	// len(tail), read without it.
	nowait  atomic.Bool
	rc      syscall.RawConn
	mu      sync.Mutex
	tail    []byte
	tailLen atomic.Int64
	// onWait is called, under mu, before a write that was not to wait
	// waits after all (the tail would pass maxTail; conn.flusherWaits).
	onWait func()
}

// maxTail bounds what writes that must not wait leave in tail, as a
// writer's frame buffer bounds what a socket that does not read holds: a
// write that would leave more waits for the socket (after the tail),
// calling onWait first. A flusher sends a burst's frame to a socket that
// took everything before, so only a socket that fell behind since its
// last frame gets a tail at all.
const maxTail = maxFrame

// maxFrameHeader is a header with a 64-bit length and a mask key.
const maxFrameHeader = 14

func newFrameWriter(nc net.Conn) *frameWriter {
	fw := &frameWriter{Conn: nc}
	switch nc.(type) {
	case *net.TCPConn, *net.UnixConn, *slotConn:
		fw.vec = true
		fw.rc = rawConn(nc)
	}
	return fw
}

// noWaitCall is one writev of a write that does not wait: its arguments,
// its results and the function RawConn.Write runs, made once per
// noWaitCall (a closure per write would be an allocation per write), and
// pooled rather than kept per socket (an idle socket holds none).
type noWaitCall struct {
	a, b []byte
	n    int
	err  error
	fn   func(fd uintptr) bool
}

var noWaitCalls = sync.Pool{New: func() any {
	c := new(noWaitCall)
	c.fn = func(fd uintptr) bool {
		c.n, c.err = writevNoWait(fd, c.a, c.b)
		return true // never wait for the runtime's poller
	}
	return c
}}

// rawConn is nc's socket for writes that do not wait, nil where writev
// is not at hand (writev_other.go).
func rawConn(nc net.Conn) syscall.RawConn {
	if !haveWritev {
		return nil
	}
	var sc syscall.Conn
	switch nc := nc.(type) {
	case *net.TCPConn:
		sc = nc
	case *net.UnixConn:
		sc = nc
	case *slotConn:
		sc = nc.TCPConn
	default:
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// blocked reports whether bytes written without waiting still wait for
// the socket.
func (fw *frameWriter) blocked() bool { return fw.tailLen.Load() > 0 }

// flushTail sends what writes that did not wait left, waiting for the
// socket as long as it takes (the caller bounds that: conn.writeStart).
func (fw *frameWriter) flushTail() error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	return fw.flushTailLocked()
}

func (fw *frameWriter) flushTailLocked() error {
	if len(fw.tail) == 0 {
		return nil
	}
	_, err := fw.Conn.Write(fw.tail)
	fw.tail = nil // a tail is rare: its socket fell behind; not kept
	fw.tailLen.Store(0)
	return err
}

// writeNoWait writes held and then p with one writev that does not wait,
// and keeps what the socket did not take in the tail, up to maxTail; the
// frames' order on the socket is the tail's. done: all of it was written
// or kept; else it returns what is left, which must be written waiting
// (an error of the socket is left to that write too).
func (fw *frameWriter) writeNoWait(held, p []byte) (restHeld, restP []byte, done bool) {
	if len(fw.tail) == 0 {
		call := noWaitCalls.Get().(*noWaitCall)
		call.a, call.b = held, p
		werr := fw.rc.Write(call.fn)
		n, err := call.n, call.err
		call.a, call.b, call.err = nil, nil, nil
		noWaitCalls.Put(call)
		if werr != nil || err != nil {
			return held, p, false
		}
		if n >= len(held) {
			held, p = nil, p[n-len(held):]
		} else {
			held = held[n:]
		}
		if len(held)+len(p) == 0 {
			return nil, nil, true
		}
	}
	if len(fw.tail)+len(held)+len(p) > maxTail {
		return held, p, false
	}
	fw.tail = append(append(fw.tail, held...), p...)
	fw.tailLen.Store(int64(len(fw.tail)))
	return nil, nil, true
}

// follow walks p through the frames and reports whether p ends inside one.
func (fw *frameWriter) follow(p []byte) bool {
	for len(p) > 0 {
		if fw.left > 0 {
			k := uint64(len(p))
			if k > fw.left {
				k = fw.left
			}
			fw.left -= k
			p = p[k:]
			continue
		}
		fw.hdr[fw.hdrLen] = p[0]
		fw.hdrLen++
		p = p[1:]
		if n, ok := frameHeaderLen(fw.hdr[:fw.hdrLen]); ok && fw.hdrLen == n {
			fw.left = framePayloadLen(fw.hdr[:n])
			fw.hdrLen = 0
		}
	}
	return fw.left > 0 || fw.hdrLen > 0
}

// frameHeaderLen is the length of the header that h begins, once h holds
// its first two bytes (RFC 6455 §5.2).
func frameHeaderLen(h []byte) (int, bool) {
	if len(h) < 2 {
		return 0, false
	}
	n := 2
	switch h[1] & 0x7f {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if h[1]&0x80 != 0 {
		n += 4
	}
	return n, true
}

// framePayloadLen is the payload length a whole header h gives.
func framePayloadLen(h []byte) uint64 {
	switch l := h[1] & 0x7f; l {
	case 126:
		return uint64(binary.BigEndian.Uint16(h[2:]))
	case 127:
		return binary.BigEndian.Uint64(h[2:])
	default:
		return uint64(l)
	}
}

func (fw *frameWriter) Write(p []byte) (int, error) {
	inFrame := fw.follow(p)
	if inFrame && fw.heldLen+len(p) <= len(fw.held) {
		fw.heldLen += copy(fw.held[fw.heldLen:], p)
		return len(p), nil
	}
	fw.mu.Lock()
	defer fw.mu.Unlock()
	held := fw.held[:fw.heldLen]
	fw.heldLen = 0
	if fw.rc != nil && fw.nowait.Load() {
		written := len(p)
		var done bool
		if held, p, done = fw.writeNoWait(held, p); done {
			return written, nil
		}
		if fw.onWait != nil {
			fw.onWait()
		}
		if _, err := fw.writeWait(held, p); err != nil {
			return 0, err
		}
		return written, nil
	}
	return fw.writeWait(held, p)
}

// writeWait writes held and then p, after the tail, waiting for the
// socket as long as it takes; it returns how much of p it wrote.
func (fw *frameWriter) writeWait(held, p []byte) (int, error) {
	if err := fw.flushTailLocked(); err != nil {
		return 0, err
	}
	if len(held) == 0 {
		return fw.Conn.Write(p)
	}
	if !fw.vec {
		return fw.writeJoined(held, p)
	}
	fw.vecs = [2][]byte{held, p}
	fw.bufs = fw.vecs[:]
	n, err := fw.bufs.WriteTo(fw.Conn)
	fw.vecs = [2][]byte{}
	return max(int(n)-len(held), 0), err
}

// joinBuffers are the one-write copies of sockets without writev (TLS).
var joinBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

func (fw *frameWriter) writeJoined(held, p []byte) (int, error) {
	bp := joinBuffers.Get().(*[]byte)
	b := append(append((*bp)[:0], held...), p...)
	n, err := fw.Conn.Write(b)
	if cap(b) <= 64<<10 {
		*bp = b[:0]
		joinBuffers.Put(bp)
	}
	return max(n-len(held), 0), err
}

var _ io.Writer = (*frameWriter)(nil)
