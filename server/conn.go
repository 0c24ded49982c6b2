package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/trace"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/internal/wids"
	"github.com/statecast/statecast/server/wire"
)

// maxFrame is how many bytes of queued messages the writer joins into one
// frame; one message larger than that goes out alone. The client reads
// a frame while the server builds the next, so it starts on a replay
// before the server has built all of it: 64 KiB frames took a resume of 1,000
// events from 1.4 to 0.9 ms after the sub was sent (`statecast bench
// resume`), and one of 10,000 did not get slower (32 KiB did: more
// syscalls); the syscall per 64 KiB is nothing next to copying them.
const maxFrame = 64 << 10

// A writer starts with a frame buffer of firstFrame bytes and keeps one
// of up to keptFrame bytes between bursts.
// A burst that needs more (a replay, the backlog of a socket that fell
// behind) is built in a pooled buffer of burstFrame bytes, a full frame
// and the message that crosses its end, taken back at the burst's end: a
// replay on a new connection would otherwise grow a fresh buffer from
// nothing, copying it at each doubling, and leave it to the garbage
// collector.
const (
	firstFrame = 512
	keptFrame  = 64 << 10
	burstFrame = maxFrame + 16<<10
)

var burstFrames = sync.Pool{New: func() any { return new([]byte) }}

// toBurstFrame returns frame's contents in a pooled burst buffer.
func toBurstFrame(frame []byte) []byte {
	p := burstFrames.Get().(*[]byte)
	b := *p
	if cap(b) != burstFrame {
		b = make([]byte, 0, burstFrame)
	}
	return append(b[:0], frame...)
}

// releaseFrame gives a burst buffer back to the pool and reports whether
// frame was one. One grown past it (a message larger than a frame) is
// left to the garbage collector.
func releaseFrame(frame []byte) bool {
	if cap(frame) != burstFrame {
		return false
	}
	p := new([]byte) // not &frame: that would cost every call an allocation
	*p = frame[:0]
	burstFrames.Put(p)
	return true
}

// maxPendingReplies is how many bytes of encoded replies may wait for the
// writer before the reader stops taking requests (awaitReplyRoom).
const maxPendingReplies = 1 << 20

// conn is one WebSocket session. Its reader goroutine reads and handles
// requests in order, and sends the replies of each frame itself when no
// writer is sending; a writer goroutine sends subscription messages and
// the other replies. Either joins whatever is queued into one frame (one
// write syscall). Lock order: docs/LOCKS.md.
type conn struct {
	s    *Server
	ws   *websocket.Conn
	nc   net.Conn     // ws's socket
	sock *sockConn    // nc as ws reads it, behind what waitReadable read
	fw   *frameWriter // nc as ws writes it
	// flusher: the flusher sending this connection's queue, if one is
	// (flushers.go).
	flusher atomic.Pointer[flusher]
	br      *bufio.Reader // ws's read buffer
	// brMu orders the reader's look at br (readIdle) before any close
	// handshake, which reads br from another goroutine; wsClosing is set
	// under it by closeWS.
	brMu      sync.Mutex
	wsClosing bool
	// parked: no reader goroutine runs; the idle poller or the socket's
	// close starts one (wakeReader). polled: the socket is in the idle
	// poller's epoll set (reader goroutines only).
	parked atomic.Bool
	polled bool
	codec  wire.Codec
	slot   int // encoding slot base of codec (see encoders)
	// Cancelling ctx drops the socket and stops the writer. end does not
	// cancel it before its close frame (the peer would see no close
	// code): it stops the writer by the closing flag (flushAndStop).
	ctx    context.Context
	cancel context.CancelFunc

	sess *session
	id   uint64 // the connection's number in the node's logs (logs.go)
	// upgrade: the span of the upgrade request, which each request's span
	// links to; reqSpan: the span of the request being handled (reader
	// goroutine only), nil with tracing off.
	upgrade trace.SpanContext
	reqSpan trace.Span
	// wscope: the scope of this connection's write ids (widScope), set
	// with sess when it has a subject; events of its own subject's writes
	// are sent with their ids.
	wscope string
	claims atomic.Pointer[auth.Claims]
	addr   string // the peer's address, whose write limit an anonymous client takes
	// hookHeader: the upgrade request's cookies, for the connect hook.
	hookHeader http.Header
	lastRead   atomic.Int64 // unix nanos of the last frame read
	// opened: when the upgrade was accepted; trimmed: when the heartbeat
	// sweep last gave back its idle buffers (sweeper only); beatClosed:
	// the sweep closed it (heartbeat.go).
	opened     time.Time
	trimmed    time.Time
	beatClosed atomic.Bool
	// connecting: the connection holds a place of Server.connects
	// (admit.go) while it connects.
	connecting   atomic.Bool
	leaveConnect func() // gives the connect's place back (doneConnecting)
	// wake: the writer has something to look at (queued messages, the
	// end of ctx, the sweep's retire). sent: a frame was sent since the
	// sweep last looked (send); idleLooks: looks since one was (sweeper
	// only); retire: the sweep asks an idle writer to exit.
	wake      chan struct{}
	sent      atomic.Bool
	retire    atomic.Bool
	idleLooks uint8
	drained   chan struct{} // the writer took the pending replies

	inflight sync.Mutex // held while one request is handled
	stopping bool       // guarded by inflight: take no more requests
	endOnce  sync.Once

	// sendMu is held by whoever collects and sends a frame: the writer
	// goroutine, or the reader sending its replies. It guards the fields
	// below it.
	sendMu sync.Mutex
	spare  []*sub          // the previous ready list, for reuse
	msgs   []rooms.Message // drain buffer
	// writeStart: unix nanos since the frame (or piece) being written was
	// handed to the socket, 0 while none is; the heartbeat sweep closes
	// a connection whose write outlasts the write timeout (writeLate: once).
	writeStart atomic.Int64
	writeLate  atomic.Bool
	// replying: the reader is handling a frame and sends its replies
	// when done, so queueing one wakes no writer.
	replying atomic.Bool

	mu      sync.Mutex
	pending []byte // encoded replies to send
	ready   []*sub // subscriptions that may have messages
	subs    map[uint64]*sub
	// prefixes counts the key prefixes of subs (and of subs starting),
	// bounded by Config.MaxConnPrefixes; filters their filters, bounded by
	// Config.MaxConnFilters.
	prefixes, filters int
	timers            []*time.Timer // stopped by end
	closing           bool
	// flushing: the connection waits for a flusher, or one sends its
	// queue (flushers.go); writerOn: a writer goroutine of its own runs,
	// for a socket that does not take its frames at once. It exits after
	// writerIdleLooks looks of the heartbeat sweep that found it idle.
	// An idle socket holds neither. stopped: none may start again.
	// writing counts the flush or the writer (one at a time).
	flushing, writerOn, stopped bool
	writing                     sync.WaitGroup
}

