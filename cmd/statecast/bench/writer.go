package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// writer is the load tool's writer: --writers connections, used in
// turn. Against statecast each sends put requests on a WebSocket (or,
// with --write-via http, PUT requests on a keep-alive HTTP/1.1
// connection); against the ceiling, POST /publish requests on a
// keep-alive HTTP/1.1 connection.
// Both pipeline up to --window requests in all (a server handles one
// connection's requests in order and answers them in order).
//
// Write seq goes to room seq % rooms; its value is a JSON string starting
// with seq, which is how subscribers find its send time. With a single
// connection, write seq commits as revision (offset) base + seq/rooms + 1
// of its room, and each reply is checked against that: nobody else writes.
type writer struct {
	e       *env
	st      *runState
	rooms   []string
	base    []uint64 // revision (offset) of each room before the first write
	keys    int
	payload int
	conns   []*writerConn
	req     []byte // ceiling: request head up to Content-Length's value

	window  chan struct{} // a token per request in flight
	next    uint64        // seq of the next write; owned by the sending goroutine
	turn    int           // connection of the next batch; owned likewise
	sent    atomic.Int64
	acked   atomic.Int64
	stalled atomic.Int64    // nanoseconds send waited for the window
	last    []atomic.Uint64 // highest revision (offset) acknowledged per room

	errMu    sync.Mutex
	err      error
	failed   chan struct{} // closed with the first error
	buf, val []byte
}

// writerConn is one connection of the writer.
type writerConn struct {
	ws       *websocket.Conn // statecast
	tcp      net.Conn        // HTTP: the ceiling, or statecast with --write-via http
	mu       sync.Mutex
	fifo     []uint64 // HTTP: seqs of the requests awaiting a reply, in order
	inflight atomic.Int64
	host     string      // HTTP: the Host header
	lat      latencyHist // send to reply, with a write log; owned by the reader
	done     chan struct{}
}

// newWriter connects the writer and reads the rooms' current revisions.
func (e *env) newWriter(ctx context.Context, st *runState, rooms []string) (*writer, error) {
	w := &writer{
		e: e, st: st, rooms: rooms, keys: e.cfg.keys, payload: e.cfg.payload,
		base: make([]uint64, len(rooms)), last: make([]atomic.Uint64, len(rooms)),
		window: make(chan struct{}, e.cfg.window), failed: make(chan struct{}),
	}
	if e.ceiling {
		off, err := e.ceilingOffset(ctx)
		if err != nil {
			return nil, err
		}
		w.base[0] = off
		w.req = []byte("POST /publish HTTP/1.1\r\nHost: " + e.hostport() + "\r\nContent-Type: application/json\r\nContent-Length: ")
	} else {
		for i, r := range rooms {
			rev, _, err := e.roomState(ctx, r)
			if err != nil {
				return nil, err
			}
			w.base[i] = rev
		}
	}
	for i := range rooms {
		w.last[i].Store(w.base[i])
	}
	for i := range e.cfg.writers {
		wc, err := w.connect(ctx, i)
		if err != nil {
			w.close()
			return nil, fmt.Errorf("writer: %w", err)
		}
		w.conns = append(w.conns, wc)
	}
	return w, nil
}

