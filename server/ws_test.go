package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redisstore"
	"github.com/statecast/statecast/store/redistest"
)

// rawEvents returns the events of a raw message as generic maps; a v2
// event array as the map of the v1 fields it has (PROTOCOL.md §11).
func rawEvents(t testing.TB, m rawMsg) []map[string]any {
	t.Helper()
	if dense, ok := m.Raw["e"].([]any); ok {
		out := make([]map[string]any, len(dense))
		for i, e := range dense {
			a, _ := e.([]any)
			if len(a) == 0 {
				t.Fatalf("v2 event %d is not an array: %v", i, e)
			}
			out[i] = map[string]any{"key": a[0]}
			if len(a) >= 4 {
				out[i]["value"] = a[1]
			}
			if x, ok := a[len(a)-1].(map[string]any); ok && x["p"] != nil {
				out[i]["prev"] = x["p"]
			}
		}
		return out
	}
	list, ok := m.Raw["events"].([]any)
	if !ok {
		t.Fatalf("%s message without an events array: %v", m.T, m.Raw)
	}
	out := make([]map[string]any, len(list))
	for i, e := range list {
		if out[i], ok = e.(map[string]any); !ok {
			t.Fatalf("event %d is not a map: %v", i, e)
		}
	}
	return out
}

func TestWSConnected(t *testing.T) {
	e := servertest.Start(t, servertest.Options{Server: server.Config{PingInterval: 7 * time.Second, LeaseGrace: 3 * time.Second}})
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			_, m := connectRaw(t, e, codec)
			if m.V != codecByName(t, codec).Version() || !strings.HasPrefix(m.Session, "s_") || !strings.HasPrefix(m.Resume, "r_") ||
				m.PingMS != 7000 || m.LeaseGraceMS != 3000 {
				t.Fatalf("connected = %+v", m.Message)
			}
			// resumed is always present; expires_ms only with a token.
			if !m.has("resumed") || m.Resumed || m.has("expires_ms") {
				t.Fatalf("connected fields %v: want resumed:false and no expires_ms", m.Raw)
			}
			_, m2 := connectRaw(t, e, codec)
			if m2.Session == m.Session || m2.Resume == m.Resume {
				t.Fatalf("two connections share session %q / resume %q", m.Session, m.Resume)
			}
		})
	}
}

// TestWSFramesWithUpgrade: a client may send its first frames in the
// same packet as the upgrade request, before it reads the 101. Those
// bytes are read with the request; they must reach the session intact
// (the server swaps the hijacked read buffer for a smaller one).
func TestWSFramesWithUpgrade(t *testing.T) {
	e := servertest.Start(t, servertest.Options{})
	for _, size := range []int{1, 3000} { // within and past the read buffer
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			nc, err := net.Dial("tcp", e.TS.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
			req := "GET /v1/ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
				"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
			pad := strings.Repeat("x", size)
			frames := maskedFrame(`{"t":"connect"}`) // then a ping, padded by an unknown field
			frames = append(frames, maskedFrame(`{"t":"ping","pad":"`+pad+`"}`)...)
			if _, err := nc.Write(append([]byte(req), frames...)); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(nc)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("upgrade: %v %v", resp, err)
			}
			var got []string
			for len(got) < 2 {
				h := make([]byte, 2)
				if _, err := io.ReadFull(br, h); err != nil {
					t.Fatalf("after %q: %v", got, err)
				}
				if h[0]&0x0f != 1 {
					t.Fatalf("frame opcode %d, want text", h[0]&0x0f)
				}
				n := int(h[1] & 0x7f)
				if n == 126 {
					if _, err := io.ReadFull(br, h); err != nil {
						t.Fatal(err)
					}
					n = int(h[0])<<8 | int(h[1])
				}
				body := make([]byte, n)
				if _, err := io.ReadFull(br, body); err != nil {
					t.Fatal(err)
				}
				for _, line := range strings.Split(string(body), "\n") {
					var m struct{ T string }
					_ = json.Unmarshal([]byte(line), &m)
					got = append(got, m.T)
				}
			}
			if got[0] != "connected" || got[1] != "pong" {
				t.Fatalf("got %q, want connected then pong", got)
			}
		})
	}
}

// maskedFrame is one client text frame (clients must mask).
func maskedFrame(payload string) []byte {
	key := [4]byte{1, 2, 3, 4}
	f := []byte{0x81}
	switch n := len(payload); {
	case n < 126:
		f = append(f, 0x80|byte(n))
	default:
		f = append(f, 0x80|126, byte(n>>8), byte(n))
	}
	f = append(f, key[:]...)
	for i := range len(payload) {
		f = append(f, payload[i]^key[i%4])
	}
	return f
}

// TestWSMessages walks one subscription through every message of §5 on
// the wire: ok, initial snapshot, events of a put, of a delete and of a
// transaction (one message), prev values, synced, then unsub.
func TestWSMessages(t *testing.T) {
	e := servertest.Start(t, servertest.Options{})
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			room := "msgs-" + codec
			w := dialCodec(t, e, "json")
			ctx := servertest.Context(t)
			for _, k := range []string{"g/b", "g/a", "g/d", "x"} { // revs 1-4
				if _, err := w.Put(ctx, room, k, k); err != nil {
					t.Fatal(err)
				}
			}
			r, _ := connectRaw(t, e, codec)
			r.send(&wire.Request{T: wire.TSub, ID: 1, Room: room, Prefixes: []string{"g/"}, Prev: true})
			if m := r.next(); m.T != wire.TOK || m.ID != 1 {
				t.Fatalf("sub answered %+v, want ok", m.Message)
			}
			snap := r.next()
			if snap.T != wire.TSnapshot || snap.S != 1 || snap.Reason != "initial" || snap.Rev != 4 || snap.Epoch == "" {
				t.Fatalf("snapshot = %+v", snap.Message)
			}
			var keys []string
			for _, it := range snap.Items {
				keys = append(keys, it.Key)
				if it.CreateRev == 0 || it.ModRev != it.CreateRev || it.Version != 1 || it.Lease {
					t.Fatalf("snapshot item %+v", it)
				}
			}
			if fmt.Sprint(keys) != "[g/a g/b g/d]" {
				t.Fatalf("snapshot keys %v, want [g/a g/b g/d] sorted, x filtered out", keys)
			}
			if it := snap.Items[0]; string(it.Value) != `"g/a"` || it.CreateRev != 2 {
				t.Fatalf("item g/a = %+v", it)
			}

			// A put of an existing key: prev carries the old version.
			if _, err := w.Put(ctx, room, "g/a", map[string]int{"v": 2}); err != nil { // 5
				t.Fatal(err)
			}
			m := r.next()
			if m.T != wire.TEvents || m.S != 1 || m.Rev != 5 || len(m.Events) != 1 {
				t.Fatalf("events = %+v", m.Message)
			}
			ev := m.Events[0]
			if ev.Type != "put" || ev.Key != "g/a" || string(ev.Value) != `{"v":2}` || ev.CreateRev != 2 || ev.ModRev != 5 || ev.Version != 2 ||
				ev.Prev == nil || string(ev.Prev.Value) != `"g/a"` || ev.Prev.ModRev != 2 || ev.Prev.Version != 1 || ev.Prev.Key != "" {
				t.Fatalf("put event = %+v (prev %+v)", ev, ev.Prev)
			}

			// A key outside the prefixes is not sent; a delete is an event.
			if _, err := w.Put(ctx, room, "x", 0); err != nil { // 6
				t.Fatal(err)
			}
			if _, err := w.Delete(ctx, room, "g/b"); err != nil { // 7
				t.Fatal(err)
			}
			m = r.next()
			if m.T != wire.TEvents || m.Rev != 7 || len(m.Events) != 1 {
				t.Fatalf("delete events = %+v", m.Message)
			}
			if ev := m.Events[0]; ev.Type != "delete" || ev.Key != "g/b" || ev.ModRev != 7 || ev.Prev == nil || string(ev.Prev.Value) != `"g/b"` {
				t.Fatalf("delete event = %+v", ev)
			}
			if raw := rawEvents(t, m)[0]; raw["value"] != nil {
				t.Fatalf("delete event carries a value: %v", raw)
			}

			// A transaction is one revision and one message, its events in
			// the order of its ops; a created key has no prev.
			rev, err := w.Txn(ctx, room, []wire.Cond{{Key: "g/d", ModRev: 3}}, []wire.TxnOp{
				{Type: "put", Key: "g/n", Value: wire.Value(`[1]`)},
				{Type: "delete", Key: "g/d"},
				{Type: "put", Key: "x", Value: wire.Value(`1`)},
				{Type: "put", Key: "g/a", Value: wire.Value(`3`)},
			})
			if err != nil || rev != 8 {
				t.Fatalf("Txn = %d, %v", rev, err)
			}
			m = r.next()
			if m.T != wire.TEvents || m.Rev != 8 || len(m.Events) != 3 {
				t.Fatalf("txn events = %+v, want the 3 matching events of rev 8 in one message", m.Message)
			}
			var got []string
			for i, ev := range m.Events {
				got = append(got, ev.Type+":"+ev.Key)
				if ev.ModRev != 8 {
					t.Fatalf("txn event %d has mod_rev %d", i, ev.ModRev)
				}
			}
			if fmt.Sprint(got) != "[put:g/n delete:g/d put:g/a]" {
				t.Fatalf("txn events %v, want the ops' order", got)
			}
			raws := rawEvents(t, m)
			if _, ok := raws[0]["prev"]; ok || m.Events[0].Prev != nil || m.Events[0].CreateRev != 8 || m.Events[0].Version != 1 {
				t.Fatalf("created key's event %v: want no prev, create_rev 8, version 1", raws[0])
			}
			if m.Events[1].Prev == nil || m.Events[2].Prev == nil || string(m.Events[2].Prev.Value) != `{"v":2}` {
				t.Fatalf("txn prev values: %+v", m.Events)
			}

			// A resume at head+1 gets synced at once, then live events.
			r.send(&wire.Request{T: wire.TSub, ID: 2, Room: room, From: &wire.Position{Epoch: snap.Epoch, Rev: 9}})
			if m := r.next(); m.T != wire.TOK || m.ID != 2 {
				t.Fatalf("sub 2 answered %+v", m.Message)
			}
			if m := r.next(); m.T != wire.TSynced || m.S != 2 || m.Rev != 8 || len(m.Raw) != 3 {
				t.Fatalf("sub 2 got %v, want exactly {t:synced, s:2, rev:8}", m.Raw)
			}

			// unsub: ok, and nothing of subscription 1 after it. Sub 2
			// covers the same keys, so its events show that the write
			// after the unsub was fanned out.
			r.send(&wire.Request{T: wire.TUnsub, ID: 3, Sub: 1})
			if m := r.next(); m.T != wire.TOK || m.ID != 3 {
				t.Fatalf("unsub answered %+v", m.Message)
			}
			if _, err := w.Put(ctx, room, "g/a", 4); err != nil { // 9
				t.Fatal(err)
			}
			r.send(&wire.Request{T: wire.TUnsub, ID: 4, Sub: 1})
			var live, again bool
			for !live || !again {
				switch m := r.next(); {
				case m.S == 1:
					t.Fatalf("message of subscription 1 after its unsub: %v", m.Raw)
				case m.T == wire.TEvents && m.S == 2 && m.Rev == 9:
					live = true
				case m.ID == 4:
					again = true
					if m.T != wire.TErr || m.Code != wire.CodeNotFound {
						t.Fatalf("second unsub of 1 = %v, want err not_found", m.Raw)
					}
				default:
					t.Fatalf("unexpected %v", m.Raw)
				}
			}
		})
	}
}

