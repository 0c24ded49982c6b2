package server_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// BenchmarkResumeSocket measures a resume end to end over a real loopback
// socket: dial, connect, subscribe from 100, 1,000 or 10,000 revisions
// back, and read until synced. It is the server's share of `statecast
// bench resume`, without the load tool's own work or a writer competing
// for the CPU.
func BenchmarkResumeSocket(b *testing.B) {
	for _, n := range []int{100, 1_000, 10_000} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) { benchResumeSocket(b, n) })
	}
}

func benchResumeSocket(b *testing.B, missed int) {
	ctx := context.Background()
	ret := store.RetentionPolicy{Default: store.Retention{MaxEvents: 20_000}}
	e := servertest.Start(b, servertest.Options{Memory: store.MemoryConfig{Retention: ret},
		Rooms: rooms.Config{Retention: ret, Prepare: server.PrepareChange}})
	value := []byte(fmt.Sprintf(`"%0100d"`, 7))
	for i := range 10_000 {
		if _, err := e.Engine.Apply(ctx, "r", store.Put(fmt.Sprintf("k%d", i%10), value)); err != nil {
			b.Fatal(err)
		}
	}
	snap, err := e.Engine.List(ctx, "r", "", rooms.ReadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	from := snap.Rev - uint64(missed) + 1
	synced := []byte(`"t":"synced"`)
	var buf bytes.Buffer
	b.ResetTimer()
	for range b.N {
		r, _ := connectRaw(b, e, "json")
		r.send(&wire.Request{T: wire.TSub, ID: 1, Room: "r", From: &wire.Position{Epoch: snap.Epoch, Rev: from}})
		bytesIn := 0
		for done := false; !done; {
			_, rd, err := r.ws.Reader(ctx)
			if err == nil {
				buf.Reset()
				_, err = buf.ReadFrom(rd)
			}
			if err != nil {
				b.Fatal(err)
			}
			bytesIn += buf.Len()
			// synced is the last message of its frame: look at the tail only.
			tail := buf.Bytes()[max(0, buf.Len()-64):]
			done = bytes.Contains(tail, synced)
		}
		b.SetBytes(int64(bytesIn))
		_ = r.ws.CloseNow()
	}
}