// sub is one subscription of a conn.
type sub struct {
	id      uint64
	room    string
	w       *rooms.Watcher
	prev    bool
	nprefix int  // key prefixes it holds of the connection's budget
	nfilter int  // 1 when it holds a filter of the connection's budget
	queued  bool // in conn.ready; guarded by conn.mu
	// started: its first messages (a snapshot or a replay, which a
	// flusher leaves to a writer of the connection's own) were collected;
	// guarded by conn.sendMu.
	started bool
	active  atomic.Bool // ok sent: its messages may follow
	gone    atomic.Bool // unsubscribed by the client, or the connection ended
}

// errClose ends a connection with a close code.
type errClose struct {
	code   websocket.StatusCode
	reason string
}

func (e *errClose) Error() string { return fmt.Sprintf("close %d: %s", e.code, e.reason) }

func closeWith(code websocket.StatusCode, format string, args ...any) error {
	return &errClose{code: code, reason: fmt.Sprintf(format, args...)}
}

// maxCloseReason is the most bytes a close frame's reason can carry
// (RFC 6455 §5.5: a 125-byte control payload, 2 of them the code).
const maxCloseReason = 123

// closeReason cuts reason to fit a close frame, on a rune boundary: the
// websocket library refuses a longer reason and then sends no close frame
// at all, so the peer would never learn the close code.
func closeReason(reason string) string {
	if len(reason) <= maxCloseReason {
		return reason
	}
	reason = reason[:maxCloseReason]
	for len(reason) > 0 && !utf8.ValidString(reason) {
		reason = reason[:len(reason)-1]
	}
	return reason
}

// refusedConn is the close code and reason for a WebSocket addConn
// refused: a node that began draining during the handshake closes it as
// its open sockets (1012: reconnect now, elsewhere), a full one with 4004
// (back off).
func (s *Server) refusedConn() (websocket.StatusCode, string) {
	if s.draining.Load() {
		return websocket.StatusServiceRestart, "server shutting down; reconnect"
	}
	s.metrics.rejected.WithLabelValues("full").Inc()
	return wire.CloseServerFull, "server full"
}

// handleWS upgrades the request and starts the session on its own goroutine.
func (s *Server) handleWS(ec echo.Context) error {
	r, w := ec.Request(), ec.Response()
	if s.draining.Load() {
		return echo.NewHTTPError(http.StatusServiceUnavailable, "server is shutting down")
	}
	codec, ok := negotiate(r)
	if !ok {
		return echo.NewHTTPError(http.StatusBadRequest, "unsupported subprotocol: offer "+wire.JSON.Subprotocol()+" or "+wire.Msgpack.Subprotocol())
	}
	if origin := r.Header.Get(echo.HeaderOrigin); origin != "" && !originAllowed(origin, r.Host, s.cfg.AllowOrigins) {
		s.refuseOrigin(w, r, codec, origin)
		return nil
	}
	if s.connsFull() {
		s.refuseFull(w) // before the handshake: cheap (guardReserve)
		return nil
	}
	leave, ok := s.connects.enterFrom(r.Context(), r.RemoteAddr)
	if !ok {
		return s.refuseConnect(ec)
	}
	if s.connsFull() { // filled while this connect queued
		leave()
		s.refuseFull(w)
		return nil
	}
	lean := &leanBuffers{ResponseWriter: w}
	// Before the 101: the client sends its connect only after it, so
	// this orders the client's connects however late the node reads
	// the frame (sessions.open).
	upgraded := time.Now()
	ws, err := websocket.Accept(lean, r, &websocket.AcceptOptions{
		Subprotocols:   []string{codec.Subprotocol()},
		OriginPatterns: s.cfg.AllowOrigins,
	})
	if err != nil {
		leave()
		s.metrics.rejected.WithLabelValues("upgrade").Inc()
		return nil // Accept has answered; the connection is hijacked or failed
	}
	ws.SetReadLimit(s.cfg.MaxFrameBytes)
	ctx, cancel := context.WithCancel(context.Background())
	c := &conn{
		s: s, ws: ws, nc: lean.nc, sock: lean.sock, fw: lean.fw, br: lean.br, codec: codec, slot: codecSlot(codec), ctx: ctx, cancel: cancel,
		addr: r.RemoteAddr, hookHeader: s.hookHeader(r), wake: make(chan struct{}, 1), drained: make(chan struct{}, 1), subs: make(map[uint64]*sub),
		leaveConnect: leave,
	}
	c.id = s.connSeq.Add(1)
	if c.fw != nil {
		c.fw.onWait = c.flusherWaits
	}
	// Before addConn: the heartbeat sweep looks at it from then on.
	c.opened, c.trimmed = upgraded, time.Now()
	c.lastRead.Store(c.opened.UnixNano())
	lean.sock.owner = c
	if s.tracer != nil {
		c.upgrade = trace.SpanContextFromContext(r.Context())
	}
	if !s.addConn(c) {
		leave()
		cancel()
		code, reason := s.refusedConn()
		ws.Close(code, reason)
		return nil
	}
	s.metrics.connections.Inc()
	c.holdConnecting()
	// The session runs on a fresh goroutine and the handler returns: the
	// handler's deep stack (net/http, echo) and its request would
	// otherwise stay pinned for the socket's lifetime, about 8 KB per
	// idle connection. Server.Shutdown waits for it through connWG.
	go c.serve()
	return nil
}

