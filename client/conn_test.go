package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
)

func TestDialConnected(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			c := dial(t, s, codec)
			m := c.Connected()
			v := 1
			if codec == "json2" {
				v = 2
			}
			if m.T != wire.TConnected || m.V != v || m.Session == "" || m.Resume == "" || m.PingMS <= 0 {
				t.Fatalf("connected = %+v", m)
			}
			if c.Err() != nil {
				t.Fatalf("Err() of an open connection = %v", c.Err())
			}
			if err := c.Ping(servertest.Context(t)); err != nil {
				t.Fatalf("Ping: %v", err)
			}
		})
	}
}

func TestDialErrors(t *testing.T) {
	if _, err := client.Dial(context.Background(), "ws://127.0.0.1:1/v1/ws", &client.Options{Codec: "xml"}); err == nil {
		t.Fatal("Dial with codec xml succeeded")
	}
	s := servertest.Start(t, servertest.Options{})
	_, err := client.Dial(servertest.Context(t), strings.TrimSuffix(s.WS, "/ws")+"/nowhere", nil)
	var e *client.Error
	if !errors.As(err, &e) || e.Status != 404 {
		t.Fatalf("Dial of a missing endpoint: %v, want the server's 404 as an *Error", err)
	}
}

func TestWrites(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			ctx, c, room := servertest.Context(t), dial(t, s, codec), "w-"+codec
			rev, err := c.Put(ctx, room, "a", map[string]any{"n": 1})
			if err != nil || rev != 1 {
				t.Fatalf("Put = %d, %v; want 1", rev, err)
			}
			if rev, err = c.Put(ctx, room, "a", json.RawMessage(`[1,"x",null]`), client.IfRev(1)); err != nil || rev != 2 {
				t.Fatalf("Put IfRev(1) = %d, %v; want 2", rev, err)
			}
			if rev, err = c.Put(ctx, room, "b", wire.Value(`"b"`), client.IfRev(0)); err != nil || rev != 3 {
				t.Fatalf("Put IfRev(0) = %d, %v; want 3", rev, err)
			}

			_, err = c.Put(ctx, room, "a", 3, client.IfRev(1))
			var e *client.Error
			if !errors.Is(err, client.ErrConflict) || !errors.As(err, &e) {
				t.Fatalf("stale Put: err = %v, want a conflict", err)
			}
			if e.Key != "a" || e.ModRev != 2 || e.Rev != 3 {
				t.Fatalf("conflict = %+v, want key a, mod_rev 2, rev 3", e)
			}
			if got, want := err.Error(), `conflict: key "a" has mod_rev 2`; got != want {
				t.Fatalf("conflict message %q, want %q", got, want)
			}
			if _, err = c.Delete(ctx, room, "zz", client.IfRev(4)); !errors.Is(err, client.ErrConflict) || err.Error() != `conflict: key "zz" does not exist` {
				t.Fatalf("Delete of a missing key with IfRev: %v", err)
			}

			if rev, err = c.Delete(ctx, room, "b"); err != nil || rev != 4 {
				t.Fatalf("Delete = %d, %v; want 4", rev, err)
			}
			if rev, err = c.Delete(ctx, room, "b"); err != nil || rev != 4 {
				t.Fatalf("Delete of a missing key = %d, %v; want 4 (nothing written)", rev, err)
			}

			rev, err = c.Txn(ctx, room, []wire.Cond{{Key: "a", ModRev: 2}}, []wire.TxnOp{
				{Type: "put", Key: "t/1", Value: wire.Value(`1`)},
				{Type: "put", Key: "t/2", Value: wire.Value(`{"k":2.5}`)},
				{Type: "delete", Key: "a"},
			})
			if err != nil || rev != 5 {
				t.Fatalf("Txn = %d, %v; want 5", rev, err)
			}
			if _, err = c.Txn(ctx, room, []wire.Cond{{Key: "a", ModRev: 2}}, []wire.TxnOp{{Type: "delete", Key: "t/1"}}); !errors.Is(err, client.ErrConflict) {
				t.Fatalf("stale Txn: %v", err)
			}

			if _, err = c.Put(ctx, "bad room!", "k", 1); !errors.As(err, &e) || e.Code != wire.CodeInvalidRoom {
				t.Fatalf("Put in an invalid room: %v", err)
			}
			if _, err = c.Put(ctx, room, "k", wire.Value(`{oops`)); err == nil || errors.As(err, &e) {
				t.Fatalf("Put of invalid JSON: %v, want a local encoding error", err)
			}

			// Both codecs store the same JSON.
			it, _, err := s.HTTP.Get(ctx, room, "t/2")
			if err != nil || string(it.Value) != `{"k":2.5}` || it.ModRev != 5 {
				t.Fatalf("Get t/2 = %+v, %v", it, err)
			}
			// The connection is still usable after errors.
			if err := c.Ping(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestRequestRaw(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	ctx, c := servertest.Context(t), dial(t, s, "json")
	m, err := c.Request(ctx, wire.Request{T: wire.TPut, ID: 77, Room: "raw", Key: "k", Value: wire.Value(`true`)})
	if err != nil || m.T != wire.TOK || m.ID != 77 || m.Rev != 1 {
		t.Fatalf("Request = %+v, %v", m, err)
	}
	m, err = c.Request(ctx, wire.Request{T: wire.TUnsub, Sub: 12345})
	if !errors.Is(err, client.ErrNotFound) || m.T != wire.TErr || m.Code != wire.CodeNotFound {
		t.Fatalf("unsub of nothing = %+v, %v", m, err)
	}
	if m, err = c.Request(ctx, wire.Request{T: wire.TPing}); err != nil || m.T != wire.TPong {
		t.Fatalf("ping = %+v, %v", m, err)
	}
	// A second connect is a protocol error: close 4500.
	if _, err = c.Request(ctx, wire.Request{T: wire.TConnect}); client.CloseCode(err) != int(wire.CloseProtocolError) {
		t.Fatalf("second connect: %v, want close 4500", err)
	}
}

// TestConcurrentWrites pipelines writes from many goroutines on one
// connection while it also carries a subscription's (batched) events.
func TestConcurrentWrites(t *testing.T) {
	s := servertest.Start(t, servertest.Options{Server: server.Config{WriteRate: 1e6}})
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			ctx, c, room := servertest.Context(t), dial(t, s, codec), "many-"+codec
			sub, err := c.Subscribe(ctx, room, client.SubscribeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			const writers, each = 8, 50
			revs := make(chan uint64, writers*each)
			var wg sync.WaitGroup
			for w := range writers {
				wg.Go(func() {
					for i := range each {
						rev, err := c.Put(ctx, room, fmt.Sprintf("k%d", w), i)
						if err != nil {
							t.Error(err)
							return
						}
						revs <- rev
					}
				})
			}
			wg.Wait()
			close(revs)
			seen := map[uint64]bool{}
			for r := range revs {
				if seen[r] {
					t.Fatalf("rev %d returned twice", r)
				}
				seen[r] = true
			}
			v := client.NewView()
			for v.Rev < writers*each {
				m, err := sub.Next(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := v.Apply(m); err != nil {
					t.Fatal(err)
				}
			}
			servertest.AssertViewIsRoom(t, s.HTTP, room, v)
		})
	}
}

func TestSubscribe(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			ctx, c, room := servertest.Context(t), dial(t, s, codec), "sub-"+codec
			for _, k := range []string{"g/1", "g/2", "other"} {
				if _, err := c.Put(ctx, room, k, k); err != nil {
					t.Fatal(err)
				}
			}
			sub, err := c.Subscribe(ctx, room, client.SubscribeOptions{Prefixes: []string{"g/"}, Prev: true})
			if err != nil {
				t.Fatal(err)
			}
			m, err := sub.Next(ctx)
			if err != nil || m.T != wire.TSnapshot || m.S != sub.ID() || m.Reason != "initial" || m.Rev != 3 || len(m.Items) != 2 {
				t.Fatalf("first message = %+v, %v; want the initial snapshot of g/1, g/2 at 3", m, err)
			}
			v := client.NewView()
			if err := v.Apply(m); err != nil {
				t.Fatal(err)
			}

			if _, err := c.Put(ctx, room, "g/1", "new"); err != nil { // 4
				t.Fatal(err)
			}
			if _, err := c.Put(ctx, room, "other", 0); err != nil { // 5: not ours
				t.Fatal(err)
			}
			if _, err := c.Txn(ctx, room, nil, []wire.TxnOp{ // 6
				{Type: "delete", Key: "g/2"}, {Type: "put", Key: "g/3", Value: wire.Value(`3`)}}); err != nil {
				t.Fatal(err)
			}
			m = next(t, sub)
			if m.T != wire.TEvents || m.Rev != 4 || len(m.Events) != 1 || m.Events[0].Prev == nil || string(m.Events[0].Prev.Value) != `"g/1"` {
				t.Fatalf("events = %+v", m)
			}
			applyAll(t, v, m)
			m = next(t, sub)
			if m.T != wire.TEvents || m.Rev != 6 || len(m.Events) != 2 {
				t.Fatalf("txn events = %+v, want both changes of rev 6 in one message", m)
			}
			applyAll(t, v, m)
			if got := fmt.Sprint(keys(v)); got != "[g/1 g/3]" || string(v.Items["g/1"].Value) != `"new"` {
				t.Fatalf("view keys %s, g/1 = %s", got, v.Items["g/1"].Value)
			}

			if err := sub.Unsubscribe(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Put(ctx, room, "g/4", 4); err != nil {
				t.Fatal(err)
			}
			if m, err := sub.Next(ctx); !errors.Is(err, client.ErrUnsubscribed) {
				t.Fatalf("Next after Unsubscribe = %+v, %v", m, err)
			}
		})
	}
}

