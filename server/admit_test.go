package server_test

// Connect admission (server/admit.go): a node works on at most
// MaxConnecting connects at once and answers the rest 503 at once.

import (
	"io"
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

// TestConnectGate: with one place, a connect that waits on the connect
// hook keeps it however long it waits, and meanwhile an upgrade and an
// SSE watch get 503 with Retry-After; once its first subscription is
// answered the place is free. A socket that sends nothing gives its place
// back within a look while it stays open, so silent sockets cannot close
// the node to connects.
func TestConnectGate(t *testing.T) {
	release := make(chan struct{})
	var asked atomic.Int32
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, `{"subject":"alice","expires_in":60,"grants":[{"room":"*","access":"rw"}]}`)
	}))
	t.Cleanup(backend.Close)
	ch, err := hooks.NewConnector(hooks.ConnectorConfig{URL: backend.URL, Secret: hookSecret, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	n := servertest.Start(t, servertest.Options{Server: server.Config{Connect: ch, MaxConnecting: 1}})
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

	close(release)
	c := <-dialed
	if c == nil {
		t.FailNow()
	}
	defer c.Close()
	if _, err := c.Subscribe(ctx, "r", client.SubscribeOptions{}); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	if got := n.Counter("statecast_connecting"); got != 0 {
		t.Errorf("statecast_connecting = %v after the first subscription's answer, want 0", got)
	}

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
