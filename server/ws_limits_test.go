package server_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
)

// bystander is a connection on the same server as a misbehaving one; it
// must not notice anything.
type bystander struct {
	c   *client.Conn
	sub *client.Subscription
	v   *client.View
	n   int
}

func newBystander(t *testing.T, e *servertest.Node) *bystander {
	t.Helper()
	b := &bystander{c: dialCodec(t, e, "msgpack"), v: client.NewView()}
	var err error
	if b.sub, err = b.c.Subscribe(servertest.Context(t), "bystander", client.SubscribeOptions{}); err != nil {
		t.Fatal(err)
	}
	applyUntil(t, b.sub, b.v, func(m wire.Message) bool { return m.T == wire.TSnapshot })
	return b
}

// check writes, sees its own write's event and pings.
func (b *bystander) check(t *testing.T) {
	t.Helper()
	ctx := servertest.Context(t)
	b.n++
	rev, err := b.c.Put(ctx, "bystander", "k", b.n)
	if err != nil {
		t.Fatalf("bystander: Put: %v", err)
	}
	applyUntil(t, b.sub, b.v, func(m wire.Message) bool { return m.Rev >= rev })
	if got := string(b.v.Items["k"].Value); got != fmt.Sprint(b.n) {
		t.Fatalf("bystander: k = %s, want %d", got, b.n)
	}
	if err := b.c.Ping(ctx); err != nil {
		t.Fatalf("bystander: Ping: %v", err)
	}
	if err := b.c.Err(); err != nil {
		t.Fatalf("bystander: connection ended: %v", err)
	}
}

func msgpackFrame(t *testing.T, msgs ...map[string]any) []byte {
	t.Helper()
	var b []byte
	for _, m := range msgs {
		p, err := msgpack.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, p...)
	}
	return b
}

