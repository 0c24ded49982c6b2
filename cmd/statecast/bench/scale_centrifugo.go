package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// The scale scenario against Centrifugo (v6, github.com/centrifugal/centrifugo,
// built on github.com/centrifugal/centrifuge), --server centrifugo: the same
// connections, rooms and figures, the nodes being Centrifugo's with its
// Redis engine, history on and recovery and positioning forced for every
// channel (scale.sh writes that configuration). A room is a channel.
//
// Each connection speaks Centrifugo's JSON client protocol (v2) on
// /connection/websocket: commands and replies are JSON objects, several in
// a frame separated by '\n' (protocol's JSONStreamCommandDecoder and
// JSONDataEncoder). It sends, in one frame,
//
//	{"id":1,"connect":{}}
//	{"id":2,"subscribe":{"channel":"R"}}
//
// (the nodes run with client.insecure: no tokens), and on a reconnect
// {"id":2,"subscribe":{"channel":"R","recover":true,"offset":N,"epoch":"E"}}
// from its position. The server answers {"id":1,"connect":{…}} and
// {"id":2,"subscribe":{…,"epoch":"E","publications":[…],"recovered":true,
// "offset":N,"positioned":true,…}}; when recovered, "offset" is the one
// asked for and the publications missed since follow in the reply (the
// fields are those of protocol's SubscribeResult, omitted when empty). A
// publication arrives as {"push":{"channel":"R","pub":{"data":…,
// "offset":N}}} (the first of a stream also with its "epoch"); the server's application-level ping is {}, which the
// client answers with {} (centrifuge client.go: an id-less command is a
// pong, and one that answers no ping ends the connection). Centrifugo
// ends a connection with a WebSocket close code (centrifuge
// disconnect.go): 3000-3499 and 4000-4499 reconnect, 3500-3999 and
// 4500-4999 are terminal; a subscription it drops is a push
// {"push":{"channel":"R","unsubscribe":{"code":C}}}, resubscribed (with
// recovery) for C ≥ 2500.
//
// What is counted, as for statecast: ready (the subscribe answered),
// marked publications delivered (their data is the marked write's value,
// "mark:<seq>:<unix ns>") with their latency, gaps (a publication whose
// offset is not the last one's + 1), and on a resume after a loss how it
// resumed: recovered with the missed publications in the reply (as
// statecast's replay), recovered with nothing missed (synced), or not
// recovered (as statecast's snapshot: the client would reload its state
// elsewhere). There are no sessions: session figures stay 0, --lease is
// refused and leases reports no lease figures.

// centrifugoAPIKey is the HTTP API key of the Centrifugo nodes
// (http_api.key in the configuration scale.sh writes).
const centrifugoAPIKey = "bench"

// centrifugoServer says whether --server is centrifugo (else statecast)
// and refuses what that server has not.
func centrifugoServer(cfg *config) (bool, error) {
	switch cfg.server {
	case "", "statecast":
		return false, nil
	case "centrifugo":
		if cfg.lease {
			return true, errors.New("bench: --lease needs statecast's sessions: Centrifugo has no session-bound keys (leave --lease out with --server centrifugo)")
		}
		return true, nil
	}
	return false, fmt.Errorf("bench: --server must be statecast or centrifugo, not %q", cfg.server)
}

// cfWSURL is Centrifugo's WebSocket endpoint of node u (http://host:port).
func cfWSURL(u string) string {
	return "ws" + strings.TrimPrefix(strings.TrimRight(u, "/"), "http") + "/connection/websocket"
}

// Centrifugo's close codes that matter here (centrifuge disconnect.go).
const (
	cfCloseShutdown    = 3001 // the node is shutting down
	cfCloseServerError = 3004 // the node failed to serve the connection
)

// cfMoveOn says whether a connection that ended before it was ready
// should try the next node: the one it was on shuts down or failed it.
func cfMoveOn(err error) bool {
	switch websocket.CloseStatus(err) {
	case cfCloseShutdown, cfCloseServerError:
		return true
	}
	return false
}

// cfTerminal says whether close code code tells a client not to
// reconnect (centrifuge disconnect.go): the load tool did something the
// server refuses.
func cfTerminal(code websocket.StatusCode) bool {
	return code >= 3500 && code < 4000 || code >= 4500 && code < 5000
}

// cfDial opens a connection for c to node and sends connect and c's
// subscribe (recovering from its position, once it has one).
func (r *scaleRun) cfDial(c *scaleConn, node int) (*websocket.Conn, error) {
	// No subprotocol: JSON is the default (centrifuge handler_websocket.go),
	// and no Origin header, which Centrifugo's origin check lets through.
	b := make([]byte, 0, 192)
	b = append(b, `{"id":1,"connect":{}}`+"\n"...)
	return r.open(c, node, nil, r.cfSubRequest(c, b))
}

