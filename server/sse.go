package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// Watching over Server-Sent Events. Each message of the watcher is one
// SSE event whose id is its revision, so a browser's EventSource resumes
// by itself: it reconnects with Last-Event-ID = the last revision it got,
// and the watch restarts at the next one (replay, then synced; or a reset
// when that history is gone).

// sseTiming paces a stream's housekeeping. Tests use short intervals.
type sseTiming struct {
	keepAlive time.Duration // send a comment line after this long without writing
	poll      time.Duration // how often an idle stream checks for server shutdown
}

var defaultSSETiming = sseTiming{keepAlive: 15 * time.Second, poll: time.Second}

// sseFlushBytes bounds how much a stream batches into one write.
const sseFlushBytes = 256 << 10

func (s *Server) handleWatch(c echo.Context) error { return s.watchSSE(c, defaultSSETiming) }

func (s *Server) watchSSE(c echo.Context, tm sseTiming) error {
	// The connect: asking the connect hook, compiling the filter, loading
	// or resuming the room (admit.go).
	leave, ok := s.connects.enterFrom(c.Request().Context(), c.Request().RemoteAddr)
	if !ok {
		return s.refuseConnect(c)
	}
	connecting := true
	doneConnecting := func() {
		if connecting {
			connecting = false
			leave()
		}
	}
	defer doneConnecting()
	claims, err := s.httpClaims(c, true)
	if err != nil {
		return err
	}
	if s.draining.Load() {
		return newError(wire.CodeUnavailable, "server is shutting down; watch on another node")
	}
	room, _, err := s.httpTarget(c, false)
	if err != nil {
		return err
	}
	prefixes, keys := c.QueryParams()["prefix"], c.QueryParams()["key"]
	if err := s.checkWatch(claims, room, prefixes, keys); err != nil {
		return err
	}
	from, err := watchFrom(c)
	if err != nil {
		return err
	}
	f, err := s.compileFilter(c.QueryParam("filter"))
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	wctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
	w, err := s.engine.Watch(wctx, room, rooms.WatchOptions{Prefixes: prefixes, Keys: keys, Filter: f, From: from})
	cancel()
	doneConnecting()
	if err != nil {
		if ctx.Err() != nil {
			return nil // the client went away
		}
		return readError(err)
	}
	defer w.Close()
	s.metrics.countStart(from)
	s.metrics.subscriptions.Inc()
	defer s.metrics.subscriptions.Dec()

	h := c.Response().Header()
	h.Set(echo.HeaderContentType, "text/event-stream")
	h.Set(echo.HeaderCacheControl, "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	c.Response().WriteHeader(http.StatusOK)
	st := &sseStream{s: s, c: c, rc: http.NewResponseController(c.Response()), id: s.connSeq.Add(1), subject: claims.Subject}
	if s.authEnabled() {
		st.expires = s.validUntil(claims) // as a WebSocket session ends (4002)
	}
	defer s.streaming(c.Request())()
	if st.flush() != nil { // headers now, so the client sees the stream open
		return nil
	}
	st.run(ctx, w, tm)
	return nil
}

// watchFrom reads the resume position: Last-Event-ID (the last revision
// received) wins over from (the first revision wanted), which must be
// a revision all the same; epoch names the epoch either belongs to,
// absent meaning the room's current one.
func watchFrom(c echo.Context) (*rooms.Position, error) {
	epoch := c.QueryParam("epoch")
	var from *rooms.Position
	if f := c.QueryParam("from"); f != "" {
		rev, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return nil, newError(wire.CodeBadRequest, "from must be a revision (an unsigned integer)")
		}
		// Revision 0 holds no events: from=0 is from=1, the whole history.
		from = &rooms.Position{Epoch: epoch, Rev: max(rev, 1)}
	}
	if id := c.Request().Header.Get("Last-Event-ID"); id != "" {
		rev, err := strconv.ParseUint(strings.TrimSpace(id), 10, 64)
		if err != nil || rev == math.MaxUint64 {
			return nil, newError(wire.CodeBadRequest, "Last-Event-ID must be a revision (an unsigned integer)")
		}
		from = &rooms.Position{Epoch: epoch, Rev: rev + 1}
	}
	return from, nil
}

