package server_test

// Connect admission (server/admit.go): a node works on at most
// MaxConnecting connects at once; the rest wait in a queue for a place,
// then get 503.

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/server/servertest"
)

// heldHook is a connect hook that lets alice in with every grant,
// answering its nth call only once answer is closed; asked counts calls.
func heldHook(t *testing.T, nth int32) (ch *hooks.Connector, asked *atomic.Int32, answer chan struct{}) {
	t.Helper()
	answer, asked = make(chan struct{}), new(atomic.Int32)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if asked.Add(1) == nth {
			select {
			case <-answer:
			case <-r.Context().Done():
				return
			}
		}
		_, _ = io.WriteString(w, `{"subject":"alice","expires_in":60,"grants":[{"room":"*","access":"rw"}]}`)
	}))
	t.Cleanup(backend.Close)
	ch, err := hooks.NewConnector(hooks.ConnectorConfig{URL: backend.URL, Secret: hookSecret, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return ch, asked, answer
}

// holdOnePlace starts a node with one connect place and the given queue
// wait, and has a client take that place by connecting through a connect
// hook that answers it only on release, which then has the client
// subscribe, ending its connect.
func holdOnePlace(t *testing.T, wait time.Duration) (n *servertest.Node, release func()) {
	t.Helper()
	ch, asked, answer := heldHook(t, 1)
	n = servertest.Start(t, servertest.Options{Server: server.Config{Connect: ch, MaxConnecting: 1, ConnectQueueWait: wait}})
	ctx := servertest.Context(t)
	dialed := make(chan *client.Conn, 1)
	go func() {
		c, err := client.Dial(ctx, n.WS, nil)
		if err != nil {
			t.Errorf("the connect waiting on the hook: %v", err)
		}
		dialed <- c
	}()
	waitFor(t, 5*time.Second, "the connect hook to be asked", func() bool { return asked.Load() == 1 })
	return n, func() {
		t.Helper()
		close(answer)
		c := <-dialed
		if c == nil {
			t.FailNow()
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Subscribe(ctx, "r", client.SubscribeOptions{}); err != nil {
			t.Fatalf("subscribe: %v", err)
		}
	}
}

// TestConnectGate: with one place and no queue, a connect that waits on
// the connect hook keeps it however long it waits, and meanwhile an
// upgrade and an SSE watch get 503 with Retry-After; once its first subscription is
// answered the place is free. A socket that sends nothing gives its place
// back within a look while it stays open, so silent sockets cannot close
// the node to connects.
func TestConnectGate(t *testing.T) {
	n, release := holdOnePlace(t, -1)
	ctx := servertest.Context(t)
	time.Sleep(1500 * time.Millisecond) // past a look: a connect being handled keeps its place

	refused := func(what string, resp *http.Response, err error) {
		t.Helper()
		if err == nil && resp.StatusCode < 300 {
			t.Errorf("%s while the node's one place is taken: admitted, want 503", what)
			return
		}
		if resp == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
			t.Errorf("%s while the node's one place is taken: %v %v, want 503 with Retry-After: 1", what, resp, err)
		}
	}
	_, resp, err := websocket.Dial(ctx, n.WS, &websocket.DialOptions{Subprotocols: []string{"statecast.v2.json"}})
	refused("an upgrade", resp, err)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, n.TS.URL+"/v1/rooms/r/watch", nil)
	resp, err = http.DefaultClient.Do(req)
	refused("an SSE watch", resp, err)
	if resp != nil {
		resp.Body.Close()
	}
	if got := n.Counter("statecast_connections_rejected_total", "reason", "connecting"); got != 2 {
		t.Errorf("rejected{connecting} = %v, want 2", got)
	}
	if got := n.Counter("statecast_connecting"); got != 1 {
		t.Errorf("statecast_connecting = %v while one connects, want 1", got)
	}

	// The held connect subscribes: its place is given back just after its
	// answer is queued, which the client may read first.
	release()
	waitFor(t, 5*time.Second, "the place to be given back after the first subscription's answer", func() bool { return n.Counter("statecast_connecting") == 0 })

	silent, _, err := websocket.Dial(ctx, n.WS, &websocket.DialOptions{Subprotocols: []string{"statecast.v2.json"}})
	if err != nil {
		t.Fatalf("an upgrade with the place free: %v", err)
	}
	defer silent.CloseNow()
	if got := n.Counter("statecast_connecting"); got != 1 {
		t.Errorf("statecast_connecting = %v with a socket just upgraded, want 1", got)
	}
	// Well within the connect timeout (10 s): the socket is still open.
	waitFor(t, 3*time.Second, "a silent socket to give its place back", func() bool { return n.Counter("statecast_connecting") == 0 })
	other := dial(t, n, nil)
	if _, err := other.Subscribe(ctx, "r", client.SubscribeOptions{}); err != nil {
		t.Errorf("a client connecting beside the silent socket: %v", err)
	}
}

