package server_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
)

var abuseFor = flag.Duration("abuse", 1500*time.Millisecond, "TestAbuse: how long each surface is attacked (and measured without attack)")

// TestAbuse drives random bad input at a running server through one
// surface at a time (WebSocket JSON, WebSocket msgpack, HTTP, SSE), and
// two attacks found from outside (filters whose evaluation walks big
// values in the good client's room; a room grown by 256-put transactions)
// while a
// well-behaved client of another subject writes and watches its room,
// which the attacker may read but not write.
// The good client must see every write of its own succeed and end with a
// view equal to the room; its write-to-event latency is reported with
// and without the attack (figures, not assertions: `go test ./server -run
// TestAbuse -v -abuse 10s`). The attacker is an authenticated subject
// with grants, so its input reaches past the token check.
func TestAbuse(t *testing.T) {
	t.Parallel() // runs for a fixed time per surface
	for _, surface := range []string{"ws-json", "ws-msgpack", "http", "sse", "filters", "growth"} {
		t.Run(surface, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			authn, err := auth.New(auth.Config{HMACSecret: hmacSecret})
			if err != nil {
				t.Fatal(err)
			}
			e := servertest.Start(t, servertest.Options{Server: server.Config{Auth: authn, MaxFrameBytes: 256 << 10}})
			good := tokenFor(t, "good", time.Now().Add(time.Hour), allRooms)
			bad := tokenFor(t, "mallory", time.Now().Add(time.Hour), map[string]any{"grants": []any{
				map[string]any{"room": "r*", "access": "rw"}, map[string]any{"room": "good", "access": "r"},
				map[string]any{"room": "good", "prefix": "m/", "access": "rw"}}})

			g := newGoodClient(t, e, good)
			base := g.run(t, *abuseFor)

			ctx, stop := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			for i := range 2 {
				a := &attacker{e: e, token: bad, rng: rand.New(rand.NewPCG(seed, uint64(i)))}
				wg.Go(func() { a.run(ctx, surface) })
			}
			attacked := g.run(t, *abuseFor)
			stop()
			wg.Wait()
			g.check(t)
			t.Logf("%s: good client, %d writes unattacked p50 %v p99 %v; %d writes attacked p50 %v p99 %v",
				surface, len(base), pct(base, 50), pct(base, 99), len(attacked), pct(attacked, 50), pct(attacked, 99))
		})
	}
}

// goodClient writes to its room and waits for each write's event on its
// own subscription, checking the revision contract as it goes.
type goodClient struct {
	e    *servertest.Node
	c    *client.Conn
	sub  *client.Subscription
	v    *client.View
	http *client.HTTP
	n    int
}

func newGoodClient(t *testing.T, e *servertest.Node, token string) *goodClient {
	g := &goodClient{e: e, c: dial(t, e, &client.Options{Codec: "msgpack", Token: token}), v: client.NewView(),
		http: &client.HTTP{URL: e.TS.URL, Token: token}}
	var err error
	if g.sub, err = g.c.Subscribe(servertest.Context(t), "good", client.SubscribeOptions{}); err != nil {
		t.Fatal(err)
	}
	applyUntil(t, g.sub, g.v, func(m wire.Message) bool { return m.T == wire.TSnapshot })
	return g
}

// run writes for d and returns the latency of each write: from sending
// it to applying its event.
func (g *goodClient) run(t *testing.T, d time.Duration) []time.Duration {
	t.Helper()
	var lat []time.Duration
	ctx := servertest.Context(t)
	for end := time.Now().Add(d); time.Now().Before(end); {
		g.n++
		start := time.Now()
		key := fmt.Sprintf("g/%d", g.n%16)
		var rev uint64
		var err error
		if g.n%5 == 0 {
			rev, err = g.c.Delete(ctx, "good", key)
		} else {
			rev, err = g.c.Put(ctx, "good", key, map[string]any{"n": g.n})
		}
		if err != nil {
			t.Fatalf("good write %d: %v", g.n, err)
		}
		if rev > g.v.Rev { // a delete of a missing key writes nothing
			applyUntil(t, g.sub, g.v, func(m wire.Message) bool { return m.Rev >= rev })
		}
		lat = append(lat, time.Since(start))
		time.Sleep(8 * time.Millisecond) // under the write rate limit
	}
	return lat
}

