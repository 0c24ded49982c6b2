// Package client is a Go client of statecast protocol v1
// (server/PROTOCOL.md): Conn is one WebSocket session with pipelined
// requests and any number of subscriptions, HTTP speaks the HTTP API and
// its Server-Sent Events watch, and View applies a subscription's
// messages while checking the revision contract. Integration tests, the
// statecast CLI and the load tool share it, so it does no more than the
// protocol asks and stays cheap per message.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/statecast/statecast/server/wire"
)

// Options configures Dial. The zero value is a JSON connection without a
// token.
type Options struct {
	// Codec is "" (the default: protocol v2's dense JSON where the server
	// speaks it, else v1 JSON), "json2" (v2 only), "json" (v1) or
	// "msgpack" (v1); the subprotocol names (wire.SubprotocolJSON2, …) are
	// accepted too. Every codec yields the same messages.
	Codec string
	// Token is the JWT sent in connect.
	Token string
	// Session and Resume, from an earlier Connected(), take that session
	// over so that its session leases are kept (PROTOCOL.md §7).
	Session, Resume string
	// HTTPHeader is sent with the upgrade request (e.g. Origin).
	HTTPHeader http.Header
	// ReadLimit is the largest frame read: 0 means 256 MiB (a snapshot of
	// a big room is one message and the server never splits a message),
	// a negative value means no limit.
	ReadLimit int64
	// NoKeepAlive stops the client from pinging on its own, for tests of
	// the server's heartbeat timeout (4001).
	NoKeepAlive bool
	// OnMessage receives the messages no caller waits for: refresh, err
	// replies without an id, replies to requests given up on, and
	// messages of unknown subscriptions. It runs on the reader goroutine
	// and must not block.
	OnMessage func(wire.Message)
}

const defaultReadLimit = 256 << 20

// Conn is a WebSocket session. One reader goroutine decodes every frame
// and hands replies to the callers waiting for them and subscription
// messages to their Subscription's queue; it never blocks on a caller.
// All methods are safe for concurrent use.
type Conn struct {
	ws        *websocket.Conn
	codec     wire.Codec
	connected wire.Message
	onMessage func(wire.Message)
	pingFrame []byte

	ctx         context.Context // the reader's; cancelled by CloseNow
	cancel      context.CancelFunc
	done        chan struct{} // closed when the reader has ended
	bg          sync.WaitGroup
	connectedCh chan wire.Message
	lastID      atomic.Uint64
	wrote       atomic.Bool  // a frame was sent since the keepalive looked
	lastRead    atomic.Int64 // unix nanos of the last frame received
	heartbeat   atomic.Bool  // the keepalive found the socket dead
	closing     atomic.Bool  // Close was called

	mu      sync.Mutex
	waiters map[uint64]chan wire.Message // nil once the connection ended
	subs    map[uint64]*Subscription
	pongs   []chan struct{} // one per ping sent, in order; nil: a keepalive ping
	err     error           // why the connection ended

	pingMu sync.Mutex // keeps pongs in the order pings are written
}

