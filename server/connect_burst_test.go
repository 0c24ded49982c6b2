package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// slowLoads is a store whose room snapshots wait until release is closed.
type slowLoads struct {
	store.Store
	release chan struct{}
}

func (s *slowLoads) Snapshot(ctx context.Context, room, prefix string) (store.Snapshot, error) {
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	return s.Store.Snapshot(ctx, room, prefix)
}

// TestSubWhoseRoomLoadTimesOut: a sub whose room does not load within the
// store timeout is answered unavailable (retry), as an SSE watch is; it
// was internal ("a bug"), which the scale run's subs got by the hundred
// while room loads waited for the Redis pool.
func TestSubWhoseRoomLoadTimesOut(t *testing.T) {
	slow := &slowLoads{Store: store.NewMemory(store.MemoryConfig{}), release: make(chan struct{})}
	n := servertest.Start(t, servertest.Options{Store: slow, Server: server.Config{StoreTimeout: 200 * time.Millisecond}})
	defer close(slow.release)
	r, _ := connectRaw(t, n, "json")
	r.send(&wire.Request{T: wire.TSub, ID: 1, Room: "lobby"})
	if m := r.reply(1); m.T != wire.TErr || m.Code != wire.CodeUnavailable {
		t.Fatalf("sub of a room whose load outlasts the store timeout: %+v, want unavailable", m)
	}
}