func next(t *testing.T, s *client.Subscription) wire.Message {
	t.Helper()
	m, err := s.Next(servertest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func applyAll(t *testing.T, v *client.View, msgs ...wire.Message) {
	t.Helper()
	for _, m := range msgs {
		if err := v.Apply(m); err != nil {
			t.Fatal(err)
		}
	}
}

func keys(v *client.View) []string {
	var ks []string
	for _, it := range v.Sorted() {
		ks = append(ks, it.Key)
	}
	return ks
}

func TestSubscribeErrors(t *testing.T) {
	s := servertest.Start(t, servertest.Options{Server: server.Config{MaxSubscriptions: 1}})
	ctx, c := servertest.Context(t), dial(t, s, "json")
	var e *client.Error
	if _, err := c.Subscribe(ctx, "bad room", client.SubscribeOptions{}); !errors.As(err, &e) || e.Code != wire.CodeInvalidRoom {
		t.Fatalf("Subscribe to an invalid room: %v", err)
	}
	if _, err := c.Subscribe(ctx, "r", client.SubscribeOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Subscribe(ctx, "r", client.SubscribeOptions{}); !errors.As(err, &e) || e.Code != wire.CodeTooManySubs {
		t.Fatalf("Subscribe past the limit: %v", err)
	}
}

// TestResume: a subscriber that went away resumes from its View's
// position: the writes it missed are replayed exactly once, then synced.
func TestResume(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			ctx, room := servertest.Context(t), "resume-"+codec
			c := dial(t, s, codec)
			for i := range 3 {
				if _, err := c.Put(ctx, room, fmt.Sprint("k", i), i); err != nil {
					t.Fatal(err)
				}
			}
			sub, err := c.Subscribe(ctx, room, client.SubscribeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			v := client.NewView()
			applyAll(t, v, next(t, sub))
			if _, err := c.Put(ctx, room, "k0", "x"); err != nil { // 4
				t.Fatal(err)
			}
			applyAll(t, v, next(t, sub))
			if err := c.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if code := client.CloseCode(c.Err()); code != 1000 {
				t.Fatalf("after Close: Err() = %v (close %d), want 1000", c.Err(), code)
			}
			if err := c.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			if _, err := sub.Next(ctx); !errors.Is(err, client.ErrClosed) {
				t.Fatalf("Next after Close: %v", err)
			}

			// Missed while away: 5, 6, 7.
			if _, err := s.HTTP.Put(ctx, room, "k1", json.RawMessage(`"y"`), nil, ""); err != nil {
				t.Fatal(err)
			}
			if _, err := s.HTTP.Delete(ctx, room, "k2", nil); err != nil {
				t.Fatal(err)
			}
			if _, err := s.HTTP.Put(ctx, room, "k3", json.RawMessage(`3`), nil, ""); err != nil {
				t.Fatal(err)
			}

			c2 := dial(t, s, codec)
			from := v.Position()
			if from.Rev != 5 || from.Epoch == "" {
				t.Fatalf("Position = %+v, want rev 5", from)
			}
			sub, err = c2.Subscribe(ctx, room, client.SubscribeOptions{From: from})
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for {
				m := next(t, sub)
				applyAll(t, v, m) // fails on a duplicate
				kinds = append(kinds, fmt.Sprintf("%s@%d", m.T, m.Rev))
				if m.T == wire.TSynced {
					break
				}
			}
			if got := strings.Join(kinds, " "); got != "events@5 events@6 events@7 synced@7" {
				t.Fatalf("resume delivered %s", got)
			}
			servertest.AssertViewIsRoom(t, s.HTTP, room, v)
		})
	}
}

func TestGarbageFrameCloses1007(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	frames := map[string][]byte{"json": []byte("this is not json"), "msgpack": {0xc1, 0xc1}}
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			ctx, c := servertest.Context(t), dial(t, s, codec)
			if err := c.WriteFrame(ctx, frames[codec]); err != nil {
				t.Fatal(err)
			}
			select {
			case <-c.Done():
			case <-ctx.Done():
				t.Fatal("the server kept the connection")
			}
			if code := client.CloseCode(c.Err()); code != int(websocket.StatusInvalidFramePayloadData) {
				t.Fatalf("close code %d (%v), want 1007", code, c.Err())
			}
			if !errors.Is(c.Err(), client.ErrClosed) {
				t.Fatalf("Err() = %v, want ErrClosed", c.Err())
			}
			if _, err := c.Put(ctx, "r", "k", 1); !errors.Is(err, client.ErrClosed) || errors.Is(err, client.ErrOutcomeUnknown) {
				t.Fatalf("Put on a closed connection: %v, want ErrClosed (nothing was sent)", err)
			}
			if err := c.Close(); err != nil {
				t.Fatalf("Close of an ended connection: %v", err)
			}
		})
	}
}