// check compares the good client's view with the room, read over HTTP.
func (g *goodClient) check(t *testing.T) {
	t.Helper()
	if err := g.c.Err(); err != nil {
		t.Fatalf("the good client's connection ended: %v", err)
	}
	l, err := g.http.List(servertest.Context(t), "good", "")
	if err != nil {
		t.Fatal(err)
	}
	if l.Rev > g.v.Rev { // the attacker wrote too: catch up first
		applyUntil(t, g.sub, g.v, func(m wire.Message) bool { return m.Rev >= l.Rev })
	}
	if l.Rev != g.v.Rev || l.Epoch != g.v.Epoch {
		t.Fatalf("view at %s/%d, room at %s/%d", g.v.Epoch, g.v.Rev, l.Epoch, l.Rev)
	}
	if !slices.EqualFunc(g.v.Sorted(), l.Items, func(a, b wire.Item) bool {
		return a.Key == b.Key && bytes.Equal(a.Value, b.Value) && a.ModRev == b.ModRev
	}) {
		t.Fatalf("view %v\nroom %v", g.v.Sorted(), l.Items)
	}
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

// attacker sends random bad input through one surface until ctx ends.
type attacker struct {
	e     *servertest.Node
	token string
	rng   *rand.Rand
}

func (a *attacker) run(ctx context.Context, surface string) {
	for ctx.Err() == nil {
		switch surface {
		case "ws-json":
			a.websocket(ctx, wire.JSON)
		case "ws-msgpack":
			a.websocket(ctx, wire.Msgpack)
		case "http":
			a.request(ctx)
		case "sse":
			a.watch(ctx)
		case "filters":
			a.filters(ctx)
		case "growth":
			a.grow(ctx)
		}
	}
}

// websocket opens one connection and sends random frames until the
// server closes it (or a few dozen went out). Sometimes it never reads,
// to be a slow consumer as well.
func (a *attacker) websocket(ctx context.Context, codec wire.Codec) {
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(dctx, a.e.WS, &websocket.DialOptions{Subprotocols: []string{codec.Subprotocol()}})
	if err != nil {
		return
	}
	defer ws.CloseNow()
	if a.rng.IntN(3) > 0 { // discard what the server sends
		go func() {
			for {
				if _, _, err := ws.Read(dctx); err != nil {
					return
				}
			}
		}()
	}
	if a.rng.IntN(10) > 0 { // mostly past connect, to reach the handlers
		b, _ := codec.Append(nil, map[string]any{"t": "connect", "token": a.token})
		if ws.Write(dctx, codec.MessageType(), b) != nil {
			return
		}
	}
	for range 1 + a.rng.IntN(40) {
		typ, frame := codec.MessageType(), a.frame(codec)
		if a.rng.IntN(20) == 0 {
			typ = websocket.MessageBinary + websocket.MessageText - typ // the other frame type
		}
		if ws.Write(dctx, typ, frame) != nil {
			return
		}
	}
}

// frame is a random frame: noise, or a batch of requests whose fields
// are random, in the codec or broken by a random byte.
func (a *attacker) frame(codec wire.Codec) []byte {
	r := a.rng
	if r.IntN(8) == 0 {
		return a.bytes(r.IntN(3000))
	}
	var b []byte
	for range 1 + r.IntN(4) {
		var err error
		if codec == wire.Msgpack {
			var p []byte
			p, err = msgpack.Marshal(a.request1())
			b = append(b, p...)
		} else {
			b, err = codec.Append(b, a.request1())
		}
		if err != nil {
			continue
		}
	}
	if r.IntN(6) == 0 && len(b) > 0 {
		b[r.IntN(len(b))] = byte(r.IntN(256))
	}
	return b
}

var abuseTypes = []string{"connect", "auth", "ping", "sub", "unsub", "put", "del", "txn", "nope", ""}

// request1 is one request with random fields, some of the wrong type.
func (a *attacker) request1() map[string]any {
	r := a.rng
	m := map[string]any{"t": abuseTypes[r.IntN(len(abuseTypes))]}
	if r.IntN(5) > 0 {
		m["id"] = a.number()
	}
	m["room"] = a.pick("good", "r", "", "bad room", strings.Repeat("r", 200), a.text())
	m["key"] = a.pick("g/1", "k", "", a.text(), strings.Repeat("k", 2000))
	if r.IntN(2) == 0 {
		m["value"] = a.value(3)
	}
	if r.IntN(3) == 0 {
		n := a.pick(1, 3, 70, 2000).(int)
		ps := make([]any, n)
		for i := range ps {
			ps[i] = a.pick("g/", "", a.text(), fmt.Sprint("p", i))
		}
		m["prefixes"] = ps
	}
	if r.IntN(3) == 0 {
		m["from"] = map[string]any{"epoch": a.pick("", "x", a.text()), "rev": a.number()}
	}
	if r.IntN(4) == 0 {
		m["if_rev"] = a.number()
	}
	if r.IntN(3) == 0 {
		ops := make([]any, a.pick(1, 5, 300).(int))
		for i := range ops {
			ops[i] = map[string]any{"op": a.pick("put", "del", "x"), "key": a.pick("g/1", a.text()), "value": a.value(2)}
		}
		m["ops"] = ops
	}
	if r.IntN(5) == 0 {
		m["sub"] = a.number()
		m["lease"] = a.pick("session", "ttl_x", a.text())
		m["token"] = a.pick(a.token, "x.y.z", a.text())
		m["session"], m["resume"] = a.text(), a.text()
	}
	return m
}

func (a *attacker) pick(choices ...any) any { return choices[a.rng.IntN(len(choices))] }

func (a *attacker) number() any {
	return a.pick(0, 1, -5, a.rng.IntN(1000), uint64(1)<<63, 1e300, -1e20, "7", nil, true)
}

// text is a short random string: ASCII, UTF-8, or invalid UTF-8.
func (a *attacker) text() string {
	return string(a.bytes(a.rng.IntN(12)))
}

func (a *attacker) bytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		if a.rng.IntN(4) == 0 {
			b[i] = byte(a.rng.IntN(256))
		} else {
			b[i] = byte('a' + a.rng.IntN(26))
		}
	}
	return b
}

