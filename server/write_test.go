package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/statecast/statecast/server/wire"
)

// TestWritesAgreeAcrossSurfaces: one write path. The same transaction
// sent as a WebSocket txn and as POST /v1/rooms/{room}/txn commits at the
// same revision or fails with the same code: ops spelt with "type"
// ("put", "delete") or, the older way, with "op" ("put", "del"); a bad op
// is reported in order, the first one found.
func TestWritesAgreeAcrossSurfaces(t *testing.T) {
	e := newEnv(t, envOpts{})
	ws, _ := connectRaw(t, e, "json")
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
		ws.sendBytes([]byte(fmt.Sprintf(`{"t":"txn","id":%d,"room":"ws",%s}`, id, c.body)))
		m := ws.reply(id)
		status, body := postTxn(t, e, "http", "{"+c.body+"}")
		var h struct {
			Rev   uint64 `json:"rev"`
			Error struct {
				Code string `json:"code"`
				Rev  uint64 `json:"rev"` // conflict
			} `json:"error"`
		}
		if err := json.Unmarshal(body, &h); err != nil {
			t.Fatalf("%s: HTTP body %s: %v", c.name, body, err)
		}
		if m.Code != c.code || h.Error.Code != c.code || m.Rev != h.Rev+h.Error.Rev {
			t.Errorf("%s: WebSocket %+v, HTTP %d %s; want both code %q at one revision", c.name, m.Raw, status, body, c.code)
		}
	}
}

// postTxn posts a txn body to room over HTTP.
func postTxn(t *testing.T, e *env, room, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(e.TS.URL+"/v1/rooms/"+room+"/txn", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}
