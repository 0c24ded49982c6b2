package server

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
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
}

// maxFrameHeader is a header with a 64-bit length and a mask key.
const maxFrameHeader = 14

func newFrameWriter(nc net.Conn) *frameWriter {
	fw := &frameWriter{Conn: nc}
	switch nc.(type) {
	case *net.TCPConn, *net.UnixConn, *slotConn:
		fw.vec = true
	}
	return fw
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
	if fw.heldLen == 0 {
		return fw.Conn.Write(p)
	}
	held := fw.held[:fw.heldLen]
	fw.heldLen = 0
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
