package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/statecast/statecast/server/wire"
)

// The scale scenario: one of several load-tool processes that together
// hold more connections than one process may (RLIMIT_NOFILE) from more
// source addresses than one has ports, over several nodes. Its
// connections are --part I/N of --conns, each subscribed to its room
// (and holding a session-leased key with --lease). It is steered over
// stdin, one command a line, each answered by one JSON line on stdout
// (scaleReport):
//
//	wait D   wait until every connection is subscribed (or D passes)
//	report   the figures so far
//	reset    the figures so far, then zero the delivery and resume figures
//	leases   report, with this part's session-leased keys counted in the store
//	quit     (or end of input) close every connection and exit
//
// A connection whose node goes away reconnects at once to another node
// with its session and resume secret and resumes its subscription from
// its position. scale-mark makes the marked writes whose delivery the
// subscribers time (wall clock: every process shares the machine's), and
// scale-merge adds the processes' reports up. With --server centrifugo
// the nodes are Centrifugo's instead (scale_centrifugo.go).

// markPrefix starts the value of a marked write: "mark:<seq>:<unix ns>".
var markPrefix = []byte(`"mark:`)

var (
	fSession = []byte(`"session":"`)
	fCode    = []byte(`"code":"`)
	fResume  = []byte(`"resume":"`)
	fResumed = []byte(`"resumed":true`)
)

// ipBindAddressNoPort is Linux's IP_BIND_ADDRESS_NO_PORT: a socket bound
// to a source address gets its port at connect, per destination, so one
// source address has the whole ephemeral range for every node.
const ipBindAddressNoPort = 24

// scaleConn is one connection of the scale scenario, with what survives
// its reconnects.
type scaleConn struct {
	idx   int // global index: its place in --conns
	local int // index within this part
	room  int32
	first int32 // the node it first connected to: where its lease key's room is

	mu   sync.Mutex
	ws   *websocket.Conn
	node int32 // the node it is (or was last) on

	marks atomic.Int32

	// Owned by the connection's goroutine.
	session, resume string
	epoch           string
	lastRev         uint64
	based           bool // lastRev is a position
	leased          bool // the session-leased key was written
	subscribed      bool // this connection's sub was answered
	ready           bool // counted in scaleRun.ready
	wasReady        bool // ready once: a loss from now on is resumed
	lostAt          int64
	replayed        int
	tries           int // transient refusals on this connection
}

// scaleRun is one scale process.
type scaleRun struct {
	cfg      *config
	part     int
	parts    int
	nodes    []string // ws URLs
	httpURLs []string
	rooms    []string
	clients  []*http.Client // one per source address
	pinger   *pinger
	sem      chan struct{} // dials in progress
	conns    []*scaleConn
	started  time.Time
	cf       bool // the nodes are Centrifugo's (--server centrifugo): scale_centrifugo.go
	closing  atomic.Bool
	stop     chan struct{}
	wg       sync.WaitGroup

	ready        atomic.Int64
	subscribedNs atomic.Int64 // when every connection had subscribed the first time
	firstReady   atomic.Int64 // connections subscribed at least once

	// Reset by reset.
	mark                   atomicHist
	resumeLat              atomicHist
	markCount              atomic.Int64
	losses, resumes        atomic.Int64
	sessResumed, sessNew   atomic.Int64
	byReplay, bySynced     atomic.Int64
	bySnapshot             atomic.Int64
	firstLostNs, lastResNs atomic.Int64
	dialFails, gaps        atomic.Int64
	busy                   atomic.Int64 // upgrades answered 503 (--max-connecting)
	full                   atomic.Int64 // dials a full node refused (503 full, or 4004)
	errs                   atomic.Int64
	errMu                  sync.Mutex
	firstErr, firstDialErr string
}

// parsePart parses --part I/N.
func parsePart(s string) (part, parts int, err error) {
	a, b, ok := strings.Cut(s, "/")
	part, err1 := strconv.Atoi(a)
	parts, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || parts < 1 || part < 0 || part >= parts {
		return 0, 0, fmt.Errorf("bench: bad --part %q: want I/N with 0 ≤ I < N", s)
	}
	return part, parts, nil
}

// parseSources parses --source: comma-separated loopback addresses or
// ranges FIRST-LAST (127.0.0.2-127.0.0.9); empty: the kernel's choice.
func parseSources(s string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(f, "-")
		a, err := netip.ParseAddr(lo)
		b := a
		if err == nil && isRange {
			b, err = netip.ParseAddr(hi)
		}
		if err != nil || !a.Is4() || !a.IsLoopback() || !b.Is4() || !b.IsLoopback() || b.Less(a) {
			return nil, fmt.Errorf("bench: bad --source %q: want loopback IPv4 addresses or ranges A-B", f)
		}
		for x := a; ; x = x.Next() {
			out = append(out, x)
			if len(out) > 1<<16 {
				return nil, fmt.Errorf("bench: --source %q: too many addresses", s)
			}
			if x == b {
				break
			}
		}
	}
	return out, nil
}

