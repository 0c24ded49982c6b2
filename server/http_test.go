package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/go-cmp/cmp"
	"github.com/labstack/echo/v4"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/internal/openapicheck"
	"github.com/statecast/statecast/store"
)

// apiOpts configures a test server for the HTTP API.
type apiOpts struct {
	auth      *auth.Authenticator
	retention store.RetentionPolicy
	progress  time.Duration // engine ProgressInterval; 0 = disabled
	timing    sseTiming     // zero = defaultSSETiming
	cfg       Config        // the rest of the server's configuration
}

type apiEnv struct {
	st     *store.Memory
	eng    *rooms.Engine
	srv    *Server
	hs     *httptest.Server
	client *http.Client
}

// newAPIEnv starts a Server on a memory store behind an httptest server;
// everything is closed when the test ends.
func newAPIEnv(t testing.TB, o apiOpts) *apiEnv {
	t.Helper()
	st := store.NewMemory(store.MemoryConfig{Retention: o.retention})
	t.Cleanup(func() { st.Close() })
	progress := o.progress
	if progress == 0 {
		progress = -1
	}
	eng := rooms.New(st, rooms.Config{Retention: o.retention, ProgressInterval: progress})
	t.Cleanup(func() { eng.Close() })
	cfg := o.cfg
	cfg.Store, cfg.Engine, cfg.Auth, cfg.WriteTimeout = st, eng, o.auth, 5*time.Second
	srv, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	h := srv.Handler()
	if o.timing != (sseTiming{}) {
		// The watch route with test timing; everything else as served.
		e := echo.New()
		e.HTTPErrorHandler = srv.httpError
		e.GET("/v1/rooms/:room/watch", func(c echo.Context) error { return srv.watchSSE(c, o.timing) })
		e.Any("/*", echo.WrapHandler(h))
		h = e
	}
	hs := httptest.NewServer(openapicheck.Handler(t, loadOpenAPI(t), h))
	t.Cleanup(hs.Close) // runs first: after each test's streams are closed
	return &apiEnv{st: st, eng: eng, srv: srv, hs: hs, client: hs.Client()}
}

type apiResp struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request; hdr holds header name/value pairs ("Host" sets the
// request's Host). A body is sent as application/json unless hdr says
// otherwise.
func (e *apiEnv) do(t testing.TB, method, path, body string, hdr ...string) apiResp {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.hs.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json") // as every client sends
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return apiResp{resp.StatusCode, resp.Header, b}
}

// want checks the status and decodes the body into v (when not nil).
func (r apiResp) want(t testing.TB, status int, v any) apiResp {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.body)
	}
	if v != nil {
		if err := json.Unmarshal(r.body, v); err != nil {
			t.Fatalf("decode %s: %v", r.body, err)
		}
	}
	return r
}

type apiErrBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Key     string `json:"key"`
		ModRev  uint64 `json:"mod_rev"`
		Rev     uint64 `json:"rev"`
	} `json:"error"`
}

// wantErr checks an error answer's status and code.
func (r apiResp) wantErr(t testing.TB, status int, code string) apiErrBody {
	t.Helper()
	var b apiErrBody
	r.want(t, status, &b)
	if b.Error.Code != code {
		t.Fatalf("code %q, want %q; body %s", b.Error.Code, code, r.body)
	}
	return b
}

type apiItem struct {
	Key       string          `json:"key"`
	Value     json.RawMessage `json:"value"`
	CreateRev uint64          `json:"create_rev"`
	ModRev    uint64          `json:"mod_rev"`
	Version   uint64          `json:"version"`
	Lease     bool            `json:"lease"`
}

type apiList struct {
	Epoch string    `json:"epoch"`
	Rev   uint64    `json:"rev"`
	Items []apiItem `json:"items"`
}

type apiRev struct {
	Rev uint64 `json:"rev"`
}

func (e *apiEnv) put(t testing.TB, room, key, value string, hdr ...string) uint64 {
	t.Helper()
	var r apiRev
	e.do(t, "PUT", "/v1/rooms/"+room+"/kv/"+key, value, hdr...).want(t, 200, &r)
	return r.Rev
}

func (e *apiEnv) list(t testing.TB, room, query string) apiList {
	t.Helper()
	var l apiList
	e.do(t, "GET", "/v1/rooms/"+room+"/kv"+query, "").want(t, 200, &l)
	return l
}