// TestConnectQueue: with the one place held by a connect waiting on the
// connect hook, an upgrade and an SSE watch queue for it; the watch whose
// client goes away leaves the queue, and the upgrade gets the place as
// soon as the first connect's subscription is answered, with nothing
// refused. A connect still queued when its wait ends gets 503.
func TestConnectQueue(t *testing.T) {
	n, release := holdOnePlace(t, 30*time.Second)
	ctx := servertest.Context(t)

	type upgraded struct {
		ws   *websocket.Conn
		resp *http.Response
		err  error
	}
	queued := make(chan upgraded, 1)
	go func() {
		ws, resp, err := websocket.Dial(ctx, n.WS, &websocket.DialOptions{Subprotocols: []string{"statecast.v2.json"}})
		queued <- upgraded{ws, resp, err}
	}()
	waitFor(t, 5*time.Second, "the upgrade to queue", func() bool { return n.Counter("statecast_connect_queue") == 1 })
	sseCtx, sseGone := context.WithCancel(ctx)
	sseDone := make(chan struct{})
	go func() {
		defer close(sseDone)
		req, _ := http.NewRequestWithContext(sseCtx, http.MethodGet, n.TS.URL+"/v1/rooms/r/watch", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			t.Errorf("an SSE watch whose client went away while queued was answered %s", resp.Status)
			resp.Body.Close()
		}
	}()
	waitFor(t, 5*time.Second, "the watch to queue", func() bool { return n.Counter("statecast_connect_queue") == 2 })
	sseGone()
	<-sseDone
	waitFor(t, 5*time.Second, "the gone watch to leave the queue", func() bool { return n.Counter("statecast_connect_queue") == 1 })

	release() // the held connect subscribes: its place is given back
	u := <-queued
	if u.err != nil {
		t.Fatalf("the queued upgrade after the place came free: %v %v", u.resp, u.err)
	}
	defer u.ws.CloseNow()
	if got := n.Counter("statecast_connect_queue"); got != 0 {
		t.Errorf("statecast_connect_queue = %v after the place was handed over, want 0", got)
	}
	if got := n.Counter("statecast_connecting"); got != 1 {
		t.Errorf("statecast_connecting = %v with the queued upgrade connecting, want 1", got)
	}
	if got := n.Counter("statecast_connections_rejected_total", "reason", "connecting"); got != 0 {
		t.Errorf("rejected{connecting} = %v, want 0: every connect queued", got)
	}

	// A connect queued behind a held place past a short wait is refused.
	short, releaseShort := holdOnePlace(t, 50*time.Millisecond)
	defer releaseShort()
	_, resp, err := websocket.Dial(ctx, short.WS, &websocket.DialOptions{Subprotocols: []string{"statecast.v2.json"}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Statecast-Refused") != "connecting" {
		t.Errorf("an upgrade queued past its wait: %v %v, want 503 (Statecast-Refused: connecting)", resp, err)
	}
	if got := short.Counter("statecast_connections_rejected_total", "reason", "connecting"); got != 1 {
		t.Errorf("rejected{connecting} = %v, want 1", got)
	}
}

// TestConnectPlacesPerClient: one client address holds at most an eighth
// of the node's connect places (4 at least), waiting ones included, so
// sockets that upgrade and say nothing, which need no token, cannot take
// them all: past its share an upgrade from that address is answered 503
// `connecting` at once, while another address connects. (Before, a few
// hundred silent upgrades a second kept every place taken.)
func TestConnectPlacesPerClient(t *testing.T) {
	n := servertest.Start(t, servertest.Options{Server: server.Config{MaxConnecting: 16, LimitLoopback: true}})
	ctx := servertest.Context(t)
	from := func(src string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
	}
	dial := func(src string) (*websocket.Conn, *http.Response, error) {
		return websocket.Dial(ctx, n.WS, &websocket.DialOptions{HTTPClient: from(src), Subprotocols: []string{"statecast.v2.json"}})
	}
	for i := range 4 { // silent: each holds its place until a look gives it back
		ws, _, err := dial("127.0.0.1")
		if err != nil {
			t.Fatalf("silent upgrade %d: %v", i, err)
		}
		defer ws.CloseNow()
	}
	ws, resp, err := dial("127.0.0.1")
	if err == nil {
		ws.CloseNow()
		t.Fatal("a fifth upgrade from the address holding four places was accepted")
	}
	if resp == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Statecast-Refused") != "connecting" {
		t.Fatalf("a fifth upgrade from the same address: %v %v, want 503 connecting", resp, err)
	}
	other, _, err := dial("127.0.0.2")
	if err != nil {
		t.Fatalf("an upgrade from another address, with places free: %v", err)
	}
	other.CloseNow()
	// The silent sockets' places come back at the looks: the address may
	// connect again.
	waitFor(t, 5*time.Second, "the silent sockets' places to come back", func() bool {
		ws, _, err := dial("127.0.0.1")
		if err == nil {
			ws.CloseNow()
		}
		return err == nil
	})
}