type sseStream struct {
	s       *Server
	c       echo.Context
	rc      *http.ResponseController
	id      uint64 // the stream's number in the node's logs, as a WebSocket's
	subject string
	buf     []byte
	last    time.Time // of the last write
	// expires is when the stream's token stops being valid; zero without
	// auth. The stream ends then, as a WebSocket session does.
	expires time.Time
}

// run copies the watcher's messages to the stream until the client goes
// away, the watcher ends or the server shuts down. Everything available
// goes out in one write and one flush.
func (st *sseStream) run(ctx context.Context, w *rooms.Watcher, tm sseTiming) {
	tick := time.NewTicker(tm.poll)
	defer tick.Stop()
	var expired <-chan time.Time
	if !st.expires.IsZero() {
		t := time.NewTimer(time.Until(st.expires))
		defer t.Stop()
		expired = t.C
	}
	var msgs []rooms.Message
	for {
		var err error
		msgs, err = w.Drain(msgs[:0])
		if len(msgs) > 0 {
			st.s.metrics.countDelivered(msgs)
			for i := range msgs {
				if encErr := st.appendMessage(&msgs[i]); encErr != nil && err == nil {
					err = encErr
				}
			}
			clear(msgs) // do not pin changes and snapshots while idle
			if err == nil && len(st.buf) < sseFlushBytes {
				continue // batch whatever else is ready into this write
			}
		}
		if len(st.buf) > 0 && st.flush() != nil {
			return
		}
		if err != nil {
			st.fail(err)
			return
		}
		if len(msgs) > 0 {
			continue // flushed a full buffer; more may be ready
		}
		select {
		case <-w.Ready():
		case <-ctx.Done():
			return
		case <-expired:
			st.fail(newError(wire.CodeUnauthorized, "token expired; watch again with a new token from your last revision"))
			return
		case <-tick.C:
			if st.s.draining.Load() {
				st.fail(newError(wire.CodeUnavailable, "server is shutting down; resume on another node"))
				return
			}
			if time.Since(st.last) >= tm.keepAlive {
				st.buf = append(st.buf, ": keepalive\n\n"...)
				if st.flush() != nil {
					return
				}
			}
		}
	}
}

type sseReset struct {
	Epoch  string      `json:"epoch"`
	Rev    uint64      `json:"rev"`
	Reason string      `json:"reason"`
	Items  []wire.Item `json:"items"`
}

// appendMessage appends one watcher message as one SSE event.
func (st *sseStream) appendMessage(m *rooms.Message) error {
	switch m.Kind {
	case rooms.KindEvents, rooms.KindCoalesced:
		name := "coalesced"
		if m.Kind == rooms.KindEvents {
			name = "txn"
			if evs := m.Change.Events; len(evs) == 1 {
				name = wireEventType(evs[0], m.Change.Filtered)
			}
		}
		// The JSON event list is encoded once per revision and shared with
		// every WebSocket and SSE watcher that gets the whole revision. A
		// large one is written as it is, after what the buffer holds: a
		// stream whose client reads slowly holds the shared list while it
		// writes, not a copy of it.
		list := m.Change.Encoded(codecSlot(wire.JSON), encoders[codecSlot(wire.JSON)])
		st.head(m.Rev, name)
		st.buf = append(st.buf, `{"rev":`...)
		st.buf = strconv.AppendUint(st.buf, m.Rev, 10)
		st.buf = append(st.buf, `,"events":`...)
		if len(list) < pieceList {
			st.buf = append(st.buf, list...)
		} else {
			if err := st.write(st.buf); err != nil {
				return err
			}
			st.buf = st.buf[:0]
			if err := st.write(list); err != nil {
				return err
			}
		}
		st.buf = append(st.buf, "}\n\n"...)
	case rooms.KindSnapshot:
		if m.Snap != nil {
			return st.appendReset(m)
		}
		data, err := compactJSON(sseReset{Epoch: m.Epoch, Rev: m.Rev, Reason: m.Reason.String(), Items: wireItems(m.Items)})
		if err != nil {
			return err
		}
		st.head(m.Rev, "reset")
		st.buf = append(st.buf, data...)
		st.buf = append(st.buf, "\n\n"...)
	case rooms.KindSynced, rooms.KindProgress:
		st.head(m.Rev, m.Kind.String())
		st.buf = append(st.buf, `{"rev":`...)
		st.buf = strconv.AppendUint(st.buf, m.Rev, 10)
		st.buf = append(st.buf, "}\n\n"...)
	}
	return nil
}