func TestHTTPListAndGet(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	r := e.do(t, "GET", "/v1/rooms/empty/kv", "")
	var l apiList
	r.want(t, 200, &l)
	if l.Rev != 0 || l.Epoch == "" || !bytes.Contains(r.body, []byte(`"items":[]`)) {
		t.Fatalf("empty room: %s", r.body)
	}

	e.put(t, "r1", "b", `{"n": 2}`)
	e.put(t, "r1", "a/1", `[1, "x"]`)
	e.put(t, "r1", "a/2", `"two"`)
	e.put(t, "r1", "b", `{"n":3}`)

	l = e.list(t, "r1", "")
	want := []apiItem{
		{Key: "a/1", Value: json.RawMessage(`[1,"x"]`), CreateRev: 2, ModRev: 2, Version: 1},
		{Key: "a/2", Value: json.RawMessage(`"two"`), CreateRev: 3, ModRev: 3, Version: 1},
		{Key: "b", Value: json.RawMessage(`{"n":3}`), CreateRev: 1, ModRev: 4, Version: 2},
	}
	if l.Rev != 4 {
		t.Errorf("rev %d, want 4", l.Rev)
	}
	if diff := cmp.Diff(want, l.Items); diff != "" {
		t.Errorf("items (-want +got):\n%s", diff)
	}
	if l := e.list(t, "r1", "?prefix=a/"); len(l.Items) != 2 || l.Rev != 4 {
		t.Errorf("prefix a/: %+v", l)
	}

	var it apiItem
	r = e.do(t, "GET", "/v1/rooms/r1/kv/b", "").want(t, 200, &it)
	if diff := cmp.Diff(want[2], it); diff != "" {
		t.Errorf("get b (-want +got):\n%s", diff)
	}
	if got := r.header.Get("X-Statecast-Rev"); got != "4" {
		t.Errorf("X-Statecast-Rev %q, want 4", got)
	}
	// "a" prefixes existing keys but is not one.
	e.do(t, "GET", "/v1/rooms/r1/kv/a", "").wantErr(t, 404, "not_found")
	e.do(t, "GET", "/v1/rooms/r1/kv/zzz", "").wantErr(t, 404, "not_found")
}

// TestHTTPReadConsistency: ?consistency= and ?min_rev= are accepted on
// GET and list (the memory store's view is always fresh), and bad values
// are a 400.
func TestHTTPReadConsistency(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	rev := e.put(t, "r", "k", `1`)
	for _, q := range []string{"?consistency=serializable", "?consistency=s", "?consistency=linearizable", "?consistency=l",
		"?min_rev=" + strconv.FormatUint(rev, 10), "?consistency=s&min_rev=99"} {
		var it apiItem
		e.do(t, "GET", "/v1/rooms/r/kv/k"+q, "").want(t, 200, &it)
		if it.ModRev != rev {
			t.Errorf("get%s: %+v", q, it)
		}
		if l := e.list(t, "r", q); len(l.Items) != 1 || l.Rev != rev {
			t.Errorf("list%s: %+v", q, l)
		}
	}
	for _, q := range []string{"?consistency=strong", "?min_rev=-1", "?min_rev=x"} {
		e.do(t, "GET", "/v1/rooms/r/kv/k"+q, "").wantErr(t, 400, "bad_request")
		e.do(t, "GET", "/v1/rooms/r/kv"+q, "").wantErr(t, 400, "bad_request")
	}
}

func TestHTTPPutIfMatch(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	if rev := e.put(t, "r", "k", `1`, "If-Match", "0"); rev != 1 {
		t.Fatalf("create rev %d", rev)
	}
	e.put(t, "r", "other", `true`)
	b := e.do(t, "PUT", "/v1/rooms/r/kv/k", `2`, "If-Match", "0").wantErr(t, 412, "conflict")
	if b.Error.Key != "k" || b.Error.ModRev != 1 || b.Error.Rev != 2 {
		t.Errorf("conflict body %+v, want key k, mod_rev 1, rev 2", b.Error)
	}
	b = e.do(t, "PUT", "/v1/rooms/r/kv/k", `2`, "If-Match", "7").wantErr(t, 412, "conflict")
	if b.Error.ModRev != 1 {
		t.Errorf("conflict mod_rev %d, want 1", b.Error.ModRev)
	}
	if rev := e.put(t, "r", "k", `3`, "If-Match", "1"); rev != 3 {
		t.Errorf("conditional put rev %d, want 3", rev)
	}
	if rev := e.put(t, "r", "k", `4`, "If-Match", `"3"`); rev != 4 {
		t.Errorf("quoted If-Match rev %d, want 4", rev)
	}
	for _, bad := range []string{"abc", "-1", "1.0", "*", "18446744073709551616"} {
		e.do(t, "PUT", "/v1/rooms/r/kv/k", `5`, "If-Match", bad).wantErr(t, 400, "bad_request")
	}
	if l := e.list(t, "r", ""); l.Rev != 4 {
		t.Errorf("rev %d after refused writes, want 4", l.Rev)
	}
}

func TestHTTPPutValues(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	for _, bad := range []string{"", "{", "nope", `{"a":1}x`, `1e400`, "\"\xff\"", `"\ud800"`, `{"\udc00":1}`} {
		e.do(t, "PUT", "/v1/rooms/r/kv/k", bad).wantErr(t, 400, "invalid_value")
	}
	limit := store.Limits{}.WithDefaults().MaxValueBytes
	atLimit := `"` + strings.Repeat("a", limit-2) + `"`
	e.put(t, "r", "big", atLimit)
	e.do(t, "PUT", "/v1/rooms/r/kv/big", atLimit+" ").wantErr(t, 413, "too_large")
	e.do(t, "PUT", "/v1/rooms/r/kv/big", strings.Repeat(" ", 4*limit)).wantErr(t, 413, "too_large")

	// Values are stored in canonical form and read back as JSON.
	e.put(t, "r", "v", " { \"b\" : [ 1.50 , null ] , \"a\" : \"\\u00e9<>\" } ")
	var it apiItem
	e.do(t, "GET", "/v1/rooms/r/kv/v", "").want(t, 200, &it)
	if got, want := string(it.Value), `{"b":[1.50,null],"a":"é<>"}`; got != want {
		t.Errorf("value %s, want %s", got, want)
	}
}