// refuseOrigin answers the upgrade of a page whose Origin is not allowed.
// A browser hides why a handshake failed (the page sees 1006, and a client
// retries it forever), so the upgrade is accepted only to be closed at once
// with 4502 and a reason naming --allow-origin. Nothing is read from the
// socket: the page gets no session and can send nothing.
func (s *Server) refuseOrigin(w http.ResponseWriter, r *http.Request, codec wire.Codec, origin string) {
	s.metrics.rejected.WithLabelValues("origin").Inc()
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{codec.Subprotocol()}, InsecureSkipVerify: true})
	if err != nil {
		return
	}
	host := origin
	if u, err := url.Parse(origin); err == nil && u.Host != "" {
		host = u.Host
	}
	reason := "Origin not allowed: start the server with --allow-origin " + host
	if len(reason) > 123 { // a close frame's reason
		reason = reason[:123]
	}
	ws.Close(wire.CloseOriginRefused, reason)
}

// leanBuffers gives the hijacked connection the buffers an idle socket
// holds for its lifetime (net/http hands it 4 KiB of each) as small as
// bufio allows. Reads: on Linux the reader's wait takes what arrived into
// a pooled buffer (readAhead), which the websocket read then copies, so a
// small read buffer costs no syscalls (readable_linux.go sets its size).
// Writes: frameWriter sends a frame's header with its payload in one
// syscall, without copying the payload.
type leanBuffers struct {
	http.ResponseWriter
	nc   net.Conn      // the hijacked socket
	sock *sockConn     // nc as the websocket library reads it
	fw   *frameWriter  // nc as it writes it
	br   *bufio.Reader // its read buffer
}

func (w *leanBuffers) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	sock := &sockConn{Conn: nc}
	br := bufio.NewReaderSize(sock, readBufferSize)
	if n := brw.Reader.Buffered(); n > 0 {
		// Bytes the client sent right after our 101 are already read:
		// they must be in the new buffer itself, since the websocket
		// library keeps what is buffered and re-points the reader at the
		// connection returned here.
		b, _ := brw.Reader.Peek(n)
		br = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(bytes.Clone(b)), sock), max(n, readBufferSize))
		if _, err := br.Peek(n); err != nil {
			nc.Close()
			return nil, nil, err
		}
	}
	w.nc, w.sock, w.br, w.fw = nc, sock, br, newFrameWriter(nc)
	return sock, bufio.NewReadWriter(br, bufio.NewWriterSize(w.fw, libraryWriteBuffer)), nil
}

// sockConn is a socket as the websocket library reads it: a read returns
// first the bytes waitReadable already took from the socket (its head).
// Only the reader, and a close handshake once it owns the read buffer
// (conn.brMu), read it.
type sockConn struct {
	net.Conn
	head   []byte  // unread bytes of *pooled
	pooled *[]byte // a readAheads buffer while head holds bytes
	owner  *conn   // woken when the library closes the socket
}

// readAheadSize is the most waitReadable reads at once, a few requests.
// Its buffer is pooled and held only until the read buffer takes them.
const readAheadSize = 4 << 10

var readAheads = sync.Pool{New: func() any { b := make([]byte, readAheadSize); return &b }}

// setHead makes the first n bytes of the readAheads buffer p the head.
func (s *sockConn) setHead(p *[]byte, n int) { s.pooled, s.head = p, (*p)[:n] }

// Close closes the socket and wakes its connection's parked reader, which
// then meets the close.
func (s *sockConn) Close() error {
	err := s.Conn.Close()
	if s.owner != nil {
		s.owner.wakeReader()
	}
	return err
}

func (s *sockConn) Read(b []byte) (int, error) {
	if s.pooled == nil {
		return s.Conn.Read(b)
	}
	n := copy(b, s.head)
	s.head = s.head[n:]
	if len(s.head) == 0 {
		readAheads.Put(s.pooled)
		s.pooled, s.head = nil, nil
	}
	return n, nil
}

// negotiate picks the codec from the offered subprotocols: the first one
// we know, or JSON when none is offered.
func negotiate(r *http.Request) (wire.Codec, bool) {
	var offered []string
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(h, ",") {
			if p = strings.TrimSpace(p); p != "" {
				offered = append(offered, p)
			}
		}
	}
	if len(offered) == 0 {
		return wire.JSON, true
	}
	for _, p := range offered {
		if c, ok := wire.ForSubprotocol(p); ok && p != "" {
			return c, true
		}
	}
	return nil, false
}