// sourceClient is an HTTP client whose connections come from src (any
// address when not valid).
func sourceClient(src netip.Addr) *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second}
	if src.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, ipBindAddressNoPort, 1)
			})
			return errors.Join(err, serr)
		}
	}
	return &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: d.DialContext}}
}

// wsURL is the WebSocket endpoint of node u (http://host:port).
func wsURL(u string) string {
	return "ws" + strings.TrimPrefix(strings.TrimRight(u, "/"), "http") + "/v1/ws"
}

// scaleRoom is the name of room i of the scale scenario.
func scaleRoom(prefix string, i int) string { return prefix + "-" + strconv.Itoa(i) }

// leaseRoom is where connection c keeps its session-leased key: one room
// per part and first node, so that each node follows only the lease rooms
// of its own clients.
func (r *scaleRun) leaseRoom(node int) string {
	return r.cfg.room + "-lease-" + strconv.Itoa(r.part) + "-" + strconv.Itoa(node)
}

// runScale runs one scale process until its input ends or ctx does.
func runScale(ctx context.Context, cfg *config, in io.Reader, out, errOut io.Writer) error {
	part, parts, err := parsePart(cfg.part)
	if err != nil {
		return err
	}
	if cfg.protocol != "v2" {
		return errors.New("bench: scale speaks protocol v2 only")
	}
	if len(cfg.subURLs) == 0 {
		return errors.New("bench: scale needs the nodes: --sub-url (repeatable)")
	}
	cf, err := centrifugoServer(cfg)
	if err != nil {
		return err
	}
	if cfg.placement != "rr" && cfg.placement != "room" {
		return fmt.Errorf("bench: --placement must be rr or room, not %q", cfg.placement)
	}
	srcs, err := parseSources(cfg.sources)
	if err != nil {
		return err
	}
	r := &scaleRun{cfg: cfg, part: part, parts: parts, started: time.Now(), stop: make(chan struct{}),
		sem: make(chan struct{}, cfg.dialConc), cf: cf}
	r.httpURLs = cfg.subURLs
	for _, u := range cfg.subURLs {
		if cf {
			r.nodes = append(r.nodes, cfWSURL(u))
		} else {
			r.nodes = append(r.nodes, wsURL(u))
		}
	}
	for i := range cfg.rooms {
		r.rooms = append(r.rooms, scaleRoom(cfg.room, i))
	}
	if len(srcs) == 0 {
		r.clients = []*http.Client{sourceClient(netip.Addr{})}
	}
	for _, s := range srcs {
		r.clients = append(r.clients, sourceClient(s))
	}
	for i := part; i < cfg.conns; i += parts {
		c := &scaleConn{idx: i, local: len(r.conns), room: int32(i % cfg.rooms)}
		c.first = int32(c.local % len(r.nodes))
		if cfg.placement == "room" {
			c.first = c.room % int32(len(r.nodes))
		}
		r.conns = append(r.conns, c)
	}
	// Each source address holds its share towards each node (a port per
	// connection, another while a replaced one is in TIME_WAIT).
	perSource := (len(r.conns) + len(r.clients) - 1) / len(r.clients)
	if err := checkCapacity(len(r.conns)+16, 2*perSource/len(r.nodes)+16); err != nil {
		return err
	}
	r.pinger = startPinger(func() time.Duration { return 22 * time.Second })
	defer r.pinger.close()
	logf := func(format string, a ...any) {
		fmt.Fprintf(errOut, "bench scale %s: "+format+"\n", append([]any{cfg.part}, a...)...)
	}
	logf("opening %d connections to %d nodes from %d source addresses", len(r.conns), len(r.nodes), len(r.clients))
	for _, c := range r.conns {
		r.wg.Add(1)
		go r.run(c)
	}
	defer r.close()

	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	enc := json.NewEncoder(out)
	for {
		var line string
		var ok bool
		select {
		case <-ctx.Done():
			return ctx.Err()
		case line, ok = <-lines:
		}
		if !ok {
			return nil
		}
		cmd, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
		var rep *scaleReport
		switch cmd {
		case "":
			continue
		case "quit":
			return nil
		case "wait":
			d, err := time.ParseDuration(strings.TrimSpace(arg))
			if err != nil {
				d = cfg.timeout
			}
			deadline := time.Now().Add(d)
			for r.ready.Load() < int64(len(r.conns)) && time.Now().Before(deadline) {
				if err := sleepCtx(ctx, 5*time.Millisecond); err != nil {
					return err
				}
			}
			rep = r.report()
		case "report":
			rep = r.report()
		case "reset":
			rep = r.report()
			r.reset()
		case "leases":
			rep = r.report()
			if !r.cf { // Centrifugo: no sessions, no session-bound keys: the report alone
				n, missing, err := r.countLeases(ctx)
				if err != nil {
					rep.Errors++
					rep.FirstError = "leases: " + err.Error()
				}
				rep.LeaseKeys, rep.MissingKeys = &n, missing
			}
		default:
			return fmt.Errorf("bench scale: unknown command %q (want wait, report, reset, leases, quit)", line)
		}
		rep.Command = cmd
		if err := enc.Encode(rep); err != nil {
			return err
		}
	}
}

