package server

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/store"
)

// BenchmarkRoomMemory measures what a node holds per loaded room: R rooms
// of K keys of V-byte values, each written H times (so H events of
// history, their JSON encodings cached at commit as statecast serve does)
// and watched by one subscriber. The store's own copy is measured apart
// and left out: on Redis the node holds only the engine's part, which is
// the B/room reported (docs/SCALING.md sizes node memory with it). With
// -short (make test's smoke run) it loads a tenth of the rooms.
func BenchmarkRoomMemory(b *testing.B) {
	for _, c := range []struct{ rooms, keys, value, history int }{
		{1000, 10, 100, 10}, // little history: the fixed part and the keys
		{1000, 10, 100, 100},
		{200, 1000, 100, 1000}, // a key per event: keys and history both grow
	} {
		if testing.Short() {
			c.rooms /= 10
		}
		name := fmt.Sprintf("keys=%d/value=%d/history=%d", c.keys, c.value, c.history)
		b.Run(name, func(b *testing.B) {
			var perRoom, storePerRoom float64
			for i := 0; i < b.N; i++ {
				e, s := roomMemory(b, c.rooms, c.keys, c.value, c.history)
				perRoom += e
				storePerRoom += s
			}
			b.ReportMetric(perRoom/float64(b.N), "B/room")
			b.ReportMetric(storePerRoom/float64(b.N), "store-B/room")
		})
	}
}

// roomMemory loads the rooms and returns the heap bytes per room of the
// engine (view, history ring, cached encodings, one watcher) and of the
// memory store alone.
func roomMemory(b *testing.B, nRooms, keys, valueBytes, history int) (engine, st float64) {
	ctx := context.Background()
	ret := store.RetentionPolicy{Default: store.Retention{MaxEvents: history}}
	value := []byte(`"` + fmt.Sprintf("%0*d", valueBytes-2, 7) + `"`)
	fill := func(apply func(room string, op store.Write) error) {
		for r := 0; r < nRooms; r++ {
			room := "room-" + strconv.Itoa(r)
			for h := 0; h < history; h++ {
				if err := apply(room, store.Put("k"+strconv.Itoa(h%keys), value)); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	heap := func() int64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}

	// The store alone.
	h0 := heap()
	alone := store.NewMemory(store.MemoryConfig{Retention: ret})
	fill(func(room string, op store.Write) error { _, err := alone.Apply(ctx, room, op); return err })
	st = float64(heap()-h0) / float64(nRooms)
	runtime.KeepAlive(alone)
	_ = alone.Close()

	// The store and the engine, each room watched before it is written,
	// as a node's rooms are while clients watch them.
	h0 = heap()
	ms := store.NewMemory(store.MemoryConfig{Retention: ret})
	e := rooms.New(ms, rooms.Config{Retention: ret, Prepare: PrepareChange, IdleTimeout: time.Hour, ProgressInterval: -1})
	defer ms.Close()
	defer e.Close()
	ws := make([]*rooms.Watcher, 0, nRooms)
	var drained []rooms.Message
	for r := 0; r < nRooms; r++ {
		w, err := e.Watch(ctx, "room-"+strconv.Itoa(r), rooms.WatchOptions{})
		if err != nil {
			b.Fatal(err)
		}
		ws = append(ws, w)
	}
	fill(func(room string, op store.Write) error { _, err := e.Apply(ctx, room, op); return err })
	for _, w := range ws { // a subscriber that keeps up holds no queue
		for n := 0; ; n++ {
			var err error
			if drained, err = w.Drain(drained[:0]); err != nil {
				b.Fatal(err)
			}
			if len(drained) == 0 {
				if n == 0 {
					b.Fatal("watcher got nothing")
				}
				break
			}
		}
	}
	both := float64(heap()-h0) / float64(nRooms)
	runtime.KeepAlive(ws)
	return both - st, st
}