func TestHTTPDelete(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	e.put(t, "r", "k", `1`)
	e.put(t, "r", "j", `1`)
	var r apiRev
	e.do(t, "DELETE", "/v1/rooms/r/kv/k", "", "If-Match", "5").wantErr(t, 412, "conflict")
	e.do(t, "DELETE", "/v1/rooms/r/kv/k", "", "If-Match", "1").want(t, 200, &r)
	if r.Rev != 3 {
		t.Errorf("delete rev %d, want 3", r.Rev)
	}
	e.do(t, "DELETE", "/v1/rooms/r/kv/k", "").want(t, 200, &r)
	if r.Rev != 3 {
		t.Errorf("delete of a missing key: rev %d, want the current 3", r.Rev)
	}
	e.do(t, "DELETE", "/v1/rooms/r/kv/never", "").want(t, 200, &r)
	if l := e.list(t, "r", ""); l.Rev != 3 || len(l.Items) != 1 {
		t.Errorf("after deletes of missing keys: %+v, want rev 3 and one key", l)
	}
	e.do(t, "DELETE", "/v1/rooms/fresh/kv/x", "").want(t, 200, &r)
	if r.Rev != 0 {
		t.Errorf("delete in an empty room: rev %d, want 0", r.Rev)
	}
	e.do(t, "DELETE", "/v1/rooms/r/kv/j", "", "If-Match", "x").wantErr(t, 400, "bad_request")
}

func TestHTTPKeyEscaping(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	cases := []struct{ path, key string }{
		{"a/b/c", "a/b/c"},
		{"x%2Fy", "x/y"},
		{"100%25", "100%"},
		{"lit%252F", "lit%2F"},
		{"sp%20ace", "sp ace"},
		{"q%3Fm%23h", "q?m#h"},
		{"%C3%A9t%C3%A9", "été"},
		{"%41%2f", "A/"},
		{"dots/../x", "dots/../x"},
	}
	for _, c := range cases {
		e.put(t, "r", c.path, `"`+c.path+`"`)
		var it apiItem
		e.do(t, "GET", "/v1/rooms/r/kv/"+c.path, "").want(t, 200, &it)
		if it.Key != c.key {
			t.Errorf("path %q: key %q, want %q", c.path, it.Key, c.key)
		}
	}
	// The same key through '/' and '%2F'.
	var it apiItem
	e.do(t, "GET", "/v1/rooms/r/kv/x/y", "").want(t, 200, &it)
	if it.Key != "x/y" || string(it.Value) != `"x%2Fy"` {
		t.Errorf("x/y: %+v", it)
	}
	if l := e.list(t, "r", ""); len(l.Items) != len(cases) {
		t.Errorf("%d keys, want %d: %+v", len(l.Items), len(cases), l.Items)
	}
	if l := e.list(t, "r", "?prefix=q%3F"); len(l.Items) != 1 || l.Items[0].Key != "q?m#h" {
		t.Errorf("prefix q?: %+v", l.Items)
	}
}

func TestHTTPInvalidRoomAndKey(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	long := strings.Repeat("r", 129)
	// _statecast:* are the server's own rooms (the webhooks' cursors).
	for _, room := range []string{"bad%20room", "a%2Fb", long, "%7Bx%7D", "_statecast:hooks"} {
		e.do(t, "GET", "/v1/rooms/"+room+"/kv", "").wantErr(t, 400, "invalid_room")
		e.do(t, "GET", "/v1/rooms/"+room+"/kv/k", "").wantErr(t, 400, "invalid_room")
		e.do(t, "PUT", "/v1/rooms/"+room+"/kv/k", "1").wantErr(t, 400, "invalid_room")
		e.do(t, "DELETE", "/v1/rooms/"+room+"/kv/k", "").wantErr(t, 400, "invalid_room")
		e.do(t, "POST", "/v1/rooms/"+room+"/txn", `{"ops":[{"type":"delete","key":"k"}]}`).wantErr(t, 400, "invalid_room")
		e.do(t, "GET", "/v1/rooms/"+room+"/watch", "").wantErr(t, 400, "invalid_room")
	}
	for _, key := range []string{"", "nul%00", "%FF", "%ff", "a%ED%A0%80", strings.Repeat("k", 1025)} {
		e.do(t, "GET", "/v1/rooms/r/kv/"+key, "").wantErr(t, 400, "invalid_key")
		e.do(t, "PUT", "/v1/rooms/r/kv/"+key, "1").wantErr(t, 400, "invalid_key")
		e.do(t, "DELETE", "/v1/rooms/r/kv/"+key, "").wantErr(t, 400, "invalid_key")
	}
	e.do(t, "GET", "/v1/rooms/r/kv?prefix=%00", "").wantErr(t, 400, "invalid_key")
	e.do(t, "GET", "/v1/rooms/r/kv?prefix=%ff", "").wantErr(t, 400, "invalid_key")
	e.do(t, "GET", "/v1/rooms/r/watch?prefix=a&prefix=%FF", "").wantErr(t, 400, "invalid_key")
}