// close drops every connection and waits for their goroutines.
func (r *scaleRun) close() {
	r.closing.Store(true)
	close(r.stop)
	for _, c := range r.conns {
		c.mu.Lock()
		if c.ws != nil {
			r.pinger.remove(libConn{c.ws})
			c.ws.CloseNow()
		}
		c.mu.Unlock()
	}
	r.wg.Wait()
}

func (r *scaleRun) fail(format string, a ...any) {
	r.errs.Add(1)
	r.errMu.Lock()
	if r.firstErr == "" {
		r.firstErr = fmt.Sprintf(format, a...)
	}
	r.errMu.Unlock()
}

// run keeps c connected and subscribed until the process closes: it
// connects (first without a session, then resuming it), reads until the
// connection ends, and starts over on another node.
func (r *scaleRun) run(c *scaleConn) {
	defer r.wg.Done()
	n := len(r.nodes)
	node, backoff := int(c.first), time.Duration(0)
	// failed pauses before the next try, longer each time (50 ms to 2 s,
	// jittered: a node that refused many at once is not hit by all of
	// them again at once); a node that is down or full (503 with
	// Statecast-Refused: full, or 4004 when it filled meanwhile) is left for
	// the next, while one that could not serve this connection (1011: it
	// could not save the session) is tried again.
	failed := func(err error, down bool) {
		r.dialFails.Add(1)
		r.errMu.Lock()
		if r.firstDialErr == "" {
			r.firstDialErr = fmt.Sprintf("connection %d to %s: %v", c.idx, r.nodes[node], err)
		}
		r.errMu.Unlock()
		var busy *busyError
		switch {
		case errors.As(err, &busy) && busy.full:
			r.full.Add(1)
			node = (node + 1) % n
		case errors.As(err, &busy):
			// The node works on as many connects as it takes: come back
			// when it says, jittered, as a client that reads the status
			// does (PROTOCOL.md §8); its clients then arrive at its pace.
			r.busy.Add(1)
			backoff = 2 * busy.after
			return
		case websocket.CloseStatus(err) == wire.CloseServerFull:
			r.full.Add(1)
			node = (node + 1) % n
		case down:
			node = (node + 1) % n
		}
		backoff = min(max(2*backoff, 50*time.Millisecond), 2*time.Second)
	}
	for !r.closing.Load() {
		if backoff > 0 {
			select {
			case <-r.stop:
				return
			case <-time.After(backoff/2 + rand.N(backoff/2)):
			}
		}
		var ws *websocket.Conn
		var err error
		if r.cf {
			ws, err = r.cfDial(c, node)
		} else {
			ws, err = r.dial(c, node)
		}
		if err != nil {
			failed(err, true)
			continue
		}
		if r.cf {
			err = r.cfRead(c, ws)
		} else {
			err = r.read(c, ws)
		}
		if r.closing.Load() {
			return
		}
		r.lost(c)
		if !c.subscribed || !c.wasReady {
			// Refused, or lost before its sub (or first lease write) was
			// answered. (A Centrifugo node shutting down or failing is
			// left for the next.)
			failed(err, r.cf && cfMoveOn(err))
			continue
		}
		// Lost: resume at once elsewhere. A node's clients spread over
		// the others rather than all falling on the next one; with
		// --placement room, a room's stay together.
		backoff = 0
		key := c.idx
		if r.cfg.placement == "room" {
			key = int(c.room)
		}
		if n > 1 {
			node = (node + 1 + key%(n-1)) % n
		}
	}
}

// lost accounts for c's connection ending: c is no longer ready, and
// from now on lost if it was ever ready (until it resumes).
func (r *scaleRun) lost(c *scaleConn) {
	if c.ready {
		c.ready = false
		r.ready.Add(-1)
	}
	if now := time.Now().UnixNano(); c.wasReady && c.lostAt == 0 {
		c.lostAt = now
		r.losses.Add(1)
		casMin(&r.firstLostNs, now)
	}
}

// dial opens a connection for c to node and sends connect (with c's
// session, once it has one), its lease write (until one succeeded) and
// its sub (from its position, once it has one).
func (r *scaleRun) dial(c *scaleConn, node int) (*websocket.Conn, error) {
	b := make([]byte, 0, 256)
	b = append(b, `{"t":"connect"`...)
	if c.session != "" {
		b = append(b, `,"session":`...)
		b = strconv.AppendQuote(b, c.session)
		b = append(b, `,"resume":`...)
		b = strconv.AppendQuote(b, c.resume)
	}
	b = append(b, "}\n"...)
	if r.cfg.lease && !c.leased {
		b = append(r.leaseWrite(c, b), '\n')
	}
	ws, err := r.open(c, node, []string{"statecast.v2.json"}, r.subRequest(c, b))
	if err == nil {
		r.pinger.add(libConn{ws})
	}
	return ws, err
}

