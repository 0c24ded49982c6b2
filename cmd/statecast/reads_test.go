package main

// Read consistency on Redis (issue 19): a node serves reads from its own
// view, which follows Redis by pub/sub; a read must still reflect every
// write acknowledged before it began.

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
)

// TestReadYourWritesRedis: PUT then GET of the same key through one node,
// 300 times: every GET, linearizable (the default) and serializable
// (this node's view: it holds the node's own acknowledged writes), reads
// the value just written.
func TestReadYourWritesRedis(t *testing.T) {
	c := startCluster(t, 1, mnOptions{})
	h := &client.HTTP{URL: c.nodes[0].HTTP()}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stale := 0
	for i := range 300 {
		want := fmt.Sprintf("%d", i)
		rev, err := h.Put(ctx, "ryw", "k", json.RawMessage(want), nil, "")
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		for _, o := range []client.ReadOptions{{}, {Serializable: true}} {
			it, at, err := h.GetWith(ctx, "ryw", "k", o)
			if err != nil {
				t.Fatalf("get %d (%+v): %v", i, o, err)
			}
			if string(it.Value) != want || at < rev {
				stale++
				if stale <= 5 {
					t.Errorf("get %d (%+v) after the put at rev %d: read %s at rev %d", i, o, rev, it.Value, at)
				}
			}
		}
	}
	if stale > 0 {
		t.Errorf("%d of 600 reads missed the write acknowledged just before", stale)
	}
}
