package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
)

// Tests against a scripted server, for what a real one does not do on
// demand: lose replies, batch chosen messages into one frame.

// fakeConn is the server side of one scripted connection.
type fakeConn struct {
	ws    *websocket.Conn
	codec wire.Codec
}

// send writes msgs as one frame.
func (f *fakeConn) send(msgs ...any) {
	var frame []byte
	for _, m := range msgs {
		frame, _ = f.codec.Append(frame, m)
	}
	_ = f.ws.Write(context.Background(), f.codec.MessageType(), frame)
}

// fakeServer answers connect, then hands every later request to fn.
func fakeServer(t *testing.T, fn func(f *fakeConn, r wire.Request)) string {
	return fakeServerSpeaking(t, []string{wire.SubprotocolJSON2, wire.SubprotocolJSON, wire.SubprotocolMsgpack}, fn)
}

// fakeServerSpeaking is fakeServer knowing only the subprotocols protos.
func fakeServerSpeaking(t *testing.T, protos []string, fn func(f *fakeConn, r wire.Request)) string {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: protos})
		if err != nil {
			return
		}
		defer ws.CloseNow()
		codec, _ := wire.ForSubprotocol(ws.Subprotocol())
		f := &fakeConn{ws: ws, codec: codec}
		for {
			_, b, err := ws.Read(r.Context())
			if err != nil {
				return
			}
			reqs, err := codec.DecodeRequests(b)
			if err != nil {
				ws.Close(websocket.StatusInvalidFramePayloadData, "")
				return
			}
			for _, req := range reqs {
				if req.T == wire.TConnect {
					f.send(&wire.Connected{T: wire.TConnected, V: codec.Version(), Session: "s", Resume: "r", PingMS: 60000})
					continue
				}
				fn(f, req)
			}
		}
	}))
	t.Cleanup(ts.Close)
	return "ws" + strings.TrimPrefix(ts.URL, "http")
}

// TestMultiMessageFrames: every message of a frame reaches its caller or
// subscription, in order, in both codecs.
func TestMultiMessageFrames(t *testing.T) {
	url := fakeServer(t, func(f *fakeConn, r wire.Request) {
		if r.T != wire.TSub {
			return
		}
		s := r.ID
		ev := wire.Event{Type: "put", Key: "k", Value: wire.Value(`{"v":[1,2.5,"x"]}`), CreateRev: 3, ModRev: 3, Version: 1}
		f.send( // the events of a subscription may come in the ok's frame
			&wire.OK{T: wire.TOK, ID: s, Rev: 2},
			&wire.Snapshot{T: wire.TSnapshot, S: s, Epoch: "e", Rev: 2, Reason: "initial", Items: []wire.Item{}},
			&wire.Pong{T: wire.TPong},
			&wire.Refresh{T: wire.TRefresh, ExpiresMS: 1000},
		)
		f.send(
			&wire.Message{T: wire.TEvents, S: s, Rev: 3, Events: []wire.Event{ev}},
			&wire.Mark{T: wire.TProgress, S: s, Rev: 9},
			&wire.Mark{T: wire.TSynced, S: 999, Rev: 9}, // no such subscription
			&wire.Unsubscribed{T: wire.TUnsubscribed, S: s, Code: wire.CodeUnavailable, Message: "room reset"},
		)
	})
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			var mu sync.Mutex
			var other []string
			ctx := servertest.Context(t)
			c, err := client.Dial(ctx, url, &client.Options{Codec: codec, OnMessage: func(m wire.Message) {
				mu.Lock()
				other = append(other, m.T)
				mu.Unlock()
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			sub, err := c.Subscribe(ctx, "r", client.SubscribeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			v := client.NewView()
			var got []string
			for {
				m, err := sub.Next(ctx)
				if err != nil {
					if !errors.Is(err, client.ErrUnavailable) {
						t.Fatalf("Next after unsubscribed: %v", err)
					}
					break
				}
				if err := v.Apply(m); err != nil {
					t.Fatal(err)
				}
				got = append(got, m.T)
			}
			if strings.Join(got, " ") != "snapshot events progress unsubscribed" {
				t.Fatalf("subscription got %v", got)
			}
			if string(v.Items["k"].Value) != `{"v":[1,2.5,"x"]}` || v.Rev != 9 {
				t.Fatalf("view %+v", v)
			}
			mu.Lock()
			defer mu.Unlock()
			// The unsolicited pong is dropped; the rest reaches OnMessage.
			if strings.Join(other, " ") != "refresh synced" {
				t.Fatalf("OnMessage got %v", other)
			}
		})
	}
}

// TestOutcomeUnknown: requests in flight when the socket dies fail, and a
// write among them says its outcome is unknown (PROTOCOL.md §4).
func TestOutcomeUnknown(t *testing.T) {
	url := fakeServer(t, func(f *fakeConn, r wire.Request) {
		if r.T == wire.TPut {
			f.ws.Close(websocket.StatusServiceRestart, "bye") // no reply
		}
	})
	ctx := servertest.Context(t)
	c, err := client.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	subErr := make(chan error, 1)
	go func() {
		_, err := c.Subscribe(ctx, "r", client.SubscribeOptions{}) // never answered
		subErr <- err
	}()
	time.Sleep(20 * time.Millisecond)
	_, err = c.Put(ctx, "r", "k", 1)
	if !errors.Is(err, client.ErrOutcomeUnknown) || client.CloseCode(err) != int(websocket.StatusServiceRestart) {
		t.Fatalf("Put = %v, want ErrOutcomeUnknown with close 1012", err)
	}
	err = <-subErr
	if !errors.Is(err, client.ErrClosed) || errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("Subscribe = %v, want ErrClosed", err)
	}
	if err := c.Ping(ctx); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Ping on a closed connection: %v", err)
	}
}