func TestHTTPTxn(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	e.put(t, "r", "gone", `0`)
	var r apiRev
	e.do(t, "POST", "/v1/rooms/r/txn", `{"if":[{"key":"title","mod_rev":0}],
		"ops":[{"type":"put","key":"title","value":"Plan"},{"type":"put","key":"items/1","value":{"x":1}},{"type":"delete","key":"gone"}]}`).want(t, 200, &r)
	if r.Rev != 2 {
		t.Fatalf("txn rev %d, want 2 (one revision)", r.Rev)
	}
	l := e.list(t, "r", "")
	if len(l.Items) != 2 || l.Items[0].ModRev != 2 || l.Items[1].ModRev != 2 {
		t.Errorf("after txn: %+v", l)
	}
	b := e.do(t, "POST", "/v1/rooms/r/txn", `{"if":[{"key":"title","mod_rev":1}],"ops":[{"type":"delete","key":"title"}]}`).wantErr(t, 412, "conflict")
	if b.Error.Key != "title" || b.Error.ModRev != 2 || b.Error.Rev != 2 {
		t.Errorf("conflict %+v", b.Error)
	}
	for body, code := range map[string]string{
		`{`:                                  "bad_request",
		`[]`:                                 "bad_request",
		`{}`:                                 "bad_request",
		`{"ops":[{"type":"put","key":"k"}]}`: "bad_request",
		`{"ops":[{"type":"zap","key":"k"}]}`: "bad_request",
		`{"ops":[{"type":"put","key":"k","value":1e400}]}`:                  "invalid_value",
		`{"ops":[{"type":"delete","key":"k"},{"type":"delete","key":"k"}]}`: "invalid_key",
		`{"ops":[{"type":"delete","key":""}]}`:                              "invalid_key",
		`{"ops":[{"type":"put","key":"k","value":1,"lease":"session"}]}`:    "not_found",
		// Keys and values that are not Unicode are refused, never read as
		// U+FFFD (which made "\ud800" and "\udc00" one key).
		`{"ops":[{"type":"put","key":"\ud800","value":1}]}`:                         "invalid_key",
		`{"ops":[{"type":"put","key":"\udc00","value":1}]}`:                         "invalid_key",
		"{\"ops\":[{\"type\":\"put\",\"key\":\"\xff\",\"value\":1}]}":               "invalid_key",
		"{\"ops\":[{\"type\":\"delete\",\"key\":\"a\xfe\"}]}":                       "invalid_key",
		`{"if":[{"key":"\ud800","mod_rev":0}],"ops":[{"type":"delete","key":"k"}]}`: "invalid_key",
		`{"ops":[{"type":"put","key":"k","value":{"a":"\ud800"}}]}`:                 "invalid_value",
		"{\"ops\":[{\"type\":\"put\",\"key\":\"k\",\"value\":\"\xff\"}]}":           "invalid_value",
		`{"ops":[{"type":"put","key":"k","value":1,"lease":"ttl_\ud800"}]}`:         "bad_request",
	} {
		status := 400
		if code == "not_found" {
			status = 404
		}
		e.do(t, "POST", "/v1/rooms/r/txn", body).wantErr(t, status, code)
	}
	if l := e.list(t, "r", ""); l.Rev != 2 {
		t.Errorf("refused txns wrote: rev %d", l.Rev)
	}
}

type apiLease struct {
	ID    string `json:"id"`
	TTLMS int64  `json:"ttl_ms"`
	Keys  int    `json:"keys"`
}