func TestFrameTooLargeCloses1009(t *testing.T) {
	s := servertest.Start(t, servertest.Options{Server: server.Config{MaxFrameBytes: 1 << 10}})
	ctx, c := servertest.Context(t), dial(t, s, "json")
	_, err := c.Put(ctx, "r", "k", strings.Repeat("x", 2<<10))
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("Put of an oversized frame: %v, want ErrOutcomeUnknown (no reply)", err)
	}
	<-c.Done()
	if code := client.CloseCode(c.Err()); code != int(websocket.StatusMessageTooBig) {
		t.Fatalf("close code %d (%v), want 1009", code, c.Err())
	}
}

func TestAuth(t *testing.T) {
	secret := []byte(strings.Repeat("k", 32))
	authn, err := auth.New(auth.Config{HMACSecret: secret})
	if err != nil {
		t.Fatal(err)
	}
	s := servertest.Start(t, servertest.Options{Server: server.Config{Auth: authn}})
	ctx := servertest.Context(t)
	token := func(sub string) string {
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
			"sub": sub, "exp": time.Now().Add(time.Hour).Unix(),
			"statecast": map[string]any{"grants": []any{map[string]any{"room": "*", "access": "rw"}}},
		}).SignedString(secret)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}

	_, err = client.Dial(ctx, s.WS, nil)
	if code := client.CloseCode(err); code != int(wire.CloseUnauthorized) {
		t.Fatalf("Dial without a token: %v (close %d), want 4501", err, code)
	}
	c, err := client.Dial(ctx, s.WS, &client.Options{Token: token("alice")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Connected().ExpiresMS <= 0 {
		t.Fatalf("connected without expires_ms: %+v", c.Connected())
	}
	if err := c.Auth(ctx, token("alice")); err != nil {
		t.Fatalf("Auth with a fresh token: %v", err)
	}
	if err := c.Auth(ctx, token("bob")); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("Auth as another subject: %v", err)
	}
	if _, err := c.Put(ctx, "r", "k", 1); err != nil {
		t.Fatal(err)
	}

	if _, _, err := s.HTTP.Get(ctx, "r", "k"); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("HTTP Get without a token: %v", err)
	}
	h := *s.HTTP
	h.Token = token("alice")
	if it, _, err := h.Get(ctx, "r", "k"); err != nil || string(it.Value) != "1" {
		t.Fatalf("HTTP Get with a token = %+v, %v", it, err)
	}
}

