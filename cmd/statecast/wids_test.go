package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server/wire"
)

// TestMultiNodeWidAfterKill: a client pipelines 100 writes with wids to
// node A, which is SIGKILLed once it has answered the first; the client
// never learns the outcome of the others and resends every write, with its
// wid, to node B. Each is applied exactly once (by A before it died, or by
// B), and every resend is answered with the revision the room's history
// holds for its wid: dup for the ones A had applied.
func TestMultiNodeWidAfterKill(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 2, mnOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const room, n = "mn:wid", 100
	since := uint64(0)
	put := func(i int) wire.Request {
		return wire.Request{T: wire.TPut, Room: room, Key: fmt.Sprint("k", i%7), Value: wire.Value(fmt.Sprint(i)),
			Wid: fmt.Sprint("mn-", i), Since: &since}
	}

	answered := make(chan struct{}, n)
	a, err := client.Dial(ctx, c.nodes[0].WS(), &client.Options{OnMessage: func(m wire.Message) {
		if m.T == wire.TOK {
			answered <- struct{}{}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.CloseNow)
	var frame []byte
	for i := range n {
		req := put(i)
		req.ID = uint64(i + 1)
		if frame, err = a.Codec().Append(frame, &req); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.WriteFrame(ctx, frame); err != nil {
		t.Fatal(err)
	}
	select {
	case <-answered:
	case <-ctx.Done():
		t.Fatal("node A answered none of the writes")
	}
	c.nodes[0].kill()

	b, err := client.Dial(ctx, c.nodes[1].WS(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.CloseNow)
	revs := map[string]uint64{}
	dups := 0
	for i := range n {
		req := put(i)
		m, err := b.Request(ctx, req)
		if err != nil {
			t.Fatalf("resend of %s to node B: %v", req.Wid, err)
		}
		if m.Dup {
			dups++
		}
		revs[req.Wid] = m.Rev
	}

	bs, err := c.st.History(ctx, room, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != n {
		t.Errorf("%d revisions in the room for %d writes, each sent twice", len(bs), n)
	}
	seen := map[string]bool{}
	for _, bt := range bs {
		wid := bt.Events[0].Wid
		if len(wid) > 18 && wid[0] == '~' && wid[17] == '~' {
			wid = wid[18:] // the store keeps it behind its writer's scope: ~<16 characters>~<id>
		}
		if seen[wid] || revs[wid] != bt.Rev {
			t.Errorf("revision %d carries wid %q (seen before: %v), whose resend was answered with revision %d", bt.Rev, wid, seen[wid], revs[wid])
		}
		seen[wid] = true
	}
	if dups == 0 {
		t.Error("no resend was a dup, yet node A had answered a write")
	}
	t.Logf("node A applied %d of %d writes before SIGKILL (their resends were dups); node B applied %d", dups, n, n-dups)
}