// TestWSViolations: each limit and protocol violation of PROTOCOL.md §8
// and §9 gets its documented answer, and another connection on the same
// server keeps working through it.
func TestWSViolations(t *testing.T) {
	cases := []struct {
		name string
		cfg  server.Config
		run  func(t *testing.T, e *servertest.Node)
	}{
		{"frame over MaxFrameBytes closes 1009", server.Config{MaxFrameBytes: 4 << 10}, func(t *testing.T, e *servertest.Node) {
			r, _ := connectRaw(t, e, "json")
			r.send(&wire.Request{T: wire.TPut, ID: 1, Room: "r", Key: "k", Value: wire.Value(`"` + strings.Repeat("x", 3<<10) + `"`)})
			if m := r.reply(1); m.T != wire.TOK {
				t.Fatalf("a frame under the limit: %v", m.Raw)
			}
			r.send(&wire.Request{T: wire.TPut, ID: 2, Room: "r", Key: "k", Value: wire.Value(`"` + strings.Repeat("x", 5<<10) + `"`)})
			if code, msgs := r.closeStatus(10 * time.Second); code != websocket.StatusMessageTooBig || len(msgs) != 0 {
				t.Fatalf("oversized frame: close %d after %v, want 1009 and no reply", code, msgs)
			}
			if it, _, err := e.HTTP.Get(servertest.Context(t), "r", "k"); err != nil || len(it.Value) != 3<<10+2 {
				t.Fatalf("k = %d bytes, %v: the oversized put must not apply", len(it.Value), err)
			}
		}},
		{"garbage JSON closes 1007", server.Config{}, func(t *testing.T, e *servertest.Node) {
			r, _ := connectRaw(t, e, "json")
			r.sendBytes([]byte("this is not json"))
			if code, _ := r.closeStatus(10 * time.Second); code != websocket.StatusInvalidFramePayloadData {
				t.Fatalf("close %d, want 1007", code)
			}
		}},
		{"JSON that is not an object closes 1007", server.Config{}, func(t *testing.T, e *servertest.Node) {
			r, _ := connectRaw(t, e, "json")
			r.sendBytes([]byte(`{"t":"ping"}` + "\n" + `[1,2]`))
			if code, _ := r.closeStatus(10 * time.Second); code != websocket.StatusInvalidFramePayloadData {
				t.Fatalf("close %d, want 1007", code)
			}
		}},
		{"garbage msgpack closes 1007", server.Config{}, func(t *testing.T, e *servertest.Node) {
			r, _ := connectRaw(t, e, "msgpack")
			r.sendBytes([]byte{0xc1, 0xc1, 0x00})
			if code, _ := r.closeStatus(10 * time.Second); code != websocket.StatusInvalidFramePayloadData {
				t.Fatalf("close %d, want 1007", code)
			}
		}},
		{"truncated msgpack closes 1007", server.Config{}, func(t *testing.T, e *servertest.Node) {
			r, _ := connectRaw(t, e, "msgpack")
			f := msgpackFrame(t, map[string]any{"t": "put", "id": 1, "room": "r", "key": "k", "value": "abcdef"})
			r.sendBytes(f[:len(f)-3])
			if code, _ := r.closeStatus(10 * time.Second); code != websocket.StatusInvalidFramePayloadData {
				t.Fatalf("close %d, want 1007", code)
			}
		}},
		{"text frame that is not UTF-8 closes 1007", server.Config{}, func(t *testing.T, e *servertest.Node) {
			// RFC 6455 §8.1: the whole frame is invalid, not one key.
			r, _ := connectRaw(t, e, "json")
			r.sendBytes([]byte(`{"t":"put","id":1,"room":"r","key":"ok","value":1}` + "\n" +
				"{\"t\":\"put\",\"id\":2,\"room\":\"r\",\"key\":\"\xff\",\"value\":1}"))
			if code, msgs := r.closeStatus(10 * time.Second); code != websocket.StatusInvalidFramePayloadData || len(msgs) != 0 {
				t.Fatalf("close %d after %v, want 1007 and no reply", code, msgs)
			}
			if l, err := e.HTTP.List(servertest.Context(t), "r", ""); err != nil || len(l.Items) != 0 {
				t.Fatalf("keys %+v, %v: nothing of the frame may apply", l, err)
			}
		}},
		{"binary frame on JSON closes 1003", server.Config{}, func(t *testing.T, e *servertest.Node) {
			r, _ := connectRaw(t, e, "json")
			if err := r.ws.Write(servertest.Context(t), websocket.MessageBinary, []byte(`{"t":"put","id":1,"room":"r","key":"bin","value":1}`)); err != nil {
				t.Fatal(err)
			}
			if code, msgs := r.closeStatus(10 * time.Second); code != websocket.StatusUnsupportedData || len(msgs) != 0 {
				t.Fatalf("close %d after %v, want 1003", code, msgs)
			}
			if _, _, err := e.HTTP.Get(servertest.Context(t), "r", "bin"); !errors.Is(err, client.ErrNotFound) {
				t.Fatalf("a binary frame was applied: %v", err)
			}
		}},
		{"text frame on msgpack closes 1003", server.Config{}, func(t *testing.T, e *servertest.Node) {
			r, _ := connectRaw(t, e, "msgpack")
			if err := r.ws.Write(servertest.Context(t), websocket.MessageText, []byte(`{"t":"ping"}`)); err != nil {
				t.Fatal(err)
			}
			if code, msgs := r.closeStatus(10 * time.Second); code != websocket.StatusUnsupportedData || len(msgs) != 0 {
				t.Fatalf("close %d after %v, want 1003", code, msgs)
			}
		}},
		{"request without id closes 4500", server.Config{}, func(t *testing.T, e *servertest.Node) {
			frames := map[string][]byte{
				"json:absent":  []byte(`{"t":"ping"}` + "\n" + `{"t":"put","room":"r","key":"noid","value":1}`),
				"json:zero":    []byte(`{"t":"ping"}` + "\n" + `{"t":"del","id":0,"room":"r","key":"noid"}`),
				"msgpack:nil":  msgpackFrame(t, map[string]any{"t": "ping"}, map[string]any{"t": "put", "id": nil, "room": "r", "key": "noid", "value": 1}),
				"msgpack:zero": msgpackFrame(t, map[string]any{"t": "ping"}, map[string]any{"t": "sub", "id": 0, "room": "r"}),
			}
			for name, frame := range frames {
				r, _ := connectRaw(t, e, strings.Split(name, ":")[0])
				r.sendBytes(frame)
				code, msgs := r.closeStatus(10 * time.Second)
				if code != wire.CloseProtocolError || len(msgs) != 1 || msgs[0].T != wire.TPong {
					t.Fatalf("%s: close %d after %v, want the pong, then 4500", name, code, msgs)
				}
			}
			if _, _, err := e.HTTP.Get(servertest.Context(t), "r", "noid"); !errors.Is(err, client.ErrNotFound) {
				t.Fatalf("a request without id was applied: %v", err)
			}
		}},
		{"negative msgpack id closes 1007", server.Config{}, func(t *testing.T, e *servertest.Node) {
			r, _ := connectRaw(t, e, "msgpack")
			r.sendBytes(msgpackFrame(t, map[string]any{"t": "put", "id": -5, "room": "r", "key": "neg", "value": 1}))
			if code, msgs := r.closeStatus(10 * time.Second); code != websocket.StatusInvalidFramePayloadData || len(msgs) != 0 {
				t.Fatalf("close %d after %v, want 1007 (as JSON's -5), not an answer to id 2^64-5", code, msgs)
			}
			if _, _, err := e.HTTP.Get(servertest.Context(t), "r", "neg"); !errors.Is(err, client.ErrNotFound) {
				t.Fatalf("a request with a negative id was applied: %v", err)
			}
		}},
		{"ping before connect closes 4500", server.Config{}, func(t *testing.T, e *servertest.Node) {
			r := dialRaw(t, e, "json")
			r.send(&wire.Request{T: wire.TPing})
			if code, msgs := r.closeStatus(10 * time.Second); code != wire.CloseProtocolError || len(msgs) != 0 {
				t.Fatalf("close %d after %v, want 4500", code, msgs)
			}
		}},
		{"long message type before connect closes 4500", server.Config{}, func(t *testing.T, e *servertest.Node) {
			// The close reason quotes the type: it must be cut to fit a
			// close frame (123 bytes), or no close frame goes out at all.
			r := dialRaw(t, e, "json")
			r.sendBytes([]byte(`{"t":"` + strings.Repeat("é", 200) + `"}`))
			if code, msgs := r.closeStatus(10 * time.Second); code != wire.CloseProtocolError || len(msgs) != 0 {
				t.Fatalf("close %d after %v, want 4500", code, msgs)
			}
		}},
		{"put before connect closes 4500", server.Config{}, func(t *testing.T, e *servertest.Node) {
			r := dialRaw(t, e, "msgpack")
			r.send(&wire.Request{T: wire.TPut, ID: 1, Room: "r", Key: "early", Value: wire.Value(`1`)})
			if code, msgs := r.closeStatus(10 * time.Second); code != wire.CloseProtocolError || len(msgs) != 0 {
				t.Fatalf("close %d after %v, want 4500", code, msgs)
			}
			if _, _, err := e.HTTP.Get(servertest.Context(t), "r", "early"); !errors.Is(err, client.ErrNotFound) {
				t.Fatalf("a put before connect was applied: %v", err)
			}
		}},
		{"invalid value before connect closes 4500", server.Config{}, func(t *testing.T, e *servertest.Node) {
			r := dialRaw(t, e, "msgpack")
			r.sendBytes(msgpackFrame(t, map[string]any{"t": "put", "id": 1, "room": "r", "key": "k", "value": []byte{1}}))
			if code, msgs := r.closeStatus(10 * time.Second); code != wire.CloseProtocolError || len(msgs) != 0 {
				t.Fatalf("close %d after %v, want 4500: any message before connect is a protocol error", code, msgs)
			}
		}},
		{"unknown message type closes 4500", server.Config{}, func(t *testing.T, e *servertest.Node) {
			r, _ := connectRaw(t, e, "json")
			r.sendBytes([]byte(`{"t":"ping"}` + "\n" + `{"t":"hello","id":3}`))
			code, msgs := r.closeStatus(10 * time.Second)
			if code != wire.CloseProtocolError || len(msgs) != 1 || msgs[0].T != wire.TPong {
				t.Fatalf("close %d after %v, want the pong, then 4500", code, msgs)
			}
		}},
		{"no connect within ConnectTimeout closes 4005", server.Config{ConnectTimeout: 150 * time.Millisecond}, func(t *testing.T, e *servertest.Node) {
			start := time.Now()
			r := dialRaw(t, e, "json")
			if code, _ := r.closeStatus(10 * time.Second); code != wire.CloseConnectTimeout {
				t.Fatalf("close %d, want 4005", code)
			}
			if since := time.Since(start); since < 150*time.Millisecond {
				t.Fatalf("closed after %v, before the connect timeout", since)
			}
		}},
		{"silence for two ping intervals closes 4001", server.Config{PingInterval: 100 * time.Millisecond}, func(t *testing.T, e *servertest.Node) {
			c := dial(t, e, &client.Options{NoKeepAlive: true})
			if code := waitDone(t, c, 10*time.Second); code != int(wire.CloseHeartbeatTimeout) {
				t.Fatalf("close %d (%v), want 4001", code, c.Err())
			}
		}},
		{"foreign Origin is closed with 4502 naming --allow-origin", server.Config{AllowOrigins: []string{"*.allowed.example"}}, func(t *testing.T, e *servertest.Node) {
			for origin, refused := range map[string]bool{
				"http://evil.example":              true,
				"https://allowed.example.evil.com": true,
				"null":                             true,
				"https://app.allowed.example":      false,
				e.TS.URL:                           false, // same host
			} {
				r, resp, err := dialRawResp(t, e, "json", rawOpts{Header: http.Header{"Origin": {origin}}})
				if resp == nil || resp.StatusCode != http.StatusSwitchingProtocols {
					t.Fatalf("Origin %s: %v, %v; want HTTP 101", origin, resp, err)
				}
				if refused {
					// A browser shows a page nothing of a refused handshake: the close says why.
					_, err := r.read(10 * time.Second)
					var ce websocket.CloseError
					if !errors.As(err, &ce) || ce.Code != wire.CloseOriginRefused || !strings.Contains(ce.Reason, "--allow-origin") {
						t.Fatalf("Origin %s: %v; want close 4502 naming --allow-origin", origin, err)
					}
					continue
				}
				r.send(&wire.Request{T: wire.TConnect})
				if m := r.next(); m.T != wire.TConnected {
					t.Fatalf("Origin %s: %v", origin, m.Raw)
				}
			}
		}},
		{"unknown subprotocol only gets 400 at upgrade", server.Config{}, func(t *testing.T, e *servertest.Node) {
			_, resp, err := dialRawResp(t, e, "json", rawOpts{Subprotocols: []string{"graphql-ws", "statecast.v3.json"}})
			if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("unknown subprotocols: %v, %v; want HTTP 400", resp, err)
			}
			// The first known one among others is chosen; none means JSON.
			r, _, err := dialRawResp(t, e, "msgpack", rawOpts{Subprotocols: []string{"graphql-ws", wire.SubprotocolMsgpack, wire.SubprotocolJSON}})
			if err != nil || r.ws.Subprotocol() != wire.SubprotocolMsgpack {
				t.Fatalf("mixed offer: %v", err)
			}
			r.send(&wire.Request{T: wire.TConnect})
			if m := r.next(); m.T != wire.TConnected {
				t.Fatalf("%v", m.Raw)
			}
			r, _, err = dialRawResp(t, e, "json", rawOpts{Subprotocols: []string{}})
			if err != nil || r.ws.Subprotocol() != "" {
				t.Fatalf("no offer: %v", err)
			}
			r.send(&wire.Request{T: wire.TConnect})
			if m := r.next(); m.T != wire.TConnected {
				t.Fatalf("%v", m.Raw)
			}
		}},
		{"connection limit refuses the upgrade", server.Config{MaxConnections: 2}, func(t *testing.T, e *servertest.Node) {
			second := dialCodec(t, e, "json") // the bystander is the first
			_, err := client.Dial(servertest.Context(t), e.WS, nil)
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Status != http.StatusServiceUnavailable {
				t.Fatalf("third connection: %v, want its upgrade answered 503", err)
			}
			second.CloseNow()
			waitFor(t, 10*time.Second, "a free connection slot", func() bool {
				c, err := client.Dial(servertest.Context(t), e.WS, nil)
				if err == nil {
					c.CloseNow()
				}
				return err == nil
			})
		}},
		{"subscription limit answers too_many_subscriptions", server.Config{MaxSubscriptions: 2}, func(t *testing.T, e *servertest.Node) {
			r, _ := connectRaw(t, e, "msgpack")
			r.send(&wire.Request{T: wire.TSub, ID: 1, Room: "a"}, &wire.Request{T: wire.TSub, ID: 2, Room: "b"},
				&wire.Request{T: wire.TSub, ID: 3, Room: "c"})
			for id := uint64(1); id <= 2; id++ {
				if m := r.reply(id); m.T != wire.TOK {
					t.Fatalf("sub %d: %v", id, m.Raw)
				}
			}
			if m := r.reply(3); m.T != wire.TErr || m.Code != wire.CodeTooManySubs {
				t.Fatalf("third sub: %v, want too_many_subscriptions", m.Raw)
			}
			r.send(&wire.Request{T: wire.TUnsub, ID: 4, Sub: 1}, &wire.Request{T: wire.TSub, ID: 3, Room: "c"})
			r.reply(4)
			if m := r.reply(3); m.T != wire.TOK {
				t.Fatalf("sub after an unsub: %v", m.Raw)
			}
		}},
		{"prefix limits answer too_large", server.Config{MaxPrefixes: 4, MaxConnPrefixes: 6}, func(t *testing.T, e *servertest.Node) {
			r, _ := connectRaw(t, e, "json")
			prefixes := func(n int) []string {
				ps := make([]string, n)
				for i := range ps {
					ps[i] = fmt.Sprintf("p%d/", i)
				}
				return ps
			}
			r.send(&wire.Request{T: wire.TSub, ID: 1, Room: "a", Prefixes: prefixes(5)})
			if m := r.reply(1); m.T != wire.TErr || m.Code != wire.CodeTooLarge {
				t.Fatalf("5 prefixes over a limit of 4: %v, want too_large", m.Raw)
			}
			r.send(&wire.Request{T: wire.TSub, ID: 2, Room: "a", Prefixes: prefixes(4)},
				&wire.Request{T: wire.TSub, ID: 3, Room: "b", Prefixes: prefixes(3)},
				&wire.Request{T: wire.TSub, ID: 4, Room: "b", Prefixes: prefixes(2)})
			if m := r.reply(2); m.T != wire.TOK {
				t.Fatalf("4 prefixes: %v", m.Raw)
			}
			if m := r.reply(3); m.T != wire.TErr || m.Code != wire.CodeTooLarge {
				t.Fatalf("7 prefixes on the connection over a limit of 6: %v, want too_large", m.Raw)
			}
			if m := r.reply(4); m.T != wire.TOK {
				t.Fatalf("6 prefixes on the connection: %v", m.Raw)
			}
			// An unsub gives its prefixes back; a refused sub took none.
			r.send(&wire.Request{T: wire.TUnsub, ID: 5, Sub: 2}, &wire.Request{T: wire.TSub, ID: 3, Room: "b", Prefixes: prefixes(3)})
			r.reply(5)
			if m := r.reply(3); m.T != wire.TOK {
				t.Fatalf("sub after an unsub: %v", m.Raw)
			}
			// A prefix no key can have is refused, not watched.
			r.send(&wire.Request{T: wire.TSub, ID: 6, Room: "c", Prefixes: []string{strings.Repeat("x", 2000)}})
			if m := r.reply(6); m.T != wire.TErr || m.Code != wire.CodeInvalidKey {
				t.Fatalf("a 2000-byte prefix: %v, want invalid_key", m.Raw)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := servertest.Start(t, servertest.Options{Server: tc.cfg})
			b := newBystander(t, e)
			b.check(t)
			tc.run(t, e)
			b.check(t)
		})
	}
}

