package server_test

import (
	"strings"
	"testing"
	"time"

	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
)

// TestWSWidResentAfterLostReply: a put with a wid whose socket drops before
// the reply is read is resent, with the same wid, on the resumed session:
// the answer is ok with dup and the original revision, and a watcher saw
// one event, in every codec. Anonymous clients are sent no write ids (an
// authenticated writer's own are: TestWSWidsBelongToTheirWriter).
func TestWSWidResentAfterLostReply(t *testing.T) {
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			e := servertest.Start(t, servertest.Options{})
			const room = "wid"
			watcher, _ := connectRaw(t, e, codec)
			watcher.send(&wire.Request{T: wire.TSub, ID: 1, Room: room})
			snap := watcher.until(func(m rawMsg) bool { return m.T == wire.TSnapshot })
			epoch := snap[len(snap)-1].Epoch

			writer, hello := connectRaw(t, e, codec)
			put := &wire.Request{T: wire.TPut, ID: 7, Room: room, Key: "k", Value: wire.Value(`"v"`), Wid: "c1-1", Since: u64(0)}
			writer.send(put)
			_ = writer.ws.CloseNow() // the reply is lost
			ev := watcher.until(func(m rawMsg) bool { return m.T == wire.TEvents })
			first := ev[len(ev)-1]
			if len(first.Events) != 1 || first.Events[0].Wid != "" {
				t.Fatalf("event of the put %+v, want one without another session's wid", first.Raw)
			}

			again := dialRaw(t, e, codec)
			again.send(&wire.Request{T: wire.TConnect, Session: hello.Session, Resume: hello.Resume})
			if m := again.next(); m.T != wire.TConnected || !m.Resumed {
				t.Fatalf("reconnect: %+v, want the session resumed", m.Raw)
			}
			again.send(put)
			ok := again.reply(put.ID)
			if ok.T != wire.TOK || !ok.Dup || ok.Rev != first.Rev {
				t.Fatalf("resend: %+v, want ok with dup at revision %d", ok.Raw, first.Rev)
			}
			again.send(&wire.Request{T: wire.TPut, ID: 8, Room: room, Key: "after", Value: wire.Value(`1`)})
			if m := again.reply(8); m.T != wire.TOK || m.Rev != first.Rev+1 {
				t.Fatalf("next write: %+v, want ok at %d", m.Raw, first.Rev+1)
			}
			next := watcher.until(func(m rawMsg) bool { return m.T == wire.TEvents })
			if m := next[len(next)-1]; len(next) != 1 || m.Rev != first.Rev+1 || m.Events[0].Key != "after" || m.Events[0].Wid != "" {
				t.Fatalf("after the resend the watcher got %d messages, the last %+v; want only the next write, without a wid", len(next), m.Raw)
			}

			// A resume replays the write, without its id.
			again.send(&wire.Request{T: wire.TSub, ID: 9, Room: room, From: &wire.Position{Epoch: epoch, Rev: 1}})
			replay := again.until(func(m rawMsg) bool { return m.T == wire.TSynced })
			if m := replay[1]; m.T != wire.TEvents || m.Rev != first.Rev || m.Events[0].Wid != "" {
				t.Fatalf("replay: first event %+v, want the put without a wid", m.Raw)
			}
		})
	}
}

// TestWSWidInvalid: a wid that is not 1 to 64 bytes of printable ASCII,
// or a since without a wid, is answered bad_request and writes nothing;
// in MessagePack too, where a wid that is not UTF-8 is no decoding error.
func TestWSWidInvalid(t *testing.T) {
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			e := servertest.Start(t, servertest.Options{})
			c, _ := connectRaw(t, e, codec)
			bad := []*wire.Request{
				{Wid: strings.Repeat("w", 65)},
				{Wid: "white space"},
				{Wid: "é"},
				{Wid: string([]byte{'w', 0xff})}, // not UTF-8
				{Wid: "~AAAAAAAAAAAAAAAA~x"},     // the form of a stored id, another scope's
				{Since: u64(4)},
			}
			for i, r := range bad {
				r.T, r.ID, r.Room, r.Key, r.Value = wire.TPut, uint64(i+1), "r", "k", wire.Value(`1`)
				c.send(r)
				if m := c.reply(r.ID); m.T != wire.TErr || m.Code != wire.CodeBadRequest || !strings.Contains(m.Message.Message, "write id") {
					t.Errorf("put with wid %q since %v: %+v, want err bad_request about the write id", r.Wid, r.Since, m.Raw)
				}
			}
			if snap, _ := e.Store.Snapshot(servertest.Context(t), "r", ""); snap.Rev != 0 {
				t.Errorf("room at revision %d after bad writes, want 0", snap.Rev)
			}
		})
	}
}