// connect opens writer connection i and starts its reply reader.
func (w *writer) connect(ctx context.Context, i int) (*writerConn, error) {
	wc := &writerConn{done: make(chan struct{})}
	u := w.e.ws
	if n := len(w.e.writeWS); n > 0 {
		u = w.e.writeWS[i%n]
	}
	if w.e.ceiling || w.e.cfg.writeVia == "http" {
		host := w.e.hostport()
		if pu, err := url.Parse(u); err == nil && !w.e.ceiling {
			host = pu.Host
		}
		d := net.Dialer{Timeout: 10 * time.Second}
		c, err := d.DialContext(ctx, "tcp", host)
		if err != nil {
			return nil, err
		}
		wc.tcp, wc.host = c, host
		go w.readHTTP(wc, bufio.NewReaderSize(c, 64<<10))
		return wc, nil
	}
	c, err := w.e.dialWS(ctx, u, w.e.subprotocols())
	if err != nil {
		return nil, err
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"t":"connect"}`)); err != nil {
		c.CloseNow()
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, data, err := c.Read(rctx)
	cancel()
	if err != nil || !bytes.Contains(data, []byte(`"t":"connected"`)) {
		c.CloseNow()
		return nil, fmt.Errorf("no connected reply (%v): %s", err, clip(data))
	}
	wc.ws = c
	w.e.pinger.add(libConn{c})
	go w.readStatecast(wc)
	return wc, nil
}

func (w *writer) setErr(err error) {
	w.errMu.Lock()
	if w.err == nil {
		w.err = err
		close(w.failed)
	}
	w.errMu.Unlock()
}

// failure is the first error of the writer, if any.
func (w *writer) failure() error {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return w.err
}

// appendValue appends the value of write seq: a JSON string of exactly
// payload bytes (at least its digits), "<seq>:xxx…", unique per write.
func appendValue(b []byte, seq uint64, payload int) []byte {
	start := len(b)
	b = append(b, '"')
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, ':')
	for len(b)-start < payload-1 {
		b = append(b, 'x')
	}
	return append(b, '"')
}

// valueSeq is the seq of a value appendValue made (the raw JSON text).
func valueSeq(v []byte) (uint64, bool) {
	if len(v) < 3 || v[0] != '"' {
		return 0, false
	}
	seq, ok := leadingUint(v[1:])
	return seq, ok
}

// send writes n requests in one frame (ceiling: one write) on the
// connection with the fewest requests in flight (the next in turn among
// equals), after taking n window tokens.
func (w *writer) send(ctx context.Context, n int) error {
	for range n {
		select {
		case w.window <- struct{}{}:
			continue
		default:
		}
		// The server is --window writes behind.
		t := time.Now()
		select {
		case w.window <- struct{}{}:
			w.stalled.Add(int64(time.Since(t)))
		case <-ctx.Done():
			return ctx.Err()
		case <-w.failed:
			return w.failure()
		}
	}
	wc := w.conns[w.turn%len(w.conns)]
	for i := 1; i < len(w.conns) && wc.inflight.Load() > 0; i++ {
		if c := w.conns[(w.turn+i)%len(w.conns)]; c.inflight.Load() < wc.inflight.Load() {
			wc = c
		}
	}
	w.turn++
	wc.inflight.Add(int64(n))
	b := w.buf[:0]
	now := w.st.now()
	log := w.st.wlog
	if wc.tcp != nil {
		wc.mu.Lock()
	}
	for range n {
		seq := w.next
		w.next++
		if log != nil && seq < uint64(len(log.times)) {
			log.times[seq].Store(now)
		}
		room := int(seq % uint64(len(w.rooms)))
		key := (seq / uint64(len(w.rooms))) % uint64(w.keys)
		w.val = appendValue(w.val[:0], seq, w.payload)
		if wc.ws != nil {
			if len(b) > 0 {
				b = append(b, '\n')
			}
			b = append(b, `{"t":"put","id":`...)
			b = strconv.AppendUint(b, seq+1, 10)
			b = append(b, `,"room":"`...)
			b = append(b, w.rooms[room]...)
			b = append(b, `","key":"k`...)
			b = strconv.AppendUint(b, key, 10)
			b = append(b, `","value":`...)
			b = append(b, w.val...)
			b = append(b, '}')
		} else {
			wc.fifo = append(wc.fifo, seq)
			if w.e.ceiling {
				b = append(b, w.req...)
			} else {
				b = append(b, "PUT /v1/rooms/"...)
				b = append(b, w.rooms[room]...)
				b = append(b, "/kv/k"...)
				b = strconv.AppendUint(b, key, 10)
				b = append(b, " HTTP/1.1\r\nHost: "...)
				b = append(b, wc.host...)
				b = append(b, "\r\nContent-Type: application/json\r\nContent-Length: "...)
			}
			b = strconv.AppendInt(b, int64(len(w.val)), 10)
			b = append(b, "\r\n\r\n"...)
			b = append(b, w.val...)
		}
	}
	if wc.tcp != nil {
		wc.mu.Unlock()
	}
	w.buf = b
	var err error
	if wc.ws != nil {
		err = wc.ws.Write(ctx, websocket.MessageText, b)
	} else {
		_, err = wc.tcp.Write(b)
	}
	if err != nil {
		w.setErr(fmt.Errorf("writer: %w", err))
		return w.failure()
	}
	w.sent.Add(int64(n))
	return nil
}

// ack accounts for the reply on wc to write seq, which committed at rev.
func (w *writer) ack(wc *writerConn, seq, rev uint64) {
	if log := w.st.wlog; log != nil && seq < uint64(len(log.times)) {
		if at := log.times[seq].Load(); at > 0 {
			wc.lat.Record(time.Duration(w.st.now() - at))
		}
	}
	wc.inflight.Add(-1)
	r := uint64(len(w.rooms))
	room := int(seq % r)
	if want := w.base[room] + seq/r + 1; len(w.conns) == 1 && rev != want {
		w.setErr(fmt.Errorf("writer: write %d committed at revision %d, expected %d: is another client writing to %q?", seq, rev, want, w.rooms[room]))
	}
	for {
		last := w.last[room].Load()
		if rev <= last || w.last[room].CompareAndSwap(last, rev) {
			break
		}
	}
	w.acked.Add(1)
	<-w.window
}

