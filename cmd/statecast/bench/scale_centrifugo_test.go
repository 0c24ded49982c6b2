package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// cfTestRun is a scale process of one connection to one Centrifugo node,
// for its message handling alone (no connection).
func cfTestRun() (*scaleRun, *scaleConn) {
	r := &scaleRun{cfg: &config{server: "centrifugo", conns: 1, rooms: 1}, cf: true, rooms: []string{"sc-0"}}
	c := &scaleConn{}
	r.conns = []*scaleConn{c}
	return r, c
}

// TestCentrifugoMessages: Centrifugo's JSON protocol as its server writes
// it (protocol's easyjson encoders: members in the order of client.proto,
// empty ones left out; the messages are shaped as Centrifugo 6.9.1 sent
// them): the subscribe reply positions the connection, a
// pushed marked publication is timed, a ping is answered, an offset that
// skips is a gap, a resume is counted by how it recovered.
func TestCentrifugoMessages(t *testing.T) {
	r, c := cfTestRun()
	now := time.Now().UnixNano()
	sent := now - int64(3*time.Millisecond)

	if got := string(r.cfSubRequest(c, nil)); got != `{"id":2,"subscribe":{"channel":"sc-0"}}` {
		t.Errorf("first subscribe %s", got)
	}
	for _, m := range []string{
		`{"id":1,"connect":{"client":"6e0a0e2f-1b1c","version":"6.9.1","ping":25,"pong":true}}`,
		`{"id":2,"subscribe":{"recoverable":true,"epoch":"XyZw","offset":4,"positioned":true}}`,
	} {
		if a := r.cfMessage(c, []byte(m), now); a != cfNone {
			t.Fatalf("%s: action %d", m, a)
		}
	}
	if !c.subscribed || !c.ready || !c.wasReady || c.lastRev != 4 || c.epoch != "XyZw" || !c.based || r.ready.Load() != 1 || r.subscribedNs.Load() != now {
		t.Fatalf("after the subscribe reply: %+v, ready %d", c, r.ready.Load())
	}

	// The server's ping, alone or in a frame with others.
	if a := r.cfMessage(c, []byte(`{}`), now); a != cfPong {
		t.Errorf("ping: action %d, want a pong", a)
	}
	// A marked publication: timed from the send time in its data.
	mark := `{"push":{"channel":"sc-0","pub":{"data":"mark:1:` + strconv.FormatInt(sent, 10) + `","offset":5,"epoch":"XyZw"}}}`
	if a := r.cfMessage(c, []byte(mark), now); a != cfNone {
		t.Errorf("mark: action %d", a)
	}
	if c.marks.Load() != 1 || r.markCount.Load() != 1 || c.lastRev != 5 || r.gaps.Load() != 0 {
		t.Fatalf("after the mark: marks %d/%d, offset %d, gaps %d", c.marks.Load(), r.markCount.Load(), c.lastRev, r.gaps.Load())
	}
	if j := r.mark.json(); j.N != 1 || j.Max != uint64(3*time.Millisecond) {
		t.Errorf("mark latency %+v, want one of 3 ms", j)
	}
	// Data that looks like members of the publication fools nothing.
	if r.cfMessage(c, []byte(`{"push":{"channel":"sc-0","pub":{"data":{"offset":99,"x":"\"mark:"},"offset":6}}}`), now); c.lastRev != 6 || r.gaps.Load() != 0 || r.markCount.Load() != 1 {
		t.Fatalf("a publication of other data: offset %d, gaps %d, marks %d", c.lastRev, r.gaps.Load(), r.markCount.Load())
	}
	// An offset that skips one is a gap.
	r.cfMessage(c, []byte(`{"push":{"channel":"sc-0","pub":{"data":"x","offset":8}}}`), now)
	if r.gaps.Load() != 1 || c.lastRev != 8 {
		t.Fatalf("offset 6 → 8: gaps %d, offset %d", r.gaps.Load(), c.lastRev)
	}
	r.gaps.Store(0)

	// The connection is lost; the next subscribe recovers from the
	// position, and the reply carries what was missed.
	r.lost(c)
	c.subscribed, c.replayed = false, 0
	if got, want := string(r.cfSubRequest(c, nil)), `{"id":2,"subscribe":{"channel":"sc-0","recover":true,"offset":8,"epoch":"XyZw"}}`; got != want {
		t.Errorf("resubscribe %s, want %s", got, want)
	}
	recovered := `{"id":2,"subscribe":{"recoverable":true,"epoch":"XyZw","publications":[{"data":"y","offset":9},` +
		`{"data":"mark:2:` + strconv.FormatInt(sent, 10) + `","offset":10}],"recovered":true,"offset":8,"positioned":true,"was_recovering":true}}`
	r.cfMessage(c, []byte(recovered), now)
	if !c.ready || c.lastRev != 10 || c.replayed != 2 || r.byReplay.Load() != 1 || r.resumes.Load() != 1 || r.losses.Load() != 1 ||
		r.markCount.Load() != 2 || r.gaps.Load() != 0 || c.lostAt != 0 {
		t.Fatalf("recovered with 2 publications: ready %v, offset %d, replayed %d, by replay %d, resumes %d of %d, marks %d, gaps %d",
			c.ready, c.lastRev, c.replayed, r.byReplay.Load(), r.resumes.Load(), r.losses.Load(), r.markCount.Load(), r.gaps.Load())
	}

	// Lost again: recovered with nothing missed is synced; not recovered
	// (another epoch) is a snapshot, positioned at the stream's top.
	r.lost(c)
	c.subscribed, c.replayed = false, 0
	r.cfMessage(c, []byte(`{"id":2,"subscribe":{"recoverable":true,"epoch":"XyZw","recovered":true,"offset":10,"positioned":true,"was_recovering":true}}`), now)
	r.lost(c)
	c.subscribed, c.replayed = false, 0
	r.cfMessage(c, []byte(`{"id":2,"subscribe":{"recoverable":true,"epoch":"newE","offset":3,"positioned":true,"was_recovering":true}}`), now)
	if r.bySynced.Load() != 1 || r.bySnapshot.Load() != 1 || r.resumes.Load() != 3 || c.lastRev != 3 || c.epoch != "newE" || !c.ready || r.gaps.Load() != 0 {
		t.Fatalf("synced %d, snapshot %d, resumes %d, offset %d, epoch %q, ready %v, gaps %d",
			r.bySynced.Load(), r.bySnapshot.Load(), r.resumes.Load(), c.lastRev, c.epoch, c.ready, r.gaps.Load())
	}

	// The server drops the subscription (insufficient state): resubscribe
	// from the position; a temporary error is tried again; others end it.
	if a := r.cfMessage(c, []byte(`{"push":{"channel":"sc-0","unsubscribe":{"code":2500,"reason":"insufficient state"}}}`), now); a != cfResubscribe || c.ready || r.losses.Load() != 4 {
		t.Errorf("unsubscribe 2500: action %d, ready %v, losses %d", a, c.ready, r.losses.Load())
	}
	if a := r.cfMessage(c, []byte(`{"id":2,"error":{"code":100,"message":"internal server error","temporary":true}}`), now); a != cfRetry {
		t.Errorf("temporary error: action %d", a)
	}
	if a := r.cfMessage(c, []byte(`{"id":2,"error":{"code":103,"message":"permission denied"}}`), now); a != cfEnd || r.errs.Load() != 2 {
		t.Errorf("permission denied: action %d, errors %d", a, r.errs.Load())
	}
	if a := r.cfMessage(c, []byte(`{"push":{"channel":"sc-0","unsubscribe":{"code":2000,"reason":"server unsubscribe"}}}`), now); a != cfEnd {
		t.Errorf("unsubscribe 2000: action %d", a)
	}
}

