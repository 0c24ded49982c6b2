package server_test

// Integration tests of the WebSocket server over real sockets on loopback:
// servertest.Start runs a node (a real store, room engine and server,
// served as statecast serve serves it), and the tests speak protocol v1
// (PROTOCOL.md) through the client package or, where the bytes on the
// wire matter, through a raw coder/websocket connection. This file holds
// TestMain and the helpers;
// ws_test.go covers the messages, resume and leases, ws_auth_test.go the
// tokens, ws_limits_test.go the limits and close codes.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
)

// Every connection's reader, writer and timers, the lease keeper and the
// engine must end with Shutdown and Close: nothing may outlive the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var codecs = []string{"json", "msgpack", "json2"}

// dial connects through the client package and closes the connection
// when the test ends.
func dial(t testing.TB, e *servertest.Node, o *client.Options) *client.Conn {
	t.Helper()
	c, err := client.Dial(servertest.Context(t), e.WS, o)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func dialCodec(t testing.TB, e *servertest.Node, codec string) *client.Conn {
	t.Helper()
	return dial(t, e, &client.Options{Codec: codec})
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitDone waits for a client connection to end and returns its close code.
func waitDone(t testing.TB, c *client.Conn, timeout time.Duration) int {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(timeout):
		t.Fatalf("the connection is still open after %v", timeout)
	}
	return client.CloseCode(c.Err())
}

// nextMsg returns the next message of a subscription.
func nextMsg(t testing.TB, s *client.Subscription) wire.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return m
}

// applyUntil applies the subscription's messages to v until one satisfies
// stop (checking the revision contract on each), and returns them.
func applyUntil(t testing.TB, s *client.Subscription, v *client.View, stop func(wire.Message) bool) []wire.Message {
	t.Helper()
	var got []wire.Message
	for {
		m := nextMsg(t, s)
		if err := v.Apply(m); err != nil {
			t.Fatalf("%v (after %s)", err, describe(got))
		}
		got = append(got, m)
		if stop(m) {
			return got
		}
	}
}

// describe lists messages as t@rev, for failure messages.
func describe(msgs []wire.Message) string {
	var b strings.Builder
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s@%d", m.T, m.Rev)
		if m.Reason != "" {
			fmt.Fprintf(&b, "(%s)", m.Reason)
		}
	}
	return b.String()
}

// rawConn is a WebSocket speaking protocol v1 without the client package:
// for tests of the bytes on the wire, of misbehaving peers and of sockets
// that stop reading.
type rawConn struct {
	t     testing.TB
	ws    *websocket.Conn
	codec wire.Codec
	q     []rawMsg
}

// rawMsg is one decoded server message, also as a generic map so tests
// can check which fields are present.
type rawMsg struct {
	wire.Message
	Raw map[string]any
}

func (m rawMsg) has(field string) bool { _, ok := m.Raw[field]; return ok }

type rawOpts struct {
	Subprotocols []string // default: the codec's
	Header       http.Header
	ReadBuffer   int // >0: the socket's receive buffer, to make it fill fast
}

func codecByName(t testing.TB, name string) wire.Codec {
	c, ok := map[string]wire.Codec{"json": wire.JSON, "msgpack": wire.Msgpack, "json2": wire.JSON2}[name]
	if !ok {
		t.Fatalf("no codec %q", name)
	}
	return c
}

// dialRawResp opens a raw WebSocket; it returns the upgrade's response and
// error instead of failing, for tests of refused upgrades.
func dialRawResp(t testing.TB, e *servertest.Node, codec string, o rawOpts) (*rawConn, *http.Response, error) {
	t.Helper()
	cd := codecByName(t, codec)
	protos := o.Subprotocols
	if protos == nil {
		protos = []string{cd.Subprotocol()}
	}
	dopts := &websocket.DialOptions{Subprotocols: protos, HTTPHeader: o.Header}
	if o.ReadBuffer > 0 {
		tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err == nil {
				_ = c.(*net.TCPConn).SetReadBuffer(o.ReadBuffer)
			}
			return c, err
		}}
		t.Cleanup(tr.CloseIdleConnections)
		dopts.HTTPClient = &http.Client{Transport: tr}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, e.WS, dopts)
	if err != nil {
		return nil, resp, err
	}
	ws.SetReadLimit(-1)
	r := &rawConn{t: t, ws: ws, codec: cd}
	t.Cleanup(func() { _ = ws.CloseNow() })
	return r, resp, nil
}

