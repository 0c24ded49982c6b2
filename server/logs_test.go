package server_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
)

// syncBuffer is a log destination the server's goroutines share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// lines returns the JSON log lines written so far.
func (s *syncBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(s.b.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

// TestLogsCarryConnectionIDs: the JSON log line of a WebSocket request
// that failed on the node's side (its room's validation hook cannot be
// reached) carries the connection's number, session, subject, the room
// and the cause; an HTTP request's, its method, path, room and subject.
func TestLogsCarryConnectionIDs(t *testing.T) {
	var buf syncBuffer
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	v, err := hooks.NewValidator(hooks.ValidatorConfig{Routes: hooks.Routes{{Pattern: "game:*", URL: gone.URL}}, Secret: hookSecret, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	authn, err := auth.New(auth.Config{HMACSecret: hmacSecret})
	if err != nil {
		t.Fatal(err)
	}
	n := servertest.Start(t, servertest.Options{Server: server.Config{Auth: authn, Validate: v,
		Logger: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}})
	c := dial(t, n, &client.Options{Token: tokenFor(t, "alice", time.Now().Add(time.Minute), allRooms)})
	session := c.Connected().Session
	if _, err := c.Put(servertest.Context(t), "game:7", "k", 1); codeOf(err) != wire.CodeUnavailable {
		t.Fatalf("put: %v, want unavailable", err)
	}
	req, err := http.NewRequest(http.MethodPut, n.TS.URL+"/v1/rooms/game:8/kv/k", strings.NewReader("1"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tokenFor(t, "bob", time.Now().Add(time.Minute), allRooms))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	var ws, httpLine map[string]any
	for _, l := range buf.lines(t) {
		if l["msg"] != "request failed" {
			continue
		}
		if l["method"] == nil {
			ws = l
		} else {
			httpLine = l
		}
	}
	if ws == nil || httpLine == nil {
		t.Fatalf("want a request failed line of the WebSocket and one of the HTTP request; the log:\n%s", buf.String())
	}
	if id, _ := ws["conn"].(string); ws["level"] != "WARN" || !strings.HasPrefix(id, "c") || ws["session"] != session || ws["subject"] != "alice" ||
		ws["room"] != "game:7" || ws["req"] != "put" || ws["code"] != wire.CodeUnavailable || !strings.Contains(fmt.Sprint(ws["err"]), "unavailable") {
		t.Errorf("WebSocket line %v: want level WARN, conn c…, session %s, subject alice, room game:7, req put, code unavailable and the hook's error", ws, session)
	}
	if httpLine["level"] != "WARN" || httpLine["path"] != "/v1/rooms/game:8/kv/k" || httpLine["method"] != "PUT" || httpLine["room"] != "game:8" ||
		httpLine["subject"] != "bob" || httpLine["status"] != float64(503) || httpLine["code"] != wire.CodeUnavailable {
		t.Errorf("HTTP line %v: want level WARN, PUT /v1/rooms/game:8/kv/k, room game:8, subject bob, status 503, code unavailable", httpLine)
	}
}
