package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/server/hooks/hookstest"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/store"
)

// A node with a webhook: writes over HTTP reach the receiver, and the
// inspector (checked against openapi.json) and /metrics show the hook.
func TestWebhooksInInspectorAndMetrics(t *testing.T) {
	secret := []byte("s")
	rc := &hookstest.Receiver{Secret: secret}
	rs := httptest.NewServer(rc)
	defer rs.Close()
	st := store.NewMemory(store.MemoryConfig{})
	wh, err := hooks.New(st, hooks.Config{Hooks: []hooks.Route{{Pattern: "doc:*", URL: rs.URL}}, Secret: secret, Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	e := servertest.Start(t, servertest.Options{Store: st, Rooms: rooms.Config{BeforeApply: wh.BeforeApply},
		Server: server.Config{Webhooks: wh}})
	if err := wh.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wh.Close)
	ctx := servertest.Context(t)
	for i := range 3 {
		if _, err := e.HTTP.Put(ctx, "doc:1", "k", json.RawMessage(fmt.Sprint(i)), nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	var rep server.InspectReply
	waitFor(t, 5*time.Second, "the hook's cursor at 3", func() bool {
		resp, err := http.Get(e.TS.URL + "/v1/admin/inspect")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		rep = server.InspectReply{}
		if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
			t.Fatal(err)
		}
		return len(rep.Hooks) == 1 && len(rep.Hooks[0].Rooms) == 1 && rep.Hooks[0].Rooms[0].Cursor == 3
	})
	h := rep.Hooks[0]
	if !h.Claimed || h.Holder != "n1" || h.Delivered != 3 || h.Rooms[0].Room != "doc:1" || h.Rooms[0].Lag != 0 {
		t.Errorf("inspector: %+v", h)
	}
	if err := hookstest.Check(rc.Records(), map[string]hookstest.Want{"doc:1": {Rev: 3}}); err != nil {
		t.Error(err)
	}
	resp, err := http.Get(e.TS.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	want := fmt.Sprintf(`statecast_webhook_revisions_total{hook=%q} 3`, h.ID)
	if !strings.Contains(string(b), want) {
		t.Errorf("/metrics lacks %s", want)
	}
}
