package server

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// fillRoom writes keys keys of valueBytes-byte values and returns about
// how many bytes the room's items take encoded.
func fillRoom(t testing.TB, e *apiEnv, room string, keys, valueBytes int) int {
	t.Helper()
	value := []byte(`"` + strings.Repeat("v", valueBytes-2) + `"`)
	for i := 0; i < keys; i += 100 {
		var ops []store.Op
		for j := i; j < min(i+100, keys); j++ {
			ops = append(ops, store.Op{Type: store.OpPut, Key: fmt.Sprintf("k/%06d", j), Value: value})
		}
		if _, err := e.eng.Apply(context.Background(), room, store.Write{Ops: ops}); err != nil {
			t.Fatal(err)
		}
	}
	return keys * (valueBytes + 60)
}

// subscriber is a raw WebSocket client that subscribed to a room.
type subscriber struct {
	ws    *websocket.Conn
	codec wire.Codec
}

// subscribe dials in codec, connects and subscribes to room.
func subscribe(t testing.TB, ctx context.Context, e *apiEnv, codec wire.Codec, room string) *subscriber {
	t.Helper()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(e.hs.URL, "http")+"/v1/ws",
		&websocket.DialOptions{Subprotocols: []string{codec.Subprotocol()}})
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(-1)
	t.Cleanup(func() { ws.CloseNow() })
	s := &subscriber{ws: ws, codec: codec}
	s.send(t, ctx, &wire.Request{T: "connect"})
	return s
}

func (s *subscriber) send(t testing.TB, ctx context.Context, r *wire.Request) {
	b, err := s.codec.Append(nil, r)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ws.Write(ctx, s.codec.MessageType(), b); err != nil {
		t.Error(err)
	}
}

// discardUntil reads WebSocket messages without keeping them until one
// of at least n bytes came.
func (s *subscriber) discardUntil(ctx context.Context, n int64) error {
	for {
		_, r, err := s.ws.Reader(ctx)
		if err != nil {
			return err
		}
		got, err := io.Copy(io.Discard, r)
		if err != nil || got >= n {
			return err
		}
	}
}

// snapshot reads messages until the snapshot of subscription 1.
func (s *subscriber) snapshot(ctx context.Context) (wire.Message, error) {
	for {
		_, b, err := s.ws.Read(ctx)
		if err != nil {
			return wire.Message{}, err
		}
		msgs, err := s.codec.DecodeMessages(b)
		if err != nil {
			return wire.Message{}, err
		}
		for _, m := range msgs {
			if m.T == wire.TSnapshot {
				return m, nil
			}
		}
	}
}

// TestSnapshotStreamedAndShared: subscribers of one room at one revision,
// in every codec, each get the whole room in one snapshot message (one
// far larger than a frame, so streamed from the shared pieces), and
// their codec's encoding is made once for all of them.
func TestSnapshotStreamedAndShared(t *testing.T) {
	// The shared snapshot lives while a sender holds it, and until the
	// next collection: none may come between subscribers for the count.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	e := newAPIEnv(t, apiOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const keys = 3000
	fillRoom(t, e, "big", keys, 200)
	before := snapshotEncodings.Load()
	const perCodec = 4
	var subs []*subscriber
	for _, c := range []wire.Codec{wire.JSON, wire.JSON2, wire.Msgpack} {
		for range perCodec {
			subs = append(subs, subscribe(t, ctx, e, c, "big"))
		}
	}
	var wg sync.WaitGroup
	for _, s := range subs {
		s.send(t, ctx, &wire.Request{T: "sub", ID: 1, Room: "big"})
		wg.Go(func() {
			m, err := s.snapshot(ctx)
			if err != nil {
				t.Errorf("%s: %v", s.codec.Subprotocol(), err)
				return
			}
			if len(m.Items) != keys || m.Items[keys-1].Key != fmt.Sprintf("k/%06d", keys-1) || len(m.Items[0].Value) != 200 {
				t.Errorf("%s: snapshot of %d items, want the room's %d", s.codec.Subprotocol(), len(m.Items), keys)
			}
		})
	}
	wg.Wait()
	if n := snapshotEncodings.Load() - before; n != 3 {
		t.Fatalf("%d subscribers in 3 codecs: %d snapshot encodings, want 3", len(subs), n)
	}
}

