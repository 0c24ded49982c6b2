package bench

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestRawConnSpeaksWebSocket: the tool's own reader against the library
// the server uses: the subprotocol is agreed; many small messages in one
// read, a message larger than its buffer and one in fragments arrive
// whole and in order; a ping from the server is answered (the server's
// Ping returns only on the pong); what the client writes arrives masked
// and intact; the server's close ends the reads.
func TestRawConnSpeaksWebSocket(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 3*rawBufSize/16+5)
	// Each larger than the library's write buffer (4 KiB): a frame each.
	fragments := [][]byte{bytes.Repeat([]byte("a"), 6000), bytes.Repeat([]byte("b"), 6000), bytes.Repeat([]byte("c"), 6000)}
	echoed := make(chan []byte, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"statecast.v2.json"}})
		if err != nil {
			t.Errorf("accept: %v", err)
			return
		}
		defer c.CloseNow()
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		if c.Subprotocol() != "statecast.v2.json" {
			t.Errorf("subprotocol %q", c.Subprotocol())
		}
		for i := range 100 {
			if err := c.Write(ctx, websocket.MessageText, []byte(strings.Repeat("m", i))); err != nil {
				t.Errorf("write: %v", err)
				return
			}
		}
		if err := c.Write(ctx, websocket.MessageBinary, big); err != nil {
			t.Errorf("write big: %v", err)
			return
		}
		wr, err := c.Writer(ctx, websocket.MessageText)
		if err != nil {
			t.Errorf("writer: %v", err)
			return
		}
		for _, f := range fragments {
			if _, err := wr.Write(f); err != nil {
				t.Errorf("fragment: %v", err)
				return
			}
		}
		if err := wr.Close(); err != nil {
			t.Errorf("fragments close: %v", err)
			return
		}
		// The client answers the ping while it reads; the pong reaches
		// Ping through a read of this side: of the client's message, then
		// CloseRead's.
		pinged := make(chan error, 1)
		go func() { pinged <- c.Ping(ctx) }()
		_, msg, err := c.Read(ctx)
		if err != nil {
			t.Errorf("read the client's message: %v", err)
			return
		}
		echoed <- msg
		_ = c.CloseRead(ctx) // a new ctx: the ping's goroutine still reads this one
		if err := <-pinged; err != nil {
			t.Errorf("ping: %v", err)
		}
		_ = c.Close(websocket.StatusNormalClosure, "bye")
	}))
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := dialRaw(ctx, d.DialContext, "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/ws", []string{"statecast.v2.json"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.closeNow()
	var buf []byte
	for i := range 100 {
		if buf, err = c.readMessage(buf[:0]); err != nil || string(buf) != strings.Repeat("m", i) {
			t.Fatalf("message %d: %q, %v", i, buf, err)
		}
	}
	if buf, err = c.readMessage(buf[:0]); err != nil || !bytes.Equal(buf, big) {
		t.Fatalf("the big message: %d bytes, %v; want %d", len(buf), err, len(big))
	}
	if buf, err = c.readMessage(buf[:0]); err != nil || string(buf) != string(bytes.Join(fragments, nil)) {
		t.Fatalf("the fragmented message: %d bytes, %v", len(buf), err)
	}
	const hello = `{"t":"connect"}`
	if err := c.writeText(ctx, []byte(hello)); err != nil {
		t.Fatal(err)
	}
	// The ping arrives now; answering it is part of reading.
	if buf, err = c.readMessage(buf[:0]); !errors.Is(err, errRawClosed) {
		t.Fatalf("after the server's close: %q, %v; want errRawClosed", buf, err)
	}
	if got := <-echoed; string(got) != hello {
		t.Fatalf("the server read %q, want %q", got, hello)
	}
}

// TestRawConnRefusedUpgrade: an answer other than 101 is an error that
// says so.
func TestRawConnRefusedUpgrade(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "full", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	var d net.Dialer
	_, err := dialRaw(context.Background(), d.DialContext, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("dial to a server that refuses: %v, want a 503 error", err)
	}
}