// TestSessionResume: a client that reconnects with its session and resume
// secret keeps its session leases.
func TestSessionResume(t *testing.T) {
	s := servertest.Start(t, servertest.Options{Server: server.Config{LeaseGrace: 3 * time.Second}})
	ctx := servertest.Context(t)
	c, err := client.Dial(ctx, s.WS, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "r", "presence/me", true, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	c.CloseNow()
	m := c.Connected()
	c2, err := client.Dial(ctx, s.WS, &client.Options{Session: m.Session, Resume: m.Resume})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if !c2.Connected().Resumed || c2.Connected().Session != m.Session {
		t.Fatalf("connected = %+v, want session %s resumed", c2.Connected(), m.Session)
	}
	if _, _, err := s.HTTP.Get(ctx, "r", "presence/me"); err != nil {
		t.Fatalf("leased key after resume: %v", err)
	}
}

// TestHeartbeat: the keepalive keeps an idle connection open; without it
// the server closes with 4001.
func TestHeartbeat(t *testing.T) {
	s := servertest.Start(t, servertest.Options{Server: server.Config{PingInterval: 100 * time.Millisecond}})
	ctx := servertest.Context(t)
	quiet, err := client.Dial(ctx, s.WS, &client.Options{NoKeepAlive: true})
	if err != nil {
		t.Fatal(err)
	}
	alive := dial(t, s, "msgpack")
	select {
	case <-quiet.Done():
	case <-ctx.Done():
		t.Fatal("the server kept a silent connection")
	}
	if code := client.CloseCode(quiet.Err()); code != int(wire.CloseHeartbeatTimeout) {
		t.Fatalf("close code %d (%v), want 4001", code, quiet.Err())
	}
	time.Sleep(300 * time.Millisecond) // well past 2 × ping_ms
	if alive.Err() != nil {
		t.Fatalf("kept-alive connection ended: %v", alive.Err())
	}
}

// TestBigSnapshot: a snapshot is one message however big; the default
// read limit takes it (the websocket library's own default is 32 KiB).
func TestBigSnapshot(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	ctx, c := servertest.Context(t), dial(t, s, "msgpack")
	var ops []wire.TxnOp
	for i := range 200 {
		ops = append(ops, wire.TxnOp{Type: "put", Key: fmt.Sprintf("k%03d", i), Value: wire.Value(`"` + strings.Repeat("x", 1000) + `"`)})
	}
	if _, err := c.Txn(ctx, "big", nil, ops); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, "big", client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m := next(t, sub); m.T != wire.TSnapshot || len(m.Items) != 200 {
		t.Fatalf("snapshot of %d items", len(m.Items))
	}
}