// TestWSProgress: an idle prefix subscription gets progress marks while
// the room moves, so its resume point follows the head.
func TestWSProgress(t *testing.T) {
	e := servertest.Start(t, servertest.Options{Rooms: rooms.Config{ProgressInterval: 30 * time.Millisecond}})
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			room, ctx := "progress-"+codec, servertest.Context(t)
			w := dialCodec(t, e, codec)
			r, _ := connectRaw(t, e, codec)
			r.send(&wire.Request{T: wire.TSub, ID: 1, Room: room, Prefixes: []string{"quiet/"}})
			r.reply(1)
			v := client.NewView()
			if m := r.next(); m.T != wire.TSnapshot || m.Rev != 0 || len(m.Items) != 0 || v.Apply(m.Message) != nil {
				t.Fatalf("snapshot of an empty room = %v", m.Raw)
			}
			var head uint64
			for range 3 {
				var err error
				if head, err = w.Put(ctx, room, "busy/k", head); err != nil {
					t.Fatal(err)
				}
			}
			msgs := r.until(func(m rawMsg) bool { return m.T == wire.TProgress && m.Rev == head })
			for _, m := range msgs {
				if m.T != wire.TProgress || m.S != 1 || len(m.Raw) != 3 {
					t.Fatalf("got %v, want only {t:progress, s:1, rev}", m.Raw)
				}
				if err := v.Apply(m.Message); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestWSPingPong(t *testing.T) {
	e := servertest.Start(t, servertest.Options{})
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			r, _ := connectRaw(t, e, codec)
			r.send(&wire.Request{T: wire.TPing}, &wire.Request{T: wire.TPing}, &wire.Request{T: wire.TPing})
			for range 3 {
				if m := r.next(); m.T != wire.TPong || len(m.Raw) != 1 {
					t.Fatalf("got %v, want {t:pong}", m.Raw)
				}
			}
		})
	}
}

// TestWSEngineClosed: when the engine under a subscription closes, the
// server ends it with unsubscribed (code unavailable) and keeps the
// socket; writes then fail without being applied.
func TestWSEngineClosed(t *testing.T) {
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			e := servertest.Start(t, servertest.Options{})
			r, _ := connectRaw(t, e, codec)
			r.send(&wire.Request{T: wire.TSub, ID: 5, Room: "gone"})
			r.reply(5)
			if m := r.next(); m.T != wire.TSnapshot {
				t.Fatalf("got %v", m.Raw)
			}
			if err := e.Engine.Close(); err != nil {
				t.Fatal(err)
			}
			m := r.next()
			if m.T != wire.TUnsubscribed || m.S != 5 || m.Code != wire.CodeUnavailable || m.Message.Message == "" {
				t.Fatalf("got %v, want unsubscribed s:5 code unavailable", m.Raw)
			}
			r.send(&wire.Request{T: wire.TPing})
			if m := r.next(); m.T != wire.TPong {
				t.Fatalf("got %v, want pong: the socket outlives its subscriptions", m.Raw)
			}
			// The subscription is gone: unsub is not_found.
			r.send(&wire.Request{T: wire.TUnsub, ID: 6, Sub: 5})
			if m := r.reply(6); m.Code != wire.CodeNotFound {
				t.Fatalf("unsub of an ended subscription = %v", m.Raw)
			}
			// PROTOCOL.md §4: unavailable means "nothing was written";
			// a closed engine writes nothing.
			r.send(&wire.Request{T: wire.TPut, ID: 7, Room: "gone", Key: "k", Value: wire.Value(`1`)})
			if m := r.reply(7); m.T != wire.TErr || m.Code != wire.CodeUnavailable {
				t.Errorf("BUG: a write on a closed engine is answered %v, want err unavailable (errorOf does not map rooms.ErrClosed)", m.Raw)
			}
			r.send(&wire.Request{T: wire.TSub, ID: 8, Room: "gone"})
			if m := r.reply(8); m.T != wire.TErr || m.Code != wire.CodeUnavailable {
				t.Errorf("BUG: a subscription on a closed engine is answered %v, want err unavailable (errorOf does not map rooms.ErrClosed)", m.Raw)
			}
		})
	}
}

