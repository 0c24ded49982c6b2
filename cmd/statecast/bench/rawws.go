package bench

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// wsConn is what the subscribers need of a WebSocket connection: the
// library's, or the tool's own minimal reader (--raw-reader).
type wsConn interface {
	// readMessage appends the payload of the next data message to buf.
	readMessage(buf []byte) ([]byte, error)
	writeText(ctx context.Context, b []byte) error
	closeNow()
}

// libConn is a connection of github.com/coder/websocket.
type libConn struct{ c *websocket.Conn }

func (l libConn) readMessage(buf []byte) ([]byte, error) {
	_, r, err := l.c.Reader(context.Background())
	if err != nil {
		return buf, err
	}
	return readFrame(r, buf)
}

func (l libConn) writeText(ctx context.Context, b []byte) error {
	return l.c.Write(ctx, websocket.MessageText, b)
}

func (l libConn) closeNow() { _ = l.c.CloseNow() }

// rawConn is a client WebSocket of the fewest moving parts: one read
// syscall fills a buffer that may hold many frames, which are parsed in
// place; no per-message context, lock or reader object. It stands for a
// client that costs little CPU (one in C, or one on another machine), so
// that a run on one machine measures the server rather than the tool's
// readers. It speaks RFC 6455 without extensions: it answers pings,
// skips pongs, and ends on close.
type rawConn struct {
	nc   net.Conn
	wmu  sync.Mutex
	in   []byte // read and not yet parsed: in[off:]
	off  int
	msg  []byte // the fragments of a message so far
	frag bool
}

// errRawClosed is what a read returns after the server's close frame.
var errRawClosed = errors.New("the server closed the WebSocket")

// dialRaw opens a WebSocket to u (ws://) with subprotocols through dial.
func dialRaw(ctx context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error), u string, subprotocols []string) (*rawConn, error) {
	pu, err := url.Parse(u)
	if err != nil {
		return nil, err
	}
	if pu.Scheme != "ws" {
		return nil, fmt.Errorf("--raw-reader speaks ws:// only, not %s", pu.Scheme)
	}
	host := pu.Host
	if pu.Port() == "" {
		host += ":80"
	}
	nc, err := dial(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	if d, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(d)
	}
	var key [16]byte
	_, _ = rand.Read(key[:])
	req := "GET " + pu.RequestURI() + " HTTP/1.1\r\nHost: " + pu.Host +
		"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " +
		base64.StdEncoding.EncodeToString(key[:]) + "\r\n"
	if len(subprotocols) > 0 {
		req += "Sec-WebSocket-Protocol: " + strings.Join(subprotocols, ", ") + "\r\n"
	}
	if _, err := io.WriteString(nc, req+"\r\n"); err != nil {
		nc.Close()
		return nil, err
	}
	br := bufio.NewReaderSize(nc, 4096)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		nc.Close()
		return nil, err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		nc.Close()
		return nil, busyOf(resp, fmt.Errorf("WebSocket upgrade: %s", resp.Status))
	}
	_ = nc.SetDeadline(timeZero)
	c := &rawConn{nc: nc}
	// What the server sent after its answer is the first frames' bytes.
	if n := br.Buffered(); n > 0 {
		c.in, _ = br.Peek(n)
		c.in = append([]byte(nil), c.in...)
	}
	return c, nil
}

func (c *rawConn) readMessage(buf []byte) ([]byte, error) {
	for {
		fin, op, payload, err := c.nextFrame()
		if err != nil {
			return buf, err
		}
		switch op {
		case 0x8: // close
			return buf, errRawClosed
		case 0x9: // ping
			if err := c.write(0xA, payload); err != nil {
				return buf, err
			}
			continue
		case 0xA: // pong
			continue
		case 0x0: // continuation
			if !c.frag {
				return buf, errors.New("a continuation frame outside a message")
			}
		default: // text, binary
			if c.frag {
				return buf, errors.New("a new message inside a fragmented one")
			}
		}
		if fin && !c.frag {
			return append(buf, payload...), nil
		}
		c.msg = append(c.msg, payload...)
		c.frag = !fin
		if fin {
			buf = append(buf, c.msg...)
			c.msg = c.msg[:0]
			if cap(c.msg) > 1<<20 {
				c.msg = nil
			}
			return buf, nil
		}
	}
}

