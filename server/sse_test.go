package server

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/store"
)

type sseEvent struct {
	ID, Event, Data string
	Comment         string // a comment line (keepalive), alone
}

type sseClient struct {
	resp   *http.Response
	events chan sseEvent // closed when the stream ends
	stop   chan struct{}
}

// watch opens an SSE stream (which must answer 200) and parses it in the
// background until the test ends.
func (e *apiEnv) watch(t testing.TB, path string, hdr ...string) *sseClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := e.watchCtx(t, ctx, path, hdr...)
	t.Cleanup(cancel)
	return c
}

// watchCtx is watch with a context the test may cancel to drop the client.
func (e *apiEnv) watchCtx(t testing.TB, ctx context.Context, path string, hdr ...string) *sseClient {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", e.hs.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		resp.Body.Close()
		t.Fatalf("watch %s: status %d", path, resp.StatusCode)
	}
	c := &sseClient{resp: resp, events: make(chan sseEvent, 1024), stop: make(chan struct{})}
	go c.read()
	t.Cleanup(func() {
		close(c.stop)
		resp.Body.Close()
		for range c.events {
		}
	})
	return c
}

func (c *sseClient) read() {
	defer close(c.events)
	send := func(ev sseEvent) bool {
		select {
		case c.events <- ev:
			return true
		case <-c.stop:
			return false
		}
	}
	sc := bufio.NewScanner(c.resp.Body)
	sc.Buffer(nil, 16<<20)
	var ev sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev != (sseEvent{}) && !send(ev) {
				return
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, ":"):
			if !send(sseEvent{Comment: strings.TrimSpace(line[1:])}) {
				return
			}
		default:
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "id":
				ev.ID = value
			case "event":
				ev.Event = value
			case "data":
				ev.Data += value
			}
		}
	}
}

// nextAny returns the next event or comment; it fails after 5 s or when
// the stream has ended.
func (c *sseClient) nextAny(t testing.TB) sseEvent {
	t.Helper()
	select {
	case ev, ok := <-c.events:
		if !ok {
			t.Fatal("stream ended")
		}
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5s")
	}
	return sseEvent{}
}

// next returns the next event, skipping comments.
func (c *sseClient) next(t testing.TB) sseEvent {
	t.Helper()
	for {
		if ev := c.nextAny(t); ev.Comment == "" {
			return ev
		}
	}
}