// open dials node for c (at most --dial-concurrency at a time), sends
// hello as its first frame and makes the connection c's.
func (r *scaleRun) open(c *scaleConn, node int, subprotocols []string, hello []byte) (*websocket.Conn, error) {
	select {
	case r.sem <- struct{}{}:
	case <-r.stop:
		return nil, errors.New("closing")
	}
	defer func() { <-r.sem }()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, r.nodes[node], &websocket.DialOptions{
		HTTPClient:      r.clients[c.local%len(r.clients)],
		Subprotocols:    subprotocols,
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		return nil, busyOf(resp, err) // a full or busy node answers 503
	}
	ws.SetReadLimit(64 << 20)
	if err := ws.Write(ctx, websocket.MessageText, hello); err != nil {
		ws.CloseNow()
		return nil, err
	}
	c.mu.Lock()
	if r.closing.Load() {
		c.mu.Unlock()
		ws.CloseNow()
		return nil, errors.New("closing")
	}
	c.ws, c.node = ws, int32(node)
	c.mu.Unlock()
	c.subscribed, c.replayed, c.tries = false, 0, 0
	return ws, nil
}

// leaseWrite appends c's session-leased key write (id 2) to b.
func (r *scaleRun) leaseWrite(c *scaleConn, b []byte) []byte {
	b = append(b, `{"t":"put","id":2,"room":"`...)
	b = append(b, r.leaseRoom(int(c.first))...)
	b = append(b, `","key":"c`...)
	b = strconv.AppendInt(b, int64(c.idx), 10)
	return append(b, `","value":1,"lease":"session"}`...)
}

// subRequest appends c's sub (id 1), from its position once it has one,
// to b.
func (r *scaleRun) subRequest(c *scaleConn, b []byte) []byte {
	b = append(b, `{"t":"sub","id":1,"room":"`...)
	b = append(b, r.rooms[c.room]...)
	b = append(b, '"')
	if c.based {
		b = append(b, `,"from":{"epoch":`...)
		b = strconv.AppendQuote(b, c.epoch)
		b = append(b, `,"rev":`...)
		b = strconv.AppendUint(b, c.lastRev+1, 10)
		b = append(b, '}')
	}
	return append(b, '}')
}

// transientCodes are the refusals a client tries again on the same
// connection after a pause, as the SDK does (sdk-js, client.ts); others
// end the connection.
var transientCodes = []string{"unavailable", "internal", "outcome_unknown", "rate_limited"}

// retryLater sends req again on ws after a pause (50 ms to 2 s, doubling
// with c's tries, jittered), unless ws is no longer c's by then.
func (r *scaleRun) retryLater(c *scaleConn, ws *websocket.Conn, req []byte) {
	c.tries++
	d := min(50*time.Millisecond<<min(c.tries-1, 6), 2*time.Second)
	time.AfterFunc(d/2+rand.N(d/2), func() {
		c.mu.Lock()
		same := c.ws == ws
		c.mu.Unlock()
		if !same || r.closing.Load() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := ws.Write(ctx, websocket.MessageText, req); err != nil {
			ws.CloseNow() // its reader ends and the connection starts over
		}
	})
}

// scaleBufs holds the frame buffers of the readers: a connection holds one
// only while it parses a frame.
var scaleBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// read reads ws until it ends, and says why.
func (r *scaleRun) read(c *scaleConn, ws *websocket.Conn) error {
	defer func() {
		r.pinger.remove(libConn{ws})
		c.mu.Lock()
		c.ws = nil
		c.mu.Unlock()
		ws.CloseNow()
	}()
	return readLines(ws, func(line []byte, now int64) error {
		if !r.message(c, line, now) {
			return errRefused
		}
		return nil
	})
}

var errRefused = errors.New("the server refused the sub or the lease write")

// readLines reads ws's frames until it ends or line fails, handing line
// each message of a frame (they are separated by newlines) with the
// frame's arrival time.
func readLines(ws *websocket.Conn, line func(msg []byte, now int64) error) error {
	for {
		_, rd, err := ws.Reader(context.Background())
		if err != nil {
			return err
		}
		bp := scaleBufs.Get().(*[]byte)
		buf, err := readFrame(rd, (*bp)[:0])
		now := time.Now().UnixNano()
		for frame := buf; err == nil && len(frame) > 0; {
			msg := frame
			if i := bytes.IndexByte(frame, '\n'); i >= 0 {
				msg, frame = frame[:i], frame[i+1:]
			} else {
				frame = nil
			}
			err = line(msg, now)
		}
		if cap(buf) <= 64<<10 {
			*bp = buf
			scaleBufs.Put(bp)
		}
		if err != nil {
			return err
		}
	}
}

