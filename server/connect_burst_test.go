package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redisstore"
	"github.com/statecast/statecast/store/redistest"
)

// burstResult is what one connection of a connect burst got: connected
// or the close status, and the answer to its put and its sub ("ok", or
// the error's code).
type burstResult struct {
	connected bool
	close     websocket.StatusCode
	put, sub  string
	err       error
}

// burstConn dials ws and sends, in one frame as the scale run's load tool
// does, connect, a put of key c<i> in leaseRoom bound to the session, and
// a sub of room; it reads until both are answered or the socket ends. An
// upgrade answered 503 (the node's connects at their bound) is tried
// again after its Retry-After, as a client does.
func burstConn(ws string, i int, leaseRoom, room string) (r burstResult) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, ws, &websocket.DialOptions{Subprotocols: []string{wire.JSON2.Subprotocol()}})
	for err != nil && resp != nil && resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "1" {
		time.Sleep(time.Second + rand.N(time.Second))
		c, resp, err = websocket.Dial(ctx, ws, &websocket.DialOptions{Subprotocols: []string{wire.JSON2.Subprotocol()}})
	}
	if err != nil {
		r.err = err
		return r
	}
	defer c.CloseNow()
	frame := `{"t":"connect"}` + "\n" +
		`{"t":"put","id":2,"room":"` + leaseRoom + `","key":"c` + strconv.Itoa(i) + `","value":1,"lease":"session"}` + "\n" +
		`{"t":"sub","id":1,"room":"` + room + `"}`
	if r.err = c.Write(ctx, websocket.MessageText, []byte(frame)); r.err != nil {
		return r
	}
	for r.put == "" || r.sub == "" {
		_, data, err := c.Read(ctx)
		if err != nil {
			r.close, r.err = websocket.CloseStatus(err), err
			return r
		}
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			var m struct {
				T    string `json:"t"`
				ID   uint64 `json:"id"`
				Code string `json:"code"`
			}
			if r.err = json.Unmarshal([]byte(line), &m); r.err != nil {
				return r
			}
			got := "ok"
			switch m.T {
			case wire.TConnected:
				r.connected = true
				continue
			case wire.TErr:
				got = m.Code
			case wire.TOK:
			default:
				continue
			}
			if m.ID == 2 {
				r.put = got
			} else if m.ID == 1 {
				r.sub = got
			}
		}
	}
	return r
}

// TestConnectBurstOnSmallPool: 300 clients connect at once to a node
// whose Redis client has a pool of 2 connections, each with a put bound
// to its session and a sub, while Redis stalls its writes for longer than
// the pool's timeout (2.5 s) but less than a write's (5 s). Every
// connect gets connected, every put and sub is answered ok, and every
// key is there. Before, each session save took a pooled connection of
// its own: 298 connects waited for the pool past its timeout and were
// closed 1011, as 234,420 dials of the 100,000-connection scale run were.
// The margins are seconds wide: under CI's load (-race, -p 4) a stall
// 0.7 s short of the write timeout failed a few saves that waited in a
// starved scheduler.
func TestConnectBurstOnSmallPool(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	ctx := servertest.Context(t)
	st, err := redisstore.New(ctx, redisstore.Config{URL: rs.URL() + "?pool_size=2", Prefix: "burst", WriteTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	n := servertest.Start(t, servertest.Options{Store: st, Server: server.Config{NodeTimeout: 10 * time.Second, StoreTimeout: 10 * time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))}})
	if _, err := redistest.Do(rs.Addr(), "CLIENT", "PAUSE", "3000", "WRITE"); err != nil {
		t.Fatal(err)
	}
	const conns = 300
	results := make([]burstResult, conns)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() { results[i] = burstConn(n.WS, i, "lease", "r"+strconv.Itoa(i%20)) })
	}
	wg.Wait()
	got := map[string]int{}
	for _, r := range results {
		if !r.connected || r.put != "ok" || r.sub != "ok" {
			got[fmt.Sprintf("connected %v, close %d, put %q, sub %q, %v", r.connected, r.close, r.put, r.sub, r.err)]++
		}
	}
	if len(got) > 0 {
		t.Errorf("of %d connects during the stall, not connected with put and sub ok: %v", conns, got)
	}
	if l, err := n.HTTP.List(ctx, "lease", ""); err != nil || len(l.Items) != conns {
		t.Errorf("session-bound keys: %d (%v), want %d", len(l.Items), err, conns)
	}
	if t.Failed() {
		t.Logf("the node's warnings:\n%s", logs.String())
	}
}

// slowLoads is a store whose room snapshots wait until release is closed.
type slowLoads struct {
	store.Store
	release chan struct{}
}

func (s *slowLoads) Snapshot(ctx context.Context, room, prefix string) (store.Snapshot, error) {
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	return s.Store.Snapshot(ctx, room, prefix)
}

// TestSubWhoseRoomLoadTimesOut: a sub whose room does not load within the
// store timeout is answered unavailable (retry), as an SSE watch is; it
// was internal ("a bug"), which the scale run's subs got by the hundred
// while room loads waited for the Redis pool.
func TestSubWhoseRoomLoadTimesOut(t *testing.T) {
	slow := &slowLoads{Store: store.NewMemory(store.MemoryConfig{}), release: make(chan struct{})}
	n := servertest.Start(t, servertest.Options{Store: slow, Server: server.Config{StoreTimeout: 200 * time.Millisecond}})
	defer close(slow.release)
	r, _ := connectRaw(t, n, "json")
	r.send(&wire.Request{T: wire.TSub, ID: 1, Room: "lobby"})
	if m := r.reply(1); m.T != wire.TErr || m.Code != wire.CodeUnavailable {
		t.Fatalf("sub of a room whose load outlasts the store timeout: %+v, want unavailable", m)
	}
}
