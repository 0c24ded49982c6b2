package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
)

func TestHTTPKeys(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	ctx, h := servertest.Context(t), s.HTTP
	// Keys that need escaping keep their '/' separators and come back whole.
	keys := []string{"plain", "dir/a b", "dir/c%2F/é?#x", "dir/sub/", "+&=;"}
	for i, k := range keys {
		rev, err := h.Put(ctx, "r", k, json.RawMessage(fmt.Sprint(i)), nil, "")
		if err != nil || rev != uint64(i+1) {
			t.Fatalf("Put %q = %d, %v", k, rev, err)
		}
		it, rev, err := h.Get(ctx, "r", k)
		if err != nil || it.Key != k || string(it.Value) != fmt.Sprint(i) || rev != uint64(i+1) {
			t.Fatalf("Get %q = %+v at %d, %v", k, it, rev, err)
		}
	}
	l, err := h.List(ctx, "r", "dir/")
	if err != nil || l.Rev != 5 || l.Epoch == "" || len(l.Items) != 3 || l.Items[0].Key != "dir/a b" {
		t.Fatalf("List dir/ = %+v, %v", l, err)
	}
	if l, err = h.List(ctx, "r", ""); err != nil || len(l.Items) != len(keys) {
		t.Fatalf("List = %+v, %v", l, err)
	}

	_, _, err = h.Get(ctx, "r", "missing")
	var e *client.Error
	if !errors.Is(err, client.ErrNotFound) || !errors.As(err, &e) || e.Status != http.StatusNotFound {
		t.Fatalf("Get of a missing key: %v", err)
	}
	stale := uint64(1)
	_, err = h.Put(ctx, "r", "dir/a b", json.RawMessage(`0`), &stale, "")
	if !errors.As(err, &e) || e.Code != wire.CodeConflict || e.Key != "dir/a b" || e.ModRev != 2 || e.Rev != 5 {
		t.Fatalf("stale Put: %v (%+v)", err, e)
	}
	if _, err = h.Put(ctx, "r", "k", json.RawMessage(`{bad`), nil, ""); !errors.Is(err, client.ErrInvalidValue) {
		t.Fatalf("Put of invalid JSON: %v", err)
	}
	if rev, err := h.Delete(ctx, "r", "plain", &stale); err != nil || rev != 6 {
		t.Fatalf("Delete IfRev(1) = %d, %v", rev, err)
	}
	if rev, err := h.Txn(ctx, "r", []wire.Cond{{Key: "plain", ModRev: 0}}, []wire.TxnOp{
		{Type: "put", Key: "t1", Value: wire.Value(`1`)}, {Type: "delete", Key: "+&=;"}}); err != nil || rev != 7 {
		t.Fatalf("Txn = %d, %v", rev, err)
	}
}

func TestHTTPLeases(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	ctx, h := servertest.Context(t), s.HTTP
	id, err := h.GrantLease(ctx, 5*time.Second)
	if err != nil || id == "" {
		t.Fatalf("GrantLease = %q, %v", id, err)
	}
	if _, err := h.Put(ctx, "r", "lobby/1", json.RawMessage(`{}`), nil, id); err != nil {
		t.Fatal(err)
	}
	if it, _, err := h.Get(ctx, "r", "lobby/1"); err != nil || !it.Lease {
		t.Fatalf("leased key = %+v, %v", it, err)
	}
	if err := h.KeepAlive(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := h.Revoke(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.Get(ctx, "r", "lobby/1"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("key of a revoked lease: %v", err)
	}
	if err := h.KeepAlive(ctx, id); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("KeepAlive of a revoked lease: %v", err)
	}
	if _, err := h.GrantLease(ctx, time.Millisecond); !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("GrantLease(1ms): %v", err)
	}
}

// watchInto runs Watch in the background, sending its events to a channel;
// the returned func stops it and returns Watch's error.
func watchInto(t *testing.T, h *client.HTTP, room string, prefixes []string, from uint64) (<-chan client.SSEEvent, func() error) {
	ctx, cancel := context.WithCancel(servertest.Context(t))
	evs := make(chan client.SSEEvent, 100)
	done := make(chan error, 1)
	go func() {
		done <- h.Watch(ctx, room, prefixes, from, func(ev client.SSEEvent) error {
			evs <- ev
			return nil
		})
	}()
	return evs, func() error { cancel(); return <-done }
}

func nextSSE(t *testing.T, evs <-chan client.SSEEvent) client.SSEEvent {
	t.Helper()
	select {
	case ev := <-evs:
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no SSE event")
	}
	panic("unreachable")
}