// TestWSErrors checks every request error code of §4 that a request can
// provoke on its own, with its id, on both codecs; the connection keeps
// working after each.
func TestWSErrors(t *testing.T) {
	e := servertest.Start(t, servertest.Options{})
	big := wire.Value(`"` + strings.Repeat("x", 300<<10) + `"`)
	many := make([]wire.TxnOp, 300)
	for i := range many {
		many[i] = wire.TxnOp{Type: "put", Key: fmt.Sprint("k", i), Value: wire.Value(`1`)}
	}
	cases := []struct {
		name string
		req  wire.Request
		code string
	}{
		{"put without value", wire.Request{T: wire.TPut, Room: "r", Key: "k"}, wire.CodeBadRequest},
		{"txn unknown op", wire.Request{T: wire.TTxn, Room: "r", Ops: []wire.TxnOp{{Type: "inc", Key: "k"}}}, wire.CodeBadRequest},
		{"txn put without value", wire.Request{T: wire.TTxn, Room: "r", Ops: []wire.TxnOp{{Type: "put", Key: "k"}}}, wire.CodeBadRequest},
		{"empty txn", wire.Request{T: wire.TTxn, Room: "r"}, wire.CodeBadRequest},
		{"invalid room", wire.Request{T: wire.TPut, Room: "no room!", Key: "k", Value: wire.Value(`1`)}, wire.CodeInvalidRoom},
		{"empty room", wire.Request{T: wire.TDel, Key: "k"}, wire.CodeInvalidRoom},
		{"sub invalid room", wire.Request{T: wire.TSub, Room: strings.Repeat("r", 129)}, wire.CodeInvalidRoom},
		{"put reserved room", wire.Request{T: wire.TPut, Room: "_statecast:hooks", Key: "k", Value: wire.Value(`1`)}, wire.CodeInvalidRoom},
		{"sub reserved room", wire.Request{T: wire.TSub, Room: "_statecast:hooks"}, wire.CodeInvalidRoom},
		{"empty key", wire.Request{T: wire.TPut, Room: "r", Value: wire.Value(`1`)}, wire.CodeInvalidKey},
		{"NUL in key", wire.Request{T: wire.TPut, Room: "r", Key: "a\x00b", Value: wire.Value(`1`)}, wire.CodeInvalidKey},
		{"long key", wire.Request{T: wire.TPut, Room: "r", Key: strings.Repeat("k", 1025), Value: wire.Value(`1`)}, wire.CodeInvalidKey},
		{"duplicate key in txn", wire.Request{T: wire.TTxn, Room: "r", Ops: []wire.TxnOp{
			{Type: "put", Key: "k", Value: wire.Value(`1`)}, {Type: "delete", Key: "k"}}}, wire.CodeInvalidKey},
		{"value too large", wire.Request{T: wire.TPut, Room: "r", Key: "k", Value: big}, wire.CodeTooLarge},
		{"txn too large", wire.Request{T: wire.TTxn, Room: "r", Ops: many}, wire.CodeTooLarge},
		{"unsub unknown", wire.Request{T: wire.TUnsub, Sub: 999}, wire.CodeNotFound},
		{"unknown TTL lease", wire.Request{T: wire.TPut, Room: "r", Key: "k", Value: wire.Value(`1`), Lease: "ttl_nope"}, wire.CodeNotFound},
	}
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			r, _ := connectRaw(t, e, codec)
			for i, tc := range cases {
				id := uint64(100 + i)
				req := tc.req
				req.ID = id
				r.send(&req)
				m := r.next()
				if m.T != wire.TErr || m.ID != id || m.Code != tc.code || m.Message.Message == "" {
					t.Errorf("%s: got %v, want err id %d code %s with a message", tc.name, m.Raw, id, tc.code)
				}
			}

			// A duplicate subscription id is a bad request; the first stays.
			r.send(&wire.Request{T: wire.TSub, ID: 1, Room: "r"})
			r.reply(1)
			r.next() // snapshot
			r.send(&wire.Request{T: wire.TSub, ID: 1, Room: "r"})
			if m := r.reply(1); m.T != wire.TErr || m.Code != wire.CodeBadRequest {
				t.Errorf("duplicate sub id: %v", m.Raw)
			}

			// conflict carries the key, its mod_rev and the room's rev.
			room := "conflict-" + codec
			r.send(&wire.Request{T: wire.TPut, ID: 2, Room: room, Key: "a", Value: wire.Value(`1`)},
				&wire.Request{T: wire.TPut, ID: 3, Room: room, Key: "b", Value: wire.Value(`1`)},
				&wire.Request{T: wire.TPut, ID: 4, Room: room, Key: "a", Value: wire.Value(`2`), IfRev: u64(0)},
				&wire.Request{T: wire.TTxn, ID: 5, Room: room, If: []wire.Cond{{Key: "b", ModRev: 2}, {Key: "zz", ModRev: 7}},
					Ops: []wire.TxnOp{{Type: "delete", Key: "a"}}})
			for _, id := range []uint64{2, 3} {
				if m := r.reply(id); m.T != wire.TOK || m.Rev != id-1 {
					t.Fatalf("put %d: %v", id, m.Raw)
				}
			}
			m := r.reply(4)
			if m.T != wire.TErr || m.Code != wire.CodeConflict || m.Key != "a" || m.ModRev != 1 || m.Rev != 2 {
				t.Errorf("conflict = %v, want key a, mod_rev 1, rev 2", m.Raw)
			}
			if v, err := e.HTTP.List(servertest.Context(t), room, ""); err != nil || m.Epoch != v.Epoch {
				t.Errorf("conflict's epoch %q, want the room's (%+v, %v)", m.Epoch, v, err)
			}
			m = r.reply(5)
			if m.T != wire.TErr || m.Code != wire.CodeConflict || m.Key != "zz" || m.ModRev != 0 || m.Rev != 2 {
				t.Errorf("txn conflict = %v, want key zz, mod_rev 0 (absent), rev 2", m.Raw)
			}

			r.send(&wire.Request{T: wire.TPing})
			if m := r.next(); m.T != wire.TPong {
				t.Fatalf("after errors: %v", m.Raw)
			}
		})
	}
}

// TestWSInvalidValue: a value with no JSON equivalent is refused with the
// request's own id, and the other requests of its frame are still served.
func TestWSInvalidValue(t *testing.T) {
	e := servertest.Start(t, servertest.Options{})
	frames := map[string]func(t *testing.T) []byte{
		"json": func(t *testing.T) []byte {
			return []byte(`{"t":"put","id":5,"room":"iv","key":"a","value":{"n":-1e999}}` + "\n" +
				`{"t":"put","id":6,"room":"iv","key":"b","value":{"n":1}}` + "\n" +
				`{"t":"txn","id":7,"room":"iv","ops":[{"type":"put","key":"c","value":"\ud800"}]}`)
		},
		"msgpack": func(t *testing.T) []byte {
			var b []byte
			for _, m := range []map[string]any{
				{"t": "put", "id": 5, "room": "iv", "key": "a", "value": map[string]any{"n": []byte{1, 2, 3}}}, // bin
				{"t": "put", "id": 6, "room": "iv", "key": "b", "value": map[string]any{"n": 1}},
				{"t": "txn", "id": 7, "room": "iv", "ops": []any{map[string]any{"op": "put", "key": "c", "value": map[int]int{1: 2}}}},
			} {
				p, err := msgpack.Marshal(m)
				if err != nil {
					t.Fatal(err)
				}
				b = append(b, p...)
			}
			return b
		},
	}
	frames["json2"] = frames["json"] // v2 requests are v1's
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			r, _ := connectRaw(t, e, codec)
			r.sendBytes(frames[codec](t))
			want := []string{"err:5:invalid_value", "ok:6:", "err:7:invalid_value"}
			for i, w := range want {
				m := r.next()
				if got := fmt.Sprintf("%s:%d:%s", m.T, m.ID, m.Code); got != w {
					t.Fatalf("reply %d = %v, want %s", i, m.Raw, w)
				}
			}
			it, _, err := e.HTTP.Get(servertest.Context(t), "iv", "b")
			if err != nil || string(it.Value) != `{"n":1}` {
				t.Fatalf("b = %+v, %v", it, err)
			}
			if _, _, err := e.HTTP.Get(servertest.Context(t), "iv", "a"); !errors.Is(err, client.ErrNotFound) {
				t.Fatalf("a was written: %v", err)
			}
			if _, err := e.HTTP.Delete(servertest.Context(t), "iv", "b", nil); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestWSInvalidUnicode: keys, prefixes and values that are not Unicode
// (msgpack: invalid UTF-8; JSON: escaped lone surrogates) are refused
// with the request's own id, never stored as U+FFFD; U+FFFD itself is a
// character like any other.
func TestWSInvalidUnicode(t *testing.T) {
	e := servertest.Start(t, servertest.Options{})
	frames := map[string]func(t *testing.T, room string) []byte{
		"json": func(t *testing.T, room string) []byte {
			return []byte(strings.ReplaceAll(`{"t":"put","id":1,"room":"ROOM","key":"\ud800","value":1}
{"t":"put","id":2,"room":"ROOM","key":"\udc00","value":2}
{"t":"put","id":3,"room":"ROOM","key":"v","value":{"a":"\ud800"}}
{"t":"sub","id":4,"room":"ROOM","prefixes":["\uDBFF"]}
{"t":"txn","id":5,"room":"ROOM","if":[{"key":"x","mod_rev":0}],"ops":[{"type":"put","key":"x\udfff","value":1}]}
{"t":"put","id":6,"room":"ROOM","key":"\ufffd","value":"\ufffd"}`, "ROOM", room))
		},
		"msgpack": func(t *testing.T, room string) []byte {
			return msgpackFrame(t,
				map[string]any{"t": "put", "id": 1, "room": room, "key": "\xff", "value": 1},
				map[string]any{"t": "put", "id": 2, "room": room, "key": "\xfe", "value": 2},
				map[string]any{"t": "put", "id": 3, "room": room, "key": "v", "value": map[string]any{"a": "\xed\xa0\x80"}},
				map[string]any{"t": "sub", "id": 4, "room": room, "prefixes": []string{"\xc0"}},
				map[string]any{"t": "txn", "id": 5, "room": room, "if": []any{map[string]any{"key": "x", "mod_rev": 0}},
					"ops": []any{map[string]any{"op": "put", "key": "x\xff", "value": 1}}},
				map[string]any{"t": "put", "id": 6, "room": room, "key": "\uFFFD", "value": "\uFFFD"})
		},
	}
	frames["json2"] = frames["json"]
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			room := "unicode-" + codec
			r, _ := connectRaw(t, e, codec)
			r.sendBytes(frames[codec](t, room))
			want := []string{"err:1:invalid_key", "err:2:invalid_key", "err:3:invalid_value", "err:4:invalid_key",
				"err:5:invalid_key", "ok:6:"}
			for i, w := range want {
				m := r.reply(uint64(i + 1))
				if got := fmt.Sprintf("%s:%d:%s", m.T, m.ID, m.Code); got != w {
					t.Fatalf("reply %d = %v, want %s", i, m.Raw, w)
				}
			}
			l, err := e.HTTP.List(servertest.Context(t), room, "")
			if err != nil {
				t.Fatal(err)
			}
			if len(l.Items) != 1 || l.Items[0].Key != "\uFFFD" || string(l.Items[0].Value) != "\"\uFFFD\"" || l.Rev != 1 {
				t.Fatalf("room holds %+v at rev %d, want only the U+FFFD key, written once", l.Items, l.Rev)
			}
		})
	}
}