// message handles one server message on c; false ends the connection
// (to start over on another).
func (r *scaleRun) message(c *scaleConn, line []byte, now int64) bool {
	t := messageType(line)
	switch string(t) {
	case "events", "coalesced":
		rev, _ := fieldUint(line, fR)
		if t[0] == 'e' {
			c.replayed++
			if c.based && rev != c.lastRev+1 {
				r.gaps.Add(1)
			}
		}
		c.lastRev, c.based = rev, true
		r.marks(c, line, now)
	case "snapshot":
		c.lastRev, _ = fieldUint(line, fRev)
		c.epoch = string(fieldStr(line, fEpoch))
		c.based = true
		c.subscribed = true
		r.resumed(c, now, &r.bySnapshot)
	case "synced":
		if rev, _ := fieldUint(line, fRev); rev > c.lastRev {
			// A subscription of the whole room gets every revision as events.
			r.gaps.Add(1)
			c.lastRev = rev
		}
		c.subscribed = true
		kind := &r.bySynced
		if c.replayed > 0 {
			kind = &r.byReplay
		}
		r.resumed(c, now, kind)
	case "connected":
		if c.lostAt != 0 {
			if bytes.Contains(line, fResumed) {
				r.sessResumed.Add(1)
			} else {
				r.sessNew.Add(1)
			}
		}
		c.mu.Lock() // countLeases names the session of a missing key
		c.session = string(fieldStr(line, fSession))
		c.mu.Unlock()
		c.resume = string(fieldStr(line, fResume))
	case "ok":
		if id, _ := fieldUint(line, fID); id == 2 {
			c.leased = true
			r.resumed(c, now, nil)
		}
	case "err", "unsubscribed":
		r.fail("connection %d: %s", c.idx, line)
		id, _ := fieldUint(line, fID)
		if string(t) != "err" || id != 1 && id != 2 {
			return string(t) == "err"
		}
		if !slices.Contains(transientCodes, string(fieldStr(line, fCode))) {
			return false // refused for good: start over on a fresh connection
		}
		// Tried again on this connection, after a pause: redialling would
		// cost the node a session detach and a take more, while it is
		// already behind.
		c.mu.Lock()
		ws := c.ws
		c.mu.Unlock()
		if id == 1 {
			r.retryLater(c, ws, r.subRequest(c, nil))
		} else {
			r.retryLater(c, ws, r.leaseWrite(c, nil))
		}
	}
	return true
}

// resumed accounts for c's subscription being answered (kind: how, on a
// resume) or its lease write: c is ready once both are done.
func (r *scaleRun) resumed(c *scaleConn, now int64, kind *atomic.Int64) {
	if c.ready || !c.subscribed || (r.cfg.lease && !c.leased) {
		return
	}
	c.ready = true
	r.ready.Add(1)
	if !c.wasReady {
		c.wasReady, c.lostAt = true, 0
		if r.firstReady.Add(1) == int64(len(r.conns)) {
			r.subscribedNs.Store(now)
		}
		return
	}
	if c.lostAt != 0 {
		r.resumes.Add(1)
		if kind != nil {
			kind.Add(1)
		}
		r.resumeLat.Record(time.Duration(now - c.lostAt))
		casMax(&r.lastResNs, now)
		c.lostAt = 0
	}
}

// marks records the delivery of the marked writes in an events or
// coalesced message (protocol v2).
func (r *scaleRun) marks(c *scaleConn, line []byte, now int64) {
	b := denseList(line, fE)
	var el [6][]byte
	for len(b) > 0 && b[0] == '[' {
		var n int
		if n, b = denseArray(b, &el); n < 4 || !bytes.HasPrefix(el[1], markPrefix) {
			continue
		}
		_, sent, ok := markFields(el[1])
		if !ok {
			continue
		}
		c.marks.Add(1)
		r.markCount.Add(1)
		r.mark.Record(time.Duration(now - sent))
	}
}

// markValue is the value of marked write seq sent at unix ns sent.
func markValue(seq uint64, sent int64) []byte {
	b := append([]byte(nil), markPrefix...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, ':')
	b = strconv.AppendInt(b, sent, 10)
	return append(b, '"')
}

// markFields parses a markValue.
func markFields(v []byte) (seq uint64, sent int64, ok bool) {
	v = bytes.TrimPrefix(v, markPrefix)
	a, b, found := bytes.Cut(bytes.TrimSuffix(v, []byte{'"'}), []byte{':'})
	s, err1 := strconv.ParseUint(string(a), 10, 64)
	t, err2 := strconv.ParseInt(string(b), 10, 64)
	return s, t, found && err1 == nil && err2 == nil
}

// countLeases counts this part's session-leased keys in the store, and
// names the first few missing (with the session that wrote them, to find
// in the nodes' logs).
func (r *scaleRun) countLeases(ctx context.Context) (int, []string, error) {
	want := make(map[string]bool, len(r.conns))
	for _, c := range r.conns {
		want["c"+strconv.Itoa(c.idx)] = true
	}
	seen := make(map[string]bool, len(r.conns))
	n := 0
	var lastErr error
	for node := range r.nodes {
		var err error
		for _, u := range r.httpURLs { // any node that answers
			var keys []string
			if keys, err = listKeys(ctx, u, r.leaseRoom(node)); err == nil {
				for _, k := range keys {
					if want[k] && !seen[k] {
						seen[k] = true
						n++
					}
				}
				break
			}
		}
		if err != nil {
			lastErr = err
		}
	}
	var missing []string
	for _, c := range r.conns {
		if k := "c" + strconv.Itoa(c.idx); !seen[k] && len(missing) < maxMissingKeys {
			c.mu.Lock()
			missing = append(missing, fmt.Sprintf("%s (room %s, session %s)", k, r.leaseRoom(int(c.first)), c.session))
			c.mu.Unlock()
		}
	}
	return n, missing, lastErr
}

