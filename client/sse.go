package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/statecast/statecast/server/wire"
)

// SSEEvent is one Server-Sent Event of a watch.
type SSEEvent struct {
	ID    string // the revision, for every event but error
	Event string // put, delete, leave, txn, coalesced, reset, synced, progress or error
	Data  []byte // JSON; multi-line data is joined with '\n'
}

// Message decodes the event as the WebSocket message it stands for, so a
// View can apply it: put, delete and txn are events, coalesced is
// coalesced, reset is a snapshot, synced and progress are themselves,
// and error is err.
func (e SSEEvent) Message() (wire.Message, error) {
	var m wire.Message
	if err := json.Unmarshal(e.Data, &m); err != nil {
		return m, fmt.Errorf("client: SSE %s event: %w", e.Event, err)
	}
	switch e.Event {
	case "put", "delete", "leave", "txn":
		m.T = wire.TEvents
	case "coalesced":
		m.T = wire.TCoalesced
	case "reset":
		m.T = wire.TSnapshot
	case "synced", "progress":
		m.T = e.Event
	case "error":
		m.T = wire.TErr
	default:
		return m, fmt.Errorf("client: unknown SSE event %q", e.Event)
	}
	return m, nil
}

// errStop carries an error returned by the caller's fn out of a stream.
type errStop struct{ err error }

func (e errStop) Error() string { return e.err.Error() }

// Watch streams room's changes under prefixes (none: the whole room) as
// Server-Sent Events, calling fn for each, from revision from (0: a reset
// with the current state first, then live). When the stream breaks after
// it was established it reconnects, as EventSource does, resuming after
// the last event id (in the epoch of the last reset), so fn sees no gap
// and no duplicate. It returns fn's error, ctx's, or the error that
// prevented (re)connecting: an *Error for a refused request.
func (h *HTTP) Watch(ctx context.Context, room string, prefixes []string, from uint64, fn func(SSEEvent) error) error {
	return h.WatchWith(ctx, room, WatchOptions{Prefixes: prefixes, From: from}, fn)
}

// WatchOptions say what a watch covers and where it starts.
type WatchOptions struct {
	Prefixes []string // none (and no Keys): the whole room
	Keys     []string // exact keys besides: a key they only start is not sent
	// Filter narrows the keys to those whose value passes this CEL
	// expression; a key that stops passing arrives as a "leave" event.
	Filter string
	From   uint64 // 0: the current state first, then live
}

// WatchWith is Watch with a filter.
func (h *HTTP) WatchWith(ctx context.Context, room string, o WatchOptions, fn func(SSEEvent) error) error {
	w := &sseWatch{h: h, room: room, prefixes: o.Prefixes, keys: o.Keys, filter: o.Filter, from: o.From, fn: fn, retry: time.Second}
	fails := 0 // consecutive requests that were not accepted
	for {
		established, err := w.stream(ctx)
		var stop errStop
		switch {
		case errors.As(err, &stop):
			return stop.err
		case ctx.Err() != nil:
			return ctx.Err()
		case !established && (!w.reconnecting || !retryable(err)):
			return err // say at once why the server refuses
		}
		w.reconnecting = true
		if established {
			fails = 0
		} else {
			fails++
		}
		t := time.NewTimer(min(w.retry<<min(fails, 5), 30*time.Second))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// retryable: the server may be back soon (restarting, overloaded,
// unreachable); any other refusal will not change by itself.
func retryable(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Code == wire.CodeUnavailable || e.Code == wire.CodeRateLimited || e.Code == wire.CodeInternal
	}
	return true
}

type sseWatch struct {
	h            *HTTP
	room         string
	prefixes     []string
	keys         []string
	filter       string
	from         uint64
	fn           func(SSEEvent) error
	retry        time.Duration
	lastID       string // the last event id received
	epoch        string // of the last reset: the epoch lastID belongs to
	reconnecting bool
}

// sseIdleTimeout drops a stream that received nothing, not even the
// server's keepalive comment (every 15 s), for this long: a connection
// that died silently (a phone changing networks) is then resumed
// instead of hanging forever.
const sseIdleTimeout = time.Minute

// stream runs one request; established reports whether the server
// accepted it (200), so a later failure is worth a reconnect.
func (w *sseWatch) stream(ctx context.Context) (established bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	idle := time.AfterFunc(sseIdleTimeout, cancel)
	defer idle.Stop()
	q := url.Values{}
	for _, k := range w.keys {
		q.Add("key", k)
	}
	for _, p := range w.prefixes {
		q.Add("prefix", p)
	}
	if w.filter != "" {
		q.Set("filter", w.filter)
	}
	if w.lastID == "" && w.from > 0 {
		q.Set("from", strconv.FormatUint(w.from, 10))
	}
	if w.epoch != "" {
		q.Set("epoch", w.epoch)
	}
	req, err := w.h.request(ctx, http.MethodGet, roomPath(w.room, "watch"), q, nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("Accept", "text/event-stream")
	if w.lastID != "" {
		req.Header.Set("Last-Event-ID", w.lastID)
	}
	resp, err := w.h.client().Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, httpError(resp)
	}
	body := &idleReader{r: resp.Body, idle: idle}
	return true, readSSE(body, func(ev SSEEvent, retry time.Duration) error {
		if retry > 0 {
			w.retry = retry
		}
		if ev.ID != "" {
			w.lastID = ev.ID
		}
		if ev.Event == "reset" {
			var r struct {
				Epoch string `json:"epoch"`
			}
			if json.Unmarshal(ev.Data, &r) == nil {
				w.epoch = r.Epoch
			}
		}
		if err := w.fn(ev); err != nil {
			return errStop{err}
		}
		return nil
	})
}

// idleReader restarts the idle timer whenever bytes arrive.
type idleReader struct {
	r    io.Reader
	idle *time.Timer
}

func (r *idleReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.idle.Reset(sseIdleTimeout)
	}
	return n, err
}

// readSSE parses an event stream (the WHATWG format, lines ending in LF or
// CRLF) and calls fn per event, with the stream's retry time when one was
// given. It returns fn's error or the read error (io.EOF at the end).
func readSSE(r io.Reader, fn func(SSEEvent, time.Duration) error) error {
	br := bufio.NewReaderSize(r, 32<<10)
	var ev SSEEvent
	var data []byte
	var hasData bool
	var retry time.Duration
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull { // a long line (a big reset): gather it
			long := append([]byte(nil), line...)
			for err == bufio.ErrBufferFull {
				line, err = br.ReadSlice('\n')
				long = append(long, line...)
			}
			line = long
		}
		if err != nil {
			return err // an event not ended by a blank line is dropped
		}
		line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
		if len(line) == 0 { // a blank line dispatches the event
			if hasData {
				if ev.Event == "" {
					ev.Event = "message"
				}
				ev.Data = data
				if err := fn(ev, retry); err != nil {
					return err
				}
			}
			ev, data, hasData = SSEEvent{}, nil, false
			continue
		}
		if line[0] == ':' { // a comment (keepalive)
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "id":
			ev.ID = string(value)
		case "event":
			ev.Event = string(value)
		case "data":
			if hasData {
				data = append(data, '\n')
			}
			data = append(data, value...)
			hasData = true
		case "retry":
			if ms, err := strconv.ParseUint(string(value), 10, 32); err == nil {
				retry = time.Duration(ms) * time.Millisecond
			}
		}
	}
}