func TestHTTPLeases(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	for _, body := range []string{`{"ttl_ms":999}`, `{"ttl_ms":3600001}`, `{}`, `{"ttl_ms":1.5}`, `x`, `{"ttl_ms":-1}`} {
		e.do(t, "POST", "/v1/leases", body).wantErr(t, 400, "bad_request")
	}
	var l apiLease
	e.do(t, "POST", "/v1/leases", `{"ttl_ms":60000}`).want(t, 200, &l)
	if !strings.HasPrefix(l.ID, "ttl_") || l.TTLMS != 60000 {
		t.Fatalf("grant: %+v", l)
	}
	id := l.ID
	e.do(t, "POST", "/v1/leases/"+id+"/keepalive", "").want(t, 200, &l)
	if l.ID != id || l.TTLMS != 60000 {
		t.Errorf("keepalive: %+v", l)
	}
	e.do(t, "POST", "/v1/leases/ttl_nope/keepalive", "").wantErr(t, 404, "not_found")

	e.put(t, "r", "presence/a", `1`)
	e.do(t, "PUT", "/v1/rooms/r/kv/presence/b?lease="+id, `2`).want(t, 200, nil)
	e.do(t, "PUT", "/v1/rooms/r/kv/presence/c?lease=ttl_nope", `3`).wantErr(t, 404, "not_found")
	e.do(t, "PUT", "/v1/rooms/r/kv/presence/c?lease=session:s_x", `3`).wantErr(t, 404, "not_found")
	if ls := e.list(t, "r", ""); len(ls.Items) != 2 || ls.Items[0].Lease || !ls.Items[1].Lease {
		t.Fatalf("leased key not marked: %+v", ls.Items)
	}

	e.do(t, "DELETE", "/v1/leases/"+id, "").want(t, 200, &l)
	if l.ID != id || l.Keys != 1 {
		t.Errorf("revoke: %+v", l)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ls := e.list(t, "r", "")
		if len(ls.Items) == 1 && ls.Items[0].Key == "presence/a" && ls.Rev == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("leased key not deleted by one delete: %+v", ls)
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.do(t, "DELETE", "/v1/leases/"+id, "").wantErr(t, 404, "not_found")
	e.do(t, "POST", "/v1/leases/"+id+"/keepalive", "").wantErr(t, 404, "not_found")
	e.do(t, "DELETE", "/v1/leases/session:s_x", "").wantErr(t, 404, "not_found")
}

func TestHTTPDraining(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	e.put(t, "r", "k", `1`)
	var l apiLease
	e.do(t, "POST", "/v1/leases", `{"ttl_ms":60000}`).want(t, 200, &l)
	if err := e.srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.do(t, "PUT", "/v1/rooms/r/kv/k", `2`).wantErr(t, 503, "unavailable")
	e.do(t, "DELETE", "/v1/rooms/r/kv/k", "").wantErr(t, 503, "unavailable")
	e.do(t, "POST", "/v1/rooms/r/txn", `{"ops":[{"type":"delete","key":"k"}]}`).wantErr(t, 503, "unavailable")
	e.do(t, "POST", "/v1/leases", `{"ttl_ms":5000}`).wantErr(t, 503, "unavailable")
	e.do(t, "DELETE", "/v1/leases/"+l.ID, "").wantErr(t, 503, "unavailable") // a revoke deletes keys: a write
	e.do(t, "GET", "/v1/rooms/r/watch", "").wantErr(t, 503, "unavailable")
	if l := e.list(t, "r", ""); l.Rev != 1 {
		t.Errorf("reads while draining: %+v", l)
	}
}

var apiTestSecret = []byte("0123456789abcdef0123456789abcdef")

// apiToken signs an HS256 token for sub with grants, expiring in exp.
func apiToken(t testing.TB, exp time.Duration, grants ...map[string]string) string {
	t.Helper()
	g := make([]any, len(grants))
	for i := range grants {
		g[i] = grants[i]
	}
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": "alice", "exp": time.Now().Add(exp).Unix(), "statecast": map[string]any{"grants": g},
	}).SignedString(apiTestSecret)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestHTTPAuth(t *testing.T) {
	a, err := auth.New(auth.Config{HMACSecret: apiTestSecret, Leeway: -1})
	if err != nil {
		t.Fatal(err)
	}
	e := newAPIEnv(t, apiOpts{auth: a})
	rw := apiToken(t, time.Hour, map[string]string{"room": "lobby:*", "access": "rw"})
	ro := apiToken(t, time.Hour, map[string]string{"room": "lobby:*", "access": "r"})
	presence := apiToken(t, time.Hour, map[string]string{"room": "lobby:eu", "prefix": "presence/", "access": "rw"})
	expired := apiToken(t, -time.Minute, map[string]string{"room": "*", "access": "rw"})
	bearer := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

	r := e.do(t, "GET", "/v1/rooms/lobby:eu/kv", "")
	r.wantErr(t, 401, "unauthorized")
	if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
		t.Errorf("WWW-Authenticate %q", r.header.Get("WWW-Authenticate"))
	}
	e.do(t, "GET", "/v1/rooms/lobby:eu/kv", "", bearer("garbage")...).wantErr(t, 401, "unauthorized")
	e.do(t, "GET", "/v1/rooms/lobby:eu/kv", "", "Authorization", "Basic "+rw).wantErr(t, 401, "unauthorized")
	b := e.do(t, "GET", "/v1/rooms/lobby:eu/kv", "", bearer(expired)...).wantErr(t, 401, "unauthorized")
	if !strings.Contains(b.Error.Message, "expired") || strings.Contains(b.Error.Message, expired) {
		t.Errorf("expired token message %q", b.Error.Message)
	}
	e.do(t, "POST", "/v1/leases", `{"ttl_ms":5000}`).wantErr(t, 401, "unauthorized")

	e.do(t, "PUT", "/v1/rooms/lobby:eu/kv/games/1", `1`, bearer(rw)...).want(t, 200, nil)
	e.do(t, "PUT", "/v1/rooms/lobby:eu/kv/games/1", `1`, bearer(ro)...).wantErr(t, 403, "forbidden")
	e.do(t, "DELETE", "/v1/rooms/lobby:eu/kv/games/1", "", bearer(ro)...).wantErr(t, 403, "forbidden")
	e.do(t, "POST", "/v1/rooms/lobby:eu/txn", `{"ops":[{"type":"delete","key":"games/1"}]}`, bearer(presence)...).wantErr(t, 403, "forbidden")
	e.do(t, "PUT", "/v1/rooms/doc:1/kv/k", `1`, bearer(rw)...).wantErr(t, 403, "forbidden")
	e.do(t, "GET", "/v1/rooms/lobby:eu/kv/games/1", "", bearer(ro)...).want(t, 200, nil)
	e.do(t, "GET", "/v1/rooms/doc:1/kv", "", bearer(ro)...).wantErr(t, 403, "forbidden")

	// A prefix grant reads and writes below its prefix only.
	e.do(t, "PUT", "/v1/rooms/lobby:eu/kv/presence/alice", `1`, bearer(presence)...).want(t, 200, nil)
	e.do(t, "GET", "/v1/rooms/lobby:eu/kv?prefix=presence/", "", bearer(presence)...).want(t, 200, nil)
	e.do(t, "GET", "/v1/rooms/lobby:eu/kv", "", bearer(presence)...).wantErr(t, 403, "forbidden")
	e.do(t, "GET", "/v1/rooms/lobby:eu/kv/games/1", "", bearer(presence)...).wantErr(t, 403, "forbidden")
	e.do(t, "GET", "/v1/rooms/lobby:eu/watch", "", bearer(presence)...).wantErr(t, 403, "forbidden")
	e.do(t, "GET", "/v1/rooms/lobby:eu/watch?prefix=presence/&prefix=games/", "", bearer(presence)...).wantErr(t, 403, "forbidden")

	// access_token is taken on the watch route only.
	e.do(t, "GET", "/v1/rooms/lobby:eu/kv?access_token="+ro, "").wantErr(t, 401, "unauthorized")
	e.do(t, "GET", "/v1/rooms/lobby:eu/watch?access_token="+expired, "").wantErr(t, 401, "unauthorized")
	w := e.watch(t, "/v1/rooms/lobby:eu/watch?access_token="+ro)
	if ev := w.next(t); ev.Event != "reset" {
		t.Errorf("first event %+v, want reset", ev)
	}
	w2 := e.watch(t, "/v1/rooms/lobby:eu/watch?prefix=presence/", bearer(presence)...)
	if ev := w2.next(t); ev.Event != "reset" || len(ev.data(t).Items) != 1 {
		t.Errorf("prefix watch: %+v", ev)
	}

	var l apiLease
	e.do(t, "POST", "/v1/leases", `{"ttl_ms":5000}`, bearer(ro)...).want(t, 200, &l)
	e.do(t, "POST", "/v1/leases/"+l.ID+"/keepalive", "").wantErr(t, 401, "unauthorized")
	e.do(t, "DELETE", "/v1/leases/"+l.ID, "", bearer(ro)...).want(t, 200, nil)
}