// TestWSValuesAcrossCodecs: a value written through one codec reads back
// identically through the other, in snapshots, events and over HTTP.
func TestWSValuesAcrossCodecs(t *testing.T) {
	e := servertest.Start(t, servertest.Options{})
	values := []string{
		`{"nested":{"a":[1,2,{"b":null,"c":true}],"z":"last","a2":{}},"big":9223372036854775808,"max":18446744073709551615,` +
			`"min":-9223372036854775808,"f":1.5,"neg":-0.25,"pi":3.141592653589793,"tiny":5e-324,"float1":1.0,` +
			`"uni":"h\u00e9llo w\u00f6rld \u2713 \ud83d\ude00 \"q\" \\ \n\t","empty":"","arr":[]}`,
		`"just a string"`, `12345`, `-1`, `0`, `true`, `false`, `null`, `[1.5,"x",{"k":[]}]`, `{}`,
	}
	// What every reader gets: the canonical text (escapes only where
	// JSON requires them).
	canon := func(v string) string {
		c, err := wire.ValueFromJSON([]byte(v))
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		return string(c)
	}
	if got := canon(values[0]); !strings.Contains(got, `"uni":"héllo wörld ✓ 😀 \"q\" \\ \n\t"`) || !strings.Contains(got, `"float1":1.0`) {
		t.Fatalf("canonical form %s", got)
	}
	for _, from := range codecs {
		for _, to := range codecs {
			t.Run(from+"-to-"+to, func(t *testing.T) {
				ctx, room := servertest.Context(t), "values-"+from+"-"+to
				wc, rc := dialCodec(t, e, from), dialCodec(t, e, to)
				for i, v := range values {
					if _, err := wc.Put(ctx, room, fmt.Sprintf("snap/%02d", i), wire.Value(v)); err != nil {
						t.Fatalf("put %s through %s: %v", v, from, err)
					}
				}
				sub, err := rc.Subscribe(ctx, room, client.SubscribeOptions{Prev: true})
				if err != nil {
					t.Fatal(err)
				}
				snap := nextMsg(t, sub)
				if snap.T != wire.TSnapshot || len(snap.Items) != len(values) {
					t.Fatalf("snapshot %+v", snap)
				}
				for i, it := range snap.Items {
					if got, want := string(it.Value), canon(values[i]); got != want {
						t.Errorf("snapshot %s: %s → %s gives\n %s\nwant %s", it.Key, from, to, got, want)
					}
				}
				for i, v := range values {
					if _, err := wc.Put(ctx, room, fmt.Sprintf("snap/%02d", i), wire.Value(v)); err != nil {
						t.Fatal(err)
					}
					m := nextMsg(t, sub)
					if m.T != wire.TEvents || len(m.Events) != 1 {
						t.Fatalf("got %+v", m)
					}
					ev := m.Events[0]
					if got, want := string(ev.Value), canon(v); got != want {
						t.Errorf("event: %s → %s gives\n %s\nwant %s", from, to, got, want)
					}
					if ev.Prev == nil || string(ev.Prev.Value) != canon(v) {
						t.Errorf("prev: %s → %s gives %+v", from, to, ev.Prev)
					}
					it, _, err := e.HTTP.Get(ctx, room, ev.Key)
					if err != nil || string(it.Value) != canon(v) {
						t.Errorf("HTTP read of a %s write: %s, %v", from, it.Value, err)
					}
				}
			})
		}
	}
}

// TestWSResumeAfterDrop: a subscriber whose socket dropped resumes from
// its view's position on a new socket: the writes it missed are replayed
// once each, then synced, then live events, and its view equals the room.
func TestWSResumeAfterDrop(t *testing.T) {
	e := servertest.Start(t, servertest.Options{})
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			ctx, room := servertest.Context(t), "drop-"+codec
			w := dialCodec(t, e, "json")
			for i := range 5 {
				if _, err := w.Put(ctx, room, fmt.Sprint("k", i), i); err != nil {
					t.Fatal(err)
				}
			}
			c1 := dialCodec(t, e, codec)
			sub, err := c1.Subscribe(ctx, room, client.SubscribeOptions{Prev: true})
			if err != nil {
				t.Fatal(err)
			}
			v := client.NewView()
			applyUntil(t, sub, v, func(m wire.Message) bool { return m.T == wire.TSnapshot })
			if _, err := w.Put(ctx, room, "k0", "seen"); err != nil { // 6
				t.Fatal(err)
			}
			applyUntil(t, sub, v, func(m wire.Message) bool { return m.Rev == 6 })
			c1.CloseNow()

			// Missed while away: 7..16, puts, deletes and a transaction.
			for i := range 8 {
				if _, err := w.Put(ctx, room, fmt.Sprint("k", i%3), fmt.Sprint("away", i)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := w.Delete(ctx, room, "k4"); err != nil {
				t.Fatal(err)
			}
			if _, err := w.Txn(ctx, room, nil, []wire.TxnOp{{Type: "delete", Key: "k3"}, {Type: "put", Key: "n", Value: wire.Value(`1`)}}); err != nil {
				t.Fatal(err)
			}

			c2 := dialCodec(t, e, codec)
			from := v.Position()
			if from.Rev != 7 {
				t.Fatalf("resume position %+v, want rev 7", from)
			}
			sub, err = c2.Subscribe(ctx, room, client.SubscribeOptions{From: from})
			if err != nil {
				t.Fatal(err)
			}
			got := applyUntil(t, sub, v, func(m wire.Message) bool { return m.T == wire.TSynced })
			var want []string
			for rev := 7; rev <= 16; rev++ {
				want = append(want, fmt.Sprintf("events@%d", rev))
			}
			want = append(want, "synced@16")
			if describe(got) != strings.Join(want, " ") {
				t.Fatalf("resume delivered %s\nwant %s", describe(got), strings.Join(want, " "))
			}
			servertest.AssertViewIsRoom(t, e.HTTP, room, v)
			// Live after synced.
			if _, err := w.Put(ctx, room, "live", true); err != nil {
				t.Fatal(err)
			}
			applyUntil(t, sub, v, func(m wire.Message) bool { return m.T == wire.TEvents })
			servertest.AssertViewIsRoom(t, e.HTTP, room, v)
		})
	}
}

// TestWSResumeCompacted: a resume older than the retained history gets a
// snapshot with reason compacted, and the view equals the room.
func TestWSResumeCompacted(t *testing.T) {
	ret := store.RetentionPolicy{Default: store.Retention{MaxEvents: 4}}
	e := servertest.Start(t, servertest.Options{Memory: store.MemoryConfig{Retention: ret}, Rooms: rooms.Config{Retention: ret}})
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			ctx, room := servertest.Context(t), "compacted-"+codec
			w := dialCodec(t, e, "json")
			if _, err := w.Put(ctx, room, "a", 1); err != nil {
				t.Fatal(err)
			}
			c1 := dialCodec(t, e, codec)
			sub, err := c1.Subscribe(ctx, room, client.SubscribeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			v := client.NewView()
			applyUntil(t, sub, v, func(m wire.Message) bool { return m.T == wire.TSnapshot })
			c1.CloseNow()
			for i := range 20 {
				if _, err := w.Put(ctx, room, fmt.Sprint("k", i%6), i); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := w.Delete(ctx, room, "a"); err != nil {
				t.Fatal(err)
			}
			c2 := dialCodec(t, e, codec)
			sub, err = c2.Subscribe(ctx, room, client.SubscribeOptions{From: v.Position()})
			if err != nil {
				t.Fatal(err)
			}
			m := nextMsg(t, sub)
			if m.T != wire.TSnapshot || m.Reason != "compacted" || m.Rev != 22 {
				t.Fatalf("resume from rev 2 got %s@%d (%s), want snapshot@22 (compacted)", m.T, m.Rev, m.Reason)
			}
			if err := v.Apply(m); err != nil {
				t.Fatal(err)
			}
			if _, ok := v.Items["a"]; ok {
				t.Fatal("the snapshot did not replace the view: a is still there")
			}
			servertest.AssertViewIsRoom(t, e.HTTP, room, v)
		})
	}
}

// TestWSResumeNewEpoch: a memory store restarted has lost its state; a
// client resuming with the old epoch gets a snapshot with reason epoch of
// the new state, even where the new revision is higher than its own.
func TestWSResumeNewEpoch(t *testing.T) {
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			ctx, room := servertest.Context(t), "epoch"
			e1 := servertest.Start(t, servertest.Options{})
			c1 := dialCodec(t, e1, codec)
			for i := range 3 {
				if _, err := c1.Put(ctx, room, fmt.Sprint("old", i), i); err != nil {
					t.Fatal(err)
				}
			}
			sub, err := c1.Subscribe(ctx, room, client.SubscribeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			v := client.NewView()
			applyUntil(t, sub, v, func(m wire.Message) bool { return m.T == wire.TSnapshot })
			e1.Stop()
			if code := waitDone(t, c1, 10*time.Second); code != int(websocket.StatusServiceRestart) {
				t.Fatalf("shutdown closed the socket with %d (%v), want 1012", code, c1.Err())
			}

			e2 := servertest.Start(t, servertest.Options{})
			w := dialCodec(t, e2, "json")
			for i := range 5 { // revs 1-5: past the old view's revision
				if _, err := w.Put(ctx, room, fmt.Sprint("new", i), i); err != nil {
					t.Fatal(err)
				}
			}
			c2 := dialCodec(t, e2, codec)
			sub, err = c2.Subscribe(ctx, room, client.SubscribeOptions{From: v.Position()})
			if err != nil {
				t.Fatal(err)
			}
			m := nextMsg(t, sub)
			if m.T != wire.TSnapshot || m.Reason != "epoch" || m.Epoch == v.Epoch || m.Rev != 5 {
				t.Fatalf("resume across epochs got %+v, want snapshot@5 (epoch)", m)
			}
			if err := v.Apply(m); err != nil {
				t.Fatal(err)
			}
			servertest.AssertViewIsRoom(t, e2.HTTP, room, v)
			if _, err := w.Put(ctx, room, "after", 1); err != nil {
				t.Fatal(err)
			}
			applyUntil(t, sub, v, func(m wire.Message) bool { return m.T == wire.TEvents })
			servertest.AssertViewIsRoom(t, e2.HTTP, room, v)
		})
	}
}

