package main

import (
	"context"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/store/redistest"
)

// TestAOFTailLossLinearizable: Redis comes back from an AOF that lost its
// last writes, as after an OS crash under appendfsync everysec (up to a
// second of acknowledged writes), twice, while 6 clients run the
// linearizability check's operations on 3 nodes. The writes cut off had
// been acknowledged and delivered; the nodes must start the room's new
// epoch before they answer anything of it, so the history, checked with
// lzEpochModel, has no stale read and no revision reused within an
// epoch (a few seconds). A node that had not delivered the writes cut
// off cannot tell them lost: the new Redis process starts each room's new
// epoch at its first use (store/redisstore/restart.go), which under
// appendfsync always (TestMultiNodeRedisRestartAOF) it does not.
func TestAOFTailLossLinearizable(t *testing.T) {
	c := startCluster(t, 3, mnOptions{AOF: true, Fsync: "everysec"})
	urls := c.httpURLs()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := &client.HTTP{URL: urls[0]}
	if _, err := h.Put(ctx, "lz", "start", []byte(`1`), nil, ""); err != nil {
		t.Fatal(err)
	}
	before, err := h.List(ctx, "lz", "")
	if err != nil {
		t.Fatal(err)
	}
	var cut int64
	lzCheck(t, urls, "", 6, 0, func(ctx context.Context) { cut = cutAOFTail(ctx, t, c.redis, 2) }, lzEpochModel(false))
	after, err := h.List(ctx, "lz", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d bytes of AOF cut off; epoch %s at %d before, %s at %d after", cut, before.Epoch, before.Rev, after.Epoch, after.Rev)
	if cut == 0 || after.Epoch == before.Epoch {
		t.Errorf("the AOF's tail was cut (%d bytes) and the room kept its epoch %s: want writes lost and a new epoch", cut, before.Epoch)
	}
}

// cutAOFTail kills srv times times, each after writes went on for a
// while past a point, and restarts it from its AOF cut back to that
// point; it returns the bytes cut. It runs beside the test's goroutine:
// Errorf, never Fatal.
func cutAOFTail(ctx context.Context, t *testing.T, srv *redistest.Server, times int) (cut int64) {
	for range times {
		if !lzPause(ctx, 300, 600) {
			return cut
		}
		size, err := srv.AOFSize()
		if err != nil {
			t.Error(err)
			return cut
		}
		if !lzPause(ctx, 150, 300) { // acknowledged now, lost below
			return cut
		}
		srv.Kill()
		n, err := srv.CutAOF(size)
		if err != nil {
			t.Error(err)
			return cut
		}
		cut += n
		if err := srv.StartAgain(); err != nil {
			t.Error(err)
			return cut
		}
	}
	lzPause(ctx, 500, 1000) // operations after the last restart, too
	return cut
}
