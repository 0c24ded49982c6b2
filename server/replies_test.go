package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestUnreadRepliesBounded: a client that pipelines requests and never
// reads the replies makes the server stop reading it, not buffer every
// reply: the replies waiting for the writer stay near maxPendingReplies.
func TestUnreadRepliesBounded(t *testing.T) {
	t.Parallel() // waits on wall-clock time (timeouts, grace, expiry)
	e := newAPIEnv(t, apiOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(e.hs.URL, "http")+"/v1/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"t":"connect"}`)); err != nil {
		t.Fatal(err)
	}
	// 1,024 pings a frame, each answered by a pong: 64 MB of replies if
	// all were read, far more than loopback's socket buffers hold.
	frame := []byte(strings.Repeat(`{"t":"ping"}`+"\n", 1024))
	peak := 0
	sent := 0
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
	defer wcancel()
	for sent < 5000 {
		if ws.Write(wctx, websocket.MessageText, frame) != nil {
			break // the server stopped reading: our writes block
		}
		sent++
		for _, c := range e.srv.connList() {
			c.mu.Lock()
			peak = max(peak, len(c.pending))
			c.mu.Unlock()
		}
	}
	if limit := maxPendingReplies + 1024*len(`{"t":"pong"}`+"\n"); peak > limit {
		t.Fatalf("%d bytes of replies pending after %d frames, want at most %d", peak, sent, limit)
	}
	if sent == 5000 {
		t.Fatalf("the server read all %d frames of a client that reads nothing", sent)
	}
	t.Logf("%d frames sent before the server stopped reading; peak pending %d bytes", sent, peak)
}
