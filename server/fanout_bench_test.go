package server

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// BenchmarkCollect measures the encode-once + batching path of a socket
// that is behind: each op, `batch` revisions are committed to a room with
// `subs` subscribed connections, then every connection's writer collects
// its queued messages into one frame (what writeLoop sends in one write).
// The events of a revision are encoded once per codec for all sockets,
// so ns/msg falls as subs grows and encodes/op stays at batch.
func BenchmarkCollect(b *testing.B) {
	for _, codec := range []wire.Codec{wire.JSON, wire.Msgpack, wire.JSON2} {
		for _, subs := range []int{1, 100} {
			for _, batch := range []int{1, 16} {
				name := fmt.Sprintf("%s/subs=%d/batch=%d", codec.Subprotocol()[len("statecast."):], subs, batch)
				b.Run(name, func(b *testing.B) { benchCollect(b, codec, subs, batch) })
			}
		}
	}
}

func benchCollect(b *testing.B, codec wire.Codec, nsubs, batch int) {
	ctx := context.Background()
	st := store.NewMemory(store.MemoryConfig{Retention: store.RetentionPolicy{Default: store.Retention{MaxEvents: 256}}})
	e := rooms.New(st, rooms.Config{Retention: store.RetentionPolicy{Default: store.Retention{MaxEvents: 256}}, ProgressInterval: -1})
	defer st.Close()
	defer e.Close()
	m, err := newMetrics(nopRegisterer{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	srv := &Server{metrics: m}
	conns := make([]*conn, nsubs)
	for i := range conns {
		c := &conn{s: srv, codec: codec, slot: codecSlot(codec), wake: make(chan struct{}, 1), subs: map[uint64]*sub{}, stopped: true} // the benchmark is the writer
		s := &sub{id: 1, room: "bench"}
		s.active.Store(true)
		w, err := e.Watch(ctx, "bench", rooms.WatchOptions{From: &rooms.Position{Rev: 1}, Notify: func() { c.markReady(s) }})
		if err != nil {
			b.Fatal(err)
		}
		defer w.Close()
		s.w = w
		c.subs[1] = s
		c.collect(nil, discard) // the synced marker
		conns[i] = c
	}
	value := []byte(`"` + string(make([]byte, 0, 100)) + fmt.Sprintf("%0100d", 7) + `"`)
	frames := make([][]byte, nsubs)
	b.ReportAllocs()
	b.ResetTimer()
	msgs, bytes := 0, 0
	for i := 0; i < b.N; i++ {
		for j := 0; j < batch; j++ {
			if _, err := e.Apply(ctx, "bench", store.Put(fmt.Sprintf("k%d", j%10), value)); err != nil {
				b.Fatal(err)
			}
		}
		for k, c := range conns {
			frames[k], _, _ = c.collect(frames[k][:0], discard)
			bytes += len(frames[k])
		}
		msgs += batch * nsubs
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(msgs), "ns/msg")
	// The WebSocket payload of one event (a 100-byte value, key "kN"):
	// the wire cost per delivery that docs/SCALING.md counts.
	b.ReportMetric(float64(bytes)/float64(msgs), "B/msg")
}

func discard([]byte, ...[]byte) error { return nil }

// nopRegisterer accepts every collector and keeps none.
type nopRegisterer struct{}

func (nopRegisterer) Register(prometheus.Collector) error  { return nil }
func (nopRegisterer) MustRegister(...prometheus.Collector) {}
func (nopRegisterer) Unregister(prometheus.Collector) bool { return true }