// TestWSMaxFrameDefault: without configuration the server reads frames
// up to 1 MiB (a 256 KiB value fits with room to spare) and closes on
// larger ones with 1009.
func TestWSMaxFrameDefault(t *testing.T) {
	e := servertest.Start(t, servertest.Options{})
	r, _ := connectRaw(t, e, "json")
	r.send(&wire.Request{T: wire.TPut, ID: 1, Room: "r", Key: "k", Value: wire.Value(`"` + strings.Repeat("x", 250<<10) + `"`)},
		&wire.Request{T: wire.TPut, ID: 2, Room: "r", Key: "k2", Value: wire.Value(`"` + strings.Repeat("x", 250<<10) + `"`)})
	if m := r.reply(2); m.T != wire.TOK {
		t.Fatalf("a 500 KiB frame: %v", m.Raw)
	}
	r.sendBytes([]byte(`{"t":"ping","pad":"` + strings.Repeat("x", 1<<20) + `"}`))
	if code, _ := r.closeStatus(10 * time.Second); code != websocket.StatusMessageTooBig {
		t.Fatalf("a frame over 1 MiB: close %d, want 1009", code)
	}
}

// TestWriteRateLimitPerSubject: the write limit is one bucket per subject,
// shared by all its sockets and its HTTP writes (a client got a fresh
// bucket per socket, and none over HTTP); another subject's writes, and
// reads, are not affected.
func TestWriteRateLimitPerSubject(t *testing.T) {
	authn, err := auth.New(auth.Config{HMACSecret: hmacSecret})
	if err != nil {
		t.Fatal(err)
	}
	e := servertest.Start(t, servertest.Options{Server: server.Config{Auth: authn, WriteRate: 5, WriteBurst: 5}})
	ctx := servertest.Context(t)
	alice := tokenFor(t, "alice", time.Now().Add(time.Hour), allRooms)
	a1, a2 := dial(t, e, &client.Options{Token: alice}), dial(t, e, &client.Options{Token: alice})
	aliceHTTP := &client.HTTP{URL: e.TS.URL, Token: alice}
	for i := range 5 {
		if _, err := a1.Put(ctx, "r", fmt.Sprint("k", i), i); err != nil {
			t.Fatalf("write %d within the burst: %v", i, err)
		}
	}
	_, err = a2.Put(ctx, "r", "over", 1)
	var ce *client.Error
	if !errors.Is(err, client.ErrRateLimited) || !errors.As(err, &ce) || ce.Message == "" {
		t.Fatalf("write over the burst on a second socket: %v, want rate_limited", err)
	}
	if _, err := aliceHTTP.Put(ctx, "r", "over", json.RawMessage(`1`), nil, ""); !errors.Is(err, client.ErrRateLimited) || !errors.As(err, &ce) || ce.Status != 429 {
		t.Fatalf("write over the burst over HTTP: %v, want 429 rate_limited", err)
	}
	if _, _, err := aliceHTTP.Get(ctx, "r", "over"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("a rate-limited write was applied: %v", err)
	}
	// Another subject has its own bucket; reads and pings are not writes.
	bob := dial(t, e, &client.Options{Token: tokenFor(t, "bob", time.Now().Add(time.Hour), allRooms)})
	if _, err := bob.Put(ctx, "r", "bob", 1); err != nil {
		t.Fatalf("another subject's write: %v", err)
	}
	if _, err := a1.Subscribe(ctx, "r", client.SubscribeOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := a2.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the rate limit to let a write through", func() bool {
		_, err := a2.Put(ctx, "r", "later", 1)
		if err != nil && !errors.Is(err, client.ErrRateLimited) {
			t.Fatal(err)
		}
		return err == nil
	})
}
