// Package ceiling is the reference broadcast server the load tool sets
// statecast's figures against (statecast bench ceiling): about the least a
// server must do to broadcast over WebSockets, so what statecast costs
// beyond it shows. It has no rooms, keys, auth or storage.
//
// Its design is the one of statecast's delivery path: a published message
// is encoded once and queued to every socket, and one writer goroutine per
// socket sends what is queued. A socket whose queue overflows is closed,
// so a slow reader never holds up publishers or the other sockets.
//
// The protocol, which the load tool speaks:
//
//	GET /ws[?since=O]  WebSocket: every message published while it is open,
//	                   as {"o":<offset>,"d":<payload>}; offsets start at 1 and
//	                   grow by 1. With since, the retained messages after
//	                   offset O come first, after a {"gap":true,"oldest":N}
//	                   line when some of them are no longer retained.
//	                   With Batch, the writer joins what is queued into one
//	                   text frame, messages separated by "\n"; without, each
//	                   message is a frame.
//	POST /publish      the body (JSON) is the payload; replies {"o":<offset>}.
//	GET /stats         counters, as JSON.
package ceiling

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/coder/websocket"
)

// maxPayload bounds the bytes of a published body.
const maxPayload = 1 << 20

// Config is the server's configuration; zero fields take the defaults.
type Config struct {
	Batch   bool // join the queued messages into one frame per write
	History int  // messages retained for ?since= (default 100,000)
	Queue   int  // messages a socket may have queued before it is closed (default 10,000)
	// MaxFrame bounds the bytes of a batch (default 1 MiB): a long replay
	// goes in several. statecast's frames are 64 KiB at most.
	MaxFrame int
}

// Server is the ceiling: an http.Handler. Close ends its sockets.
type Server struct {
	cfg    Config
	mux    *http.ServeMux
	ctx    context.Context // the sockets' parent: Close cancels it
	cancel context.CancelFunc
	wg     sync.WaitGroup // the sockets' handlers, which Close waits for

	mu     sync.Mutex // guards the fields below; lock order: docs/LOCKS.md
	last   uint64     // offset of the last message published
	ring   [][]byte   // the last History messages: offset o at ring[(o-1)%History]
	conns  map[*conn]struct{}
	closed bool

	delivered atomic.Uint64 // messages written to sockets
	frames    atomic.Uint64 // WebSocket messages written (with Batch, many messages each)
	dropped   atomic.Uint64 // sockets closed for letting their queue overflow
}

// conn is one socket's queue, filled by publishers and emptied by its
// writer.
type conn struct {
	cancel context.CancelFunc // closes the socket: Close, or an overflow
	wake   chan struct{}      // holds a token when something was queued

	mu    sync.Mutex // guards queue
	queue [][]byte   // encoded messages, shared with the ring and other sockets
}

// New returns a server with cfg.
func New(cfg Config) *Server {
	if cfg.History <= 0 {
		cfg.History = 100_000
	}
	if cfg.Queue <= 0 {
		cfg.Queue = 10_000
	}
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = 1 << 20
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), conns: map[*conn]struct{}{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.mux.HandleFunc("GET /ws", s.serveWS)
	s.mux.HandleFunc("POST /publish", s.servePublish)
	s.mux.HandleFunc("GET /stats", s.serveStats)
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close closes every socket and waits for their goroutines; new sockets
// and publishes are refused. The http.Server serving s is the caller's to
// shut down (it does not wait for WebSockets, which it no longer owns).
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}

func (s *Server) servePublish(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxPayload))
	if err != nil {
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	// Compacting checks the payload is JSON and takes out the newlines a
	// batch uses to separate messages.
	var d bytes.Buffer
	if err := json.Compact(&d, body); err != nil {
		http.Error(w, "the body must be JSON: "+err.Error(), http.StatusBadRequest)
		return
	}
	o, ok := s.publish(d.Bytes())
	if !ok {
		http.Error(w, "closed", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(strconv.AppendUint([]byte(`{"o":`), o, 10), '}'))
}

// publish encodes payload once as the next offset's message, retains it
// and queues it to every socket, closing those whose queue is full. It
// never waits for a socket.
func (s *Server) publish(payload []byte) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, false
	}
	s.last++
	// Built under the lock, which gives the offset and the order: every
	// queue holds the messages in offset order.
	m := make([]byte, 0, len(payload)+32)
	m = strconv.AppendUint(append(m, `{"o":`...), s.last, 10)
	m = append(append(append(m, `,"d":`...), payload...), '}')
	if len(s.ring) < s.cfg.History {
		s.ring = append(s.ring, m)
	} else {
		s.ring[(s.last-1)%uint64(s.cfg.History)] = m
	}
	for c := range s.conns {
		if !c.push(m, s.cfg.Queue) {
			delete(s.conns, c)
			s.dropped.Add(1)
			c.cancel()
		}
	}
	return s.last, true
}

