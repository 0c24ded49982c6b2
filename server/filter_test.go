package server_test

import (
	"bufio"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
)

const openDuels = `value.mode == "duel" && value.players < value.max`

type game struct {
	Mode    string `json:"mode"`
	Players int    `json:"players"`
	Max     int    `json:"max"`
}

// eventsOf returns the events of msgs as "type key" strings.
func eventsOf(msgs []wire.Message) []string {
	var out []string
	for _, m := range msgs {
		for _, ev := range m.Events {
			out = append(out, ev.Type+" "+ev.Key)
		}
	}
	return out
}

// assertViewIsFiltered checks v against the room's list with the same filter.
func assertViewIsFiltered(t *testing.T, e *servertest.Node, room, filter string, v *client.View) {
	t.Helper()
	l, err := e.HTTP.ListWith(servertest.Context(t), room, "games/", client.ReadOptions{Filter: filter})
	if err != nil {
		t.Fatal(err)
	}
	var got, want []string
	for _, it := range v.Sorted() {
		got = append(got, it.Key+"="+string(it.Value))
	}
	for _, it := range l.Items {
		want = append(want, it.Key+"="+string(it.Value))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("view %v\nthe filtered room %v", got, want)
	}
}

// TestWSFilteredSub: a sub with a filter gets the matching keys in its
// snapshot; a key whose value starts matching arrives as a put, one that
// stops matching or is deleted as a leave, changes outside the result not
// at all; a resume replays the same, filtered, then synced.
func TestWSFilteredSub(t *testing.T) {
	t.Parallel()
	e := servertest.Start(t, servertest.Options{})
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			ctx, room := servertest.Context(t), "lobby-"+codec
			w := dialCodec(t, e, "json")
			put := func(key string, g game) uint64 {
				t.Helper()
				rev, err := w.Put(ctx, room, key, g)
				if err != nil {
					t.Fatal(err)
				}
				return rev
			}
			put("games/1", game{"duel", 1, 2}) // in
			put("games/2", game{"duel", 2, 2}) // full
			put("games/3", game{"team", 1, 4}) // another mode
			put("games/4", game{"duel", 0, 2}) // in
			put("chat/1", game{"duel", 0, 2})  // another prefix
			c := dialCodec(t, e, codec)
			sub, err := c.Subscribe(ctx, room, client.SubscribeOptions{Prefixes: []string{"games/"}, Filter: openDuels})
			if err != nil {
				t.Fatal(err)
			}
			v := client.NewView()
			snap := applyUntil(t, sub, v, func(m wire.Message) bool { return m.T == wire.TSnapshot })
			if keys := v.Sorted(); len(keys) != 2 || keys[0].Key != "games/1" || keys[1].Key != "games/4" {
				t.Fatalf("snapshot %+v, want games/1 and games/4", snap[0].Items)
			}
			put("games/3", game{"team", 2, 4})         // outside, stays outside: nothing
			put("games/2", game{"duel", 1, 2})         // a seat freed: enters
			put("games/1", game{"duel", 2, 2})         // full: leaves
			last := put("games/4", game{"duel", 1, 2}) // changes within
			got := applyUntil(t, sub, v, func(m wire.Message) bool { return m.Rev == last })
			if want := []string{"put games/2", "leave games/1", "put games/4"}; !slices.Equal(eventsOf(got), want) {
				t.Fatalf("events %v, want %v", eventsOf(got), want)
			}
			assertViewIsFiltered(t, e, room, openDuels, v)
			c.CloseNow()

			// Missed while away: a delete of a key in the result, one outside, a
			// transaction moving one key out and one in.
			if _, err := w.Delete(ctx, room, "games/4"); err != nil {
				t.Fatal(err)
			}
			if _, err := w.Delete(ctx, room, "games/3"); err != nil {
				t.Fatal(err)
			}
			if _, err := w.Txn(ctx, room, nil, []wire.TxnOp{
				{Type: "put", Key: "games/2", Value: wire.Value(`{"mode":"duel","players":2,"max":2}`)},
				{Type: "put", Key: "games/5", Value: wire.Value(`{"mode":"duel","players":0,"max":3}`)},
			}); err != nil {
				t.Fatal(err)
			}
			c2 := dialCodec(t, e, codec)
			sub, err = c2.Subscribe(ctx, room, client.SubscribeOptions{Prefixes: []string{"games/"}, Filter: openDuels, From: v.Position()})
			if err != nil {
				t.Fatal(err)
			}
			got = applyUntil(t, sub, v, func(m wire.Message) bool { return m.T == wire.TSynced })
			if want := []string{"leave games/4", "leave games/2", "put games/5"}; !slices.Equal(eventsOf(got), want) {
				t.Fatalf("replay %v (%s), want %v", eventsOf(got), describe(got), want)
			}
			if n := len(got); n != 3 { // two revisions, then synced: the delete outside sends nothing
				t.Fatalf("replay %s: want 2 events messages and synced", describe(got))
			}
			assertViewIsFiltered(t, e, room, openDuels, v)
		})
	}
}