// serve runs the session: the writer in its own goroutine, the reader
// here until it parks (then on the goroutines wakeReader starts). When
// either ends, the socket is closed and both are waited for.
func (c *conn) serve() {
	c.s.startHeartbeats()
	context.AfterFunc(c.ctx, func() {
		if c.nc != nil {
			// The reader waits in waitReadable or the idle poller, which
			// no context interrupts: closing the socket ends a wait, a
			// read and a close handshake in progress (as drop needs), and
			// wakes a parked reader.
			_ = c.nc.Close()
			c.wakeReader()
		}
		c.nudgeWriter() // the writer waits on its wake-up channel alone
	})
	c.read(true)
}

// errParked: the reader handed its idle socket to the poller.
var errParked = errors.New("parked")

// read runs the reader until it parks or the connection ends; first: the
// session's first read, which bytes sent with the upgrade may await.
func (c *conn) read(first bool) {
	err := c.readLoop(first)
	if err == errParked {
		return
	}
	c.finish(err)
	c.doneConnecting()
	if c.polled {
		c.s.poller().forget(c)
	}
	c.s.metrics.connections.Dec()
	c.s.removeConn(c)
}

// wakeReader starts a reader goroutine for a parked connection: its
// socket has bytes, or was closed.
func (c *conn) wakeReader() {
	if c.parked.CompareAndSwap(true, false) {
		c.s.runReader(c)
	}
}

// finish ends the session after its reader stopped with err.
func (c *conn) finish(err error) {
	code, reason := websocket.StatusNormalClosure, ""
	var ce *errClose
	switch {
	case errors.As(err, &ce):
		code, reason = ce.code, ce.reason
		if c.s.log.Enabled(context.Background(), slog.LevelInfo) {
			c.logger().Info("websocket closed by the server", "code", int(code), "reason", reason)
		}
	case websocket.CloseStatus(err) != -1: // the peer closed
		code = -1
	case err != nil:
		code = -1 // network error: nothing to say
	}
	c.end(code, reason)
}

// end stops the writer after it flushed what is queued, closes the socket
// with code (-1: just drop it) and releases the subscriptions. It runs
// once; concurrent callers wait for it.
func (c *conn) end(code websocket.StatusCode, reason string) {
	c.endOnce.Do(func() {
		c.mu.Lock()
		c.closing = true
		subs := c.subs
		c.subs = nil
		for _, s := range subs {
			s.gone.Store(true)
		}
		c.mu.Unlock()
		for _, s := range subs {
			s.w.Close()
		}
		c.flushAndStop()
		c.mu.Lock()
		timers, sess := c.timers, c.sess
		c.timers = nil
		c.mu.Unlock()
		for _, t := range timers {
			t.Stop()
		}
		if code >= 0 {
			c.closeWS(code, closeReason(reason))
		} else {
			c.ws.CloseNow()
		}
		c.cancel()
		if sess != nil {
			c.s.sessions.detach(sess, c)
		}
		c.s.metrics.subscriptions.Sub(float64(len(subs)))
	})
}

// closeWS starts the close handshake. The handshake reads the socket
// through br on this goroutine, so the reader stops looking at br first.
func (c *conn) closeWS(code websocket.StatusCode, reason string) {
	c.brMu.Lock()
	c.wsClosing = true
	c.brMu.Unlock()
	c.ws.Close(code, reason)
}

// readIdle reports whether the reader should wait for the socket before
// reading: nothing is buffered and no close handshake owns br.
func (c *conn) readIdle() bool {
	if c.nc == nil {
		return false
	}
	c.brMu.Lock()
	defer c.brMu.Unlock()
	return !c.wsClosing && c.br.Buffered() == 0 && c.sock.pooled == nil
}

// flushAndStop lets the writer send what is queued (within the write
// timeout), then stops it.
func (c *conn) flushAndStop() {
	c.mu.Lock()
	c.wakeWriterLocked() // a writer flushes what is queued, then sees closing
	c.stopped = true     // no writer starts after this: Wait below is safe
	c.mu.Unlock()
	done := make(chan struct{})
	go func() { c.writing.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(c.s.cfg.WriteTimeout):
		c.ws.CloseNow() // unblocks a write stuck on a peer that reads nothing
		c.cancel()      // the socket is gone: no close frame to wait for
	}
	<-done
}

// shutdown is called by Server.Shutdown (which already refuses new
// writes).
func (c *conn) shutdown() { c.stop("server shutting down; reconnect") }

// stop waits for the request being handled to be answered, takes no
// more, flushes what is queued and closes with 1012. Waiting matters for
// a connect: its client, closed while the session take-over was on its
// way, would resume on another node with the secret the take replaces,
// and the take, landing after that node's, would leave the client a
// secret the store no longer holds (its next resume a new session, the
// old one's keys gone after its grace).
func (c *conn) stop(reason string) {
	c.inflight.Lock()
	c.stopping = true
	c.inflight.Unlock()
	c.end(websocket.StatusServiceRestart, reason)
}

// drop closes the socket at once, even during a close handshake that
// waits for an unresponsive peer: cancelling the reader's context makes
// the websocket library close the connection under it (CloseNow would
// wait for the handshake in progress).
func (c *conn) drop() {
	c.cancel()
	c.ws.CloseNow()
}