// apiStatuses are the statuses the HTTP API documents.
var apiStatuses = map[int]bool{200: true, 400: true, 404: true, 405: true, 412: true, 413: true}

// FuzzHTTPInputs sends arbitrary rooms, keys, bodies, conditions and
// positions through every route: the answer is never a 500 and always a
// documented status.
func FuzzHTTPInputs(f *testing.F) {
	e := newAPIEnv(f, apiOpts{cfg: Config{WriteRate: 1e9}}) // fuzzing writes faster than the default rate
	f.Add(uint8(0), "r", "k", `{"a":1}`, "", "")
	f.Add(uint8(1), "r", "a/b%2Fc", `1`, "0", "")
	f.Add(uint8(0x81), "r", "a/b", ``, "", "")
	f.Add(uint8(2), "r", "k", ``, "1", "")
	f.Add(uint8(3), "room:x", "k", `{"ops":[{"type":"put","key":"k","value":1}],"if":[{"key":"k","mod_rev":0}]}`, "", "")
	f.Add(uint8(4), "r", "", "", "", "3")
	f.Add(uint8(5), "r", "k", `{"ttl_ms":1000}`, "", "")
	f.Add(uint8(6), "bad room", "\x00", "\xff", "x", "-1")
	f.Add(uint8(7), "r", "ttl_x", "", "", "")
	f.Add(uint8(8), "r", "k", "", "", "")
	f.Add(uint8(0), "r", "%zz", "[", "18446744073709551616", "18446744073709551615")
	f.Add(uint8(4), "r", "p", "", "", "abc")
	f.Fuzz(func(t *testing.T, route uint8, room, key, body, cond, from string) {
		keyPath := apiPathEscape(key)
		if route&0x80 == 0 { // the high bit keeps '/' in keys escaped as %2F
			keyPath = strings.ReplaceAll(keyPath, "%2F", "/")
		}
		kv := "/v1/rooms/" + apiPathEscape(room) + "/kv/" + keyPath
		var method, target string
		switch route % 9 {
		case 0:
			method, target = "PUT", kv+"?lease="+apiPathEscape(from)
		case 1:
			method, target = "GET", kv
		case 2:
			method, target = "DELETE", kv
		case 3:
			method, target = "POST", "/v1/rooms/"+apiPathEscape(room)+"/txn"
		case 4:
			method, target = "GET", "/v1/rooms/"+apiPathEscape(room)+"/watch?prefix="+apiPathEscape(key)+"&from="+apiPathEscape(from)
		case 5:
			method, target = "POST", "/v1/leases"
		case 6:
			method, target = "GET", "/v1/rooms/"+apiPathEscape(room)+"/kv?prefix="+apiPathEscape(key)
		case 7:
			method, target = "POST", "/v1/leases/"+apiPathEscape(key)+"/keepalive"
		case 8:
			method, target = "DELETE", "/v1/leases/"+apiPathEscape(key)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, target, strings.NewReader(body))
		if err != nil {
			t.Skip()
		}
		req.Host = "localhost"
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("If-Match", strings.Map(apiHeaderSafe, cond))
		req.Header.Set("Last-Event-ID", strings.Map(apiHeaderSafe, from))
		rec := httptest.NewRecorder()
		openapicheck.Handler(t, loadOpenAPI(t), e.srv.Handler()).ServeHTTP(rec, req)
		if rec.Code == http.StatusServiceUnavailable && ctx.Err() != nil {
			return // the request's own 20 ms ran out (a loaded machine): unavailable is the answer
		}
		if !apiStatuses[rec.Code] {
			t.Fatalf("%s %s (If-Match %q): status %d, body %s", method, target, cond, rec.Code, rec.Body)
		}
		var eb apiErrBody
		if rec.Code != 200 && (json.Unmarshal(rec.Body.Bytes(), &eb) != nil || eb.Error.Code == "") {
			t.Fatalf("%s %s: status %d with body %s, want an error object", method, target, rec.Code, rec.Body)
		}
	})
}