// TestGiveUpOnWrite: a write whose ctx ends before its reply has an
// unknown outcome; the connection stays usable.
func TestGiveUpOnWrite(t *testing.T) {
	url := fakeServer(t, func(f *fakeConn, r wire.Request) {
		if r.T != wire.TPut { // puts are never answered
			f.send(&wire.OK{T: wire.TOK, ID: r.ID})
		}
	})
	ctx := servertest.Context(t)
	c, err := client.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := c.Put(short, "r", "k", 1); !errors.Is(err, client.ErrOutcomeUnknown) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Put given up on: %v", err)
	}
	if err := c.Auth(ctx, "tok"); err != nil {
		t.Fatalf("a request after giving up: %v", err)
	}
}

// The default codec is v2 where the server speaks it, and v1 JSON on a
// server from before v2 (a rolling deploy); asked for v2 only, a v1 server
// is an error.
func TestDefaultCodecNegotiates(t *testing.T) {
	ctx := servertest.Context(t)
	for _, tc := range []struct {
		protos []string
		codec  string
		want   int // connected's v, 0: Dial fails
	}{
		{[]string{wire.SubprotocolJSON2, wire.SubprotocolJSON}, "", 2},
		{[]string{wire.SubprotocolJSON}, "", 1},
		{[]string{wire.SubprotocolJSON}, "json2", 0},
		{[]string{wire.SubprotocolJSON2, wire.SubprotocolJSON}, "json", 1},
	} {
		url := fakeServerSpeaking(t, tc.protos, func(*fakeConn, wire.Request) {})
		c, err := client.Dial(ctx, url, &client.Options{Codec: tc.codec})
		if tc.want == 0 {
			if err == nil {
				c.Close()
				t.Errorf("%v, codec %q: Dial succeeded", tc.protos, tc.codec)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v, codec %q: %v", tc.protos, tc.codec, err)
		}
		if v := c.Connected().V; v != tc.want {
			t.Errorf("%v, codec %q: v%d, want v%d", tc.protos, tc.codec, v, tc.want)
		}
		c.Close()
	}
}