// writerIdleLooks is how many looks of the heartbeat sweep (one a
// second at most) must find a writer goroutine idle before it exits.
const writerIdleLooks = 2

// wakeWriterLocked makes sure the queues will be looked at: by the
// connection's writer goroutine when it has one, else by a flusher. A
// flusher looks again before it lets the connection go. Called with c.mu
// held.
func (c *conn) wakeWriterLocked() {
	switch {
	case c.writerOn:
		c.nudgeWriter()
	case c.flushing || c.stopped:
	case c.fw == nil || c.fw.rc == nil:
		c.startWriterLocked(true) // no write that does not wait: a writer
	default:
		c.flushing = true
		c.writing.Add(1)
		if !c.s.queueFlush(c) {
			c.toWriterLocked() // the flushers are stopped
		}
	}
}

// startWriterLocked starts the connection's writer goroutine; count: it
// is counted in writing, else it takes over a flusher's count. Called with
// c.mu held.
func (c *conn) startWriterLocked(count bool) {
	if count {
		c.writing.Add(1)
	}
	c.writerOn = true
	c.s.metrics.writers.Inc()
	go c.writeLoop()
	c.nudgeWriter()
}

// nudgeWriter makes a running writer look at what changed.
func (c *conn) nudgeWriter() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// lookAtWriter asks a writer that sent nothing for writerIdleLooks looks
// to exit (heartbeat sweep only).
func (c *conn) lookAtWriter() {
	if c.sent.Swap(false) {
		c.idleLooks = 0
		return
	}
	if c.idleLooks++; c.idleLooks >= writerIdleLooks {
		c.idleLooks = 0
		c.retire.Store(true)
		c.nudgeWriter()
	}
}

// markReady is the watchers' Notify: it runs under a room lock and must
// not block.
func (c *conn) markReady(s *sub) {
	c.mu.Lock()
	if !s.queued && c.subs != nil {
		s.queued = true
		c.ready = append(c.ready, s)
		c.wakeWriterLocked()
	}
	c.mu.Unlock()
}

// awaitReplyRoom holds the reader while more than maxPendingReplies bytes
// of replies wait for a client that does not read them: its requests then
// wait in its own socket (TCP backpressure), not in server memory. A
// writer stuck on such a client ends the connection at the write timeout.
func (c *conn) awaitReplyRoom() error {
	for {
		c.mu.Lock()
		n := len(c.pending)
		c.mu.Unlock()
		if n <= maxPendingReplies {
			return nil
		}
		select {
		case <-c.drained:
		case <-c.ctx.Done():
			return c.ctx.Err()
		}
	}
}

// reply queues one encoded message to send.
func (c *conn) reply(msg any) {
	c.mu.Lock()
	b, err := c.codec.Append(c.pending, msg)
	if err == nil {
		c.pending = b
		c.repliedLocked()
	}
	c.mu.Unlock()
	if err != nil {
		c.logger().Error("server: cannot encode reply", "err", err)
	}
}

// repliedLocked makes sure the replies just queued go out: the reader
// sends them after its frame (sendReplies), else a writer goroutine does.
// Called with c.mu held.
func (c *conn) repliedLocked() {
	if !c.replying.Load() {
		c.wakeWriterLocked()
	}
}

// replyFrames are the frame buffers of readers sending their replies:
// taken for one send, so an idle connection holds none.
var replyFrames = sync.Pool{New: func() any { b := make([]byte, 0, 1<<10); return &b }}

// sendReplies ends the reader's replying: it sends the replies queued
// while it handled a frame, on the reader's goroutine. Waking the writer
// goroutine instead costs a goroutine switch per reply, about a tenth of
// the node's CPU per write (64 writers, one write in flight each). It
// makes one pass of collect, so the events a write made for this
// connection's subscriptions go in the same frame as its ok, as the
// writer sends them (clients read their write in the tick that settles
// it); what is queued after that pass (a busy room's stream, the rest of
// a replay) is the writer's, so the reader never stays sending while
// requests and pings wait. When a writer is sending already, it is woken
// to send the replies after its frame.
func (c *conn) sendReplies() error {
	c.replying.Store(false)
	if !c.sendMu.TryLock() {
		c.mu.Lock()
		if len(c.pending) > 0 {
			c.wakeWriterLocked()
		}
		c.mu.Unlock()
		return nil
	}
	defer c.sendMu.Unlock()
	c.mu.Lock()
	send := len(c.pending) > 0 && !c.stopped
	c.mu.Unlock()
	if !send {
		return nil
	}
	p := replyFrames.Get().(*[]byte)
	frame, _, err := c.collect((*p)[:0], c.send)
	if err == nil && len(frame) > 0 {
		err = c.send(frame)
	}
	c.mu.Lock()
	if err != nil {
		c.stopped = true
	} else if len(c.pending) > 0 || len(c.ready) > 0 {
		c.wakeWriterLocked()
	}
	c.mu.Unlock()
	if err != nil {
		c.cancel()
	}
	if !releaseFrame(frame) && cap(frame) <= keptFrame {
		*p = frame[:0]
		replyFrames.Put(p)
	}
	return err
}

// replyErr answers r with e, and logs it (logs.go).
func (c *conn) replyErr(r *wire.Request, e *Error) {
	c.logFailure(r, e)
	if c.reqSpan != nil {
		failSpan(c.reqSpan, e)
	}
	m := &wire.Err{T: wire.TErr, ID: r.ID, Code: e.Code, Message: e.Message, Key: e.Key, Line: e.Line, Column: e.Column}
	switch e.Code {
	case wire.CodeConflict: // mod_rev 0 means "absent": say it
		m.ModRev, m.Rev, m.Epoch = &e.ModRev, &e.Rev, e.Epoch
	case wire.CodeWidReused: // the revision the id committed at
		m.Rev = &e.Rev
	}
	c.reply(m)
}

