package server

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/statecast/statecast/server/wire"
)

// TestWritesAgreeAcrossSurfaces: one write path. The same transaction
// sent as a WebSocket txn and as POST /v1/rooms/{room}/txn commits at the
// same revision or fails with the same code: ops spelt with "type"
// ("put", "delete") or, the older way, with "op" ("put", "del"); a bad op
// is reported in order, the first one found.
func TestWritesAgreeAcrossSurfaces(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	ws := dialJSON(t, e)
	cases := []struct {
		name, body string
		code       string // "" = committed
	}{
		{"type", `"ops":[{"type":"put","key":"a","value":1},{"type":"put","key":"b","value":{"x":[2]}}]`, ""},
		{"type delete", `"if":[{"key":"a","mod_rev":1}],"ops":[{"type":"delete","key":"a"}]`, ""},
		{"older op spelling", `"ops":[{"op":"put","key":"a","value":3},{"op":"del","key":"b"}]`, ""},
		{"both spellings", `"ops":[{"type":"put","op":"put","key":"a","value":1}]`, wire.CodeBadRequest},
		{"type del", `"ops":[{"type":"del","key":"a"}]`, wire.CodeBadRequest},
		{"op delete", `"ops":[{"op":"delete","key":"a"}]`, wire.CodeBadRequest},
		{"no type", `"ops":[{"key":"a","value":1}]`, wire.CodeBadRequest},
		{"put without value", `"ops":[{"type":"put","key":"a"}]`, wire.CodeBadRequest},
		{"no ops", `"ops":[]`, wire.CodeBadRequest},
		{"not a lease", `"ops":[{"type":"put","key":"a","value":1,"lease":"session:s_x"}]`, wire.CodeNotFound},
		{"unknown TTL lease", `"ops":[{"type":"put","key":"a","value":1,"lease":"ttl_x"}]`, wire.CodeNotFound},
		{"first bad op first", `"ops":[{"type":"put","key":"a","value":1,"lease":"s_1"},{"type":"zap","key":"b"}]`, wire.CodeNotFound},
		{"duplicate key", `"ops":[{"type":"delete","key":"a"},{"type":"put","key":"a","value":1}]`, wire.CodeInvalidKey},
		{"conflict", `"if":[{"key":"a","mod_rev":99}],"ops":[{"type":"delete","key":"a"}]`, wire.CodeConflict},
	}
	for i, c := range cases {
		id := uint64(i + 1)
		m := ws.ask(t, fmt.Sprintf(`{"t":"txn","id":%d,"room":"ws",%s}`, id, c.body))
		r := e.do(t, "POST", "/v1/rooms/http/txn", "{"+c.body+"}")
		var h struct {
			Rev   uint64 `json:"rev"`
			Error struct {
				Code string `json:"code"`
				Rev  uint64 `json:"rev"` // conflict
			} `json:"error"`
		}
		if err := json.Unmarshal(r.body, &h); err != nil {
			t.Fatalf("%s: HTTP body %s: %v", c.name, r.body, err)
		}
		if m.ID != id || m.Code != c.code || h.Error.Code != c.code || m.Rev != h.Rev+h.Error.Rev {
			t.Errorf("%s: WebSocket %+v, HTTP %d %s; want both code %q at one revision", c.name, m, r.status, r.body, c.code)
		}
	}
}

// jsonSocket is a connected WebSocket speaking statecast.v1.json.
type jsonSocket struct{ ws *websocket.Conn }

func dialJSON(t *testing.T, e *apiEnv) jsonSocket {
	t.Helper()
	ws, _, err := websocket.Dial(testContext(t), "ws"+strings.TrimPrefix(e.hs.URL, "http")+"/v1/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ws.CloseNow() })
	s := jsonSocket{ws}
	if m := s.ask(t, `{"t":"connect"}`); m.T != wire.TConnected {
		t.Fatalf("connect: %+v", m)
	}
	return s
}

// ask sends one message and reads the next one.
func (s jsonSocket) ask(t *testing.T, msg string) wire.Message {
	t.Helper()
	ctx := testContext(t)
	if err := s.ws.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		t.Fatal(err)
	}
	_, b, err := s.ws.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var m wire.Message
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return m
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}