// ended waits for the stream to end, failing on any further event.
func (c *sseClient) ended(t testing.TB) {
	t.Helper()
	select {
	case ev, ok := <-c.events:
		if ok {
			t.Fatalf("event %+v, want the end of the stream", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("stream did not end within 5s")
	}
}

type sseWireEvent struct {
	Type      string          `json:"type"`
	Key       string          `json:"key"`
	Value     json.RawMessage `json:"value,omitempty"`
	CreateRev uint64          `json:"create_rev,omitempty"`
	ModRev    uint64          `json:"mod_rev"`
	Version   uint64          `json:"version,omitempty"`
	Lease     bool            `json:"lease,omitempty"`
}

type sseData struct {
	Epoch   string         `json:"epoch"`
	Rev     uint64         `json:"rev"`
	Reason  string         `json:"reason"`
	Items   []apiItem      `json:"items"`
	Events  []sseWireEvent `json:"events"`
	Code    string         `json:"code"`
	Message string         `json:"message"`
}

func (ev sseEvent) data(t testing.TB) sseData {
	t.Helper()
	var d sseData
	if err := json.Unmarshal([]byte(ev.Data), &d); err != nil {
		t.Fatalf("event %+v: %v", ev, err)
	}
	return d
}

// want checks an event's name and id and returns its data, whose rev must
// be the id.
func (ev sseEvent) want(t testing.TB, name string, rev uint64) sseData {
	t.Helper()
	if ev.Event != name || ev.ID != strconv.FormatUint(rev, 10) {
		t.Fatalf("event %q id %q, want %q id %d (data %s)", ev.Event, ev.ID, name, rev, ev.Data)
	}
	d := ev.data(t)
	if d.Rev != rev {
		t.Fatalf("data rev %d, want %d", d.Rev, rev)
	}
	return d
}

func TestSSEInitialAndLive(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	e.put(t, "r", "a/1", `{"x":1}`)
	w := e.watch(t, "/v1/rooms/r/watch")
	for h, want := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"} {
		if got := w.resp.Header.Get(h); got != want {
			t.Errorf("%s: %q, want %q", h, got, want)
		}
	}
	d := w.next(t).want(t, "reset", 1)
	if d.Reason != "initial" || d.Epoch == "" || len(d.Items) != 1 || string(d.Items[0].Value) != `{"x":1}` {
		t.Errorf("reset %+v", d)
	}

	e.put(t, "r", "a/2", `"v"`)
	d = w.next(t).want(t, "put", 2)
	want := []sseWireEvent{{Type: "put", Key: "a/2", Value: json.RawMessage(`"v"`), CreateRev: 2, ModRev: 2, Version: 1}}
	if diff := cmp.Diff(want, d.Events); diff != "" {
		t.Errorf("put (-want +got):\n%s", diff)
	}

	e.do(t, "DELETE", "/v1/rooms/r/kv/a/1", "").want(t, 200, nil)
	d = w.next(t).want(t, "delete", 3)
	if diff := cmp.Diff([]sseWireEvent{{Type: "delete", Key: "a/1", ModRev: 3}}, d.Events); diff != "" {
		t.Errorf("delete (-want +got):\n%s", diff)
	}

	e.do(t, "POST", "/v1/rooms/r/txn", `{"ops":[{"type":"put","key":"b","value":[]},{"type":"delete","key":"a/2"}]}`).want(t, 200, nil)
	d = w.next(t).want(t, "txn", 4)
	want = []sseWireEvent{
		{Type: "put", Key: "b", Value: json.RawMessage(`[]`), CreateRev: 4, ModRev: 4, Version: 1},
		{Type: "delete", Key: "a/2", ModRev: 4},
	}
	if diff := cmp.Diff(want, d.Events); diff != "" {
		t.Errorf("txn (-want +got):\n%s", diff)
	}

	// A delete of a missing key is no revision and no event.
	e.do(t, "DELETE", "/v1/rooms/r/kv/missing", "").want(t, 200, nil)
	e.put(t, "r", "c", `null`)
	w.next(t).want(t, "put", 5)
}

func TestSSEEmptyRoom(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	w := e.watch(t, "/v1/rooms/new/watch")
	if d := w.next(t).want(t, "reset", 0); d.Items == nil || len(d.Items) != 0 {
		t.Errorf("empty reset %+v, want items []", d)
	}
	e.put(t, "new", "k", `1`)
	w.next(t).want(t, "put", 1)
}

// ssePutRevs writes n revisions to room, one key each.
func ssePutRevs(t testing.TB, e *apiEnv, room string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		e.put(t, room, "k"+strconv.Itoa(i), strconv.Itoa(i))
	}
}

// sseWantReplay reads put events from..to, then synced at to.
func sseWantReplay(t testing.TB, w *sseClient, from, to uint64) {
	t.Helper()
	for rev := from; rev <= to; rev++ {
		w.next(t).want(t, "put", rev)
	}
	w.next(t).want(t, "synced", to)
}

