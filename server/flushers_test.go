package server_test

import (
	"bufio"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
)

// TestWSSocketsThatDoNotReadHoldUpNoOne: sockets that stop reading, more
// of them than the node has flushers, in a room written with large values:
// their writes wait on their own goroutines (a flusher whose write must
// wait hands its place on first), so a subscriber that reads gets every
// write at once, not after the write timeout (a minute here).
func TestWSSocketsThatDoNotReadHoldUpNoOne(t *testing.T) {
	e := servertest.Start(t, servertest.Options{Server: server.Config{WriteTimeout: time.Minute, WriteRate: 1e6}, SendBuffer: 32 << 10})
	ctx, room := servertest.Context(t), "stuck"
	stuck := 4 * runtime.GOMAXPROCS(0)
	for range stuck {
		subscribeThenStopReading(t, e, room)
	}
	// Their subscriptions' writers gone (two idle looks of the heartbeat
	// sweep, a second apart at most): the writes below reach them through
	// the flushers. (A writer still there would only make this test pass
	// without the flushers' hand-over; the process's goroutine count is no
	// gauge of it: warm readers and the sweep come and go.)
	time.Sleep(3 * time.Second)
	fast := dialCodec(t, e, "json2")
	sub, err := fast.Subscribe(ctx, room, client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v := client.NewView()
	applyUntil(t, sub, v, func(m wire.Message) bool { return m.T == wire.TSnapshot })
	w := dialCodec(t, e, "json2")
	// Writes of 150 KB: from the first, more than the socket buffers of
	// one that does not read hold, with more than a tail's worth left.
	for i := range 20 {
		head, err := w.Put(ctx, room, fmt.Sprint("k", i%4), bigValue(i, 150<<10))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		applyUntil(t, sub, v, func(m wire.Message) bool { return m.Rev >= head })
		if d := time.Since(start); d > 20*time.Second {
			t.Fatalf("write %d reached the reading subscriber after %v", i, d)
		}
	}
}

// TestWSLargeEventsNotCopiedPerSocket: a write of a large value to a room
// whose subscribers' sockets are idle (reached through the flushers) and
// cannot take it at once costs the node about one copy of its encoding,
// not one per socket: each socket's frame holds the shared list as a piece
// of its own, however long the socket takes. (Each frame was a copy: a
// 200 KiB value to 100,000 subscribers allocated 28 GiB.)
func TestWSLargeEventsNotCopiedPerSocket(t *testing.T) {
	e := servertest.Start(t, servertest.Options{Server: server.Config{WriteTimeout: time.Minute, WriteRate: 1e6}, SendBuffer: 32 << 10})
	ctx, room := servertest.Context(t), "big"
	const socks, size = 32, 200 << 10
	for range socks {
		subscribeThenStopReading(t, e, room)
	}
	time.Sleep(3 * time.Second) // their writers retire: the write below goes through the flushers
	w := dialCodec(t, e, "json2")
	if _, err := w.Put(ctx, room, "warm", `1`); err != nil { // each socket's frame buffers, as in steady use
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	wantNoCopyEach(t, w, room, socks, size)
}

// wantNoCopyEach checks that a write of a size-byte value to room, whose n
// readers do not read, allocates well under a copy for each: against the
// same write to a room nobody watches (the write's own path).
func wantNoCopyEach(t *testing.T, w *client.Conn, room string, n, size int) {
	t.Helper()
	ctx := servertest.Context(t)
	allocs := func(room string) uint64 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		if _, err := w.Put(ctx, room, "k", bigValue(0, size)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // every reader's turn
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	alone, fanned := allocs("empty"), allocs(room)
	t.Logf("a %d KiB value: %d KiB allocated with no reader, %d KiB with %d that do not read", size>>10, alone>>10, fanned>>10, n)
	if fanned > alone && fanned-alone > uint64(n*size/8) {
		t.Errorf("the %d readers cost %d KiB more, want well under a copy each (%d KiB)", n, (fanned-alone)>>10, size>>10)
	}
}

// subscribeThenStopReading opens a socket (with a small receive buffer)
// that subscribes to room, reads its snapshot and then nothing more.
func subscribeThenStopReading(t *testing.T, e *servertest.Node, room string) {
	t.Helper()
	r, _, err := dialRawResp(t, e, "json2", rawOpts{ReadBuffer: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	r.send(&wire.Request{T: wire.TConnect})
	r.next()
	r.send(&wire.Request{T: wire.TSub, ID: 1, Room: room})
	r.until(func(m rawMsg) bool { return m.T == wire.TSnapshot })
}

// TestSSELargeEventsNotCopiedPerStream: as for WebSockets, a large write
// to a room whose SSE streams do not read costs the node its shared
// encoding, not a copy for each stream's buffer.
func TestSSELargeEventsNotCopiedPerStream(t *testing.T) {
	e := servertest.Start(t, servertest.Options{Server: server.Config{WriteTimeout: time.Minute, WriteRate: 1e6}, SendBuffer: 32 << 10, Unchecked: true})
	room := "big"
	const streams, size = 32, 200 << 10
	host := strings.TrimPrefix(e.TS.URL, "http://")
	for range streams {
		nc, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		_ = nc.(*net.TCPConn).SetReadBuffer(16 << 10)
		fmt.Fprintf(nc, "GET /v1/rooms/%s/watch HTTP/1.1\r\nHost: %s\r\n\r\n", room, host)
		br := bufio.NewReader(nc)
		for { // its reset, then nothing more is read
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(line, "event: reset") {
				break
			}
		}
	}
	wantNoCopyEach(t, dialCodec(t, e, "json2"), room, streams, size)
}