func TestJSONMember(t *testing.T) {
	obj := []byte(`{"a":"x\"}","b" : {"c":[1,{"d":2}]},"e":true, "f":12}trailing`)
	for name, want := range map[string]string{"a": `"x\"}"`, "b": `{"c":[1,{"d":2}]}`, "e": "true", "f": "12", "c": "", "d": ""} {
		if got := string(jsonMember(obj, name)); got != want {
			t.Errorf("member %q: %q, want %q", name, got, want)
		}
	}
	for _, bad := range []string{``, `[]`, `{`, `{"`, `{"a"`, `{"a":`, `{"b":1,`, `{"b":1 "a":2}`} {
		if got := jsonMember([]byte(bad), "a"); got != nil {
			t.Errorf("%q: %q", bad, got)
		}
	}
}

// TestScaleCentrifugoFlags: --lease and unknown servers are refused.
func TestScaleCentrifugoFlags(t *testing.T) {
	var out bytes.Buffer
	err := runScale(context.Background(), &config{server: "centrifugo", lease: true, part: "0/1", protocol: "v2", subURLs: []string{"http://127.0.0.1:1"}},
		strings.NewReader(""), &out, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--lease") {
		t.Errorf("--lease with centrifugo: %v", err)
	}
	if _, err := centrifugoServer(&config{server: "nats"}); err == nil {
		t.Error("--server nats accepted")
	}
	// leases answers with the report alone (the node is not there: the
	// connections are refused meanwhile).
	out.Reset()
	cfg := &config{server: "centrifugo", part: "0/1", protocol: "v2", subURLs: []string{"http://127.0.0.1:1"}, conns: 2, rooms: 1,
		room: "sc", placement: "rr", dialConc: 2, timeout: time.Second}
	if err := runScale(context.Background(), cfg, strings.NewReader("leases\n"), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var rep scaleReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || rep.Command != "leases" || rep.LeaseKeys != nil || rep.Conns != 2 || rep.Errors != 0 {
		t.Errorf("leases: %s (%v)", out.String(), err)
	}
}

// TestScaleMarkCentrifugo: one publication per channel through the HTTP
// API, with the key, each data a mark of its send time.
func TestScaleMarkCentrifugo(t *testing.T) {
	var mu sync.Mutex
	var channels []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var body struct{ Channel, Data string }
		err := json.NewDecoder(req.Body).Decode(&body)
		_, sent, ok := markFields([]byte(strconv.Quote(body.Data)))
		if req.Method != http.MethodPost || req.URL.Path != "/api/publish" || req.Header.Get("X-API-Key") != centrifugoAPIKey || err != nil ||
			!strings.HasPrefix(body.Data, "mark:7:") || !ok || time.Since(time.Unix(0, sent)) > time.Minute {
			w.Write([]byte(`{"error":{"code":107,"message":"bad request"}}`))
			return
		}
		mu.Lock()
		channels = append(channels, body.Channel)
		mu.Unlock()
		w.Write([]byte(`{"result":{"offset":1,"epoch":"e"}}`))
	}))
	defer srv.Close()
	var out bytes.Buffer
	if err := Run(context.Background(), []string{"scale-mark", "--server", "centrifugo", "--url", srv.URL, "--rooms", "120", "--room", "sc", "--seq", "7"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	slices.Sort(channels)
	var want []string
	for i := range 120 {
		want = append(want, scaleRoom("sc", i))
	}
	slices.Sort(want)
	if !slices.Equal(channels, want) {
		t.Errorf("published to %d channels %v…, want each of %d once", len(channels), channels[:min(5, len(channels))], len(want))
	}
	if !strings.Contains(out.String(), `"writes":120`) {
		t.Errorf("output %s", out.String())
	}
}