// apiPathEscape escapes every byte that is not unreserved, so the fuzzer
// controls exactly what the server decodes.
func apiPathEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~:@", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

// apiHeaderSafe drops the bytes a header value cannot carry.
func apiHeaderSafe(r rune) rune {
	if r < 0x20 || r == 0x7f {
		return -1
	}
	return r
}

// TestHTTPLeaseLimit: a subject holds at most MaxLeases TTL leases; an
// ended one gives its place back.
func TestHTTPLeaseLimit(t *testing.T) {
	e := newAPIEnv(t, apiOpts{cfg: Config{MaxLeases: 2}})
	var l apiLease
	e.do(t, "POST", "/v1/leases", `{"ttl_ms":60000}`).want(t, 200, &l)
	e.do(t, "POST", "/v1/leases", `{"ttl_ms":60000}`).want(t, 200, nil)
	e.do(t, "POST", "/v1/leases", `{"ttl_ms":60000}`).wantErr(t, 413, "too_large")
	e.do(t, "DELETE", "/v1/leases/"+l.ID, "").want(t, 200, nil)
	e.do(t, "POST", "/v1/leases", `{"ttl_ms":60000}`).want(t, 200, nil)
	e.do(t, "POST", "/v1/leases", `{"ttl_ms":60000}`).wantErr(t, 413, "too_large")
}

// TestHTTPIdempotencyKeyBelongsToItsSubject: an Idempotency-Key is its
// writer's own. Bob's write under the key Alice used applies (it used to
// be answered as Alice's commit, dup, and never applied); a repeat of
// one's own key with another body is 422 wid_reused and writes nothing.
func TestHTTPIdempotencyKeyBelongsToItsSubject(t *testing.T) {
	a, err := auth.New(auth.Config{HMACSecret: apiTestSecret})
	if err != nil {
		t.Fatal(err)
	}
	e := newAPIEnv(t, apiOpts{auth: a})
	token := func(sub string) string {
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": sub, "exp": time.Now().Add(time.Hour).Unix(),
			"statecast": map[string]any{"grants": []any{map[string]any{"room": "r", "access": "rw"}}}}).SignedString(apiTestSecret)
		if err != nil {
			t.Fatal(err)
		}
		return "Bearer " + tok
	}
	alice, bob := token("alice"), token("bob")
	type dupRev struct {
		Rev uint64 `json:"rev"`
		Dup bool   `json:"dup"`
	}
	var r dupRev
	e.do(t, "PUT", "/v1/rooms/r/kv/alice%2Fx", `1`, "Authorization", alice, "Idempotency-Key", "same-id-1").want(t, 200, &r)
	if r != (dupRev{Rev: 1}) {
		t.Fatalf("alice's put: %+v, want applied at 1", r)
	}
	e.do(t, "PUT", "/v1/rooms/r/kv/bob%2Fx", `2`, "Authorization", bob, "Idempotency-Key", "same-id-1").want(t, 200, &r)
	if r != (dupRev{Rev: 2}) {
		t.Fatalf("bob's put under alice's key: %+v, want applied at 2", r)
	}
	e.do(t, "PUT", "/v1/rooms/r/kv/alice%2Fx", `1`, "Authorization", alice, "Idempotency-Key", "same-id-1").want(t, 200, &r)
	if r != (dupRev{Rev: 1, Dup: true}) {
		t.Errorf("alice's repeat: %+v, want dup at 1", r)
	}
	res := e.do(t, "PUT", "/v1/rooms/r/kv/alice%2Fx", `"other"`, "Authorization", alice, "Idempotency-Key", "same-id-1")
	res.wantErr(t, 422, "wid_reused")
	if !strings.Contains(string(res.body), `"rev":1`) {
		t.Errorf("422 body %s, want the revision the key committed at", res.body)
	}
	var l struct {
		Rev   uint64 `json:"rev"`
		Items []struct {
			Key string `json:"key"`
		} `json:"items"`
	}
	e.do(t, "GET", "/v1/rooms/r/kv", "", "Authorization", alice).want(t, 200, &l)
	if l.Rev != 2 || len(l.Items) != 2 || l.Items[0].Key != "alice/x" || l.Items[1].Key != "bob/x" {
		t.Errorf("room %+v, want alice/x and bob/x at revision 2", l)
	}
}