func TestSSEResume(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	ssePutRevs(t, e, "r", 6)
	epoch := e.list(t, "r", "").Epoch

	sseWantReplay(t, e.watch(t, "/v1/rooms/r/watch", "Last-Event-ID", "2"), 3, 6)
	sseWantReplay(t, e.watch(t, "/v1/rooms/r/watch?from=3"), 3, 6)
	sseWantReplay(t, e.watch(t, "/v1/rooms/r/watch?from=0"), 1, 6)
	sseWantReplay(t, e.watch(t, "/v1/rooms/r/watch?from=1", "Last-Event-ID", "4"), 5, 6) // the header wins
	sseWantReplay(t, e.watch(t, "/v1/rooms/r/watch?from=2&epoch="+epoch), 2, 6)

	live := e.watch(t, "/v1/rooms/r/watch", "Last-Event-ID", "6")
	live.next(t).want(t, "synced", 6)
	future := e.watch(t, "/v1/rooms/r/watch?from=8")
	e.put(t, "r", "x", `1`)
	live.next(t).want(t, "put", 7)
	e.put(t, "r", "x", `2`)
	future.next(t).want(t, "put", 8) // waited for revision 8

	other := e.watch(t, "/v1/rooms/r/watch?from=3&epoch=not-"+epoch)
	if d := other.next(t).want(t, "reset", 8); d.Reason != "epoch" || len(d.Items) != 7 {
		t.Errorf("other epoch: %+v", d)
	}
}

// A client that drops and comes back with Last-Event-ID sees every
// revision exactly once.
func TestSSEResumeNoGapNoDuplicate(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	var seen []uint64
	collect := func(w *sseClient, n int) string {
		last := ""
		for i := 0; i < n; i++ {
			ev := w.next(t)
			if ev.Event == "put" {
				seen = append(seen, ev.data(t).Rev)
			}
			last = ev.ID
		}
		return last
	}
	ctx, cancel := context.WithCancel(context.Background())
	first := e.watchCtx(t, ctx, "/v1/rooms/r/watch")
	first.next(t).want(t, "reset", 0)
	ssePutRevs(t, e, "r", 3)
	last := collect(first, 3)
	cancel()
	first.ended(t)

	ssePutRevs(t, e, "r", 4) // missed while away
	second := e.watch(t, "/v1/rooms/r/watch", "Last-Event-ID", last)
	collect(second, 4)
	second.next(t).want(t, "synced", 7)
	e.put(t, "r", "live", `1`)
	collect(second, 1)
	if diff := cmp.Diff([]uint64{1, 2, 3, 4, 5, 6, 7, 8}, seen); diff != "" {
		t.Errorf("revisions seen (-want +got):\n%s", diff)
	}
}

func TestSSECompacted(t *testing.T) {
	ret := store.RetentionPolicy{Default: store.Retention{MaxEvents: 2}}
	e := newAPIEnv(t, apiOpts{retention: ret})
	ssePutRevs(t, e, "r", 10)
	w := e.watch(t, "/v1/rooms/r/watch", "Last-Event-ID", "1")
	if d := w.next(t).want(t, "reset", 10); d.Reason != "compacted" || len(d.Items) != 10 {
		t.Errorf("compacted reset: reason %q, %d items", d.Reason, len(d.Items))
	}
	e.put(t, "r", "k0", `"new"`)
	w.next(t).want(t, "put", 11)
	// Still retained: a replay.
	sseWantReplay(t, e.watch(t, "/v1/rooms/r/watch?from=10"), 10, 11)
}

func TestSSEPrefixes(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	for _, k := range []string{"a/1", "b/1", "c/1"} {
		e.put(t, "r", k, `1`)
	}
	w := e.watch(t, "/v1/rooms/r/watch?prefix=a/&prefix=c/")
	d := w.next(t).want(t, "reset", 3)
	if len(d.Items) != 2 || d.Items[0].Key != "a/1" || d.Items[1].Key != "c/1" {
		t.Errorf("prefix reset items %+v", d.Items)
	}
	e.put(t, "r", "b/2", `1`)
	e.do(t, "POST", "/v1/rooms/r/txn", `{"ops":[{"type":"put","key":"b/3","value":1},{"type":"put","key":"c/2","value":2}]}`).want(t, 200, nil)
	d = w.next(t).want(t, "put", 5) // only the matching event of the txn
	if len(d.Events) != 1 || d.Events[0].Key != "c/2" {
		t.Errorf("events %+v", d.Events)
	}
}