func TestHTTPWatch(t *testing.T) {
	s := servertest.Start(t, servertest.Options{})
	ctx, h := servertest.Context(t), s.HTTP
	for i := range 3 {
		if _, err := h.Put(ctx, "w", fmt.Sprint("g/", i), json.RawMessage(`1`), nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	evs, stop := watchInto(t, h, "w", []string{"g/"}, 0)
	v := client.NewView()
	apply := func(want string) client.SSEEvent {
		t.Helper()
		ev := nextSSE(t, evs)
		if ev.Event != want {
			t.Fatalf("event %q (%s), want %s", ev.Event, ev.Data, want)
		}
		m, err := ev.Message()
		if err != nil {
			t.Fatal(err)
		}
		if err := v.Apply(m); err != nil {
			t.Fatal(err)
		}
		if ev.ID != fmt.Sprint(v.Rev) {
			t.Fatalf("event id %q, view at %d", ev.ID, v.Rev)
		}
		return ev
	}
	apply("reset")
	if _, err := h.Put(ctx, "w", "g/9", json.RawMessage(`"x"`), nil, ""); err != nil {
		t.Fatal(err)
	}
	apply("put")
	if _, err := h.Delete(ctx, "w", "g/0", nil); err != nil {
		t.Fatal(err)
	}
	apply("delete")
	if _, err := h.Txn(ctx, "w", nil, []wire.TxnOp{{Type: "delete", Key: "g/1"}, {Type: "put", Key: "g/5", Value: wire.Value(`5`)}}); err != nil {
		t.Fatal(err)
	}
	apply("txn")
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Watch after cancel: %v", err)
	}
	servertest.AssertViewIsRoom(t, s.HTTP, "w", v)

	// From a revision: replay, then synced.
	evs, stop = watchInto(t, h, "w", nil, 5)
	var got []string
	for len(got) < 3 {
		ev := nextSSE(t, evs)
		got = append(got, ev.Event+"@"+ev.ID)
	}
	if fmt.Sprint(got) != "[delete@5 txn@6 synced@6]" {
		t.Fatalf("watch from 5: %v", got)
	}
	_ = stop()

	// fn's error ends the watch.
	stopErr := errors.New("enough")
	if err := h.Watch(ctx, "w", nil, 0, func(client.SSEEvent) error { return stopErr }); err != stopErr {
		t.Fatalf("Watch = %v, want fn's error", err)
	}
	// A refused watch fails at once.
	if err := h.Watch(ctx, "bad room", nil, 0, func(client.SSEEvent) error { return nil }); !errors.Is(err, &client.Error{Code: wire.CodeInvalidRoom}) {
		t.Fatalf("Watch of an invalid room: %v", err)
	}
}

// TestHTTPWatchReconnects: a stream that breaks is resumed after its last
// event id, in the epoch of its last reset, at the retry the server asked.
func TestHTTPWatchReconnects(t *testing.T) {
	requests := make(chan *http.Request, 3)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests <- r
		w.Header().Set("Content-Type", "text/event-stream")
		if r.Header.Get("Last-Event-ID") == "" {
			fmt.Fprint(w, "retry: 10\n\nid: 3\nevent: reset\ndata: {\"epoch\":\"e1\",\"rev\":3,\"reason\":\"initial\",\"items\":[]}\n\n")
			return // the stream breaks
		}
		fmt.Fprint(w, ": hi\n\nid: 4\nevent: put\ndata: {\"rev\":4,\"events\":[]}\n\n")
	}))
	defer ts.Close()
	h := &client.HTTP{URL: ts.URL, Token: "t"}
	var ids []string
	stop := errors.New("stop")
	err := h.Watch(servertest.Context(t), "r", []string{"a/", "b/"}, 0, func(ev client.SSEEvent) error {
		ids = append(ids, ev.ID)
		if len(ids) == 2 {
			return stop
		}
		return nil
	})
	if err != stop || fmt.Sprint(ids) != "[3 4]" {
		t.Fatalf("Watch = %v after %v", err, ids)
	}
	first, second := <-requests, <-requests
	if q := first.URL.Query(); fmt.Sprint(q["prefix"]) != "[a/ b/]" || q.Get("from") != "" || first.Header.Get("Authorization") != "Bearer t" {
		t.Fatalf("first request %s %v", first.URL, first.Header)
	}
	if second.Header.Get("Last-Event-ID") != "3" || second.URL.Query().Get("epoch") != "e1" {
		t.Fatalf("reconnect %s Last-Event-ID %q", second.URL, second.Header.Get("Last-Event-ID"))
	}
}
