package main

// Read consistency on Redis (issue 19): a node serves reads from its own
// view, which follows Redis by pub/sub; a read must still reflect every
// write acknowledged before it began.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/store/redistest"
)

// TestReadYourWritesRedis: PUT then GET of the same key through one node,
// 300 times: every GET, linearizable (the default) and serializable
// (this node's view: it holds the node's own acknowledged writes), reads
// the value just written.
func TestReadYourWritesRedis(t *testing.T) {
	t.Parallel()
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

// TestReadFigures measures read latency, linearizable against
// serializable, on one node and across nodes (reads on node 1 while node
// 0 writes to the room 200 times a second), and Redis commands per read
// (INFO commandstats around the reads). It only logs; it runs when
// READ_FIGURES=1:
//
//	READ_FIGURES=1 CI=true go test -count=1 -v -run TestReadFigures ./cmd/statecast
func TestReadFigures(t *testing.T) {
	if os.Getenv("READ_FIGURES") != "1" {
		t.Skip("figures only: READ_FIGURES=1")
	}
	c := startCluster(t, 2, mnOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	h0, h1 := &client.HTTP{URL: c.nodes[0].HTTP()}, &client.HTTP{URL: c.nodes[1].HTTP()}
	if _, err := h0.Put(ctx, "fig", "k", json.RawMessage(`0`), nil, ""); err != nil {
		t.Fatal(err)
	}
	const n = 3000
	measure := func(name string, h *client.HTTP, o client.ReadOptions) {
		if _, _, err := h.GetWith(ctx, "fig", "k", o); err != nil { // the room is loaded
			t.Fatal(err)
		}
		before := c.commandCalls()
		ds := make([]time.Duration, 0, n)
		for range n {
			t0 := time.Now()
			if _, _, err := h.GetWith(ctx, "fig", "k", o); err != nil {
				t.Fatal(err)
			}
			ds = append(ds, time.Since(t0))
		}
		after := c.commandCalls()
		var calls []string
		total := 0
		for cmd, v := range after {
			if d := v - before[cmd]; d > 0 && cmd != "info" {
				calls = append(calls, fmt.Sprintf("%s=%d", cmd, d))
				total += d
			}
		}
		sort.Strings(calls)
		t.Logf("%-40s p50 %8v  p99 %8v  redis commands/read %.3f (%s)", name, percentile(ds, 0.5), percentile(ds, 0.99), float64(total)/n, strings.Join(calls, " "))
	}
	measure("one node, linearizable", h0, client.ReadOptions{})
	measure("one node, serializable", h0, client.ReadOptions{Serializable: true})

	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { // node 0 writes another key of the room, 200/s
		defer close(done)
		tk := time.NewTicker(5 * time.Millisecond)
		defer tk.Stop()
		for i := 0; ; i++ {
			select {
			case <-wctx.Done():
				return
			case <-tk.C:
				_, _ = h0.Put(wctx, "fig", "w", json.RawMessage(strconv.Itoa(i)), nil, "")
			}
		}
	}()
	measure("across nodes (writer on the other), lin.", h1, client.ReadOptions{})
	measure("across nodes (writer on the other), ser.", h1, client.ReadOptions{Serializable: true})
	stop()
	<-done
}

// TestReadAfterFlushRedis: Redis loses the room (FLUSHALL) while a node
// holds its view; the next linearizable read must neither hang nor serve
// the lost state: the key is gone. Then a write in the new epoch is read.
func TestReadAfterFlushRedis(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 1, mnOptions{})
	h := &client.HTTP{URL: c.nodes[0].HTTP()}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 3 {
		if _, err := h.Put(ctx, "flush", "k", json.RawMessage(strconv.Itoa(i)), nil, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := h.Put(ctx, "flush", "other", json.RawMessage(`1`), nil, ""); err != nil {
			t.Fatal(err)
		}
		if _, _, err := h.Get(ctx, "flush", "k"); err != nil {
			t.Fatal(err)
		}
		if _, err := redistest.Do(c.redis.Addr(), "FLUSHALL"); err != nil {
			t.Fatal(err)
		}
		if it, rev, err := h.Get(ctx, "flush", "k"); !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("round %d: get after FLUSHALL: %s at rev %d, %v; want not_found", i, it.Value, rev, err)
		}
	}
}
