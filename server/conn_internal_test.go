package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server/wire"
)

// TestIdleConnectionDropsGrownDrainBuffers: an idle connection gives back
// the drain buffers a burst grew (a resume's replay of 1,000 revisions
// grew them to 80 KiB), and keeps the small ones a trickle reuses.
func TestIdleConnectionDropsGrownDrainBuffers(t *testing.T) {
	c := &conn{msgs: make([]rooms.Message, 0, 1024), spare: make([]*sub, 0, 1024)}
	c.dropSendState()
	if c.msgs != nil || c.spare != nil {
		t.Errorf("after a burst: drain buffers of %d and %d entries kept", cap(c.msgs), cap(c.spare))
	}
	c = &conn{msgs: make([]rooms.Message, 0, keptDrain), spare: make([]*sub, 0, 4)}
	c.dropSendState()
	if cap(c.msgs) != keptDrain || cap(c.spare) != 4 {
		t.Errorf("small drain buffers dropped: %d and %d entries kept", cap(c.msgs), cap(c.spare))
	}
}

// TestRefusedConnDuringDrain: a WebSocket that a node refuses after its
// handshake because the node began draining meanwhile is told to
// reconnect at once (1012, as the node's open sockets are), not that the
// node is full (4004, which clients back off from); a request past the
// connection limit on a draining node is told it is shutting down; and
// neither is counted as refused for being full.
func TestRefusedConnDuringDrain(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{metrics: m}
	if code, _ := s.refusedConn(); code != wire.CloseServerFull {
		t.Errorf("a full node closes with %d, want %d", code, wire.CloseServerFull)
	}
	s.draining.Store(true)
	if code, _ := s.refusedConn(); code != websocket.StatusServiceRestart {
		t.Errorf("a draining node closes with %d, want 1012", code)
	}
	// So too a request over the connection limit that a draining node
	// refuses: it is told the node is going away, not that it is full.
	rec := httptest.NewRecorder()
	s.refuseFull(rec)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Statecast-Refused") != "" || !strings.Contains(rec.Body.String(), "shutting down") {
		t.Errorf("a draining node over its limit answers %d %q %s, want 503 shutting down", rec.Code, rec.Header().Get("Statecast-Refused"), rec.Body)
	}
	var full dto.Metric
	if err := m.rejected.WithLabelValues("full").Write(&full); err != nil || full.GetCounter().GetValue() != 1 {
		t.Errorf("rejected{full} = %v (%v), want 1 (the full node's only)", full.GetCounter().GetValue(), err)
	}
}
