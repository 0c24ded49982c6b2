package server_test

import (
	"strings"
	"testing"

	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
)

// TestWSWidResentAfterLostReply: a put with a wid whose socket drops before
// the reply is read is resent, with the same wid, on the resumed session:
// the answer is ok with dup and the original revision, and a watcher saw
// one event, carrying the wid (live and in a replay), in both codecs.
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
			if len(first.Events) != 1 || first.Events[0].Wid != "c1-1" {
				t.Fatalf("event of the put %+v, want one carrying wid c1-1", first.Raw)
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

			// A resume replays the write with its wid.
			again.send(&wire.Request{T: wire.TSub, ID: 9, Room: room, From: &wire.Position{Epoch: epoch, Rev: 1}})
			replay := again.until(func(m rawMsg) bool { return m.T == wire.TSynced })
			if m := replay[1]; m.T != wire.TEvents || m.Rev != first.Rev || m.Events[0].Wid != "c1-1" {
				t.Fatalf("replay: first event %+v, want the put with wid c1-1", m.Raw)
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