// TestFilterErrors: a filter that does not compile is refused with
// invalid_filter and where the fault is, on every surface, and the
// connection goes on (its prefix budget given back).
func TestFilterErrors(t *testing.T) {
	t.Parallel()
	e := servertest.Start(t, servertest.Options{})
	ctx := servertest.Context(t)
	c := dialCodec(t, e, "json")
	for _, tc := range []struct {
		filter    string
		line, col int
		msg       string
	}{
		{`value.mode ==`, 1, 14, "Syntax error"},
		{`players > 1`, 1, 1, "undeclared reference to 'players'"},
		{"value.mode == 'duel' &&\n  value.seats +", 2, 16, "Syntax error"},
		{`value.players + 1`, 1, 1, "not a bool"},
		{`1 == 1 &&` + strings.Repeat(" true &&", 200) + " true", 0, 0, "over the limit"},
		// Compared whole, two values of --max-value bytes cost more than
		// the budget: refused, with the estimate and the budget.
		{`value == value`, 0, 0, "estimated to cost 288358, over the budget of 263144"},
	} {
		for range 3 { // more than the connection's prefix budget would allow if it leaked
			_, err := c.Subscribe(ctx, "lobby", client.SubscribeOptions{Prefixes: []string{"games/"}, Filter: tc.filter})
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Code != wire.CodeInvalidFilter || ce.Line != tc.line || ce.Column != tc.col || !strings.Contains(ce.Message, tc.msg) {
				t.Fatalf("filter %q: %#v, want invalid_filter at %d:%d with %q", tc.filter, err, tc.line, tc.col, tc.msg)
			}
		}
		_, err := e.HTTP.ListWith(ctx, "lobby", "games/", client.ReadOptions{Filter: tc.filter})
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status != http.StatusBadRequest || ce.Code != wire.CodeInvalidFilter || ce.Line != tc.line || ce.Column != tc.col {
			t.Fatalf("list with filter %q: %#v, want 400 invalid_filter at %d:%d", tc.filter, err, tc.line, tc.col)
		}
		err = e.HTTP.WatchWith(ctx, "lobby", client.WatchOptions{Filter: tc.filter}, func(client.SSEEvent) error { return errors.New("an event") })
		if !errors.As(err, &ce) || ce.Status != http.StatusBadRequest || ce.Code != wire.CodeInvalidFilter {
			t.Fatalf("SSE watch with filter %q: %#v, want 400 invalid_filter", tc.filter, err)
		}
	}
	if _, err := c.Put(ctx, "lobby", "games/1", game{"duel", 1, 2}); err != nil {
		t.Fatalf("the connection after refused filters: %v", err)
	}
	// A value the filter cannot evaluate (no such field, not an object)
	// does not match; it is not an error of the watch.
	if _, err := c.Put(ctx, "lobby", "games/2", "just a string"); err != nil {
		t.Fatal(err)
	}
	l, err := e.HTTP.ListWith(ctx, "lobby", "games/", client.ReadOptions{Filter: openDuels})
	if err != nil || len(l.Items) != 1 || l.Items[0].Key != "games/1" {
		t.Fatalf("list: %+v, %v; want games/1 only", l, err)
	}
}

// TestFilterBudget: a connection holds at most MaxConnFilters filtered
// subscriptions; ending one gives its place back.
func TestFilterBudget(t *testing.T) {
	t.Parallel()
	e := servertest.Start(t, servertest.Options{Server: server.Config{MaxConnFilters: 2}})
	ctx := servertest.Context(t)
	c := dialCodec(t, e, "json")
	var subs []*client.Subscription
	for i := range 2 {
		s, err := c.Subscribe(ctx, "lobby", client.SubscribeOptions{Filter: fmt.Sprintf("value.n == %d", i)})
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s)
	}
	_, err := c.Subscribe(ctx, "lobby", client.SubscribeOptions{Filter: "value.n == 9"})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != wire.CodeTooManySubs {
		t.Fatalf("a third filtered sub: %v, want too_many_subscriptions", err)
	}
	if _, err := c.Subscribe(ctx, "lobby", client.SubscribeOptions{}); err != nil {
		t.Fatalf("an unfiltered sub: %v", err)
	}
	if err := subs[0].Unsubscribe(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Subscribe(ctx, "lobby", client.SubscribeOptions{Filter: "value.n == 9"}); err != nil {
		t.Fatalf("after an unsub: %v", err)
	}
}