// appendReset appends a reset event from the snapshot's shared encoding
// (v1's JSON items, which a reset carries): pieces that do not fit the
// buffer are written to the client as they are, so a stream's reset
// costs it its buffer, not a copy of the room.
func (st *sseStream) appendReset(m *rooms.Message) error {
	pieces := m.Snap.Encoded(codecSlot(wire.JSON), snapshotEncoders[codecSlot(wire.JSON)])
	if pieces == nil {
		return errors.New("server: cannot encode a snapshot")
	}
	head, err := compactJSON(sseReset{Epoch: m.Epoch, Rev: m.Rev, Reason: m.Reason.String(), Items: []wire.Item{}})
	if err != nil {
		return err
	}
	st.head(m.Rev, "reset")
	st.buf = append(st.buf, head[:len(head)-2]...) // up to the items' "["
	for _, p := range pieces {
		if len(st.buf)+len(p) <= sseFlushBytes {
			st.buf = append(st.buf, p...)
			continue
		}
		if err := st.write(st.buf); err != nil {
			return err
		}
		st.buf = st.buf[:0]
		if err := st.write(p); err != nil {
			return err
		}
	}
	st.buf = append(st.buf, "]}\n\n"...)
	return nil
}

// write writes p to the client within the write timeout.
func (st *sseStream) write(p []byte) error {
	// Recorders and some wrappers cannot set deadlines; they do not block.
	if err := st.rc.SetWriteDeadline(time.Now().Add(st.s.cfg.WriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	_, err := st.c.Response().Write(p)
	return err
}

func wireEventType(ev store.Event, filtered bool) string {
	switch {
	case ev.Type == store.OpPut:
		return "put"
	case filtered:
		return "leave"
	}
	return "delete"
}

// head appends an event's id and name and opens its data line. Data is
// compact JSON, which never holds a raw line break.
func (st *sseStream) head(rev uint64, name string) {
	st.buf = append(st.buf, "id: "...)
	st.buf = strconv.AppendUint(st.buf, rev, 10)
	st.buf = append(st.buf, "\nevent: "...)
	st.buf = append(st.buf, name...)
	st.buf = append(st.buf, "\ndata: "...)
}

// compactJSON encodes v without HTML escaping, so values keep their text.
func compactJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// fail ends the stream with an error event saying why.
func (st *sseStream) fail(err error) {
	var e *Error
	switch {
	case errors.As(err, &e):
	case errors.Is(err, rooms.ErrFilterTooSlow):
		e = filterTooSlow()
	case errors.Is(err, rooms.ErrRoomReset):
		e = newError(wire.CodeUnavailable, "room reset; reconnect to resume")
	case isUnavailable(err):
		e = newError(wire.CodeUnavailable, "server is shutting down; resume on another node")
	default:
		st.s.log.Warn("server: SSE watch failed", append(httpAttrs(st.c), "conn", connName(st.id), "subject", st.subject, "err", err)...)
		e = newError(wire.CodeInternal, "internal error")
	}
	data, _ := compactJSON(struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}{e.Code, e.Message})
	st.buf = fmt.Appendf(st.buf, "event: error\ndata: %s\n\n", data)
	_ = st.flush()
}

// flush writes the buffer and pushes it to the client. A client that does
// not take it within the write timeout is dropped; it resumes with
// Last-Event-ID on its next connection.
func (st *sseStream) flush() error {
	if err := st.write(st.buf); err != nil {
		return err
	}
	st.last = time.Now()
	if cap(st.buf) > sseFlushBytes {
		st.buf = nil // do not keep a snapshot's buffer on an idle stream
	} else {
		st.buf = st.buf[:0]
	}
	return st.rc.Flush()
}