// cfSubRequest appends c's subscribe (id 2) to b: with recovery from its
// position once it has one.
func (r *scaleRun) cfSubRequest(c *scaleConn, b []byte) []byte {
	b = append(b, `{"id":2,"subscribe":{"channel":`...)
	b = strconv.AppendQuote(b, r.rooms[c.room])
	if c.based {
		b = append(b, `,"recover":true,"offset":`...)
		b = strconv.AppendUint(b, c.lastRev, 10)
		b = append(b, `,"epoch":`...)
		b = strconv.AppendQuote(b, c.epoch)
	}
	return append(b, "}}"...)
}

// cfAction is what the reader does after a server message.
type cfAction uint8

const (
	cfNone        cfAction = iota
	cfPong                 // answer the server's ping
	cfResubscribe          // send the subscribe again, recovering: the server dropped it
	cfRetry                // send the subscribe again after a pause: a temporary error
	cfEnd                  // end the connection and start over
)

var (
	cfPushPrefix = []byte(`{"push":`)
	cfPongMsg    = []byte(`{}`)
	cfTrue       = []byte(`true`)
)

// cfRead reads ws until it ends, and says why.
func (r *scaleRun) cfRead(c *scaleConn, ws *websocket.Conn) error {
	defer func() {
		c.mu.Lock()
		c.ws = nil
		c.mu.Unlock()
		ws.CloseNow()
	}()
	err := readLines(ws, func(line []byte, now int64) error {
		switch r.cfMessage(c, line, now) {
		case cfPong:
			return cfWrite(ws, cfPongMsg)
		case cfResubscribe:
			return cfWrite(ws, r.cfSubRequest(c, nil))
		case cfRetry:
			r.retryLater(c, ws, r.cfSubRequest(c, nil))
		case cfEnd:
			return errCfEnd
		}
		return nil
	})
	if cfTerminal(websocket.CloseStatus(err)) {
		r.fail("connection %d: the server closed it for good: %v", c.idx, err)
	}
	return err
}

var errCfEnd = errors.New("the server refused the connect or the subscribe, or dropped it")

// cfWrite sends one message on ws from its reader.
func cfWrite(ws *websocket.Conn, b []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return ws.Write(ctx, websocket.MessageText, b)
}

// cfMessage handles one server message (a Reply of Centrifugo's protocol)
// on c and says what the reader does next.
func (r *scaleRun) cfMessage(c *scaleConn, line []byte, now int64) cfAction {
	if len(line) == 2 && line[0] == '{' && line[1] == '}' {
		return cfPong
	}
	var push []byte
	if bytes.HasPrefix(line, cfPushPrefix) {
		push = line[len(cfPushPrefix):] // the server writes push alone
	} else {
		push = jsonMember(line, "push")
	}
	if push != nil {
		if pub := jsonMember(push, "pub"); pub != nil {
			r.cfPublication(c, pub, now)
			return cfNone
		}
		if u := jsonMember(push, "unsubscribe"); u != nil {
			if code, _ := leadingUint(jsonMember(u, "code")); code >= 2500 {
				// Insufficient state and the like: resubscribe from the
				// position, as the SDKs do.
				r.lost(c)
				c.subscribed = false
				return cfResubscribe
			}
			r.fail("connection %d: unsubscribed by the server: %s", c.idx, line)
			return cfEnd
		}
		if d := jsonMember(push, "disconnect"); d != nil {
			if code, _ := leadingUint(jsonMember(d, "code")); cfTerminal(websocket.StatusCode(code)) {
				r.fail("connection %d: disconnected by the server: %s", c.idx, line)
			}
			return cfEnd
		}
		return cfNone // join, leave, message…: none asked for
	}
	if e := jsonMember(line, "error"); e != nil {
		r.fail("connection %d: %s", c.idx, line)
		if id, _ := leadingUint(jsonMember(line, "id")); id == 2 && bytes.Equal(jsonMember(e, "temporary"), cfTrue) {
			// Tried again on this connection after a pause, as the SDKs do.
			return cfRetry
		}
		return cfEnd // refused for good: start over on a fresh connection
	}
	if sub := jsonMember(line, "subscribe"); sub != nil {
		r.cfSubscribed(c, sub, now)
	}
	return cfNone // the connect reply: nothing to keep
}

// cfSubscribed handles c's subscribe reply sub (a SubscribeResult).
func (r *scaleRun) cfSubscribed(c *scaleConn, sub []byte, now int64) {
	off, _ := leadingUint(jsonMember(sub, "offset"))
	kind := &r.bySnapshot
	if c.based && bytes.Equal(jsonMember(sub, "recovered"), cfTrue) {
		// Recovered: the offset is the one asked for, and the publications
		// missed since follow.
		if off != c.lastRev {
			r.gaps.Add(1)
			c.lastRev = off
		}
		pubs := jsonMember(sub, "publications")
		if len(pubs) > 0 && pubs[0] == '[' {
			b := pubs[1:]
			for len(b) > 0 && b[0] == '{' {
				n := skipJSON(b)
				c.replayed++
				r.cfPublication(c, b[:n], now)
				if b = b[n:]; len(b) > 0 && b[0] == ',' {
					b = b[1:]
				}
			}
		}
		kind = &r.bySynced
		if c.replayed > 0 {
			kind = &r.byReplay
		}
	} else {
		// Not recovered (or the first subscribe): positioned at the
		// stream's top, the publications before it lost to this client.
		c.lastRev = off
	}
	if e := jsonMember(sub, "epoch"); len(e) >= 2 && string(e[1:len(e)-1]) != c.epoch {
		c.epoch = string(e[1 : len(e)-1])
	}
	c.based, c.subscribed = true, true
	r.resumed(c, now, kind)
}