func TestSSEProgress(t *testing.T) {
	e := newAPIEnv(t, apiOpts{progress: 20 * time.Millisecond})
	e.put(t, "r", "b/1", `1`)
	w := e.watch(t, "/v1/rooms/r/watch?prefix=a/")
	w.next(t).want(t, "reset", 1)
	e.put(t, "r", "b/2", `1`)
	w.next(t).want(t, "progress", 2)
}

func TestSSEKeepAlive(t *testing.T) {
	e := newAPIEnv(t, apiOpts{timing: sseTiming{keepAlive: 30 * time.Millisecond, poll: 5 * time.Millisecond}})
	w := e.watch(t, "/v1/rooms/r/watch")
	w.next(t).want(t, "reset", 0)
	if ev := w.nextAny(t); ev.Comment != "keepalive" {
		t.Fatalf("got %+v, want a keepalive comment", ev)
	}
	e.put(t, "r", "k", `1`)
	w.next(t).want(t, "put", 1)
}

func TestSSEServerShutdown(t *testing.T) {
	e := newAPIEnv(t, apiOpts{timing: sseTiming{keepAlive: time.Hour, poll: 5 * time.Millisecond}})
	w := e.watch(t, "/v1/rooms/r/watch")
	w.next(t).want(t, "reset", 0)
	if err := e.srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ev := w.next(t); ev.Event != "error" || ev.data(t).Code != "unavailable" {
		t.Fatalf("got %+v, want an unavailable error", ev)
	}
	w.ended(t)
}

func TestSSEEngineClosed(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	w := e.watch(t, "/v1/rooms/r/watch")
	w.next(t).want(t, "reset", 0)
	e.eng.Close()
	if ev := w.next(t); ev.Event != "error" || ev.data(t).Code != "unavailable" {
		t.Fatalf("got %+v, want an unavailable error", ev)
	}
	w.ended(t)
	e.do(t, "GET", "/v1/rooms/r/watch", "").wantErr(t, 503, "unavailable")
	e.do(t, "GET", "/v1/rooms/r/kv", "").wantErr(t, 503, "unavailable")
}