// TestWSWidsBelongToTheirWriter: a write id is its writer's own. Bob's put
// under the id Alice used applies (it used to be answered dup with Alice's
// revision and never applied); an id read off Alice's events cannot be
// committed ahead of her (watchers of other subjects are never sent it,
// and it would be Bob's own id anyway); a repeat of one's own id with
// other content is wid_reused and writes nothing. In every codec.
func TestWSWidsBelongToTheirWriter(t *testing.T) {
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			e := authEnv(t)
			hour := time.Now().Add(time.Hour)
			login := func(sub string) *rawConn {
				c := dialRaw(t, e, codec)
				c.send(&wire.Request{T: wire.TConnect, Token: tokenFor(t, sub, hour, allRooms)})
				if m := c.next(); m.T != wire.TConnected {
					t.Fatalf("%s: %+v, want connected", sub, m.Raw)
				}
				c.send(&wire.Request{T: wire.TSub, ID: 1, Room: "r"})
				c.until(func(m rawMsg) bool { return m.T == wire.TSnapshot })
				return c
			}
			alice, bob := login("alice"), login("bob")
			// The wid each connection was sent with the event of a revision.
			seen := map[*rawConn]map[uint64]string{alice: {}, bob: {}}
			record := func(c *rawConn, stop func(rawMsg) bool) rawMsg {
				t.Helper()
				msgs := c.until(func(m rawMsg) bool {
					if m.T == wire.TEvents {
						seen[c][m.Rev] = m.Events[0].Wid
					}
					return stop(m)
				})
				return msgs[len(msgs)-1]
			}
			put := func(c *rawConn, id uint64, key, value, wid string) rawMsg {
				t.Helper()
				c.send(&wire.Request{T: wire.TPut, ID: id, Room: "r", Key: key, Value: wire.Value(value), Wid: wid})
				return record(c, func(m rawMsg) bool { return (m.T == wire.TOK || m.T == wire.TErr) && m.ID == id })
			}
			event := func(c *rawConn, rev uint64) string {
				t.Helper()
				if _, ok := seen[c][rev]; !ok {
					record(c, func(m rawMsg) bool { return m.T == wire.TEvents && m.Rev == rev })
				}
				return seen[c][rev]
			}

			if m := put(alice, 2, "alice/x", `1`, "same-id-1"); m.T != wire.TOK || m.Dup || m.Rev != 1 {
				t.Fatalf("alice's put: %+v, want ok at 1", m.Raw)
			}
			if m := put(bob, 2, "bob/x", `2`, "same-id-1"); m.T != wire.TOK || m.Dup || m.Rev != 2 {
				t.Fatalf("bob's put under alice's id: %+v, want ok at 2, applied", m.Raw)
			}
			if w := event(alice, 1); w != "same-id-1" {
				t.Errorf("alice's own event carries wid %q, want hers", w)
			}
			if w := event(alice, 2); w != "" {
				t.Errorf("alice was sent bob's wid %q", w)
			}
			if w := event(bob, 1); w != "" {
				t.Errorf("bob was sent alice's wid %q", w)
			}
			if w := event(bob, 2); w != "same-id-1" {
				t.Errorf("bob's own event carries wid %q, want his", w)
			}

			// Bob commits the id alice will use next, on his own key.
			if m := put(bob, 3, "bob/y", `3`, "same-id-2"); m.T != wire.TOK || m.Rev != 3 {
				t.Fatalf("bob's put: %+v", m.Raw)
			}
			if m := put(alice, 3, "alice/y", `4`, "same-id-2"); m.T != wire.TOK || m.Dup || m.Rev != 4 {
				t.Errorf("alice's next write after bob took its id: %+v, want ok at 4, applied", m.Raw)
			}

			m := put(alice, 4, "alice/x", `"changed"`, "same-id-1")
			if m.T != wire.TErr || m.Code != wire.CodeWidReused || m.Rev != 1 {
				t.Errorf("alice's id again with another value: %+v, want err wid_reused naming revision 1", m.Raw)
			}
			if m := put(alice, 5, "alice/x", `1`, "same-id-1"); m.T != wire.TOK || !m.Dup || m.Rev != 1 {
				t.Errorf("alice's resend: %+v, want ok dup at 1", m.Raw)
			}
			snap, err := e.Store.Snapshot(servertest.Context(t), "r", "")
			if err != nil {
				t.Fatal(err)
			}
			if snap.Rev != 4 || len(snap.Items) != 4 || string(snap.Items[0].Value) != "1" {
				t.Errorf("room at %d with %d keys (alice/x=%s), want 4 keys at 4, alice/x=1", snap.Rev, len(snap.Items), snap.Items[0].Value)
			}
		})
	}
}

// TestWSAnonymousWids: without auth every client is anonymous, and they
// share one scope, so that the resend of a write finds its id on a new
// session too (its session may be lost with a node). None is sent ids, so
// none can learn another's; an id that collides all the same is refused
// wid_reused, never answered as the other's commit.
func TestWSAnonymousWids(t *testing.T) {
	e := servertest.Start(t, servertest.Options{})
	watcher, _ := connectRaw(t, e, "json")
	watcher.send(&wire.Request{T: wire.TSub, ID: 1, Room: "r"})
	watcher.until(func(m rawMsg) bool { return m.T == wire.TSnapshot })
	a, _ := connectRaw(t, e, "json")
	a.send(&wire.Request{T: wire.TPut, ID: 1, Room: "r", Key: "a", Value: wire.Value(`1`), Wid: "w.1"})
	if m := a.reply(1); m.T != wire.TOK || m.Rev != 1 {
		t.Fatalf("a's put: %+v", m.Raw)
	}
	if ev := watcher.until(func(m rawMsg) bool { return m.T == wire.TEvents }); ev[len(ev)-1].Events[0].Wid != "" {
		t.Errorf("an anonymous watcher was sent wid %q", ev[len(ev)-1].Events[0].Wid)
	}
	b, _ := connectRaw(t, e, "json") // a new session, as after a lost one
	b.send(&wire.Request{T: wire.TPut, ID: 1, Room: "r", Key: "a", Value: wire.Value(`1`), Wid: "w.1"})
	if m := b.reply(1); m.T != wire.TOK || !m.Dup || m.Rev != 1 {
		t.Errorf("resend on a new session: %+v, want dup at 1", m.Raw)
	}
	b.send(&wire.Request{T: wire.TPut, ID: 2, Room: "r", Key: "b", Value: wire.Value(`2`), Wid: "w.1"})
	if m := b.reply(2); m.T != wire.TErr || m.Code != wire.CodeWidReused || m.Rev != 1 {
		t.Errorf("another write under the id: %+v, want err wid_reused at 1", m.Raw)
	}
}
