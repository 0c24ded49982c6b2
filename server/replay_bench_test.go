package server

import (
	"context"
	"fmt"
	"testing"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// BenchmarkReplayCollect measures the server side of a resume: a socket
// subscribing from the oldest of 10,000 retained revisions gets them all
// collected into frames. Each iteration replays revisions nobody has
// received yet (as after a disconnect); the engine runs PrepareChange at
// commit as statecast serve configures it, so their JSON is ready.
func BenchmarkReplayCollect(b *testing.B) {
	ctx := context.Background()
	ret := store.RetentionPolicy{Default: store.Retention{MaxEvents: 20_000}}
	value := []byte(fmt.Sprintf(`"%0100d"`, 7))
	m, _ := newMetrics(nopRegisterer{}, nil)
	srv := &Server{metrics: m}
	b.ReportAllocs()
	for range b.N {
		b.StopTimer()
		st := store.NewMemory(store.MemoryConfig{Retention: ret})
		e := rooms.New(st, rooms.Config{Retention: ret, ProgressInterval: -1, Prepare: PrepareChange})
		if _, err := e.List(ctx, "r", "", rooms.ReadOptions{}); err != nil { // loaded, as while its clients were connected
			b.Fatal(err)
		}
		for i := range 10_000 {
			if _, err := e.Apply(ctx, "r", store.Put(fmt.Sprintf("k%d", i%10), value)); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		c := &conn{s: srv, codec: wire.JSON, wake: make(chan struct{}, 1), subs: map[uint64]*sub{}, stopped: true} // the benchmark is the writer
		s := &sub{id: 1, room: "r"}
		s.active.Store(true)
		w, err := e.Watch(ctx, "r", rooms.WatchOptions{From: &rooms.Position{Rev: 1}, Notify: func() { c.markReady(s) }})
		if err != nil {
			b.Fatal(err)
		}
		s.w = w
		c.subs[1] = s
		bytes := 0
		count := func(f []byte, _ ...[]byte) error { bytes += len(f); return nil }
		for bytes < 10_000*150 {
			var f []byte
			f, _, _ = c.collect(nil, count)
			bytes += len(f)
			c.markReady(s)
		}
		b.StopTimer()
		w.Close()
		e.Close()
		st.Close()
		b.StartTimer()
	}
}