// apiGauge reads a gauge of the server's registry.
func apiGauge(t testing.TB, s *Server, name string) float64 {
	t.Helper()
	mfs, err := s.cfg.Gatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestSSEClientGone(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	ctx, cancel := context.WithCancel(context.Background())
	w := e.watchCtx(t, ctx, "/v1/rooms/r/watch")
	w.next(t).want(t, "reset", 0)
	if n := apiGauge(t, e.srv, "statecast_subscriptions"); n != 1 {
		t.Errorf("subscriptions %v, want 1", n)
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for apiGauge(t, e.srv, "statecast_subscriptions") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("subscription not released after the client left")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := e.eng.Stats(); len(st) != 1 || st[0].Watchers != 0 {
		t.Errorf("engine still has watchers: %+v", st)
	}
}

func TestSSEBadParams(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	e.do(t, "GET", "/v1/rooms/r/watch?from=abc", "").wantErr(t, 400, "bad_request")
	e.do(t, "GET", "/v1/rooms/r/watch?from=-1", "").wantErr(t, 400, "bad_request")
	e.do(t, "GET", "/v1/rooms/r/watch", "", "Last-Event-ID", "x").wantErr(t, 400, "bad_request")
	e.do(t, "GET", "/v1/rooms/r/watch", "", "Last-Event-ID", "18446744073709551615").wantErr(t, 400, "bad_request")
	// Last-Event-ID wins over from, which must be a revision all the same.
	e.do(t, "GET", "/v1/rooms/r/watch?from=-5", "", "Last-Event-ID", "3").wantErr(t, 400, "bad_request")
	e.do(t, "GET", "/v1/rooms/r/watch?prefix=%00", "").wantErr(t, 400, "invalid_key")
	// More prefixes than a watch may name (default 64).
	e.do(t, "GET", "/v1/rooms/r/watch?"+strings.Repeat("prefix=p&", 65), "").wantErr(t, 413, "too_large")
}

// The encoding of every message kind, byte for byte.
func TestSSEEncoding(t *testing.T) {
	put := store.Event{Type: store.OpPut, KV: store.KV{Key: "k", Value: []byte(`{"a":"<b>"}`), CreateRev: 2, ModRev: 9, Version: 3, Lease: "ttl_x"}}
	del := store.Event{Type: store.OpDelete, KV: store.KV{Key: "d", ModRev: 9}, Wid: "c1-9"}
	msgs := []rooms.Message{
		{Kind: rooms.KindSnapshot, Rev: 7, Epoch: "e1", Reason: rooms.ReasonSlow, Items: []store.KV{put.KV}},
		{Kind: rooms.KindEvents, Rev: 9, Change: &rooms.Change{Rev: 9, Events: []store.Event{put}}},
		{Kind: rooms.KindEvents, Rev: 9, Change: &rooms.Change{Rev: 9, Events: []store.Event{del}}},
		{Kind: rooms.KindEvents, Rev: 9, Change: &rooms.Change{Rev: 9, Events: []store.Event{put, del}}},
		{Kind: rooms.KindCoalesced, Rev: 12, Change: &rooms.Change{Rev: 12, Events: []store.Event{del}}},
		{Kind: rooms.KindSynced, Rev: 12},
		{Kind: rooms.KindProgress, Rev: 15},
	}
	var st sseStream
	for i := range msgs {
		if err := st.appendMessage(&msgs[i]); err != nil {
			t.Fatal(err)
		}
	}
	putJSON := `{"type":"put","key":"k","value":{"a":"<b>"},"create_rev":2,"mod_rev":9,"version":3,"lease":true}`
	delJSON := `{"type":"delete","key":"d","mod_rev":9}` // an SSE stream is sent no write ids (server/wids.go)
	want := "id: 7\nevent: reset\ndata: " + `{"epoch":"e1","rev":7,"reason":"slow","items":[{"key":"k","value":{"a":"<b>"},"create_rev":2,"mod_rev":9,"version":3,"lease":true}]}` + "\n\n" +
		"id: 9\nevent: put\ndata: {\"rev\":9,\"events\":[" + putJSON + "]}\n\n" +
		"id: 9\nevent: delete\ndata: {\"rev\":9,\"events\":[" + delJSON + "]}\n\n" +
		"id: 9\nevent: txn\ndata: {\"rev\":9,\"events\":[" + putJSON + "," + delJSON + "]}\n\n" +
		"id: 12\nevent: coalesced\ndata: {\"rev\":12,\"events\":[" + delJSON + "]}\n\n" +
		"id: 12\nevent: synced\ndata: {\"rev\":12}\n\n" +
		"id: 15\nevent: progress\ndata: {\"rev\":15}\n\n"
	if diff := cmp.Diff(want, string(st.buf)); diff != "" {
		t.Errorf("encoding (-want +got):\n%s", diff)
	}
}

// TestSSETokenExpiry: an SSE stream ends with an unauthorized error when
// its token expires, as a WebSocket session ends with 4002.
func TestSSETokenExpiry(t *testing.T) {
	t.Parallel() // waits on wall-clock time (timeouts, grace, expiry)
	a, err := auth.New(auth.Config{HMACSecret: apiTestSecret, Leeway: -1})
	if err != nil {
		t.Fatal(err)
	}
	e := newAPIEnv(t, apiOpts{auth: a})
	tok := apiToken(t, 2*time.Second, map[string]string{"room": "*", "access": "r"})
	w := e.watch(t, "/v1/rooms/r/watch?access_token="+tok)
	w.next(t).want(t, "reset", 0)
	if ev := w.next(t); ev.Event != "error" || ev.data(t).Code != "unauthorized" {
		t.Fatalf("got %+v, want an unauthorized error at expiry", ev)
	}
	w.ended(t)
}