// bigValue is a JSON string of about n bytes, distinct per i.
func bigValue(i, n int) wire.Value {
	return wire.Value(fmt.Sprintf(`"%06d%s"`, i, strings.Repeat("v", n)))
}

// TestWSSlowConsumerCoalesced: a socket that stops reading falls behind
// while a writer rewrites a few keys with large values; when it reads
// again it gets one coalesced message (latest value per key) and its view
// equals the room, while a fast subscriber saw every revision.
func TestWSSlowConsumerCoalesced(t *testing.T) {
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			e := servertest.Start(t, servertest.Options{Rooms: rooms.Config{QueueLimit: 4}, SendBuffer: 32 << 10})
			ctx, room := servertest.Context(t), "slow-"+codec
			w := dialCodec(t, e, codec)
			if _, err := w.Put(ctx, room, "gone", 0); err != nil {
				t.Fatal(err)
			}

			// The slow subscriber: small socket buffers (SendBuffer on the
			// server's side), so that the server's writes block once a few
			// hundred KB are in flight.
			slow, _, err := dialRawResp(t, e, codec, rawOpts{ReadBuffer: 128 << 10})
			if err != nil {
				t.Fatal(err)
			}
			slow.send(&wire.Request{T: wire.TConnect})
			slow.next()
			slow.send(&wire.Request{T: wire.TSub, ID: 1, Room: room})
			slow.reply(1)
			sv := client.NewView()
			if m := slow.next(); m.T != wire.TSnapshot || sv.Apply(m.Message) != nil {
				t.Fatalf("got %v", m.Raw)
			}

			fast := dialCodec(t, e, codec)
			fsub, err := fast.Subscribe(ctx, room, client.SubscribeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			fv := client.NewView()
			applyUntil(t, fsub, fv, func(m wire.Message) bool { return m.T == wire.TSnapshot })

			// Rewrite 4 keys with 20 KB values until the slow socket's
			// writer is stuck and its watcher has overflowed QueueLimit.
			// Each revision is one events message per watcher: once the
			// fast subscriber has all of them, the server's count of
			// delivered events tells how many the slow watcher still
			// holds, and it holds at most QueueLimit before it is parked.
			const size, queueLimit = 20 << 10, 4
			delivered := func() int { return int(e.Counter("statecast_messages_out_total", "kind", "events")) }
			base := delivered()
			var (
				head   uint64
				writes int
				got    []wire.Message
			)
			for {
				// One write at a time, each seen by the fast subscriber
				// before the next: its queue never holds more than one.
				if head, err = w.Put(ctx, room, fmt.Sprint("k", writes%4), bigValue(writes, size)); err != nil {
					t.Fatal(err)
				}
				writes++
				got = append(got, applyUntil(t, fsub, fv, func(m wire.Message) bool { return m.Rev == head })...)
				if slowHas := delivered() - base - writes; writes-slowHas > queueLimit {
					break
				}
				if writes > 1000 {
					t.Fatal("20 MB written and the slow socket never fell behind")
				}
			}
			if head, err = w.Delete(ctx, room, "gone"); err != nil {
				t.Fatal(err)
			}
			writes++
			got = append(got, applyUntil(t, fsub, fv, func(m wire.Message) bool { return m.Rev == head })...)

			// The fast subscriber saw every revision, one events each.
			if len(got) != writes {
				t.Fatalf("fast subscriber got %d messages for %d revisions: %.300s", len(got), writes, describe(got))
			}
			for _, m := range got {
				if m.T != wire.TEvents {
					t.Fatalf("fast subscriber got %s", describe(got))
				}
			}

			// The slow one catches up with a coalesced message.
			var kinds []string
			coalesced := 0
			for sv.Rev < head {
				m := slow.next()
				if err := sv.Apply(m.Message); err != nil {
					t.Fatalf("%v after %v", err, kinds)
				}
				kinds = append(kinds, fmt.Sprintf("%s@%d", m.T, m.Rev))
				if m.T == wire.TCoalesced {
					coalesced++
					if m.S != 1 || len(m.Events) == 0 || len(m.Events) > 5 {
						t.Fatalf("coalesced %v", m.Raw["t"])
					}
					if !slices.IsSortedFunc(m.Events, func(a, b wire.Event) int { return int(a.ModRev) - int(b.ModRev) }) {
						t.Fatalf("coalesced events not sorted by mod_rev")
					}
				}
				if m.T == wire.TSnapshot {
					t.Fatalf("slow subscriber got a snapshot (reason %s): coalescing should have sufficed (%v)", m.Reason, kinds)
				}
			}
			if coalesced == 0 {
				t.Fatalf("the slow subscriber never got a coalesced message: %v", kinds)
			}
			t.Logf("%d writes; slow subscriber: %d messages, %d coalesced", writes, len(kinds), coalesced)
			servertest.AssertViewIsRoom(t, e.HTTP, room, sv)
			servertest.AssertViewIsRoom(t, e.HTTP, room, fv)
		})
	}
}

// TestWSSlowConsumerWriteTimeout: a socket that takes nothing for longer
// than the write timeout is closed, and the client resumes where it was.
// The close frame (4000) can only go out once the socket takes the rest
// of the frame stuck in it: a client that reads again soon gets 4000, a
// dead one is dropped (PROTOCOL.md §8 promises 4000 in both cases).
func TestWSSlowConsumerWriteTimeout(t *testing.T) {
	t.Parallel() // waits on wall-clock time (timeouts, grace, expiry)
	// stuck returns a subscriber whose socket the server gave up on.
	stuck := func(t *testing.T, e *servertest.Node, room string) (*rawConn, *client.View) {
		ctx := servertest.Context(t)
		w := dialCodec(t, e, "json")
		if _, err := w.Put(ctx, room, "k0", 0); err != nil {
			t.Fatal(err)
		}
		slow, _, err := dialRawResp(t, e, "json", rawOpts{ReadBuffer: 128 << 10})
		if err != nil {
			t.Fatal(err)
		}
		slow.send(&wire.Request{T: wire.TConnect})
		slow.next()
		slow.send(&wire.Request{T: wire.TSub, ID: 1, Room: room})
		slow.reply(1)
		v := client.NewView()
		if m := slow.next(); v.Apply(m.Message) != nil {
			t.Fatalf("got %v", m.Raw)
		}
		for i := 0; e.Counter("statecast_slow_consumer_closes_total") == 0; i++ {
			if i == 2000 {
				t.Fatal("2000 writes of 20 KB and the stuck socket was not closed")
			}
			if _, err := w.Put(ctx, room, fmt.Sprint("k", i%3), bigValue(i, 20<<10)); err != nil {
				t.Fatal(err)
			}
		}
		return slow, v
	}
	resume := func(t *testing.T, e *servertest.Node, room string, v *client.View) {
		c := dialCodec(t, e, "json")
		sub, err := c.Subscribe(servertest.Context(t), room, client.SubscribeOptions{From: v.Position()})
		if err != nil {
			t.Fatal(err)
		}
		applyUntil(t, sub, v, func(m wire.Message) bool { return m.T == wire.TSynced || m.T == wire.TSnapshot })
		servertest.AssertViewIsRoom(t, e.HTTP, room, v)
	}
	cfg := servertest.Options{Server: server.Config{WriteTimeout: 300 * time.Millisecond, WriteRate: 1e6}, SendBuffer: 32 << 10}

	t.Run("reads again: 4000", func(t *testing.T) {
		e := servertest.Start(t, cfg)
		bystander := newBystander(t, e)
		slow, v := stuck(t, e, "stuck")
		code, msgs := slow.closeStatus(15 * time.Second)
		for _, m := range msgs {
			if err := v.Apply(m.Message); err != nil {
				t.Fatal(err)
			}
		}
		if code != wire.CloseSlowConsumer {
			t.Fatalf("stuck socket closed with %d after %d messages, want 4000", code, len(msgs))
		}
		bystander.check(t)
		resume(t, e, "stuck", v)
	})
	t.Run("never reads: dropped", func(t *testing.T) {
		e := servertest.Start(t, cfg)
		bystander := newBystander(t, e)
		_, v := stuck(t, e, "dead")
		// The writer and the bystander stay; the dead socket goes, within
		// the websocket library's 5 s close timeout.
		waitFor(t, 10*time.Second, "the dead socket to be dropped", func() bool {
			return e.Counter("statecast_connections") == 2
		})
		bystander.check(t)
		resume(t, e, "dead", v)
	})
}