// maxMissingKeys: how many missing keys a report names.
const maxMissingKeys = 5

// listKeys lists the keys of room on node base, page by page at one
// revision (PROTOCOL.md, HTTP list pages).
func listKeys(ctx context.Context, base, room string) ([]string, error) {
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: nil}}
	defer hc.CloseIdleConnections()
	var keys []string
	q := "?limit=10000"
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/v1/rooms/"+url.PathEscape(room)+"/kv"+q, nil)
		if err != nil {
			return nil, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		var page struct {
			Rev   uint64 `json:"rev"`
			Items []struct {
				Key string `json:"key"`
			} `json:"items"`
			More bool   `json:"more"`
			Next string `json:"next"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("GET %s: %s", room, resp.Status)
		}
		if err != nil {
			return nil, err
		}
		for _, it := range page.Items {
			keys = append(keys, it.Key)
		}
		if !page.More {
			return keys, nil
		}
		q = "?limit=10000&rev=" + strconv.FormatUint(page.Rev, 10) + "&after=" + url.QueryEscape(page.Next)
	}
}

// casMin and casMax keep the smallest (non-zero) and largest value in a.
func casMin(a *atomic.Int64, v int64) {
	for {
		o := a.Load()
		if (o != 0 && o <= v) || a.CompareAndSwap(o, v) {
			return
		}
	}
}

func casMax(a *atomic.Int64, v int64) {
	for {
		o := a.Load()
		if o >= v || a.CompareAndSwap(o, v) {
			return
		}
	}
}

// scaleReport is what one scale process answers each command with, and
// (merged) what scale-merge prints. Times are unix nanoseconds.
type scaleReport struct {
	Command      string `json:"command,omitempty"`
	Part         string `json:"part,omitempty"`
	Parts        int    `json:"parts"` // processes merged
	Conns        int    `json:"conns"`
	Ready        int64  `json:"ready"`
	StartedNs    int64  `json:"started_unix_ns"`
	SubscribedNs int64  `json:"subscribed_unix_ns,omitempty"`
	// ConnsOnNode is the connections open on each node, by its index.
	ConnsOnNode []int   `json:"conns_on_node"`
	RSSMB       float64 `json:"rss_mb"`

	Marks        int64          `json:"marks"`
	MarksPerConn map[string]int `json:"marks_per_conn"` // connections by marked writes received
	MarkLatency  histJSON       `json:"mark_latency"`

	Losses         int64    `json:"losses"`
	Resumes        int64    `json:"resumes"`
	SessionResumed int64    `json:"session_resumed"`
	SessionNew     int64    `json:"session_new"`
	ByReplay       int64    `json:"by_replay"`
	BySynced       int64    `json:"by_synced"` // nothing to replay
	BySnapshot     int64    `json:"by_snapshot"`
	FirstLostNs    int64    `json:"first_lost_unix_ns,omitempty"`
	LastResumedNs  int64    `json:"last_resumed_unix_ns,omitempty"`
	ResumeLatency  histJSON `json:"resume_latency"`
	DialFailures   int64    `json:"dial_failures"` // connections refused or lost before subscribing
	Busy           int64    `json:"busy"`          // of them, upgrades answered 503 + Retry-After (--max-connecting)
	Full           int64    `json:"full"`          // of them, refused by a full node (503 Statecast-Refused: full, or 4004)
	FirstDialError string   `json:"first_dial_error,omitempty"`
	Gaps           int64    `json:"gaps"`
	Errors         int64    `json:"errors"`
	FirstError     string   `json:"first_error,omitempty"`
	LeaseKeys      *int     `json:"lease_keys,omitempty"`
	MissingKeys    []string `json:"missing_keys,omitempty"` // the first few of them

	// Figures of scale-merge.
	SubscribedS     float64 `json:"subscribed_s,omitempty"`       // first start to the last process all subscribed
	MarkP50Ms       float64 `json:"mark_p50_ms,omitempty"`        // send to delivery
	MarkP99Ms       float64 `json:"mark_p99_ms,omitempty"`        //
	MarkMaxMs       float64 `json:"mark_max_ms,omitempty"`        // the last delivery
	ResumeP50Ms     float64 `json:"resume_p50_ms,omitempty"`      // loss to resumed
	ResumeP99Ms     float64 `json:"resume_p99_ms,omitempty"`      //
	ResumeAllS      float64 `json:"resume_all_s,omitempty"`       // first loss to the last resumed
	ResumeMaxMs     float64 `json:"resume_max_ms,omitempty"`      //
	ClientKBPerConn float64 `json:"client_kb_per_conn,omitempty"` // the load tool's RSS per connection
}

func (r *scaleRun) report() *scaleReport {
	rep := &scaleReport{Part: r.cfg.part, Parts: 1, Conns: len(r.conns), Ready: r.ready.Load(),
		StartedNs: r.started.UnixNano(), SubscribedNs: r.subscribedNs.Load(), ConnsOnNode: make([]int, len(r.nodes)),
		MarksPerConn: map[string]int{}, Marks: r.markCount.Load(),
		Losses: r.losses.Load(), Resumes: r.resumes.Load(), SessionResumed: r.sessResumed.Load(), SessionNew: r.sessNew.Load(),
		ByReplay: r.byReplay.Load(), BySynced: r.bySynced.Load(), BySnapshot: r.bySnapshot.Load(),
		FirstLostNs: r.firstLostNs.Load(), LastResumedNs: r.lastResNs.Load(),
		DialFailures: r.dialFails.Load(), Busy: r.busy.Load(), Full: r.full.Load(), Gaps: r.gaps.Load(), Errors: r.errs.Load()}
	for _, c := range r.conns {
		rep.MarksPerConn[strconv.Itoa(int(c.marks.Load()))]++
		c.mu.Lock()
		if c.ws != nil {
			rep.ConnsOnNode[c.node]++
		}
		c.mu.Unlock()
	}
	if rss, err := procRSS(os.Getpid()); err == nil {
		rep.RSSMB = float64(rss) / (1 << 20)
	}
	rep.MarkLatency = r.mark.json()
	rep.ResumeLatency = r.resumeLat.json()
	r.errMu.Lock()
	rep.FirstError, rep.FirstDialError = r.firstErr, r.firstDialErr
	r.errMu.Unlock()
	return rep
}

// reset zeroes the delivery and resume figures: a new phase.
func (r *scaleRun) reset() {
	for _, c := range r.conns {
		c.marks.Store(0)
	}
	r.mark.reset()
	r.resumeLat.reset()
	for _, a := range []*atomic.Int64{&r.markCount, &r.losses, &r.resumes, &r.sessResumed, &r.sessNew, &r.byReplay,
		&r.bySynced, &r.bySnapshot, &r.firstLostNs, &r.lastResNs, &r.dialFails, &r.busy, &r.full, &r.gaps, &r.errs} {
		a.Store(0)
	}
	r.errMu.Lock()
	r.firstErr, r.firstDialErr = "", ""
	r.errMu.Unlock()
}

// mergeScale adds reports of several processes up and derives the
// figures of the whole run.
func mergeScale(reps []*scaleReport) *scaleReport {
	m := &scaleReport{MarksPerConn: map[string]int{}}
	var mark, res latencyHist
	for _, r := range reps {
		m.Parts += max(r.Parts, 1)
		m.Conns += r.Conns
		m.Ready += r.Ready
		m.RSSMB += r.RSSMB
		m.Marks += r.Marks
		m.Losses += r.Losses
		m.Resumes += r.Resumes
		m.SessionResumed += r.SessionResumed
		m.SessionNew += r.SessionNew
		m.ByReplay += r.ByReplay
		m.BySynced += r.BySynced
		m.BySnapshot += r.BySnapshot
		m.DialFailures += r.DialFailures
		m.Busy += r.Busy
		m.Full += r.Full
		m.Gaps += r.Gaps
		m.Errors += r.Errors
		if m.FirstError == "" {
			m.FirstError = r.FirstError
		}
		if m.FirstDialError == "" {
			m.FirstDialError = r.FirstDialError
		}
		if r.LeaseKeys != nil {
			n := *r.LeaseKeys
			if m.LeaseKeys != nil {
				n += *m.LeaseKeys
			}
			m.LeaseKeys = &n
		}
		for _, k := range r.MissingKeys {
			if len(m.MissingKeys) < maxMissingKeys {
				m.MissingKeys = append(m.MissingKeys, k)
			}
		}
		for k, v := range r.MarksPerConn {
			m.MarksPerConn[k] += v
		}
		for i, n := range r.ConnsOnNode {
			for len(m.ConnsOnNode) <= i {
				m.ConnsOnNode = append(m.ConnsOnNode, 0)
			}
			m.ConnsOnNode[i] += n
		}
		if m.StartedNs == 0 || (r.StartedNs != 0 && r.StartedNs < m.StartedNs) {
			m.StartedNs = r.StartedNs
		}
		if m.FirstLostNs == 0 || (r.FirstLostNs != 0 && r.FirstLostNs < m.FirstLostNs) {
			m.FirstLostNs = r.FirstLostNs
		}
		m.LastResumedNs = max(m.LastResumedNs, r.LastResumedNs)
		m.SubscribedNs = max(m.SubscribedNs, r.SubscribedNs)
		h := r.MarkLatency.hist()
		mark.Merge(&h)
		h = r.ResumeLatency.hist()
		res.Merge(&h)
	}
	// Every process subscribed all of its connections, or the run did not.
	for _, r := range reps {
		if r.SubscribedNs == 0 {
			m.SubscribedNs = 0
		}
	}
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	m.MarkLatency, m.ResumeLatency = mark.toJSON(), res.toJSON()
	m.MarkP50Ms, m.MarkP99Ms, m.MarkMaxMs = ms(mark.Quantile(0.5)), ms(mark.Quantile(0.99)), ms(mark.Max())
	m.ResumeP50Ms, m.ResumeP99Ms, m.ResumeMaxMs = ms(res.Quantile(0.5)), ms(res.Quantile(0.99)), ms(res.Max())
	if m.SubscribedNs > 0 {
		m.SubscribedS = float64(m.SubscribedNs-m.StartedNs) / 1e9
	}
	if m.FirstLostNs > 0 && m.LastResumedNs > m.FirstLostNs {
		m.ResumeAllS = float64(m.LastResumedNs-m.FirstLostNs) / 1e9
	}
	if m.Conns > 0 {
		m.ClientKBPerConn = m.RSSMB * 1024 / float64(m.Conns)
	}
	return m
}

// runScaleMerge reads reports, one JSON line each, and prints their merge.
func runScaleMerge(in io.Reader, out io.Writer) error {
	var reps []*scaleReport
	dec := json.NewDecoder(in)
	for {
		var r scaleReport
		if err := dec.Decode(&r); err == io.EOF {
			break
		} else if err != nil {
			return fmt.Errorf("bench scale-merge: %w", err)
		}
		reps = append(reps, &r)
	}
	if len(reps) == 0 {
		return errors.New("bench scale-merge: no reports on the input")
	}
	return json.NewEncoder(out).Encode(mergeScale(reps))
}

// markConns is how many connections carry the marked writes, over the
// nodes in turn, as the rooms' own writers would: a node applies one
// connection's writes one after another.
const markConns = 50

// runScaleMark makes one marked write to each of --rooms rooms over
// markConns connections to --url and the --sub-url nodes in turn (a node
// that refuses is skipped) and prints when they were sent and answered.
func runScaleMark(ctx context.Context, cfg *config, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	if cf, err := centrifugoServer(cfg); err != nil {
		return err
	} else if cf {
		return runScaleMarkCentrifugo(ctx, cfg, out)
	}
	urls := append([]string{cfg.url}, cfg.subURLs...)
	var conns []*websocket.Conn
	var err error
	for i := 0; len(conns) < min(markConns, cfg.rooms) && i < 2*markConns; i++ {
		c, derr := markConn(ctx, urls[i%len(urls)])
		if derr != nil {
			err = derr // a full node (503, or 4004), or a dead one: the next
			continue
		}
		defer c.CloseNow()
		conns = append(conns, c)
	}
	if len(conns) == 0 {
		return fmt.Errorf("bench scale-mark: no node took a connection: %w", err)
	}
	// Room i's write goes on connection i%len(conns) and nowhere else: a
	// write that may have been sent is not sent again (a room would get
	// two).
	first := time.Now()
	errs := make(chan error, len(conns))
	for k, c := range conns {
		go func() {
			var rooms []int
			for i := k; i < cfg.rooms; i += len(conns) {
				rooms = append(rooms, i)
			}
			errs <- markRooms(ctx, c, cfg, rooms)
		}()
	}
	var werr error
	for range conns {
		if e := <-errs; e != nil && werr == nil {
			werr = e
		}
	}
	if werr != nil {
		return werr
	}
	return json.NewEncoder(out).Encode(map[string]any{"writes": cfg.rooms, "conns": len(conns), "sent_unix_ns": first.UnixNano(),
		"answered_ms": float64(time.Since(first)) / 1e6})
}

// markConn opens a connection to node u, connected.
func markConn(ctx context.Context, u string) (*websocket.Conn, error) {
	c, _, err := websocket.Dial(ctx, wsURL(u), &websocket.DialOptions{HTTPClient: sourceClient(netip.Addr{}),
		Subprotocols: []string{"statecast.v2.json"}, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return nil, err
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"t":"connect"}`)); err != nil {
		c.CloseNow()
		return nil, err
	}
	_, data, err := c.Read(ctx)
	if err != nil || !bytes.Contains(data, []byte(`"t":"connected"`)) {
		c.CloseNow()
		return nil, fmt.Errorf("%s: no connected (%v): %s", u, err, clip(data))
	}
	return c, nil
}

