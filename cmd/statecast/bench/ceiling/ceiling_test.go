package ceiling

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"
)

// testServer is a ceiling on an httptest server with a client for it.
type testServer struct {
	*Server
	url string
	hc  *http.Client
}

// start serves a ceiling with cfg until the test ends, then checks that
// no goroutine outlived it.
func start(t *testing.T, cfg Config) *testServer {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) }) // runs last
	s := New(cfg)
	ts := httptest.NewServer(s)
	t.Cleanup(func() {
		s.Close()
		ts.Close()
	})
	return &testServer{Server: s, url: ts.URL, hc: ts.Client()}
}

// dial opens a socket (query: "" or "?since=O"), closed when the test ends.
func (ts *testServer) dial(t *testing.T, query string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(ts.url, "http")+"/ws"+query, &websocket.DialOptions{HTTPClient: ts.hc})
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadLimit(16 << 20)
	t.Cleanup(func() { c.CloseNow() })
	return c
}

// wait waits until the server's counters satisfy cond.
func (ts *testServer) wait(t *testing.T, cond func(Stats) bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(ts.Stats()); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v", ts.Stats())
		}
	}
}

// waitConns waits until n sockets are open: a socket misses what is
// published between its upgrade and its joining the publishers' set.
func (ts *testServer) waitConns(t *testing.T, n int) {
	t.Helper()
	ts.wait(t, func(st Stats) bool { return st.Connections == n })
}

// post publishes body over HTTP and returns the status and reply.
func (ts *testServer) post(t *testing.T, body string) (int, string) {
	t.Helper()
	resp, err := ts.hc.Post(ts.url+"/publish", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// read reads frames until n messages came; it returns them and the number
// of frames.
func read(t *testing.T, c *websocket.Conn, n int) (msgs []string, frames int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for len(msgs) < n {
		_, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("after %d of %d messages: %v", len(msgs), n, err)
		}
		frames++
		msgs = append(msgs, strings.Split(string(b), "\n")...)
	}
	return msgs, frames
}

func msg(o int) string { return `{"o":` + strconv.Itoa(o) + `,"d":{"i":` + strconv.Itoa(o) + `}}` }

func TestEverySocketGetsEveryMessageInOrder(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run("batch="+strconv.FormatBool(batch), func(t *testing.T) {
			ts := start(t, Config{Batch: batch})
			socks := []*websocket.Conn{ts.dial(t, ""), ts.dial(t, ""), ts.dial(t, "")}
			ts.waitConns(t, len(socks))
			const n = 200
			for o := 1; o <= n; o++ {
				if code, reply := ts.post(t, `{"i":`+strconv.Itoa(o)+`}`); code != http.StatusOK || reply != `{"o":`+strconv.Itoa(o)+`}` {
					t.Fatalf("publish %d: %d %s", o, code, reply)
				}
			}
			for i, c := range socks {
				got, _ := read(t, c, n)
				for o := 1; o <= n; o++ {
					if got[o-1] != msg(o) {
						t.Fatalf("socket %d, message %d: %s, want %s", i, o, got[o-1], msg(o))
					}
				}
			}
			// A message is counted once its write returned, maybe after
			// the client read it.
			ts.wait(t, func(st Stats) bool {
				return st.Published == n && st.LastOffset == n && st.Delivered == 3*n && st.Dropped == 0
			})
		})
	}
}

func TestPublishTakesJSON(t *testing.T) {
	ts := start(t, Config{})
	c := ts.dial(t, "")
	ts.waitConns(t, 1)
	if code, _ := ts.post(t, "not json"); code != http.StatusBadRequest {
		t.Errorf("a body that is not JSON: %d", code)
	}
	// A payload's newlines would split a batch's lines: it is compacted.
	ts.post(t, "{\n  \"a\": [1, 2]\n}\n")
	if got, _ := read(t, c, 1); got[0] != `{"o":1,"d":{"a":[1,2]}}` {
		t.Errorf("got %s", got[0])
	}
}

// The writer joins what is queued into one frame with Batch, and sends a
// frame per message without: a replay is queued all at once.
func TestBatchFraming(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run("batch="+strconv.FormatBool(batch), func(t *testing.T) {
			ts := start(t, Config{Batch: batch})
			for o := 1; o <= 50; o++ {
				ts.publish([]byte(`{"i":` + strconv.Itoa(o) + `}`))
			}
			got, frames := read(t, ts.dial(t, "?since=0"), 50)
			if want := map[bool]int{false: 50, true: 1}[batch]; frames != want || len(got) != 50 || got[49] != msg(50) {
				t.Errorf("%d messages in %d frames, want 50 in %d", len(got), frames, want)
			}
		})
	}
}