// readStatecast reads the replies to the puts of wc.
func (w *writer) readStatecast(wc *writerConn) {
	defer close(wc.done)
	var buf []byte
	for {
		_, r, err := wc.ws.Reader(context.Background())
		if err == nil {
			buf, err = readFrame(r, buf[:0])
		}
		if err != nil {
			if w.acked.Load() < w.sent.Load() {
				w.setErr(fmt.Errorf("writer: connection lost with writes unanswered: %v", err))
			}
			return
		}
		frame := buf
		for len(frame) > 0 {
			line := frame
			if i := bytes.IndexByte(frame, '\n'); i >= 0 {
				line, frame = frame[:i], frame[i+1:]
			} else {
				frame = nil
			}
			switch string(fieldStr(line, fT)) {
			case "ok":
				id, _ := fieldUint(line, fID)
				rev, _ := fieldUint(line, fRev)
				if id > 0 {
					w.ack(wc, id-1, rev)
				}
			case "err":
				w.setErr(fmt.Errorf("writer: the server refused a put (for rate_limited, start it with --write-rate above the offered rate): %s", line))
				<-w.window
			}
		}
	}
}

// readHTTP reads the replies to the requests of wc, in order: the
// ceiling's {"o":offset}, statecast's {"rev":revision}.
func (w *writer) readHTTP(wc *writerConn, br *bufio.Reader) {
	field := []byte(`"rev":`)
	if w.e.ceiling {
		field = []byte(`"o":`)
	}
	defer close(wc.done)
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			if w.acked.Load() < w.sent.Load() {
				w.setErr(fmt.Errorf("writer: connection lost with publishes unanswered: %v", err))
			}
			return
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			w.setErr(fmt.Errorf("writer: %s %s", resp.Status, clip(body)))
			return
		}
		o, ok := fieldUint(body, field)
		wc.mu.Lock()
		if !ok || len(wc.fifo) == 0 {
			wc.mu.Unlock()
			w.setErr(fmt.Errorf("writer: unexpected reply %s", clip(body)))
			return
		}
		seq := wc.fifo[0]
		wc.fifo = wc.fifo[1:]
		wc.mu.Unlock()
		w.ack(wc, seq, o)
	}
}

// drain waits until every write sent is answered.
func (w *writer) drain(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for w.acked.Load() < w.sent.Load() {
		if err := w.failure(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("writer: %d writes unanswered after %v", w.sent.Load()-w.acked.Load(), timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
	return w.failure()
}

// burst writes n as fast as the window allows and waits for the replies.
// The window is shared out over the connections (--writers 8 --window 8:
// eight connections with a write in flight each, not eight writes queued
// on one): a node handles one connection's requests one at a time.
func (w *writer) burst(ctx context.Context, n int) error {
	for n > 0 {
		k := min(n, 100, max(1, cap(w.window)/len(w.conns)))
		if err := w.send(ctx, k); err != nil {
			return err
		}
		n -= k
	}
	return w.drain(ctx, w.e.cfg.timeout)
}

// pace writes at rate per second until stop is closed or limit writes
// were sent. A late tick (the load tool's own goroutines compete with
// the pacer for the CPU) catches up with at most 50 ms worth of writes (at
// least 4) at once; what it cannot catch up is given up and counted in
// skipped.
func (w *writer) pace(ctx context.Context, rate float64, limit int, stop <-chan struct{}) (skipped int64, err error) {
	burstMax := max(4, int64(rate*0.05))
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	var sent int64
	for sent < int64(limit) {
		select {
		case <-stop:
			return skipped, nil
		case <-ctx.Done():
			return skipped, ctx.Err()
		case <-timer.C:
		}
		if err := w.failure(); err != nil {
			return skipped, err
		}
		due := int64(time.Since(start).Seconds()*rate) + 1 - skipped - sent
		if due > burstMax {
			skipped += due - burstMax
			due = burstMax
		}
		due = min(due, int64(limit)-sent)
		if due > 0 {
			if err := w.send(ctx, int(due)); err != nil {
				return skipped, err
			}
			sent += due
		}
		next := start.Add(time.Duration(float64(sent+skipped) / rate * float64(time.Second)))
		timer.Reset(max(time.Until(next), 0))
	}
	return skipped, nil
}

// sleep waits d, or until the writer fails or ctx ends.
func (w *writer) sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return w.failure()
	case <-w.failed:
		return w.failure()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// position is the highest revision (offset) of room i acknowledged.
func (w *writer) position(i int) uint64 { return w.last[i].Load() }

func (w *writer) close() {
	for _, wc := range w.conns {
		if wc.ws != nil {
			w.e.pinger.remove(libConn{wc.ws})
			wc.ws.CloseNow()
		} else {
			wc.tcp.Close()
		}
		<-wc.done
	}
}