// value is a random JSON-ish value up to depth levels deep.
func (a *attacker) value(depth int) any {
	k := a.rng.IntN(8)
	if depth == 0 {
		k %= 5
	}
	switch k {
	case 0:
		return nil
	case 1:
		return a.number()
	case 2:
		return a.text()
	case 3:
		return []byte(a.text())
	case 4:
		if depth < 3 { // one big value per request at most: the attacker
			return "v" // must not spend the test's CPU building frames
		}
		return strings.Repeat("v", a.pick(1, 1000, 300<<10).(int))
	case 5, 6:
		m := map[string]any{}
		for range a.rng.IntN(4) {
			m[a.text()] = a.value(depth - 1)
		}
		return m
	}
	l := make([]any, a.rng.IntN(4))
	for i := range l {
		l[i] = a.value(depth - 1)
	}
	return l
}

var abuseMethods = []string{"GET", "PUT", "POST", "DELETE", "OPTIONS", "PATCH", "HEAD"}

// request sends one random HTTP request over a fresh or kept-alive
// connection, with random path, headers and body.
func (a *attacker) request(ctx context.Context) {
	r := a.rng
	room := url.PathEscape(a.pick("good", "r", "bad room", a.text()).(string))
	path := a.pick("/v1/rooms/"+room+"/kv", "/v1/rooms/"+room+"/kv/"+url.PathEscape(a.text()),
		"/v1/rooms/"+room+"/kv/g/1", "/v1/rooms/"+room+"/txn", "/v1/leases", "/v1/leases/"+url.PathEscape(a.text()),
		"/v1/leases/ttl_x/keepalive", "/v1/admin/inspect", "/metrics", "/v1/"+a.text()).(string)
	q := url.Values{}
	for range r.IntN(4) {
		q.Add(a.pick("prefix", "from", "lease", "epoch", a.text()).(string), a.text())
	}
	var body []byte
	switch r.IntN(4) {
	case 0:
		body, _ = wire.JSON.Append(nil, a.request1())
	case 1:
		body, _ = wire.JSON.Append(nil, a.value(3))
	case 2:
		body = a.bytes(r.IntN(5000))
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, abuseMethods[r.IntN(len(abuseMethods))], a.e.TS.URL+path+"?"+q.Encode(), bytes.NewReader(body))
	if err != nil {
		return
	}
	if r.IntN(4) > 0 {
		req.Header.Set("Authorization", "Bearer "+a.pick(a.token, a.text()).(string))
	}
	req.Header.Set("Content-Type", a.pick("application/json", "text/plain", "", a.text()).(string))
	req.Header.Set("If-Match", fmt.Sprint(a.number()))
	if r.IntN(4) == 0 {
		req.Header.Set("Origin", a.pick("http://evil.example", a.e.TS.URL).(string))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
}

// watch opens an SSE stream with random parameters and reads it a while,
// or not at all.
func (a *attacker) watch(ctx context.Context) {
	r := a.rng
	q := url.Values{"access_token": {a.pick(a.token, a.text()).(string)}}
	for range r.IntN(3) {
		q.Add("prefix", a.pick("g/", a.text()).(string))
	}
	if r.IntN(8) == 0 {
		for i := range 100 {
			q.Add("prefix", fmt.Sprint("p", i))
		}
	}
	if r.IntN(2) == 0 {
		q.Set("from", fmt.Sprint(a.number()))
	}
	if r.IntN(3) == 0 {
		q.Set("epoch", a.text())
	}
	rctx, cancel := context.WithTimeout(ctx, time.Duration(1+r.IntN(300))*time.Millisecond)
	defer cancel()
	room := url.PathEscape(a.pick("good", "r", a.text()).(string))
	req, err := http.NewRequestWithContext(rctx, "GET", a.e.TS.URL+"/v1/rooms/"+room+"/watch?"+q.Encode(), nil)
	if err != nil {
		return
	}
	if r.IntN(3) == 0 {
		req.Header.Set("Last-Event-ID", fmt.Sprint(a.number()))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if r.IntN(3) == 0 {
		<-rctx.Done() // a reader that reads nothing
		return
	}
	_, err = io.Copy(io.Discard, resp.Body)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		return
	}
}

// costlyFilters are filters whose evaluation walks a value whole, many
// times: 480 ms over an 80 KB value, under the room's lock, before their
// worst case was estimated at compile time.
var costlyFilters = []string{
	"[" + strings.Repeat("value,", 79) + "value] == [" + strings.Repeat("value,", 79) + "value]",
	"value == value",
	"value in [value, value, value, value]",
	"has(value.x) && value.x.exists(a, value.x.exists(b, a == b))",
}

// filters watches the good client's room with two costly filters and
// puts 80 KB values under the prefix it may write there, every 50 ms until
// ctx ends, so that each of the room's filters walks them.
func (a *attacker) filters(ctx context.Context) {
	ws, _, err := websocket.Dial(ctx, a.e.WS, &websocket.DialOptions{Subprotocols: []string{wire.JSON.Subprotocol()}})
	if err != nil {
		return
	}
	defer ws.CloseNow()
	go func() { // read, and drop, whatever comes
		for {
			if _, _, err := ws.Read(ctx); err != nil {
				return
			}
		}
	}()
	items := make([]any, 800)
	for i := range items {
		items[i] = map[string]any{"n": i, "s": strings.Repeat("v", 80)}
	}
	send := func(m map[string]any) bool {
		b, _ := wire.JSON.Append(nil, m)
		return ws.Write(ctx, websocket.MessageText, b) == nil
	}
	i := a.rng.IntN(len(costlyFilters))
	if !send(map[string]any{"t": "connect", "token": a.token}) ||
		!send(map[string]any{"t": "sub", "id": 1, "room": "good", "filter": costlyFilters[i]}) ||
		!send(map[string]any{"t": "sub", "id": 2, "room": "good", "filter": costlyFilters[(i+1)%len(costlyFilters)]}) {
		return
	}
	for n := 3; ctx.Err() == nil; n++ {
		if !send(map[string]any{"t": "put", "id": n, "room": "good", "key": fmt.Sprint("m/", n%4), "value": map[string]any{"x": items}}) {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// grow sends transactions of 256 puts of new keys of 1 KB to one of its
// rooms over HTTP, as fast as it is let.
func (a *attacker) grow(ctx context.Context) {
	ops := make([]map[string]any, 256)
	base := a.rng.Uint64()
	for i := range ops {
		ops[i] = map[string]any{"type": "put", "key": fmt.Sprint(base, "/", i), "value": strings.Repeat("g", 1000)}
	}
	body, _ := wire.JSON.Append(nil, map[string]any{"ops": ops})
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, "POST", a.e.TS.URL+"/v1/rooms/r-grow/txn", bytes.NewReader(body))
	if err != nil {
		return
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}