// watchKeys subscribes c to room and returns a function that waits for
// the next events message and returns its events as "type:key".
func watchKeys(t *testing.T, c *client.Conn, room string) (*client.Subscription, func() []string) {
	t.Helper()
	sub, err := c.Subscribe(servertest.Context(t), room, client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m := nextMsg(t, sub); m.T != wire.TSnapshot {
		t.Fatalf("got %+v", m)
	}
	return sub, func() []string {
		t.Helper()
		for {
			m := nextMsg(t, sub)
			if m.T != wire.TEvents {
				continue
			}
			var out []string
			for _, ev := range m.Events {
				out = append(out, ev.Type+":"+ev.Key)
			}
			return out
		}
	}
}

// TestWSSessionLeaseEndsAfterGrace: a key written under the session lease
// is deleted, by a delete event, once its socket is gone for the grace.
func TestWSSessionLeaseEndsAfterGrace(t *testing.T) {
	const grace = 200 * time.Millisecond
	e := servertest.Start(t, servertest.Options{Server: server.Config{LeaseGrace: grace}})
	ctx, room := servertest.Context(t), "presence"
	watcher := dialCodec(t, e, "msgpack")
	_, nextEvents := watchKeys(t, watcher, room)

	c := dialCodec(t, e, "json")
	if _, err := c.Put(ctx, room, "presence/me", "here", client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Txn(ctx, room, nil, []wire.TxnOp{
		{Type: "put", Key: "presence/me2", Value: wire.Value(`1`), Lease: "session"},
		{Type: "put", Key: "plain", Value: wire.Value(`1`)}}); err != nil {
		t.Fatal(err)
	}
	nextEvents()
	nextEvents()
	l, err := e.HTTP.List(ctx, room, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range l.Items {
		if it.Lease != strings.HasPrefix(it.Key, "presence/") {
			t.Fatalf("item %s has lease %v", it.Key, it.Lease)
		}
	}

	gone := time.Now()
	c.CloseNow()
	var deleted []string
	for len(deleted) < 2 {
		deleted = append(deleted, nextEvents()...)
	}
	if since := time.Since(gone); since < grace {
		t.Fatalf("leased keys deleted %v after the socket closed, before the grace of %v", since, grace)
	}
	slices.Sort(deleted)
	if fmt.Sprint(deleted) != "[delete:presence/me delete:presence/me2]" {
		t.Fatalf("deleted %v", deleted)
	}
	if _, _, err := e.HTTP.Get(ctx, room, "plain"); err != nil {
		t.Fatalf("unleased key: %v", err)
	}
}

// TestWSSessionLeaseSurvivesResume: a client that reconnects within the
// grace with its session and resume secret keeps its leased keys.
func TestWSSessionLeaseSurvivesResume(t *testing.T) {
	const grace = 300 * time.Millisecond
	e := servertest.Start(t, servertest.Options{Server: server.Config{LeaseGrace: grace}})
	ctx, room := servertest.Context(t), "presence"
	c1 := dialCodec(t, e, "json")
	first := c1.Connected()
	if _, err := c1.Put(ctx, room, "presence/me", 1, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	c1.CloseNow()
	c2 := dial(t, e, &client.Options{Codec: "msgpack", Session: first.Session, Resume: first.Resume})
	second := c2.Connected()
	if !second.Resumed || second.Session != first.Session || second.Resume == first.Resume || second.Resume == "" {
		t.Fatalf("connected %+v, want session %s resumed with a new resume secret", second, first.Session)
	}
	time.Sleep(3 * grace) // on purpose: well past the grace
	if _, _, err := e.HTTP.Get(ctx, room, "presence/me"); err != nil {
		t.Fatalf("leased key after a resume within the grace: %v", err)
	}
	// The secret last presented stays good until the client presents the
	// newest (it may never have received it); then it is spent, and
	// presenting it starts a new session.
	c2.CloseNow()
	c2 = dial(t, e, &client.Options{Session: first.Session, Resume: first.Resume})
	if !c2.Connected().Resumed {
		t.Fatalf("the secret presented last, before the newest was used: %+v, want resumed", c2.Connected())
	}
	c2.CloseNow()
	c2 = dial(t, e, &client.Options{Session: first.Session, Resume: c2.Connected().Resume})
	if !c2.Connected().Resumed {
		t.Fatalf("the newest secret: %+v, want resumed", c2.Connected())
	}
	c3 := dial(t, e, &client.Options{Session: first.Session, Resume: first.Resume})
	if c3.Connected().Resumed || c3.Connected().Session == first.Session {
		t.Fatalf("a spent resume secret took the session over: %+v", c3.Connected())
	}
	// The lease still ends with the resumed session.
	c2.CloseNow()
	waitFor(t, 5*time.Second, "the leased key's delete", func() bool {
		_, _, err := e.HTTP.Get(ctx, room, "presence/me")
		return errors.Is(err, client.ErrNotFound)
	})
}

// TestWSSessionTakeover: connecting with the session of a live connection
// takes it over; the old socket is closed with 4503.
func TestWSSessionTakeover(t *testing.T) {
	const grace = 200 * time.Millisecond
	e := servertest.Start(t, servertest.Options{Server: server.Config{LeaseGrace: grace}})
	ctx := servertest.Context(t)
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			room := "takeover-" + codec
			old := dialCodec(t, e, codec)
			if _, err := old.Put(ctx, room, "presence/me", 1, client.WithLease("session")); err != nil {
				t.Fatal(err)
			}
			m := old.Connected()
			c := dial(t, e, &client.Options{Codec: codec, Session: m.Session, Resume: m.Resume})
			if !c.Connected().Resumed {
				t.Fatalf("takeover not resumed: %+v", c.Connected())
			}
			if code := waitDone(t, old, 10*time.Second); code != int(wire.CloseSessionReplaced) {
				t.Fatalf("old socket closed with %d (%v), want 4503", code, old.Err())
			}
			time.Sleep(3 * grace) // on purpose: past the grace
			if _, _, err := e.HTTP.Get(ctx, room, "presence/me"); err != nil {
				t.Fatalf("leased key after a takeover: %v", err)
			}
			if _, err := c.Put(ctx, room, "presence/me", 2, client.WithLease("session")); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestWSLeaseOfAnotherSession: "session" names the writer's own session
// lease; a client cannot bind a key to another session's lease by its id
// (PROTOCOL.md §6 allows "session" or a TTL lease id from HTTP), which
// would let it outlive its own session or be deleted with a stranger's.
func TestWSLeaseOfAnotherSession(t *testing.T) {
	e := servertest.Start(t, servertest.Options{Server: server.Config{LeaseGrace: 100 * time.Millisecond}})
	ctx := servertest.Context(t)
	victim := dialCodec(t, e, "json")
	other := dialCodec(t, e, "json")
	stolen := "session:" + victim.Connected().Session
	if _, err := other.Put(ctx, "r", "k", 1, client.WithLease(stolen)); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("a put with another session's lease id answered %v, want not_found", err)
	}
	_, err := other.Txn(ctx, "r", nil, []wire.TxnOp{
		{Type: "put", Key: "k2", Value: wire.Value(`1`), Lease: "session"},
		{Type: "put", Key: "k3", Value: wire.Value(`1`), Lease: stolen}})
	if !errors.Is(err, client.ErrNotFound) {
		t.Errorf("a txn with another session's lease id answered %v, want not_found", err)
	}
	if l, err := e.HTTP.List(ctx, "r", ""); err != nil || len(l.Items) != 0 {
		t.Fatalf("room after refused writes: %+v, %v", l, err)
	}
	// Its own session lease, by name, is fine.
	if _, err := other.Put(ctx, "r", "mine", 1, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
}

// TestWSTTLLease: keys bound to a TTL lease (granted over HTTP) are
// deleted when it is not kept alive.
func TestWSTTLLease(t *testing.T) {
	e := servertest.Start(t, servertest.Options{})
	ctx, room := servertest.Context(t), "lobby"
	watcher := dialCodec(t, e, "json")
	_, nextEvents := watchKeys(t, watcher, room)
	granted := time.Now()
	id, err := e.HTTP.GrantLease(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := dialCodec(t, e, "msgpack")
	if _, err := c.Put(ctx, room, "games/1", "ws", client.WithLease(id)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.HTTP.Put(ctx, room, "games/2", json.RawMessage(`"http"`), nil, id); err != nil {
		t.Fatal(err)
	}
	nextEvents()
	nextEvents()
	var deleted []string
	for len(deleted) < 2 {
		deleted = append(deleted, nextEvents()...)
	}
	if since := time.Since(granted); since < time.Second {
		t.Fatalf("TTL lease of 1s ended after %v", since)
	}
	slices.Sort(deleted)
	if fmt.Sprint(deleted) != "[delete:games/1 delete:games/2]" {
		t.Fatalf("deleted %v", deleted)
	}
	if err := e.HTTP.KeepAlive(ctx, id); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("KeepAlive of an ended lease: %v", err)
	}
	if _, err := c.Put(ctx, room, "games/3", 1, client.WithLease(id)); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("put with an ended lease: %v", err)
	}
}

// TestWSLeaseRecovery: leased keys in a file store outlive their server;
// the next server on the same file deletes them after the grace. Clients
// resume across the restart without a snapshot.
func TestWSLeaseRecovery(t *testing.T) {
	path := filepath.Join(t.TempDir(), "statecast.db")
	ctx, room := servertest.Context(t), "lobby"
	e1 := servertest.Start(t, servertest.Options{File: path, Server: server.Config{LeaseGrace: 10 * time.Second}})
	c := dialCodec(t, e1, "json")
	if _, err := c.Put(ctx, room, "presence/host", 1, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, room, "games/1", 1); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, room, client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v := client.NewView()
	applyUntil(t, sub, v, func(m wire.Message) bool { return m.T == wire.TSnapshot })
	e1.Stop()
	waitDone(t, c, 10*time.Second)

	const grace = 500 * time.Millisecond
	started := time.Now()
	e2 := servertest.Start(t, servertest.Options{File: path, Server: server.Config{LeaseGrace: grace}})
	c2 := dialCodec(t, e2, "msgpack")
	sub, err = c2.Subscribe(ctx, room, client.SubscribeOptions{From: v.Position()})
	if err != nil {
		t.Fatal(err)
	}
	if m := nextMsg(t, sub); m.T != wire.TSynced || m.Rev != 2 {
		t.Fatalf("resume across a file-store restart got %+v, want synced@2", m)
	}
	m := nextMsg(t, sub)
	if since := time.Since(started); since < grace {
		t.Fatalf("the recovered lease ended %v after start, before the grace %v", since, grace)
	}
	if m.T != wire.TEvents || len(m.Events) != 1 || m.Events[0].Type != "delete" || m.Events[0].Key != "presence/host" {
		t.Fatalf("got %+v, want the delete of presence/host", m)
	}
	if _, _, err := e2.HTTP.Get(ctx, room, "games/1"); err != nil {
		t.Fatal(err)
	}
}

// blockingStore holds writes to room "block" until release is closed.
type blockingStore struct {
	store.Store
	entered chan struct{} // gets one value per blocked write
	release chan struct{}
}

func (b *blockingStore) Apply(ctx context.Context, room string, w store.Write) (store.Result, error) {
	if room == "block" {
		b.entered <- struct{}{}
		<-b.release
	}
	return b.Store.Apply(ctx, room, w)
}

// TestWSGracefulShutdown: Shutdown with writes in flight. Every write is
// either answered ok and stored, or answered with an error and not
// stored, or not answered (outcome unknown); never ok without being
// stored. Writes after shutdown began get unavailable; sockets close
// with 1012 and new upgrades get 503.
func TestWSGracefulShutdown(t *testing.T) {
	bs := &blockingStore{Store: store.NewMemory(store.MemoryConfig{}), entered: make(chan struct{}, 1), release: make(chan struct{})}
	e := servertest.Start(t, servertest.Options{Store: bs, Server: server.Config{WriteRate: 1e6}})
	ctx, room := servertest.Context(t), "busy"

	watcher := dialCodec(t, e, "json")
	sub, err := watcher.Subscribe(ctx, room, client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// A write that holds its connection's request slot, so Shutdown has
	// to wait for its answer; a second write queued behind it.
	blocked, _ := connectRaw(t, e, "msgpack")
	blocked.send(&wire.Request{T: wire.TPut, ID: 1, Room: "block", Key: "k", Value: wire.Value(`1`)})
	<-bs.entered
	blocked.send(&wire.Request{T: wire.TPut, ID: 2, Room: room, Key: "after-block", Value: wire.Value(`1`)})
	type rawEnd struct {
		msgs []rawMsg
		code websocket.StatusCode
	}
	blockedEnd := make(chan rawEnd, 1)
	go func() { // keep reading, so the close handshake completes
		code, msgs := blocked.closeStatus(20 * time.Second)
		blockedEnd <- rawEnd{msgs, code}
	}()

	// Writers pipelining puts of distinct keys.
	type result struct {
		key string
		rev uint64
		err error
	}
	results := make(chan result, 100000)
	var wg sync.WaitGroup
	var writers []*client.Conn
	for g := range 3 {
		c := dialCodec(t, e, codecs[g%2])
		writers = append(writers, c)
		for p := range 4 {
			wg.Go(func() {
				for i := 0; ; i++ {
					key := fmt.Sprintf("w%d/%d/%d", g, p, i)
					rev, err := c.Put(ctx, room, key, i)
					results <- result{key, rev, err}
					if err != nil {
						return
					}
				}
			})
		}
	}
	waitFor(t, 10*time.Second, "some writes", func() bool { return len(results) > 50 })

	shutdownDone := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		shutdownDone <- e.Server.Shutdown(sctx)
	}()
	waitFor(t, 10*time.Second, "draining (/readyz 503)", func() bool {
		resp, err := http.Get(e.TS.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	if _, resp, err := dialRawResp(t, e, "json", rawOpts{}); err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("upgrade while shutting down: %v, %v; want HTTP 503", resp, err)
	}
	close(bs.release)
	if err := <-shutdownDone; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	wg.Wait()
	close(results)

	// The blocked write was taken before Shutdown: it is answered ok. The
	// one behind it came after Shutdown began: unavailable or no reply,
	// never ok.
	end := <-blockedEnd
	var first, after rawMsg
	for _, m := range end.msgs {
		switch m.ID {
		case 1:
			first = m
		case 2:
			after = m
		}
	}
	if first.T != wire.TOK {
		t.Fatalf("the write in flight at Shutdown got %v, want ok", first.Raw)
	}
	if after.T == wire.TOK || (after.T == wire.TErr && after.Code != wire.CodeUnavailable) {
		t.Fatalf("a write sent after Shutdown began got %v, want unavailable or no reply", after.Raw)
	}
	if end.code != websocket.StatusServiceRestart {
		t.Fatalf("socket with a write in flight closed with %d, want 1012", end.code)
	}

	snap, err := e.Store.Snapshot(ctx, room, "")
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]uint64{}
	for _, kv := range snap.Items {
		stored[kv.Key] = kv.ModRev
	}
	if _, ok := stored["after-block"]; ok {
		t.Fatalf("after-block is stored though it was answered %v", after.Raw)
	}
	var oks, unavailable, unknown int
	for r := range results {
		switch {
		case r.err == nil:
			oks++
			if stored[r.key] != r.rev {
				t.Errorf("write of %s answered ok at rev %d, but the store has it at %d (0: missing)", r.key, r.rev, stored[r.key])
			}
		case errors.Is(r.err, client.ErrUnavailable):
			unavailable++
			if _, ok := stored[r.key]; ok {
				t.Errorf("write of %s answered unavailable, but it is stored", r.key)
			}
		case errors.Is(r.err, client.ErrOutcomeUnknown), errors.Is(r.err, client.ErrClosed):
			unknown++
		default:
			t.Errorf("write of %s: unexpected error %v", r.key, r.err)
		}
	}
	t.Logf("%d ok, %d unavailable, %d without reply", oks, unavailable, unknown)
	for _, c := range append(writers, watcher) {
		if code := waitDone(t, c, 10*time.Second); code != int(websocket.StatusServiceRestart) {
			t.Errorf("socket closed with %d (%v), want 1012", code, c.Err())
		}
	}
	// What the watcher received is a prefix of the room's history.
	v := client.NewView()
	for {
		m, err := sub.Next(ctx)
		if err != nil {
			break
		}
		if err := v.Apply(m); err != nil {
			t.Fatal(err)
		}
	}
	for k, it := range v.Items {
		if stored[k] < it.ModRev {
			t.Errorf("the watcher saw %s at %d, the store has %d", k, it.ModRev, stored[k])
		}
	}
}

// TestWSShutdownHonorsContext: Shutdown returns when its context ends,
// even when peers do not answer the close handshake (a phone that went
// into a tunnel keeps its TCP connection open for minutes).
func TestWSShutdownHonorsContext(t *testing.T) {
	e := servertest.Start(t, servertest.Options{})
	connectRaw(t, e, "json") // and then never reads again
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := e.Server.Shutdown(ctx)
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("BUG: Shutdown with a 500 ms context took %v (%v): it ends connections one after another, "+
			"each waiting up to 5 s for the peer's close frame, and looks at its context only afterwards", took, err)
	}
}

// writeHot writes to room hot as fast as one client can until the
// returned stop is called.
func writeHot(t *testing.T, e *servertest.Node) (stop func()) {
	w := dialCodec(t, e, "json")
	ctx, cancel := context.WithCancel(servertest.Context(t))
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			_, _ = w.Put(ctx, "hot", "k", i)
		}
	})
	return func() { cancel(); wg.Wait() }
}

// TestWSSubscriptionOKFirst: a subscription's ok comes before any of its
// messages (PROTOCOL.md §5), even while the connection's writer is busy
// with another subscription's traffic.
func TestWSSubscriptionOKFirst(t *testing.T) {
	e := servertest.Start(t, servertest.Options{Server: server.Config{WriteRate: 1e6, MaxSubscriptions: 1 << 20}})
	defer writeHot(t, e)()
	for _, codec := range codecs {
		r, _ := connectRaw(t, e, codec)
		r.send(&wire.Request{T: wire.TSub, ID: 1, Room: "hot"})
		okd := map[uint64]bool{}
		id := uint64(1)
		for range 40 {
			var reqs []any
			for range 10 {
				id++
				reqs = append(reqs, &wire.Request{T: wire.TSub, ID: id, Room: fmt.Sprint("cold", id%8)})
			}
			r.send(reqs...) // ten subscriptions in one frame
			for !okd[id] {
				m := r.next()
				if m.S != 0 && !okd[m.S] {
					t.Fatalf("%s: subscription %d got %s before its ok", codec, m.S, m.T)
				}
				if m.T == wire.TOK {
					okd[m.ID] = true
				}
			}
		}
	}
}

// TestWSCloseCodesArrive: a close the server starts from outside the
// connection's reader (a takeover, a shutdown) reaches the client with
// its code, every time: the socket must not be dropped before the close
// frame is written.
func TestWSCloseCodesArrive(t *testing.T) {
	e := servertest.Start(t, servertest.Options{})
	for i := range 50 {
		old := dialCodec(t, e, codecs[i%2])
		m := old.Connected()
		dial(t, e, &client.Options{Session: m.Session, Resume: m.Resume})
		if code := waitDone(t, old, 10*time.Second); code != int(wire.CloseSessionReplaced) {
			t.Fatalf("takeover %d: old socket closed with %d (%v), want 4503", i, code, old.Err())
		}
	}
	for i := range 20 {
		e := servertest.Start(t, servertest.Options{})
		c := dialCodec(t, e, codecs[i%2])
		e.Stop()
		if code := waitDone(t, c, 10*time.Second); code != int(websocket.StatusServiceRestart) {
			t.Fatalf("shutdown %d: socket closed with %d (%v), want 1012", i, code, c.Err())
		}
	}
}

// TestWSOwnWriteByItsOK: a write's events to the writing connection's own
// subscription come no later than the frame of its ok (PROTOCOL.md §4),
// whether the reader sends the reply inline or the connection's writer is
// busy with another subscription's stream, for writes alone in their frame
// and several to a frame; on the memory store and on Redis, where a node
// hears of its writes from the pub/sub push.
func TestWSOwnWriteByItsOK(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		testOwnWriteByItsOK(t, servertest.Start(t, servertest.Options{Server: server.Config{WriteRate: 1e6}}))
	})
	t.Run("redis", func(t *testing.T) {
		rs := redistest.Start(t, redistest.Options{})
		st, err := redisstore.New(servertest.Context(t), redisstore.Config{URL: rs.URL(), Prefix: "own"})
		if err != nil {
			t.Fatal(err)
		}
		testOwnWriteByItsOK(t, servertest.Start(t, servertest.Options{Store: st, Server: server.Config{WriteRate: 1e6}}))
	})
}