// TestSnapshotBytesPerSubscriber: what the server allocates to send a
// large room's snapshot to each of many subscribers is a small part of
// the room (a frame and bookkeeping), not a copy of it: one shared list
// and encoding, streamed to each socket from the shared pieces. Each
// subscriber used to cost its own item list, wire items and encoding
// (about four times the room).
func TestSnapshotBytesPerSubscriber(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	room := fillRoom(t, e, "big", 8000, 500) // about 4 MiB
	perSub := snapshotBytesPerSubscriber(t, e, "big", room, 10)
	t.Logf("room %d KiB: %d KiB allocated per subscriber", room>>10, perSub>>10)
	if perSub > int64(room/10) {
		t.Fatalf("%d bytes allocated per subscriber of a %d-byte room, want under a tenth of it", perSub, room)
	}
}

// BenchmarkSnapshotSubscribers: n subscribers take a snapshot of one
// room of about 4 MiB at once; B/subscriber is what the server (and the
// discarding clients) allocate per subscriber beyond one room's worth.
func BenchmarkSnapshotSubscribers(b *testing.B) {
	for _, n := range []int{1, 20} {
		b.Run(fmt.Sprintf("subscribers=%d", n), func(b *testing.B) {
			e := newAPIEnv(b, apiOpts{})
			room := fillRoom(b, e, "big", 8000, 500)
			var sum int64
			for i := 0; i < b.N; i++ {
				sum += snapshotBytesPerSubscriber(b, e, "big", room, n)
				if _, err := e.eng.Apply(context.Background(), "big", store.Put("k/000000", []byte(`"x"`))); err != nil {
					b.Fatal(err) // the next round's snapshot is at a new revision
				}
			}
			b.ReportMetric(float64(sum)/float64(b.N), "B/subscriber")
		})
	}
}

// snapshotBytesPerSubscriber has n subscribers take a snapshot of room
// (about roomBytes encoded) at once and returns the bytes allocated
// meanwhile per subscriber, beyond one encoding of the room.
func snapshotBytesPerSubscriber(t testing.TB, e *apiEnv, room string, roomBytes, n int) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.eng.List(ctx, room, "", rooms.ReadOptions{}); err != nil { // loads it: not the subject
		t.Fatal(err)
	}
	subs := make([]*subscriber, n)
	for i := range subs {
		subs[i] = subscribe(t, ctx, e, wire.JSON, room)
	}
	time.Sleep(50 * time.Millisecond) // let the connects be answered: not the subject
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	alloc0 := ms.TotalAlloc
	var wg sync.WaitGroup
	for _, s := range subs {
		s.send(t, ctx, &wire.Request{T: "sub", ID: 1, Room: room})
		wg.Go(func() {
			if err := s.discardUntil(ctx, int64(roomBytes/2)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	runtime.ReadMemStats(&ms)
	for _, s := range subs {
		s.ws.CloseNow()
	}
	return (int64(ms.TotalAlloc-alloc0) - int64(roomBytes)) / int64(n)
}

// TestSSELargeReset: a reset larger than a stream's buffer, written from
// the shared encoding in pieces, is one whole event with every key.
func TestSSELargeReset(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	const keys = 3000
	fillRoom(t, e, "big", keys, 300) // about 1 MiB: four stream buffers
	w := e.watch(t, "/v1/rooms/big/watch")
	d := w.next(t).want(t, "reset", keys/100)
	if d.Reason != "initial" || len(d.Items) != keys || d.Items[keys-1].Key != fmt.Sprintf("k/%06d", keys-1) {
		t.Fatalf("reset of %d items (reason %q), want the room's %d", len(d.Items), d.Reason, keys)
	}
	e.put(t, "big", "k/x", `1`)
	w.next(t).want(t, "put", keys/100+1)
}
