package server_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/servertest"
)

// getInspect asks the inspector as if from remoteAddr, with token as bearer when set.
func getInspect(t *testing.T, e *servertest.Node, remoteAddr, token string, header ...string) (int, map[string]any, server.InspectReply) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/v1/admin/inspect", nil)
	req.RemoteAddr, req.Host = remoteAddr, "127.0.0.1:8080"
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	e.Server.Handler().ServeHTTP(rec, req)
	var raw map[string]any
	var rep server.InspectReply
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
		t.Fatalf("%d %q: %v", rec.Code, rec.Body, err)
	}
	_ = json.Unmarshal(rec.Body.Bytes(), &rep)
	return rec.Code, raw, rep
}

func TestInspectRoomsClientsAndWatches(t *testing.T) {
	e := servertest.Start(t, servertest.Options{})
	ctx := servertest.Context(t)
	c := dial(t, e, nil)
	for _, v := range []string{`1`, `2`, `3`} {
		if _, err := c.Put(ctx, "doc:1", "items/"+v, json.RawMessage(v)); err != nil {
			t.Fatal(err)
		}
	}
	s, err := c.Subscribe(ctx, "doc:1", client.SubscribeOptions{Prefixes: []string{"items/"}})
	if err != nil {
		t.Fatal(err)
	}
	nextMsg(t, s) // the snapshot

	var rep server.InspectReply
	waitFor(t, 5*time.Second, "the watch to be live", func() bool {
		code, _, r := getInspect(t, e, "127.0.0.1:5000", "")
		if code != http.StatusOK {
			t.Fatalf("loopback: status %d, want 200", code)
		}
		rep = r
		return len(r.Clients) == 1 && len(r.Clients[0].Watches) == 1 && r.Clients[0].Watches[0].State == "live"
	})
	if len(rep.Rooms) != 1 {
		t.Fatalf("rooms %+v, want doc:1 only", rep.Rooms)
	}
	want := server.InspectRoom{Name: "doc:1", Epoch: rep.Rooms[0].Epoch, Rev: 3, Oldest: 1, HistoryEvents: 3, Keys: 3, Watchers: 1}
	if rep.Rooms[0] != want || want.Epoch == "" {
		t.Errorf("room %+v, want %+v with an epoch", rep.Rooms[0], want)
	}
	cl := rep.Clients[0]
	if cl.Session != c.Connected().Session || cl.Codec != "statecast.v2.json" {
		t.Errorf("client %+v, want session %s on v2 JSON (the Go client's default)", cl, c.Connected().Session)
	}
	w := cl.Watches[0]
	if w.Room != "doc:1" || len(w.Prefixes) != 1 || w.Prefixes[0] != "items/" || w.Head != 3 || w.Lag != 0 {
		t.Errorf("watch %+v, want doc:1 items/ at head 3, lag 0", w)
	}
}

func TestInspectNeedsAdminTokenOffLoopback(t *testing.T) {
	const remote = "192.0.2.7:40000"
	open := servertest.Start(t, servertest.Options{})
	code, raw, _ := getInspect(t, open, remote, "anything")
	if code != http.StatusForbidden || raw["error"].(map[string]any)["code"] != "forbidden" {
		t.Errorf("no token configured, off loopback: %d %v, want 403 forbidden", code, raw)
	}

	e := servertest.Start(t, servertest.Options{Server: server.Config{AdminToken: "s3cret"}})
	for _, tok := range []string{"", "s3cre", "s3cret2"} {
		code, raw, _ := getInspect(t, e, remote, tok)
		if code != http.StatusUnauthorized || raw["error"].(map[string]any)["code"] != "unauthorized" {
			t.Errorf("token %q: %d %v, want 401 unauthorized", tok, code, raw)
		}
	}
	if code, raw, _ := getInspect(t, e, remote, "s3cret"); code != http.StatusOK || raw["rooms"] == nil {
		t.Errorf("right token: %d %v, want 200 with rooms", code, raw)
	}
	if code, _, _ := getInspect(t, e, "[::1]:40000", ""); code != http.StatusOK {
		t.Errorf("IPv6 loopback without token: %d, want 200", code)
	}
	// A page on a name that resolves to 127.0.0.1 (DNS rebinding) sends
	// its own Host: no loopback pass (and in anonymous mode, no answer at
	// all: origin.go).
	if code, _, _ := getInspect(t, e, "127.0.0.1:40000", "", "Host", "rebind.example:8080"); code != http.StatusForbidden {
		t.Errorf("loopback peer, Host rebind.example: %d, want 403", code)
	}
	if code, _, _ := getInspect(t, e, "127.0.0.1:40000", "", "Host", "localhost:8080"); code != http.StatusOK {
		t.Errorf("loopback peer, Host localhost: %d, want 200", code)
	}
	// A reverse proxy on this host connects from loopback: what it
	// forwards is not a loopback client.
	for _, h := range []string{"X-Forwarded-For", "Forwarded", "X-Real-Ip"} {
		if code, _, _ := getInspect(t, e, "127.0.0.1:40000", "", h, "203.0.113.9"); code != http.StatusUnauthorized {
			t.Errorf("forwarded by a local proxy (%s), no token: %d, want 401", h, code)
		}
		if code, _, _ := getInspect(t, e, "127.0.0.1:40000", "s3cret", h, "203.0.113.9"); code != http.StatusOK {
			t.Errorf("forwarded by a local proxy (%s), right token: %d, want 200", h, code)
		}
	}
}

// TestInspectEmptyForwardHeader: over a real loopback socket, a
// forwarding header that is present but empty still marks the request
// as forwarded: no loopback pass.
func TestInspectEmptyForwardHeader(t *testing.T) {
	e := servertest.Start(t, servertest.Options{Server: server.Config{AdminToken: "s3cret"}})
	get := func(header string) int {
		t.Helper()
		req, err := http.NewRequestWithContext(servertest.Context(t), http.MethodGet, e.TS.URL+"/v1/admin/inspect", nil)
		if err != nil {
			t.Fatal(err)
		}
		if header != "" {
			req.Header[header] = []string{""}
		}
		resp, err := e.TS.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(""); code != http.StatusOK {
		t.Fatalf("loopback, no forwarding header: %d, want 200", code)
	}
	for _, h := range []string{"X-Forwarded-For", "Forwarded", "X-Real-Ip", "X-Forwarded-Host", "Via", "True-Client-Ip"} {
		if code := get(h); code != http.StatusUnauthorized {
			t.Errorf("loopback with an empty %s: %d, want 401", h, code)
		}
	}
}