func testOwnWriteByItsOK(t *testing.T, e *servertest.Node) {
	defer writeHot(t, e)() // keeps the writer of a subscriber of hot busy
	for _, codec := range codecs {
		r, _ := connectRaw(t, e, codec)
		own := "own-" + codec
		r.send(&wire.Request{T: wire.TSub, ID: 1, Room: own}, &wire.Request{T: wire.TSub, ID: 2, Room: "hot"})
		r.until(func(m rawMsg) bool { return m.T == wire.TOK && m.ID == 2 })
		r.q = nil                    // the rest of that frame: hot's messages
		seen := uint64(0)            // the newest revision of own delivered
		waiting := map[uint64]bool{} // puts not answered yet
		id := uint64(2)
		for round := range 100 {
			var reqs []any
			for range 1 + round%4 { // 1 to 4 puts in a frame
				id++
				waiting[id] = true
				reqs = append(reqs, &wire.Request{T: wire.TPut, ID: id, Room: own, Key: fmt.Sprint("k", id%5), Value: wire.Value(`1`)})
			}
			r.send(reqs...)
			for len(waiting) > 0 {
				// One frame: r.q is empty here, so next decodes exactly one.
				var oks []rawMsg
				for first := true; first || len(r.q) > 0; first = false {
					m := r.next()
					switch {
					case m.S == 1 && m.T == wire.TEvents:
						for _, ev := range m.Events {
							seen = max(seen, ev.ModRev)
						}
					case m.S == 1:
						t.Fatalf("%s: own subscription got %s (only its own writes go there: it never falls behind)", codec, m.T)
					case m.T == wire.TOK && waiting[m.ID]:
						oks = append(oks, m)
					case m.T == wire.TErr:
						t.Fatalf("%s: %+v", codec, m.Message)
					}
				}
				for _, ok := range oks {
					if ok.Rev > seen {
						t.Fatalf("%s: put %d committed at rev %d; by the end of its ok's frame the subscription had rev %d only", codec, ok.ID, ok.Rev, seen)
					}
					delete(waiting, ok.ID)
				}
			}
		}
	}
}