func dialRaw(t testing.TB, e *servertest.Node, codec string) *rawConn {
	t.Helper()
	r, _, err := dialRawResp(t, e, codec, rawOpts{})
	if err != nil {
		t.Fatalf("raw dial: %v", err)
	}
	return r
}

// connectRaw dials and sends connect, returning the connected message.
func connectRaw(t testing.TB, e *servertest.Node, codec string) (*rawConn, rawMsg) {
	t.Helper()
	r := dialRaw(t, e, codec)
	r.send(&wire.Request{T: wire.TConnect})
	m := r.next()
	if m.T != wire.TConnected {
		t.Fatalf("first message %+v, want connected", m)
	}
	return r, m
}

// send writes msgs in one frame.
func (r *rawConn) send(msgs ...any) {
	r.t.Helper()
	var b []byte
	for _, m := range msgs {
		var err error
		if b, err = r.codec.Append(b, m); err != nil {
			r.t.Fatalf("encode %T: %v", m, err)
		}
	}
	r.sendBytes(b)
}

func (r *rawConn) sendBytes(b []byte) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.ws.Write(ctx, r.codec.MessageType(), b); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

// read returns the next message, or the read error (the close status).
func (r *rawConn) read(timeout time.Duration) (rawMsg, error) {
	r.t.Helper()
	if len(r.q) == 0 {
		// A read whose context ends closes the socket: only tests that
		// fail anyway may run into the timeout.
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		typ, data, err := r.ws.Read(ctx)
		if err != nil {
			return rawMsg{}, err
		}
		if typ != r.codec.MessageType() {
			r.t.Fatalf("frame of type %v, want %v", typ, r.codec.MessageType())
		}
		msgs, err := r.codec.DecodeMessages(data)
		if err != nil {
			r.t.Fatalf("decode %q: %v", data, err)
		}
		raws := rawMaps(r.t, r.codec, data)
		if len(raws) != len(msgs) {
			r.t.Fatalf("%d messages but %d maps in %q", len(msgs), len(raws), data)
		}
		for i := range msgs {
			r.q = append(r.q, rawMsg{msgs[i], raws[i]})
		}
	}
	m := r.q[0]
	r.q = r.q[1:]
	return m, nil
}

// next returns the next message, failing the test on a read error.
func (r *rawConn) next() rawMsg {
	r.t.Helper()
	m, err := r.read(10 * time.Second)
	if err != nil {
		r.t.Fatalf("read: %v", err)
	}
	return m
}

// until reads messages until one satisfies stop; it returns all of them.
func (r *rawConn) until(stop func(rawMsg) bool) []rawMsg {
	r.t.Helper()
	var got []rawMsg
	for {
		m := r.next()
		got = append(got, m)
		if stop(m) {
			return got
		}
	}
}

// reply reads until the ok or err of request id.
func (r *rawConn) reply(id uint64) rawMsg {
	r.t.Helper()
	msgs := r.until(func(m rawMsg) bool { return (m.T == wire.TOK || m.T == wire.TErr) && m.ID == id })
	return msgs[len(msgs)-1]
}

// closeStatus reads until the socket ends and returns its close status
// (-1: dropped without a close frame), with the messages read meanwhile.
func (r *rawConn) closeStatus(timeout time.Duration) (websocket.StatusCode, []rawMsg) {
	r.t.Helper()
	var got []rawMsg
	deadline := time.Now().Add(timeout)
	for {
		m, err := r.read(time.Until(deadline))
		if err != nil {
			if time.Now().After(deadline) {
				r.t.Fatalf("the socket is still open after %v (%v)", timeout, err)
			}
			return websocket.CloseStatus(err), got
		}
		got = append(got, m)
	}
}

// rawMaps decodes each message of a server frame as a generic map.
func rawMaps(t testing.TB, cd wire.Codec, frame []byte) []map[string]any {
	var out []map[string]any
	if cd == wire.JSON || cd == wire.JSON2 {
		for _, line := range bytes.Split(frame, []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			d := json.NewDecoder(bytes.NewReader(line))
			d.UseNumber()
			var m map[string]any
			if err := d.Decode(&m); err != nil {
				t.Fatalf("message %q is not a JSON object: %v", line, err)
			}
			out = append(out, m)
		}
		return out
	}
	d := msgpack.NewDecoder(bytes.NewReader(frame))
	for {
		m, err := d.DecodeMap()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("msgpack message: %v", err)
		}
		out = append(out, m)
	}
}

func u64(n uint64) *uint64 { return &n }