// nextFrame parses the next whole frame out of c.in, reading as needed.
// payload aliases c.in until the next call.
func (c *rawConn) nextFrame() (fin bool, op byte, payload []byte, err error) {
	for {
		b := c.in[c.off:]
		if len(b) >= 2 {
			hdr := 2
			n := uint64(b[1] & 0x7f)
			switch n {
			case 126:
				hdr = 4
			case 127:
				hdr = 10
			}
			if b[1]&0x80 != 0 {
				return false, 0, nil, errors.New("the server masked a frame")
			}
			if len(b) >= hdr {
				switch hdr {
				case 4:
					n = uint64(binary.BigEndian.Uint16(b[2:]))
				case 10:
					n = binary.BigEndian.Uint64(b[2:])
				}
				if n > 64<<20 {
					return false, 0, nil, fmt.Errorf("a frame of %d bytes", n)
				}
				if end := hdr + int(n); len(b) >= end {
					c.off += end
					return b[0]&0x80 != 0, b[0] & 0x0f, b[hdr:end], nil
				}
			}
		}
		if err := c.fill(); err != nil {
			return false, 0, nil, err
		}
	}
}

// fill reads more into c.in, first moving what is left of it to its
// start, or into a larger buffer when one frame fills it.
func (c *rawConn) fill() error {
	rest := len(c.in) - c.off
	switch {
	case c.in == nil:
		c.in = make([]byte, 0, rawBufSize)
	case c.off > 0 && rest == 0 && cap(c.in) > 4*rawBufSize:
		c.in, c.off = make([]byte, 0, rawBufSize), 0 // do not keep a replay's buffer
	case c.off > 0:
		copy(c.in, c.in[c.off:])
		c.in, c.off = c.in[:rest], 0
	case len(c.in) == cap(c.in):
		c.in = append(c.in, make([]byte, cap(c.in))...)[:len(c.in)]
	}
	n, err := c.nc.Read(c.in[len(c.in):cap(c.in)])
	c.in = c.in[:len(c.in)+n]
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// rawBufSize is a raw connection's read buffer: a syscall's worth of
// frames for a busy subscriber.
const rawBufSize = 16 << 10

func (c *rawConn) writeText(ctx context.Context, b []byte) error {
	if d, ok := ctx.Deadline(); ok {
		c.wmu.Lock()
		_ = c.nc.SetWriteDeadline(d)
		c.wmu.Unlock()
		defer func() {
			c.wmu.Lock()
			_ = c.nc.SetWriteDeadline(timeZero)
			c.wmu.Unlock()
		}()
	}
	return c.write(0x1, b)
}

// write sends one masked frame (a client's frames are masked: RFC 6455
// 5.3), header and payload in one write.
func (c *rawConn) write(op byte, p []byte) error {
	f := make([]byte, 0, 14+len(p))
	f = append(f, 0x80|op)
	switch n := len(p); {
	case n < 126:
		f = append(f, 0x80|byte(n))
	case n <= 0xffff:
		f = append(f, 0x80|126, byte(n>>8), byte(n))
	default:
		f = append(f, 0x80|127)
		f = binary.BigEndian.AppendUint64(f, uint64(n))
	}
	var mask [4]byte
	_, _ = rand.Read(mask[:])
	f = append(f, mask[:]...)
	start := len(f)
	f = append(f, p...)
	for i := range f[start:] {
		f[start+i] ^= mask[i&3]
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.nc.Write(f)
	return err
}

func (c *rawConn) closeNow() { _ = c.nc.Close() }

var timeZero time.Time