// TestRoomFilterBound: a room serves a bounded number of distinct
// filters: one more is too_many_subscriptions on the WebSocket, 429 on
// SSE; another watcher of a filter in use is welcome.
func TestRoomFilterBound(t *testing.T) {
	t.Parallel()
	e := servertest.Start(t, servertest.Options{Rooms: rooms.Config{MaxFilters: 1}})
	ctx := servertest.Context(t)
	c := dialCodec(t, e, "json")
	if _, err := c.Subscribe(ctx, "lobby", client.SubscribeOptions{Filter: openDuels}); err != nil {
		t.Fatal(err)
	}
	if _, err := dialCodec(t, e, "msgpack").Subscribe(ctx, "lobby", client.SubscribeOptions{Filter: openDuels}); err != nil {
		t.Fatalf("a filter the room serves: %v", err)
	}
	_, err := c.Subscribe(ctx, "lobby", client.SubscribeOptions{Filter: "value.n == 1"})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != wire.CodeTooManySubs || !strings.Contains(ce.Message, "--max-room-filters") {
		t.Fatalf("another filter: %v, want too_many_subscriptions", err)
	}
	err = e.HTTP.WatchWith(ctx, "lobby", client.WatchOptions{Filter: "value.n == 1"}, func(client.SSEEvent) error { return errors.New("an event") })
	if !errors.As(err, &ce) || ce.Status != http.StatusTooManyRequests || ce.Code != wire.CodeTooManySubs {
		t.Fatalf("another filter over SSE: %v, want 429 too_many_subscriptions", err)
	}
}

// TestSSEFilteredWatch: ?filter= on the SSE watch; a key leaving the
// result is a "leave" event.
func TestSSEFilteredWatch(t *testing.T) {
	t.Parallel()
	e := servertest.Start(t, servertest.Options{})
	ctx := servertest.Context(t)
	c := dialCodec(t, e, "json")
	if _, err := c.Put(ctx, "lobby", "games/1", game{"duel", 1, 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "lobby", "games/2", game{"duel", 2, 2}); err != nil {
		t.Fatal(err)
	}
	q := url.Values{"prefix": {"games/"}, "filter": {openDuels}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.HTTP.URL+"/v1/rooms/lobby/watch?"+q.Encode(), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	lines := bufio.NewScanner(resp.Body)
	next := func() string { // the next event's name and data
		t.Helper()
		var name string
		for lines.Scan() {
			l := lines.Text()
			switch {
			case strings.HasPrefix(l, "event: "):
				name = strings.TrimPrefix(l, "event: ")
			case strings.HasPrefix(l, "data: "):
				return name + " " + strings.TrimPrefix(l, "data: ")
			}
		}
		t.Fatalf("stream ended: %v", lines.Err())
		return ""
	}
	if got := next(); !strings.HasPrefix(got, "reset ") || !strings.Contains(got, `"games/1"`) || strings.Contains(got, `"games/2"`) {
		t.Fatalf("first event %s, want a reset with games/1 only", got)
	}
	if _, err := c.Put(ctx, "lobby", "games/2", game{"team", 1, 2}); err != nil { // outside, stays outside
		t.Fatal(err)
	}
	rev, err := c.Put(ctx, "lobby", "games/1", game{"duel", 2, 2})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`leave {"rev":%d,"events":[{"type":"leave","key":"games/1","mod_rev":%d}]}`, rev, rev)
	if got := next(); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// TestSlowFilterRateLimited: a filter over the room's time budget (here
// 1 ns: every evaluation is over it) three changes in a row ends its
// subscription with rate_limited, and a new one with it is refused
// rate_limited in that room, on the WebSocket and SSE alike.
func TestSlowFilterRateLimited(t *testing.T) {
	t.Parallel()
	e := servertest.Start(t, servertest.Options{Rooms: rooms.Config{FilterTimeBudget: time.Nanosecond}})
	ctx := servertest.Context(t)
	c := dialCodec(t, e, "json")
	const filter = `value.mode == "duel"`
	s, err := c.Subscribe(ctx, "lobby", client.SubscribeOptions{Filter: filter})
	if err != nil {
		t.Fatal(err)
	}
	for i := range rooms.FilterStrikes {
		if _, err := c.Put(ctx, "lobby", fmt.Sprintf("games/%d", i), game{"duel", 1, 2}); err != nil {
			t.Fatal(err)
		}
	}
	var ce *client.Error
	for {
		if _, err = s.Next(ctx); err != nil {
			break
		}
	}
	if !errors.As(err, &ce) || ce.Code != wire.CodeRateLimited {
		t.Fatalf("the subscription ended with %v, want rate_limited", err)
	}
	if _, err := c.Subscribe(ctx, "lobby", client.SubscribeOptions{Filter: filter}); !errors.As(err, &ce) || ce.Code != wire.CodeRateLimited {
		t.Fatalf("subscribing again: %v, want rate_limited", err)
	}
	err = e.HTTP.WatchWith(ctx, "lobby", client.WatchOptions{Filter: filter}, func(client.SSEEvent) error { return errors.New("an event") })
	if !errors.As(err, &ce) || ce.Status != http.StatusTooManyRequests || ce.Code != wire.CodeRateLimited {
		t.Fatalf("SSE watch with the filter: %#v, want 429 rate_limited", err)
	}
}