// push queues m; false when the queue is full: the socket is too slow.
func (c *conn) push(m []byte, limit int) bool {
	c.mu.Lock()
	if len(c.queue) >= limit {
		c.mu.Unlock()
		return false
	}
	c.queue = append(c.queue, m)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default: // the writer is already woken
	}
	return true
}

// replayLocked is what a socket asking for the messages after offset since
// gets first: those still retained, after a gap line if some are not.
func (s *Server) replayLocked(since uint64) [][]byte {
	if since >= s.last {
		return nil
	}
	oldest := s.last - uint64(len(s.ring)) + 1
	var out [][]byte
	if since+1 < oldest {
		gap := strconv.AppendUint([]byte(`{"gap":true,"oldest":`), oldest, 10)
		out = append(out, append(gap, '}'))
		since = oldest - 1
	}
	h := uint64(s.cfg.History)
	for o := since + 1; o <= s.last; o++ {
		out = append(out, s.ring[(o-1)%h])
	}
	return out
}

func (s *Server) serveWS(w http.ResponseWriter, r *http.Request) {
	var since uint64
	replay := r.URL.Query().Has("since")
	if replay {
		var err error
		if since, err = strconv.ParseUint(r.URL.Query().Get("since"), 10, 64); err != nil {
			http.Error(w, "since must be an offset", http.StatusBadRequest)
			return
		}
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return // Accept has answered
	}
	ctx, cancel := context.WithCancel(s.ctx)
	c := &conn{cancel: cancel, wake: make(chan struct{}, 1)}
	// The replay and joining the publishers' set happen under one lock:
	// each message comes either in the replay or in the queue, once.
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		cancel()
		ws.CloseNow()
		return
	}
	var backlog [][]byte
	if replay {
		backlog = s.replayLocked(since)
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		cancel()
		ws.CloseNow() // waits for CloseRead's goroutine
	}()
	// Clients send nothing: CloseRead's reader answers pings and ends ctx
	// when the client goes away (a data message closes the socket).
	s.write(ws.CloseRead(ctx), ws, c, backlog)
}

// write is the socket's writer: the backlog, then what publishers queue,
// until ctx ends (the client left, an overflow, Close) or a write fails.
// Ending ctx also cuts a write blocked on a full socket.
func (s *Server) write(ctx context.Context, ws *websocket.Conn, c *conn, backlog [][]byte) {
	var buf []byte
	send := func(msgs [][]byte) error {
		for len(msgs) > 0 {
			n, frame := 1, msgs[0]
			if s.cfg.Batch {
				buf = append(buf[:0], msgs[0]...)
				for n < len(msgs) && len(buf)+1+len(msgs[n]) <= s.cfg.MaxFrame {
					buf = append(append(buf, '\n'), msgs[n]...)
					n++
				}
				frame = buf
			}
			if err := ws.Write(ctx, websocket.MessageText, frame); err != nil {
				return err
			}
			s.delivered.Add(uint64(n))
			s.frames.Add(1)
			msgs = msgs[n:]
		}
		if cap(buf) > 64<<10 {
			buf = nil // an idle socket keeps no replay-sized buffer
		}
		return nil
	}
	if send(backlog) != nil {
		return
	}
	var spare [][]byte // two queues alternate: publishers fill one while this sends the other
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		}
		c.mu.Lock()
		msgs := c.queue
		c.queue = spare[:0]
		c.mu.Unlock()
		if send(msgs) != nil {
			return
		}
		clear(msgs) // let messages that left the ring be collected
		spare = msgs
	}
}

// Stats are the server's counters (GET /stats).
type Stats struct {
	Connections int    `json:"connections"`
	Published   uint64 `json:"published"`
	LastOffset  uint64 `json:"last_offset"` // = Published: what the load tool reads
	Delivered   uint64 `json:"delivered"`   // messages written to sockets
	Frames      uint64 `json:"frames"`      // WebSocket messages written: Delivered/Frames messages a frame
	Dropped     uint64 `json:"dropped"`     // sockets closed as slow consumers
}

// Stats returns the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	st := Stats{Connections: len(s.conns), Published: s.last, LastOffset: s.last}
	s.mu.Unlock()
	st.Delivered, st.Frames, st.Dropped = s.delivered.Load(), s.frames.Load(), s.dropped.Load()
	return st
}

func (s *Server) serveStats(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s.Stats())
}