// markRooms sends the marked write of each of rooms on c at once, each
// stamped with its send time, and reads their answers.
func markRooms(ctx context.Context, c *websocket.Conn, cfg *config, rooms []int) error {
	var b []byte
	sent := time.Now().UnixNano()
	for _, i := range rooms {
		b = append(b, `{"t":"put","id":`...)
		b = strconv.AppendInt(b, int64(i+1), 10)
		b = append(b, `,"room":"`...)
		b = append(b, scaleRoom(cfg.room, i)...)
		b = append(b, `","key":"mark","value":`...)
		b = append(b, markValue(uint64(cfg.seq), sent)...)
		b = append(b, "}\n"...)
	}
	if err := c.Write(ctx, websocket.MessageText, b); err != nil {
		return err
	}
	for acked := 0; acked < len(rooms); {
		_, data, err := c.Read(ctx)
		if err != nil {
			return fmt.Errorf("bench scale-mark: %d of %d writes of a connection answered: %w", acked, len(rooms), err)
		}
		for _, line := range bytes.Split(data, []byte{'\n'}) {
			switch string(fieldStr(line, fT)) {
			case "ok":
				acked++
			case "err":
				return fmt.Errorf("bench scale-mark: the server refused a write: %s", line)
			}
		}
	}
	return nil
}