// Dial opens a WebSocket to url (ws://host:port/v1/ws), sends connect and
// waits for connected. A refused connect comes back as an error carrying
// the close code (see CloseCode); a refused upgrade as an *Error.
func Dial(ctx context.Context, url string, opts *Options) (*Conn, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	offer, err := codecsNamed(o.Codec)
	if err != nil {
		return nil, err
	}
	var protos []string
	for _, c := range offer {
		protos = append(protos, c.Subprotocol())
	}
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		HTTPHeader:   o.HTTPHeader,
		Subprotocols: protos,
	})
	if err != nil {
		return nil, dialError(resp, err)
	}
	codec, ok := wire.ForSubprotocol(ws.Subprotocol())
	if !ok || !slices.Contains(offer, codec) {
		ws.CloseNow()
		return nil, fmt.Errorf("client: server did not accept subprotocol %s", strings.Join(protos, " or "))
	}
	switch {
	case o.ReadLimit == 0:
		ws.SetReadLimit(defaultReadLimit)
	case o.ReadLimit < 0:
		ws.SetReadLimit(-1)
	default:
		ws.SetReadLimit(o.ReadLimit)
	}
	ping, err := codec.Append(nil, &wire.Request{T: wire.TPing})
	if err != nil {
		ws.CloseNow()
		return nil, err
	}
	c := &Conn{
		ws: ws, codec: codec, onMessage: o.OnMessage, pingFrame: ping,
		done: make(chan struct{}), connectedCh: make(chan wire.Message, 1),
		waiters: make(map[uint64]chan wire.Message), subs: make(map[uint64]*Subscription),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.lastRead.Store(time.Now().UnixNano())
	go c.readLoop()

	connect := &wire.Request{T: wire.TConnect, Token: o.Token, Session: o.Session, Resume: o.Resume}
	b, err := c.encode(connect)
	if err == nil {
		err = c.write(ctx, b)
	}
	if err != nil {
		// The server may have closed the socket before our write (4004:
		// it filled up during the handshake): the reader then holds its
		// close status, which says more than the write's "use of closed
		// network connection".
		select {
		case <-c.done:
			if cerr := c.Err(); cerr != nil {
				err = cerr
			}
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
		c.CloseNow()
		return nil, err
	}
	select {
	case m := <-c.connectedCh:
		c.connected = m
	case <-c.done:
		return nil, c.err
	case <-ctx.Done():
		c.CloseNow()
		return nil, ctx.Err()
	}
	if !o.NoKeepAlive && c.connected.PingMS > 0 {
		c.bg.Add(1)
		go c.keepAlive(time.Duration(c.connected.PingMS) * time.Millisecond)
	}
	return c, nil
}

// codecsNamed is what Dial offers for Options.Codec, best first: a server
// of before protocol v2 (a rolling deploy) picks v1 from the default.
func codecsNamed(name string) ([]wire.Codec, error) {
	switch name {
	case "":
		return []wire.Codec{wire.JSON2, wire.JSON}, nil
	case "json2", wire.SubprotocolJSON2:
		return []wire.Codec{wire.JSON2}, nil
	case "json", wire.SubprotocolJSON:
		return []wire.Codec{wire.JSON}, nil
	case "msgpack", wire.SubprotocolMsgpack:
		return []wire.Codec{wire.Msgpack}, nil
	}
	return nil, fmt.Errorf("client: unknown codec %q (want json2, json or msgpack)", name)
}

// dialError turns a refused upgrade into the server's *Error when the
// response carries one (the library keeps the first KiB of the body).
func dialError(resp *http.Response, err error) error {
	if resp == nil {
		return err
	}
	if e := decodeHTTPError(resp); e != nil {
		return e
	}
	return fmt.Errorf("client: upgrade refused: %s: %w", resp.Status, err)
}

// Connected returns the server's connected message: session, resume,
// ping_ms, lease_grace_ms, expires_ms.
func (c *Conn) Connected() wire.Message { return c.connected }

// Codec returns the connection's codec, for tests that build raw frames.
func (c *Conn) Codec() wire.Codec { return c.codec }

// Done is closed when the connection has ended.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns why the connection ended (wrapping ErrClosed and, when the
// socket was closed with one, the close status: see CloseCode), or nil
// while it is open.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the socket normally (1000) and waits for the reader to end.
// Requests still in flight fail; writes among them with ErrOutcomeUnknown.
// Closing a connection that has already ended is not an error.
func (c *Conn) Close() error {
	c.closing.Store(true)
	err := c.ws.Close(websocket.StatusNormalClosure, "")
	c.cancel()
	<-c.done
	c.bg.Wait()
	if errors.Is(err, net.ErrClosed) || CloseCode(err) == int(websocket.StatusNormalClosure) {
		err = nil
	}
	return err
}

// CloseNow drops the socket without a close handshake, as a crashed
// client would, and waits for the reader to end.
func (c *Conn) CloseNow() {
	c.ws.CloseNow()
	c.cancel()
	<-c.done
	c.bg.Wait()
}

// readLoop is the reader goroutine.
func (c *Conn) readLoop() {
	var err error
	for {
		var data []byte
		if _, data, err = c.ws.Read(c.ctx); err != nil {
			break
		}
		c.lastRead.Store(time.Now().UnixNano())
		msgs, derr := c.codec.DecodeMessages(data)
		if derr != nil {
			// The server broke the protocol; nothing after can be trusted.
			c.ws.Close(websocket.StatusInvalidFramePayloadData, "cannot decode message")
			err = derr
			break
		}
		for i := range msgs {
			c.route(&msgs[i])
		}
	}
	switch {
	case c.heartbeat.Load():
		err = fmt.Errorf("nothing received for two ping intervals: %w", err)
	case c.closing.Load() && websocket.CloseStatus(err) == -1:
		// Close's handshake may read the server's close frame itself,
		// leaving this loop only "connection closed"; say what happened.
		err = websocket.CloseError{Code: websocket.StatusNormalClosure, Reason: "closed by the client"}
	}
	c.ws.CloseNow()
	c.cancel()

	c.mu.Lock()
	c.err = fmt.Errorf("%w: %w", ErrClosed, err)
	subs := c.subs
	c.waiters, c.subs, c.pongs = nil, nil, nil
	c.mu.Unlock()
	for _, s := range subs {
		s.end(c.err)
	}
	close(c.done) // waiting callers see it and report c.err
}

// route hands one message to whoever waits for it.
func (c *Conn) route(m *wire.Message) {
	switch m.T {
	case wire.TOK, wire.TErr:
		c.mu.Lock()
		ch := c.waiters[m.ID]
		delete(c.waiters, m.ID)
		c.mu.Unlock()
		if ch != nil && m.ID != 0 {
			ch <- *m // buffered, and the only send: never blocks
			return
		}
	case wire.TPong:
		c.mu.Lock()
		var ch chan struct{}
		if len(c.pongs) > 0 {
			ch = c.pongs[0]
			c.pongs = c.pongs[1:]
		}
		c.mu.Unlock()
		if ch != nil {
			close(ch)
		}
		return
	case wire.TConnected:
		select {
		case c.connectedCh <- *m:
			return
		default:
		}
	case wire.TSnapshot, wire.TEvents, wire.TCoalesced, wire.TSynced, wire.TProgress, wire.TUnsubscribed:
		c.mu.Lock()
		s := c.subs[m.S]
		if s != nil && m.T == wire.TUnsubscribed {
			delete(c.subs, m.S)
		}
		c.mu.Unlock()
		if s != nil {
			s.push(m)
			return
		}
	}
	if c.onMessage != nil {
		c.onMessage(*m)
	}
}

// keepAlive pings when nothing else was sent for half of ping_ms, so the
// server hears from us at least every ping_ms, and drops a socket that
// sent nothing (not even a pong) for two ping intervals.
func (c *Conn) keepAlive(pingEvery time.Duration) {
	defer c.bg.Done()
	t := time.NewTicker(pingEvery / 2)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		if time.Since(time.Unix(0, c.lastRead.Load())) > 2*pingEvery {
			c.heartbeat.Store(true)
			c.ws.CloseNow()
			return
		}
		if c.wrote.Swap(false) {
			continue
		}
		ctx, cancel := context.WithTimeout(c.ctx, pingEvery)
		_ = c.sendPing(ctx, nil)
		cancel()
	}
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// encode encodes one request into a pooled buffer; release it after the
// write.
func (c *Conn) encode(req *wire.Request) (*[]byte, error) {
	bp := bufPool.Get().(*[]byte)
	b, err := c.codec.Append((*bp)[:0], req)
	if err != nil {
		bufPool.Put(bp)
		return nil, fmt.Errorf("client: cannot encode %s: %w", req.T, err)
	}
	*bp = b
	return bp, nil
}

// write sends an encoded request and releases its buffer. As with every
// write of the websocket library, a ctx that ends mid-write closes the
// connection (half a frame cannot be taken back).
func (c *Conn) write(ctx context.Context, bp *[]byte) error {
	err := c.ws.Write(ctx, c.codec.MessageType(), *bp)
	c.wrote.Store(true)
	if cap(*bp) <= 64<<10 { // do not pool the buffer of a huge value
		*bp = (*bp)[:0]
		bufPool.Put(bp)
	}
	return err
}

// WriteFrame sends b as one frame of the codec's frame type, as is: for
// protocol tests (garbage, oversized or multi-message frames). Replies
// to requests in it reach OnMessage.
func (c *Conn) WriteFrame(ctx context.Context, b []byte) error {
	err := c.ws.Write(ctx, c.codec.MessageType(), b)
	c.wrote.Store(true)
	return err
}

// Request sends req, assigning it an id when ID is zero, and waits for
// its ok or err (a ping: for its pong). An err comes back as the message
// and an *Error. For protocol tests; the typed methods are built on it.
func (c *Conn) Request(ctx context.Context, req wire.Request) (wire.Message, error) {
	if req.T == wire.TPing {
		return wire.Message{T: wire.TPong}, c.Ping(ctx)
	}
	return c.roundTrip(ctx, &req, isWrite(req.T))
}

func isWrite(t string) bool { return t == wire.TPut || t == wire.TDel || t == wire.TTxn }

// roundTrip sends req and waits for its reply. For a write (PROTOCOL.md
// §4) that was sent but got no reply — its connection died, or ctx ended
// first — the outcome is unknown and the error says so.
func (c *Conn) roundTrip(ctx context.Context, req *wire.Request, write bool) (wire.Message, error) {
	if req.ID == 0 {
		req.ID = c.lastID.Add(1)
	}
	bp, err := c.encode(req)
	if err != nil {
		return wire.Message{}, err
	}
	ch := make(chan wire.Message, 1)
	c.mu.Lock()
	switch {
	case c.waiters == nil:
		err = c.err
	case c.waiters[req.ID] != nil:
		err = fmt.Errorf("client: request id %d is already in flight", req.ID)
	default:
		c.waiters[req.ID] = ch
	}
	c.mu.Unlock()
	if err != nil {
		bufPool.Put(bp)
		return wire.Message{}, err
	}
	if err := c.write(ctx, bp); err != nil {
		c.forget(req.ID)
		return wire.Message{}, c.lost(write, err)
	}
	select {
	case m := <-ch:
		return reply(m)
	case <-ctx.Done():
		c.forget(req.ID)
	case <-c.done:
	}
	select { // the reply may have come just before
	case m := <-ch:
		return reply(m)
	default:
	}
	if ctx.Err() != nil {
		return wire.Message{}, c.lost(write, ctx.Err())
	}
	return wire.Message{}, c.lost(write, c.Err())
}

func (c *Conn) forget(id uint64) {
	c.mu.Lock()
	delete(c.waiters, id)
	c.mu.Unlock()
}

// lost is the error of a request that got no reply.
func (c *Conn) lost(write bool, cause error) error {
	if write {
		return fmt.Errorf("%w: no reply (%w)", ErrOutcomeUnknown, cause)
	}
	return cause
}

func reply(m wire.Message) (wire.Message, error) {
	if m.T == wire.TErr {
		return m, errorFromMessage(&m)
	}
	return m, nil
}

// WriteOption modifies a put or del.
type WriteOption func(*wire.Request)

// IfRev makes the write conditional on the key's mod_rev being n (0: the
// key must not exist); otherwise it fails with ErrConflict.
func IfRev(n uint64) WriteOption { return func(r *wire.Request) { r.IfRev = &n } }

// WithLease binds a put to a lease: "session" for this session's lease, or
// a TTL lease id from HTTP.GrantLease; KeepLease for the key's current one.
// A put without a lease option unbinds the key from its lease.
func WithLease(id string) WriteOption { return func(r *wire.Request) { r.Lease = id } }

// KeepLease is the lease id that keeps a key's current lease binding (none
// for a key without one): WithLease(KeepLease), HTTP.Put's lease, or a
// wire.TxnOp's Lease.
const KeepLease = "keep"

// Put writes value to key and returns the revision it committed at. A
// wire.Value or json.RawMessage is sent as is (it must be valid JSON);
// anything else is marshalled with encoding/json.
func (c *Conn) Put(ctx context.Context, room, key string, value any, opts ...WriteOption) (uint64, error) {
	v, err := toValue(value)
	if err != nil {
		return 0, err
	}
	req := wire.Request{T: wire.TPut, Room: room, Key: key, Value: v}
	for _, o := range opts {
		o(&req)
	}
	m, err := c.roundTrip(ctx, &req, true)
	return m.Rev, err
}

func toValue(value any) (wire.Value, error) {
	switch v := value.(type) {
	case wire.Value:
		return v, nil
	case json.RawMessage:
		return wire.Value(v), nil
	}
	b, err := json.Marshal(value)
	if err != nil {
		return nil, fmt.Errorf("client: value: %w", err)
	}
	return b, nil
}

// Delete deletes key and returns the revision; deleting a missing key
// writes nothing and returns the room's current revision.
func (c *Conn) Delete(ctx context.Context, room, key string, opts ...WriteOption) (uint64, error) {
	req := wire.Request{T: wire.TDel, Room: room, Key: key}
	for _, o := range opts {
		o(&req)
	}
	m, err := c.roundTrip(ctx, &req, true)
	return m.Rev, err
}

// Txn applies ops atomically, at one revision, if every cond holds.
func (c *Conn) Txn(ctx context.Context, room string, conds []wire.Cond, ops []wire.TxnOp) (uint64, error) {
	m, err := c.roundTrip(ctx, &wire.Request{T: wire.TTxn, Room: room, If: conds, Ops: ops}, true)
	return m.Rev, err
}

// Auth replaces the session's token (same subject).
func (c *Conn) Auth(ctx context.Context, token string) error {
	_, err := c.roundTrip(ctx, &wire.Request{T: wire.TAuth, Token: token}, false)
	return err
}

// Ping sends a ping and waits for its pong.
func (c *Conn) Ping(ctx context.Context) error {
	ch := make(chan struct{})
	if err := c.sendPing(ctx, ch); err != nil {
		return err
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		select {
		case <-ch:
			return nil
		default:
			return c.Err()
		}
	}
}

// sendPing queues ch for the next unanswered pong and sends a ping; pongs
// answer pings in order, so the queue pairs them.
func (c *Conn) sendPing(ctx context.Context, ch chan struct{}) error {
	c.pingMu.Lock()
	defer c.pingMu.Unlock()
	c.mu.Lock()
	if c.waiters == nil {
		c.mu.Unlock()
		return c.Err()
	}
	c.pongs = append(c.pongs, ch)
	c.mu.Unlock()
	err := c.ws.Write(ctx, c.codec.MessageType(), c.pingFrame)
	if err != nil {
		// Not sent (or the socket is broken): take back our entry, the last
		// one since pingMu is held.
		c.mu.Lock()
		if n := len(c.pongs); n > 0 {
			c.pongs = c.pongs[:n-1]
		}
		c.mu.Unlock()
		return err
	}
	c.wrote.Store(true)
	return nil
}

// SubscribeOptions says what a subscription receives.
type SubscribeOptions struct {
	// Prefixes are the key prefixes to receive; none (and no Keys) means
	// the whole room.
	Prefixes []string
	// Keys are exact keys to receive besides: a key they only start is
	// not sent.
	Keys []string
	// From resumes at a position (the last message's epoch, rev + 1; see
	// View.Position); nil means a snapshot, then live events.
	From *wire.Position
	// Prev asks for each changed key's previous value in events.
	Prev bool
	// Filter narrows the keys to those whose value passes this CEL
	// expression (PROTOCOL.md §5): keys enter with a put and leave with a
	// "leave" event.
	Filter string
}

// Subscribe subscribes to a room and waits for the server's ok. The
// subscription's messages are queued from the moment the request is sent,
// so none is missed.
func (c *Conn) Subscribe(ctx context.Context, room string, opts SubscribeOptions) (*Subscription, error) {
	s := &Subscription{c: c, id: c.lastID.Add(1), wake: make(chan struct{}, 1)}
	c.mu.Lock()
	if c.subs == nil {
		c.mu.Unlock()
		return nil, c.Err()
	}
	c.subs[s.id] = s
	c.mu.Unlock()
	req := &wire.Request{T: wire.TSub, ID: s.id, Room: room, Prefixes: opts.Prefixes, Keys: opts.Keys, From: opts.From, Prev: opts.Prev, Filter: opts.Filter}
	_, err := c.roundTrip(ctx, req, false)
	if err == nil {
		return s, nil
	}
	c.dropSub(s)
	var e *Error
	if !errors.As(err, &e) && ctx.Err() != nil && c.Err() == nil {
		// Given up on after sending: the server may still subscribe. Ask it
		// not to, without waiting; the reply goes to OnMessage.
		if bp, err := c.encode(&wire.Request{T: wire.TUnsub, ID: c.lastID.Add(1), Sub: s.id}); err == nil {
			wctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = c.write(wctx, bp)
			cancel()
		}
	}
	return nil, err
}

func (c *Conn) dropSub(s *Subscription) {
	c.mu.Lock()
	if c.subs != nil && c.subs[s.id] == s {
		delete(c.subs, s.id)
	}
	c.mu.Unlock()
}