// A replay goes out in frames of MaxFrame bytes at most.
func TestBatchMaxFrame(t *testing.T) {
	ts := start(t, Config{Batch: true, MaxFrame: 100})
	for o := 1; o <= 50; o++ {
		ts.publish([]byte(`{"i":` + strconv.Itoa(o) + `}`))
	}
	got, frames := read(t, ts.dial(t, "?since=0"), 50)
	// Each message takes 20-22 bytes and a separator: 4 or 5 to a frame.
	if len(got) != 50 || got[49] != msg(50) || frames < 10 || frames > 13 {
		t.Errorf("%d messages in %d frames of at most 100 bytes, want 50 in 10 to 13", len(got), frames)
	}
}

func TestSinceReplaysRetained(t *testing.T) {
	ts := start(t, Config{Batch: true, History: 10})
	for o := 1; o <= 15; o++ {
		ts.publish([]byte(`{"i":` + strconv.Itoa(o) + `}`))
	}
	from7 := ts.dial(t, "?since=7")
	from2 := ts.dial(t, "?since=2") // 3 to 5 are no longer retained
	now := ts.dial(t, "?since=15")
	ts.waitConns(t, 3)
	ts.publish([]byte(`{"i":16}`))
	want := func(from int) []string {
		var w []string
		for o := from; o <= 16; o++ {
			w = append(w, msg(o))
		}
		return w
	}
	for _, tc := range []struct {
		c    *websocket.Conn
		want []string
	}{
		{from7, want(8)},
		{from2, append([]string{`{"gap":true,"oldest":6}`}, want(6)...)},
		{now, want(16)},
	} {
		if got, _ := read(t, tc.c, len(tc.want)); strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
			t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(ts.url, "http")+"/ws?since=x", &websocket.DialOptions{HTTPClient: ts.hc}); err == nil {
		c.CloseNow()
		t.Error("since=x accepted")
	}
}

// A socket that does not read is closed once its queue overflows; the
// publisher never waits for it and the socket that reads keeps up.
func TestSlowConsumerClosed(t *testing.T) {
	ts := start(t, Config{Queue: 4, History: 4})
	slow, fast := ts.dial(t, ""), ts.dial(t, "")
	ts.waitConns(t, 2)
	payload := []byte(`"` + strings.Repeat("x", 256<<10) + `"`)
	for o := 1; ts.Stats().Dropped == 0; o++ {
		if o > 2000 {
			t.Fatal("the socket that does not read is still open after 2,000 messages of 256 KiB")
		}
		ts.publish(payload)
		read(t, fast, 1) // the reader keeps up, one message at a time
	}
	if st := ts.Stats(); st.Connections != 1 || st.Dropped != 1 {
		t.Errorf("stats %+v: want the slow socket dropped, the fast one open", st)
	}
	ts.publish([]byte(`1`))
	if got, _ := read(t, fast, 1); !strings.HasSuffix(got[0], `,"d":1}`) {
		t.Errorf("the fast socket got %.40s…", got[0])
	}
	// The slow client finds its socket closed after what was buffered.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if _, _, err := slow.Read(ctx); err != nil {
			if ctx.Err() != nil {
				t.Fatal("the slow socket is still open")
			}
			break
		}
	}
}

func TestCloseEndsSockets(t *testing.T) {
	ts := start(t, Config{})
	c := ts.dial(t, "")
	ts.waitConns(t, 1)
	ts.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, _, err := c.Read(ctx); err == nil || ctx.Err() != nil {
		t.Errorf("read after Close: %v", err)
	}
	if code, _ := ts.post(t, "1"); code != http.StatusServiceUnavailable {
		t.Errorf("publish after Close: %d", code)
	}
}

// Run serves until its context ends.
func TestRun(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, args := range [][]string{{"--addr", "0.0.0.0:8001"}, {"--addr", "nope"}, {"--queue", "0"}, {"extra"}} {
		if err := Run(context.Background(), args, io.Discard); err == nil {
			t.Errorf("Run %q: no error", args)
		}
	}
	if err := Run(context.Background(), []string{"-h"}, io.Discard); err != nil {
		t.Errorf("-h: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, []string{"--addr", "127.0.0.1:0", "--batch"}, pw) }()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	url, _, _ := strings.Cut(strings.TrimPrefix(line, "ceiling: listening on "), " ")
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Post(url+"/publish", "application/json", strings.NewReader(`"hi"`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var st Stats
	if resp, err = hc.Get(url + "/stats"); err == nil {
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
	}
	if err != nil || st.LastOffset != 1 {
		t.Errorf("stats after one publish: %+v, %v", st, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