// writeLoop sends frames until the connection ends or the heartbeat
// sweep finds it idle (lookAtWriter). Only one runs at a time (writerOn).
// It waits on one channel, which everything that concerns it signals: a
// select over the context, the channel and an idle timer cost each frame
// a timer armed and removed and three channels locked (about a seventh
// of a node's CPU when each frame carries one message).
func (c *conn) writeLoop() {
	defer c.writing.Done()
	var frame []byte
	for {
		<-c.wake
		if c.ctx.Err() != nil {
			return
		}
		// Let the goroutines already runnable go first: on a busy node
		// they are writes still fanning out and other sockets' writers,
		// and what they queue meanwhile goes out in this frame, not in
		// one more frame and write system call each. On an idle node
		// nothing else runs and this returns at once.
		runtime.Gosched()
		if frame == nil {
			// One allocation for the common frame, not a doubling from
			// nothing per append (a write to 100,000 idle sockets starts
			// 100,000 writers).
			frame = make([]byte, 0, firstFrame)
		}
		c.sendMu.Lock()
		var closing bool
		var err error
		frame, closing, err = c.sendQueued(frame)
		c.sendMu.Unlock()
		if err != nil || closing {
			return
		}
		if releaseFrame(frame) || cap(frame) > keptFrame {
			// Keep a burst's buffer for the whole burst (a replay takes
			// it once, not once per chunk), but not on an idle connection.
			frame = nil
		}
		// Asked to retire: only if nothing was sent since the sweep's
		// look (send sets sent).
		if c.retire.Swap(false) && !c.sent.Load() && c.retireWriter() {
			return
		}
	}
}

// retireWriter lets an idle writer goroutine exit, unless something was
// queued meanwhile: whoever queues next finds writerOn false and starts a
// new writer.
func (c *conn) retireWriter() bool {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) > 0 || len(c.ready) > 0 || (c.fw != nil && c.fw.blocked()) {
		return false
	}
	c.writerOn = false
	c.dropSendState()
	return true
}

// trimIdle gives back the reply buffer of a connection with nothing to
// send and no writer goroutine: a retiring writer gives
// them back, a reader that sends its own replies does not.
func (c *conn) trimIdle() {
	if !c.sendMu.TryLock() {
		return // sending: not idle
	}
	defer c.sendMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.writerOn && len(c.pending) == 0 {
		c.dropSendState()
	}
}

// dropSendState: an idle connection keeps no reply buffer, nor the drain
// buffers a burst grew (a resume's replay of 1,000 revisions left 80 KiB
// with each of a storm's connections for good). Called with sendMu and
// mu held.
func (c *conn) dropSendState() {
	c.pending = nil
	if cap(c.msgs) > keptDrain {
		c.msgs = nil
	}
	if cap(c.spare) > keptDrain {
		c.spare = nil
	}
}

// keptDrain is the most entries the drain buffers of an idle connection
// keep: what a few subscriptions' steady trickle needs.
const keptDrain = 16

// sendQueued sends what is queued, in frames built in frame's buffer,
// until nothing is; it returns the buffer for reuse. closing reports that
// the connection is ending and nothing more will be queued. After a write
// error nothing more is sent and the connection is dropped. Called with
// sendMu held.
func (c *conn) sendQueued(frame []byte) ([]byte, bool, error) {
	if err := c.sendTail(); err != nil {
		return frame, false, err
	}
	for {
		var closing bool
		var err error
		frame, closing, err = c.collect(frame[:0], c.send)
		if err == nil && len(frame) > 0 {
			err = c.send(frame)
		}
		if err != nil {
			c.mu.Lock()
			c.stopped = true
			c.mu.Unlock()
			c.cancel()
			return frame, false, err
		}
		if len(frame) == 0 {
			return frame, closing, nil
		}
	}
}

// sendTail sends, waiting for the socket within the write timeout, what a
// flusher's writes left in the socket writer's tail (flushers.go). After
// a write error nothing more is sent and the connection is dropped.
// Called with sendMu held.
func (c *conn) sendTail() error {
	if c.fw == nil || !c.fw.blocked() {
		return nil
	}
	c.writeStart.Store(time.Now().UnixNano())
	err := c.fw.flushTail()
	c.writeStart.Store(0)
	if err != nil {
		c.mu.Lock()
		c.stopped = true
		c.mu.Unlock()
		c.cancel()
	}
	return err
}

// send writes one frame. Writes use a background context, and the
// heartbeat sweep bounds them by the write timeout (c.writeStart): a context
// with a deadline would cost a timer per frame, a watchdog timer two timer
// operations per frame (one each pong of an idle connection). Called with
// sendMu held.
func (c *conn) send(frame []byte, more ...[]byte) error {
	c.sent.Store(true)
	c.writeStart.Store(time.Now().UnixNano())
	var err error
	n := len(frame)
	if len(more) == 0 {
		err = c.ws.Write(context.Background(), c.codec.MessageType(), frame)
	} else {
		n, err = c.sendPieces(frame, more)
	}
	c.writeStart.Store(0)
	if err == nil {
		c.s.metrics.bytesOut.Add(float64(n))
		c.s.metrics.framesOut.Inc()
	}
	return err
}

