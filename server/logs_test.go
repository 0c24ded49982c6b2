package server_test

import (
	"bufio"
	"bytes"
	"encoding/json"
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

// TestLogsCarryConnectionIDs: the JSON log lines of a WebSocket request
// that failed on the node's side (its room's validation hook cannot be
// reached) carry the connection's id, session, subject and the room.
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
	want := map[string]bool{"validation hook failed": false, "request failed": false}
	for _, l := range buf.lines(t) {
		msg, _ := l["msg"].(string)
		if _, ok := want[msg]; !ok {
			continue
		}
		want[msg] = true
		if l["level"] != "WARN" || l["session"] != session || l["subject"] != "alice" || l["room"] != "game:7" {
			t.Errorf("log line %v: want level WARN, session %s, subject alice, room game:7", l, session)
		}
		if id, _ := l["conn"].(string); len(id) < 8 {
			t.Errorf("log line %v: no connection id", l)
		}
	}
	for msg, seen := range want {
		if !seen {
			t.Errorf("no %q line in the log:\n%s", msg, buf.String())
		}
	}

	// Over HTTP: the failure's line names the request and its room, the
	// hook's its subject.
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
	var failed, hook bool
	for _, l := range buf.lines(t) {
		switch {
		case l["msg"] == "request failed" && l["method"] == "PUT":
			failed = l["path"] == "/v1/rooms/game:8/kv/k" && l["room"] == "game:8" && l["status"] == float64(503) && l["code"] == wire.CodeUnavailable
			if !failed {
				t.Errorf("HTTP failure line %v", l)
			}
		case l["msg"] == "validation hook failed" && l["room"] == "game:8":
			hook = l["subject"] == "bob"
			if !hook {
				t.Errorf("HTTP hook line %v: want subject bob", l)
			}
		}
	}
	if !failed || !hook {
		t.Errorf("HTTP write: request failed line %v, hook line %v, want both:\n%s", failed, hook, buf.String())
	}
}