// TestHTTPIdempotencyKey: an HTTP write's Idempotency-Key is its wid: a
// repeat answers 200 with the original revision and "dup":true and writes
// nothing; with Idempotency-Since, an unknown key whose history is
// compacted is outcome_unknown; a bad key or since is bad_request.
func TestHTTPIdempotencyKey(t *testing.T) {
	e := newAPIEnv(t, apiOpts{retention: store.RetentionPolicy{Default: store.Retention{MaxEvents: 3}}})
	type dupRev struct {
		Rev uint64 `json:"rev"`
		Dup bool   `json:"dup"`
	}
	write := func(method, path, body string, hdr ...string) dupRev {
		t.Helper()
		var r dupRev
		e.do(t, method, path, body, hdr...).want(t, 200, &r)
		return r
	}
	writes := []struct{ method, path, body string }{
		{"PUT", "/v1/rooms/r/kv/k", `1`},
		{"DELETE", "/v1/rooms/r/kv/k", ""},
		{"POST", "/v1/rooms/r/txn", `{"ops":[{"type":"put","key":"t","value":2}]}`},
	}
	for i, w := range writes {
		key := fmt.Sprint("c1-", i)
		first := write(w.method, w.path, w.body, "Idempotency-Key", key, "Idempotency-Since", fmt.Sprint(i))
		if first != (dupRev{Rev: uint64(i + 1)}) {
			t.Fatalf("%s %s: %+v, want applied at %d", w.method, w.path, first, i+1)
		}
		for _, k := range []string{key, `"` + key + `"`} { // as is, and as a structured-field string
			if again := write(w.method, w.path, w.body, "Idempotency-Key", k); again != (dupRev{Rev: first.Rev, Dup: true}) {
				t.Errorf("%s %s repeated with key %s: %+v, want dup at %d", w.method, w.path, k, again, first.Rev)
			}
		}
	}
	if l := e.list(t, "r", ""); l.Rev != 3 {
		t.Fatalf("room at %d after repeats, want 3", l.Rev)
	}
	e.put(t, "r", "k", `2`) // 4: revisions 2..4 retained
	e.do(t, "PUT", "/v1/rooms/r/kv/k", `1`, "Idempotency-Key", "lost", "Idempotency-Since", "0").wantErr(t, 504, "outcome_unknown")
	for _, hdr := range [][]string{
		{"Idempotency-Key", ""},
		{"Idempotency-Key", "a b"},
		{"Idempotency-Key", strings.Repeat("k", 65)},
		{"Idempotency-Since", "1"},
		{"Idempotency-Key", "ok", "Idempotency-Since", "-1"},
	} {
		e.do(t, "PUT", "/v1/rooms/r/kv/k", `1`, hdr...).wantErr(t, 400, "bad_request")
	}
	if l := e.list(t, "r", ""); l.Rev != 4 {
		t.Errorf("room at %d after refused writes, want 4", l.Rev)
	}
}

// TestHTTPRepliesCarryTheEpoch: reads, write replies and conflicts name the room's
// epoch beside its revision, so that a client can tell a revision that
// continues what it saw from one of a room started again.
func TestHTTPRepliesCarryTheEpoch(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	snap, err := e.st.Snapshot(context.Background(), "r", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ method, path, body string }{
		{"PUT", "/v1/rooms/r/kv/k", `1`},
		{"GET", "/v1/rooms/r/kv/k", ""},
		{"GET", "/v1/rooms/r/kv", ""},
		{"POST", "/v1/rooms/r/txn", `{"ops":[{"type":"delete","key":"k"}]}`},
		{"GET", "/v1/rooms/r/kv/k", ""}, // 404, at a revision of the epoch
		{"POST", "/v1/rooms/r/txn", `{"if":[{"key":"k","mod_rev":1}],"ops":[{"type":"delete","key":"k"}]}`}, // 409: its revisions are of the epoch
	} {
		res := e.do(t, r.method, r.path, r.body)
		if got := res.header.Get("X-Statecast-Epoch"); got != snap.Epoch || res.header.Get("X-Statecast-Rev") == "" {
			t.Errorf("%s %s: %d, X-Statecast-Epoch %q and X-Statecast-Rev %q, want epoch %q and a revision",
				r.method, r.path, res.status, got, res.header.Get("X-Statecast-Rev"), snap.Epoch)
		}
	}
}