// sendPieces writes frame and then more as one WebSocket message, each
// piece a WebSocket frame taken within the write timeout. It returns the
// bytes written. Called with sendMu held, from send.
func (c *conn) sendPieces(frame []byte, more [][]byte) (int, error) {
	w, err := c.ws.Writer(context.Background(), c.codec.MessageType())
	if err != nil {
		return 0, err
	}
	n := 0
	for i := -1; i < len(more) && err == nil; i++ {
		p := frame
		if i >= 0 {
			p = more[i]
			c.writeStart.Store(time.Now().UnixNano())
		}
		if len(p) > 0 {
			_, err = w.Write(p)
			n += len(p)
		}
	}
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// writeTimedOut runs when a frame was not taken within the write timeout:
// the client is too slow even for coalescing. Closing unblocks the write;
// the client resumes from its last revision.
func (c *conn) writeTimedOut() {
	c.s.metrics.slowCloses.Inc()
	go func() {
		c.closeWS(wire.CloseSlowConsumer, "socket did not drain within the write timeout")
		c.ws.CloseNow()
	}()
}

// collect appends the pending replies and the ready subscriptions'
// messages to frame; each time the frame reaches maxFrame it is handed to
// write and a new one begins, so a long replay goes out in bounded frames.
// It returns the last, partial frame. closing reports that the connection
// is ending and nothing more will be queued. Called with sendMu held (or
// alone, in benchmarks).
func (c *conn) collect(frame []byte, write func(frame []byte, more ...[]byte) error) ([]byte, bool, error) {
	c.mu.Lock()
	frame = append(frame, c.pending...)
	c.pending = c.pending[:0]
	if cap(c.pending) > 64<<10 {
		c.pending = nil
	}
	select {
	case c.drained <- struct{}{}:
	default:
	}
	// Swap the ready list with the writer's spare one: no allocation per
	// wake-up once both have grown to the connection's needs.
	ready := c.ready
	c.ready = c.spare[:0]
	all := ready
	var later []*sub
	n := 0
	for _, s := range ready {
		s.queued = false
		// A sub becomes active under mu together with queueing its ok, so
		// one active here has its ok in the pending taken above (or sent
		// before). Looking later could send its messages before its ok.
		if s.active.Load() || s.gone.Load() {
			ready[n] = s
			n++
		} else {
			later = append(later, s) // its ok is not queued yet
		}
	}
	ready = ready[:n]
	closing := c.closing
	c.mu.Unlock()

	var err error
	msgs := c.msgs[:0]
	for _, s := range ready {
		s.started = true
		gone := s.gone.Load()
		var derr error
		msgs, derr = s.w.Drain(msgs[:0])
		// Counted as drained, before a write below blocks on a full
		// socket: the count tells how much the watcher no longer holds.
		c.s.metrics.countDelivered(msgs)
		if cap(frame) < burstFrame {
			if n := len(frame) + c.sizeOf(s, msgs); n > cap(frame) && n > keptFrame {
				frame = toBurstFrame(frame)
			}
		}
		for _, m := range msgs {
			if m.Kind == rooms.KindSnapshot && m.Snap != nil {
				frame, err = c.appendSnapshot(frame, s, m, write, err)
				continue
			}
			if t, list := c.eventList(s, m); t == "" {
				frame = c.appendMessage(frame, s, m)
			} else if len(list) < pieceList {
				frame = c.codec.AppendEvents(frame, t, s.id, m.Rev, list)
			} else {
				frame, err = c.appendEventPieces(frame, s, t, m.Rev, list, write, err)
				continue
			}
			if len(frame) >= maxFrame && err == nil {
				err = write(frame)
				frame = frame[:0]
			}
		}
		if derr != nil && !gone && !errors.Is(derr, rooms.ErrWatcherClosed) {
			frame = c.appendEnded(frame, s, derr) // the server ended it
		}
	}
	clear(msgs)
	c.msgs = msgs[:0]
	clear(all)
	c.spare = all[:0]
	for _, s := range later {
		c.markReady(s)
	}
	return frame, closing && len(frame) == 0 && len(later) == 0, err
}

// sizeOf is about how many bytes msgs of s take in a frame: the encoded
// events, and a message's envelope.
func (c *conn) sizeOf(s *sub, msgs []rooms.Message) int {
	const envelope = 64
	n := 0
	for _, m := range msgs {
		n += envelope
		if m.Kind == rooms.KindEvents || m.Kind == rooms.KindCoalesced {
			slot := c.slot + boolSlot(s.prev)
			if l := len(m.Change.Encoded(slot, encoders[slot])); l < pieceList {
				n += l // a longer list goes as a piece of its own
			}
		}
	}
	return n
}

// pieceList is the size from which an events message's list is sent as
// a piece of its own (appendEventPieces) instead of copied into the frame:
// a write of a 200 KiB value to a room of 100,000 subscribers made each
// socket's frame a copy of it, 28 GiB in all, held by every socket slower
// than its send buffer.
const pieceList = 4 << 10

// appendEventPieces sends an events message of s whose list is large: the
// frame so far with the message's head, then the list itself (for most
// messages the encoding every subscriber of the room shares), then the
// message's tail, as one WebSocket message; a socket that cannot take it
// at once holds the list, not a copy.
func (c *conn) appendEventPieces(frame []byte, s *sub, t string, rev uint64, list []byte, write func([]byte, ...[]byte) error, err error) ([]byte, error) {
	frame = c.codec.AppendEventsHead(frame, t, s.id, rev)
	if err == nil {
		if tail := c.codec.EventsTail(); len(tail) > 0 {
			err = write(frame, list, tail)
		} else {
			err = write(frame, list)
		}
	}
	return frame[:0], err
}

// eventList is the type and the encoded list of an events or coalesced
// message m of s (nil for other messages).
func (c *conn) eventList(s *sub, m rooms.Message) (string, []byte) {
	var t string
	switch m.Kind {
	case rooms.KindEvents:
		t = wire.TEvents
	case rooms.KindCoalesced:
		t = wire.TCoalesced
	default:
		return "", nil
	}
	slot := c.slot + boolSlot(s.prev)
	if own := c.ownWrite(m); own || m.Rev != m.Change.Rev {
		// Events of this writer's own writes carry its write ids,
		// which the shared encodings leave out (server/wids.go). And
		// v2 writes mod_rev relative to the message's rev, which the
		// cached list assumes is its Change's (the rooms always make
		// them equal): never let a mismatch pass as wrong mod_revs.
		var wid func(string) string
		if own {
			wid = func(stored string) string { return wids.Own(stored, c.wscope) }
		}
		return t, c.codec.AppendEventList(nil, m.Rev, wireEvents(m.Change.Events, s.prev, m.Change.Filtered, wid))
	}
	return t, m.Change.Encoded(slot, encoders[slot])
}

// appendMessage encodes one watcher message of s.
func (c *conn) appendMessage(frame []byte, s *sub, m rooms.Message) []byte {
	var err error
	switch m.Kind {
	case rooms.KindEvents, rooms.KindCoalesced:
		t, list := c.eventList(s, m)
		return c.codec.AppendEvents(frame, t, s.id, m.Rev, list)
	case rooms.KindSynced:
		frame, err = c.codec.Append(frame, &wire.Mark{T: wire.TSynced, S: s.id, Rev: m.Rev})
	case rooms.KindProgress:
		frame, err = c.codec.Append(frame, &wire.Mark{T: wire.TProgress, S: s.id, Rev: m.Rev})
	case rooms.KindSnapshot:
		frame, err = c.codec.Append(frame, &wire.Snapshot{T: wire.TSnapshot, S: s.id, Epoch: m.Epoch,
			Rev: m.Rev, Reason: m.Reason.String(), Items: wireItems(m.Items)})
	}
	if err != nil {
		c.logger().Error("server: cannot encode a subscription message", "room", s.room, "err", err)
	}
	return frame
}

// ownWrite reports whether m holds an event of a write this connection's
// writer sent (its scope's id): the events of one revision share their id.
func (c *conn) ownWrite(m rooms.Message) bool {
	if c.wscope == "" {
		return false
	}
	evs := m.Change.Events
	if m.Kind == rooms.KindEvents && len(evs) > 1 {
		evs = evs[:1]
	}
	for _, ev := range evs {
		if ev.Wid != "" && wids.Own(ev.Wid, c.wscope) != "" {
			return true
		}
	}
	return false
}

// appendSnapshot writes snapshot m of s from its shared encoding. A small
// one joins the frame; a larger one goes out as one WebSocket message of
// the frame so far and then the shared pieces, written to the socket as
// they are: a subscriber's snapshot costs it a frame, not a copy of the
// room. err is the frame's write error so far: after one, nothing is
// written.
func (c *conn) appendSnapshot(frame []byte, s *sub, m rooms.Message, write func([]byte, ...[]byte) error, err error) ([]byte, error) {
	pieces := m.Snap.Encoded(c.slot, snapshotEncoders[c.slot])
	if pieces == nil {
		return frame, err // logged by the encoder; sent nothing, as before
	}
	size := 0
	for _, p := range pieces {
		size += len(p)
	}
	frame = wire.AppendSnapshotHead(c.codec, frame, s.id, m.Epoch, m.Rev, m.Reason.String(), len(m.Items))
	if len(frame)+size < maxFrame {
		for _, p := range pieces {
			frame = append(frame, p...)
		}
		frame = wire.AppendSnapshotTail(c.codec, frame)
		if len(frame) >= maxFrame && err == nil {
			err = write(frame)
			frame = frame[:0]
		}
		return frame, err
	}
	if err == nil {
		more := make([][]byte, 0, len(pieces)+1)
		more = append(more, pieces...)
		err = write(frame, append(more, wire.AppendSnapshotTail(c.codec, nil))...)
	}
	return frame[:0], err
}

// appendEnded tells the client the server ended subscription s.
func (c *conn) appendEnded(frame []byte, s *sub, err error) []byte {
	c.mu.Lock()
	if c.subs != nil && c.subs[s.id] == s {
		delete(c.subs, s.id)
		c.releaseLocked(s)
		c.s.metrics.subscriptions.Dec()
	}
	c.mu.Unlock()
	code, msg := wire.CodeUnavailable, "room reset; subscribe again from your last revision"
	switch {
	case errors.Is(err, rooms.ErrClosed):
		msg = "server is shutting down"
	case errors.Is(err, rooms.ErrFilterTooSlow):
		e := filterTooSlow()
		code, msg = e.Code, e.Message
	}
	frame, _ = c.codec.Append(frame, &wire.Unsubscribed{T: wire.TUnsubscribed, S: s.id, Code: code, Message: msg})
	return frame
}

// addTimer registers t to be stopped when the connection ends.
func (c *conn) addTimer(t *time.Timer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		t.Stop()
		return
	}
	c.timers = append(c.timers, t)
}