// cfPublication handles publication pub (a Publication) on c: its
// position, and the delivery of a marked write.
func (r *scaleRun) cfPublication(c *scaleConn, pub []byte, now int64) {
	if off, ok := leadingUint(jsonMember(pub, "offset")); ok {
		if c.based && off != c.lastRev+1 {
			r.gaps.Add(1)
		}
		c.lastRev, c.based = off, true
	}
	d := jsonMember(pub, "data")
	if !bytes.HasPrefix(d, markPrefix) {
		return
	}
	if _, sent, ok := markFields(d); ok {
		c.marks.Add(1)
		r.markCount.Add(1)
		r.mark.Record(time.Duration(now - sent))
	}
}

// jsonMember is the text of member name of the JSON object at the start
// of obj (nil if it has none): a member of the object itself, not of the
// values inside it. What follows the object is ignored.
func jsonMember(obj []byte, name string) []byte {
	if len(obj) == 0 || obj[0] != '{' {
		return nil
	}
	b := obj[1:]
	for {
		b = skipSpace(b)
		if len(b) == 0 || b[0] != '"' {
			return nil
		}
		k := skipJSON(b)
		if k < 2 {
			return nil
		}
		key := b[1 : k-1]
		if b = skipSpace(b[k:]); len(b) == 0 || b[0] != ':' {
			return nil
		}
		b = skipSpace(b[1:])
		n := skipJSON(b)
		if n == 0 {
			return nil
		}
		if string(key) == name {
			return b[:n]
		}
		if b = skipSpace(b[n:]); len(b) == 0 || b[0] != ',' {
			return nil
		}
		b = b[1:]
	}
}

// skipSpace is b past its leading JSON whitespace.
func skipSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\n' || b[0] == '\r') {
		b = b[1:]
	}
	return b
}

// runScaleMarkCentrifugo makes one marked publication to each of --rooms
// channels through Centrifugo's HTTP API (POST /api/publish, X-API-Key)
// of --url and the --sub-url nodes, markConns requests at a time, all
// stamped with the mark's start; a node that refuses the connection is
// left for the next.
func runScaleMarkCentrifugo(ctx context.Context, cfg *config, out io.Writer) error {
	urls := append([]string{cfg.url}, cfg.subURLs...)
	workers := min(markConns, cfg.rooms)
	hc := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: workers}}
	defer hc.CloseIdleConnections()
	// Every publication carries the mark's start, as statecast's marked
	// writes (sent in one frame a connection) do: the figure is from the
	// start of the mark until delivered, the sending of all included.
	first := time.Now()
	errs := make(chan error, workers)
	for k := range workers {
		go func() {
			node := k % len(urls)
			for i := k; i < cfg.rooms; i += workers {
				var err error
				for range urls {
					// Only a publication that was never sent is sent again
					// (a channel would get two).
					if err = cfPublish(ctx, hc, urls[node], scaleRoom(cfg.room, i), cfg.seq, first.UnixNano()); err == nil || !isDialError(err) {
						break
					}
					node = (node + 1) % len(urls)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	var werr error
	for range workers {
		if e := <-errs; e != nil && werr == nil {
			werr = e
		}
	}
	if werr != nil {
		return werr
	}
	return json.NewEncoder(out).Encode(map[string]any{"writes": cfg.rooms, "conns": workers, "sent_unix_ns": first.UnixNano(),
		"answered_ms": float64(time.Since(first)) / 1e6})
}

// cfPublish publishes the marked write seq, stamped sent, to channel
// through node base's HTTP API.
func cfPublish(ctx context.Context, hc *http.Client, base, channel string, seq int, sent int64) error {
	b := append([]byte(`{"channel":`), strconv.Quote(channel)...)
	b = append(b, `,"data":`...)
	b = append(b, markValue(uint64(seq), sent)...)
	b = append(b, '}')
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+"/api/publish", bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-API-Key", centrifugoAPIKey)
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || jsonMember(bytes.TrimSpace(body), "error") != nil {
		if len(body) > 300 {
			body = body[:300]
		}
		return fmt.Errorf("bench scale-mark: %s refused the publication to %s: %s: %s", base, channel, resp.Status, body)
	}
	return nil
}

// isDialError says whether err is a connection that could not be opened
// (nothing was sent).
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