// TestWSPutKeepsLease: a put with "lease":"keep" (WebSocket put or txn
// op, HTTP put) rewrites a key and keeps it bound to its lease, so the
// key still ends with its session or TTL lease; on an unleased key it
// binds none.
func TestWSPutKeepsLease(t *testing.T) {
	const grace = 200 * time.Millisecond
	e := servertest.Start(t, servertest.Options{Server: server.Config{LeaseGrace: grace}})
	ctx, room := servertest.Context(t), "keep"
	owner := dialCodec(t, e, "json")
	if _, err := owner.Put(ctx, room, "presence/me", 0, client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	id, err := e.HTTP.GrantLease(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.HTTP.Put(ctx, room, "games/1", json.RawMessage(`0`), nil, id); err != nil {
		t.Fatal(err)
	}
	keep := client.WithLease(client.KeepLease)
	for i, codec := range codecs {
		c := dialCodec(t, e, codec)
		if _, err := c.Put(ctx, room, "presence/me", i+1, keep); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Txn(ctx, room, nil, []wire.TxnOp{
			{Type: "put", Key: "games/1", Value: wire.Value(strconv.Itoa(i + 1)), Lease: client.KeepLease},
			{Type: "put", Key: "plain", Value: wire.Value(`1`), Lease: client.KeepLease}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.HTTP.Put(ctx, room, "presence/me", json.RawMessage(`"http"`), nil, client.KeepLease); err != nil {
		t.Fatal(err)
	}
	l, err := e.HTTP.List(ctx, room, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range l.Items {
		if it.Lease != (it.Key != "plain") || it.Version == 1 && it.Key != "plain" {
			t.Fatalf("item %+v: a kept lease was lost or one was bound", it)
		}
	}
	if err := e.HTTP.Revoke(ctx, id); err != nil {
		t.Fatal(err)
	}
	owner.CloseNow()
	for _, key := range []string{"games/1", "presence/me"} {
		waitFor(t, 5*time.Second, key+"'s delete with its lease", func() bool {
			_, _, err := e.HTTP.Get(ctx, room, key)
			return errors.Is(err, client.ErrNotFound)
		})
	}
	if _, _, err := e.HTTP.Get(ctx, room, "plain"); err != nil {
		t.Fatalf("unleased key: %v", err)
	}
}

// TestWSSubExactKeys: a sub with "keys" gets those keys alone (never a
// key they only start), in its snapshot, live and in a replay on resume,
// over each codec; over SSE, key= does the same.
func TestWSSubExactKeys(t *testing.T) {
	e := servertest.Start(t, servertest.Options{})
	ctx := servertest.Context(t)
	writeAll := func(room string, n int) {
		t.Helper()
		for _, k := range []string{"games/70", "games/7", "games/7/x", "games/6"} {
			if _, err := e.HTTP.Put(ctx, room, k, json.RawMessage(strconv.Itoa(n)), nil, ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	keysOf := func(m wire.Message) []string {
		var keys []string
		for _, it := range m.Items {
			keys = append(keys, it.Key)
		}
		for _, ev := range m.Events {
			keys = append(keys, ev.Key)
		}
		return keys
	}
	for _, codec := range codecs {
		t.Run(codec, func(t *testing.T) {
			room := "exact-" + codec
			writeAll(room, 1)
			c := dialCodec(t, e, codec)
			sub, err := c.Subscribe(ctx, room, client.SubscribeOptions{Keys: []string{"games/7"}})
			if err != nil {
				t.Fatal(err)
			}
			m := nextMsg(t, sub)
			if m.T != wire.TSnapshot || fmt.Sprint(keysOf(m)) != "[games/7]" {
				t.Fatalf("snapshot %+v: keys %v, want [games/7]", m, keysOf(m))
			}
			writeAll(room, 2)
			m = nextMsg(t, sub)
			if m.T != wire.TEvents || fmt.Sprint(keysOf(m)) != "[games/7]" || m.Rev != 6 {
				t.Fatalf("events %+v: keys %v, want [games/7] at 6", m, keysOf(m))
			}
			writeAll(room, 3)
			resumed, err := c.Subscribe(ctx, room, client.SubscribeOptions{Keys: []string{"games/7"}, From: &wire.Position{Epoch: m.Epoch, Rev: 1}})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for {
				m := nextMsg(t, resumed)
				if m.T == wire.TSynced {
					break
				}
				got = append(got, keysOf(m)...)
			}
			if fmt.Sprint(got) != "[games/7 games/7 games/7]" {
				t.Fatalf("replay sent %v, want games/7's three revisions alone", got)
			}
		})
	}
	t.Run("sse", func(t *testing.T) {
		const room = "exact-sse"
		writeAll(room, 1)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var got []string
		err := e.HTTP.WatchWith(wctx, room, client.WatchOptions{Keys: []string{"games/7"}, From: 1}, func(ev client.SSEEvent) error {
			if ev.Event == "synced" {
				cancel()
				return nil
			}
			m, err := ev.Message()
			if err != nil {
				return err
			}
			got = append(got, keysOf(m)...)
			return nil
		})
		if err != nil && wctx.Err() == nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != "[games/7]" {
			t.Fatalf("SSE replay sent %v, want [games/7]", got)
		}
	})
	t.Run("refused", func(t *testing.T) {
		c := dialCodec(t, e, "json")
		var ce *client.Error
		if _, err := c.Subscribe(ctx, "r", client.SubscribeOptions{Keys: []string{""}}); !errors.As(err, &ce) || ce.Code != wire.CodeInvalidKey {
			t.Fatalf("an empty exact key: %v, want invalid_key", err)
		}
	})
}
