//go:build linux && !386

package server_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
)

// TestWSIdleConnsHoldNoGoroutine: idle subscribed connections park their
// sockets in the idle poller and hold no goroutine; one woken by the
// poller still answers pings, every one still receives pushes, and a
// peer's close is noticed (the connection ends on the server).
func TestWSIdleConnsHoldNoGoroutine(t *testing.T) {
	const n = 200
	e := servertest.Start(t, servertest.Options{})
	base := runtime.NumGoroutine()
	conns := subscribeRaw(t, e, n, "idle")
	// Writers exit after two idle looks of the heartbeat sweep; readers
	// park at once. The test's own client connections run no goroutine
	// while not read.
	idle := func(when string) {
		t.Helper()
		waitFor(t, 10*time.Second, fmt.Sprintf("%s: at most %d goroutines (%d before the connections)", when, base+n/10, base), func() bool {
			return runtime.NumGoroutine() <= base+n/10
		})
	}
	idle("subscribed")

	// Woken by the poller: each request is answered, then it parks again.
	for _, r := range conns[:20] {
		r.send(&wire.Request{T: wire.TPing})
		if m := r.next(); m.T != wire.TPong {
			t.Fatalf("ping answered %+v, want pong", m.Message)
		}
	}
	idle("after pings")

	if _, err := e.HTTP.Put(servertest.Context(t), "idle", "k", []byte(`"v"`), nil, ""); err != nil {
		t.Fatal(err)
	}
	for i, r := range conns {
		msgs := r.until(func(m rawMsg) bool { return m.T == wire.TEvents })
		if evs := rawEvents(t, msgs[len(msgs)-1]); len(evs) != 1 || evs[0]["key"] != "k" {
			t.Fatalf("connection %d: events %v, want a put of k", i, evs)
		}
	}
	// A second ping after the push: the wake-ups go on.
	conns[0].send(&wire.Request{T: wire.TPing})
	if m := conns[0].next(); m.T != wire.TPong {
		t.Fatalf("ping answered %+v, want pong", m.Message)
	}
	idle("after the push")

	// Peers that go away: a close handshake, and a socket just dropped.
	_ = conns[0].ws.Close(websocket.StatusNormalClosure, "")
	_ = conns[1].ws.CloseNow()
	waitFor(t, 10*time.Second, fmt.Sprintf("statecast_connections = %d", n-2), func() bool {
		return e.Counter("statecast_connections") == n-2
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The others are ended by the server's shutdown, parked as they are.
	if err := e.Server.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range conns[2:12] {
		if code, _ := r.closeStatus(10 * time.Second); code != websocket.StatusServiceRestart {
			t.Fatalf("closed with %d, want 1012 (shutdown)", code)
		}
	}
}

// TestWSBurstToIdleConnsStartsNoWriter: a write to a room of idle
// connections reaches every one through the node's flushers: no socket
// gets a writer goroutine of its own for it (a fresh goroutine a socket
// grew a stack for each), and none is left running.
func TestWSBurstToIdleConnsStartsNoWriter(t *testing.T) {
	const n = 200
	e := servertest.Start(t, servertest.Options{})
	base := runtime.NumGoroutine()
	conns := subscribeRaw(t, e, n, "burst")
	// A writer that sent a subscription's first messages exits once its
	// connection is idle.
	waitFor(t, 10*time.Second, fmt.Sprintf("at most %d goroutines (%d before the connections)", base+n/10, base), func() bool {
		return runtime.NumGoroutine() <= base+n/10
	})
	started := e.Counter("statecast_ws_writers_started_total")
	for i := range 3 {
		key := fmt.Sprintf("k%d", i)
		if _, err := e.HTTP.Put(servertest.Context(t), "burst", key, []byte(`"v"`), nil, ""); err != nil {
			t.Fatal(err)
		}
		for j, r := range conns {
			msgs := r.until(func(m rawMsg) bool { return m.T == wire.TEvents })
			if evs := rawEvents(t, msgs[len(msgs)-1]); len(evs) != 1 || evs[0]["key"] != key {
				t.Fatalf("connection %d: events %v, want a put of %s", j, evs, key)
			}
		}
	}
	if now := e.Counter("statecast_ws_writers_started_total"); now != started {
		t.Fatalf("%v writers started for three writes to %d idle connections, want none", now-started, n)
	}
	// Besides the flushers and the HTTP client's connection: no
	// goroutine a socket.
	if g := runtime.NumGoroutine(); g > base+n/4 {
		t.Fatalf("%d goroutines after the writes (%d before the connections)", g, base)
	}
}

// subscribeRaw opens n connections subscribed to room, each past its
// snapshot.
func subscribeRaw(t *testing.T, e *servertest.Node, n int, room string) []*rawConn {
	conns := make([]*rawConn, n)
	for i := range conns {
		r, _ := connectRaw(t, e, "json2")
		r.send(&wire.Request{T: wire.TSub, ID: 1, Room: room})
		r.until(func(m rawMsg) bool { return m.T == wire.TSnapshot })
		conns[i] = r
	}
	return conns
}
