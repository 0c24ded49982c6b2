package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store/redisstore"
	"github.com/statecast/statecast/store/redistest"
)

// lostTailEnv is one node on Redis whose rooms can be put back to an
// earlier revision of the same epoch, as after a failover to a replica
// that had not received the last writes.
type lostTailEnv struct {
	node *servertest.Node
	raw  *redis.Client
}

const lostTailPrefix = "lt"

func newLostTailEnv(t *testing.T) *lostTailEnv {
	rs := redistest.Start(t, redistest.Options{})
	// No periodic check: only what a client asks for can reveal the loss.
	st, err := redisstore.New(servertest.Context(t), redisstore.Config{URL: rs.URL(), Prefix: lostTailPrefix, CheckInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	raw := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { _ = raw.Close() })
	return &lostTailEnv{node: servertest.Start(t, servertest.Options{Store: st}), raw: raw}
}

func (e *lostTailEnv) roomKeys(room string) []string {
	base := lostTailPrefix + ":{" + room + "}:"
	return []string{base + "meta", base + "kv", base + "log", base + "wids"}
}

// dump returns the room's keys as Redis holds them now.
func (e *lostTailEnv) dump(t *testing.T, room string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, k := range e.roomKeys(room) {
		d, err := e.raw.Dump(context.Background(), k).Result()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out[k] = d
	}
	return out
}

// loseTail puts the room's keys back as dumped.
func (e *lostTailEnv) loseTail(t *testing.T, dump map[string]string) {
	t.Helper()
	for k, d := range dump {
		if err := e.raw.RestoreReplace(context.Background(), k, 0, d).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// watchThroughLoss writes revisions 1-5 of room, watched by a client
// until revision 5, after Redis was dumped at revision 3, then makes Redis
// lose revisions 4 and 5. It returns the lost epoch.
func (e *lostTailEnv) watchThroughLoss(t *testing.T, room string) (epoch string) {
	t.Helper()
	ctx := servertest.Context(t)
	w := dialCodec(t, e.node, "json")
	c := dialCodec(t, e.node, "json")
	sub, err := c.Subscribe(ctx, room, client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v := client.NewView()
	applyUntil(t, sub, v, func(m wire.Message) bool { return m.T == wire.TSnapshot })
	var dump map[string]string
	for i := 1; i <= 5; i++ {
		if _, err := w.Put(ctx, room, "k", fmt.Sprint("lost-", i)); err != nil {
			t.Fatal(err)
		}
		if i == 3 {
			dump = e.dump(t, room)
		}
	}
	applyUntil(t, sub, v, func(m wire.Message) bool { return m.Rev == 5 })
	c.CloseNow()
	e.loseTail(t, dump)
	return v.Epoch
}

// TestWSResumeAcrossLostTail: Redis lost revisions 4 and 5 of the epoch a
// client watched (a failover to a replica that had not received them). A
// WebSocket client resuming from within the lost tail, or from past it,
// gets a snapshot (reason epoch) of a new epoch that holds what Redis
// kept, never a replay of the lost revisions nor a revision reused for
// another write; the writes after it continue the new epoch.
func TestWSResumeAcrossLostTail(t *testing.T) {
	e := newLostTailEnv(t)
	ctx := servertest.Context(t)
	w := dialCodec(t, e.node, "json")
	for _, from := range []uint64{4, 6} {
		t.Run(fmt.Sprint("from ", from), func(t *testing.T) {
			room := fmt.Sprint("ws-", from)
			lost := e.watchThroughLoss(t, room)
			c := dialCodec(t, e.node, "json")
			sub, err := c.Subscribe(ctx, room, client.SubscribeOptions{From: &wire.Position{Epoch: lost, Rev: from}})
			if err != nil {
				t.Fatal(err)
			}
			m := nextMsg(t, sub)
			if m.T != wire.TSnapshot || m.Reason != "epoch" || m.Epoch == lost {
				t.Fatalf("resume from %s/%d after Redis lost revisions 4 and 5 got %s (epoch %s), want a snapshot (reason epoch) of a new epoch", lost, from, describe([]wire.Message{m}), m.Epoch)
			}
			v := client.NewView()
			if err := v.Apply(m); err != nil {
				t.Fatal(err)
			}
			if got := string(v.Items["k"].Value); got != `"lost-3"` {
				t.Errorf("the new epoch's snapshot holds k=%s, want what Redis kept, \"lost-3\"", got)
			}
			servertest.AssertViewIsRoom(t, e.node.HTTP, room, v)
			rev, err := w.Put(ctx, room, "k", "after")
			if err != nil {
				t.Fatal(err)
			}
			got := applyUntil(t, sub, v, func(m wire.Message) bool { return m.Rev >= rev })
			if last := got[len(got)-1]; last.T != wire.TEvents || last.Rev != rev || v.Epoch != m.Epoch {
				t.Fatalf("after the snapshot: %s, epoch %s, want events@%d in epoch %s", describe(got), v.Epoch, rev, m.Epoch)
			}
		})
	}
}

// TestSSEResumeAcrossLostTail: the same for an SSE stream resumed with its
// epoch and Last-Event-ID: a reset (reason epoch) of the new epoch.
func TestSSEResumeAcrossLostTail(t *testing.T) {
	e := newLostTailEnv(t)
	lost := e.watchThroughLoss(t, "sse")
	req, _ := http.NewRequestWithContext(servertest.Context(t), http.MethodGet, e.node.HTTP.URL+"/v1/rooms/sse/watch?epoch="+lost, nil)
	req.Header.Set("Last-Event-ID", "3")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	var name, data string
	for data == "" && lines.Scan() { // the first event's name and data
		if n, ok := strings.CutPrefix(lines.Text(), "event: "); ok {
			name = n
		}
		if d, ok := strings.CutPrefix(lines.Text(), "data: "); ok {
			data = d
		}
	}
	var d struct {
		Epoch  string `json:"epoch"`
		Reason string `json:"reason"`
		Items  []struct {
			Key   string          `json:"key"`
			Value json.RawMessage `json:"value"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(data), &d); err != nil {
		t.Fatalf("first event %q: %q: %v", name, data, err)
	}
	if name != "reset" || d.Reason != "epoch" || d.Epoch == lost || len(d.Items) != 1 || string(d.Items[0].Value) != `"lost-3"` {
		t.Fatalf("SSE resume after revision 3 of %s, whose revisions 4 and 5 Redis then lost: %s %s, want a reset (reason epoch) of a new epoch holding k=\"lost-3\"", lost, name, data)
	}
}
