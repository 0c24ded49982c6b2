package main

// Sessions and TTL leases carried by migrate and restore, over real
// processes (docs/BACKUP.md).

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/store/redistest"
)

// has says whether room holds key on n (a linearizable list).
func has(t *testing.T, n *mnNode, room, key string) bool {
	t.Helper()
	for _, it := range list(t, n, room).Items {
		if it.Key == key {
			return true
		}
	}
	return false
}

// keepAlive renews lease id through *at every 500 ms until stop; it
// counts the renewals that failed.
func keepAlive(at *atomic.Pointer[mnNode], id string, failed *atomic.Int64, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(500 * time.Millisecond):
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := (&client.HTTP{URL: at.Load().HTTP()}).KeepAlive(ctx, id)
		cancel()
		if errors.Is(err, client.ErrNotFound) {
			failed.Add(1)
		}
	}
}

// TestMigrateCarriesSessionsAndLeases: a file store's sessions and TTL
// leases move to Redis with the rooms. On a Redis node afterwards the
// client that presents its session and resume secret resumes it and
// keeps its session-bound key; the session nobody resumes ends a grace
// after the node started, and its key goes then; the TTL lease kept
// alive through the Redis node keeps its key past its first deadline;
// the one nobody keeps alive ends at its deadline, which the migration
// neither moved nor cut.
func TestMigrateCarriesSessionsAndLeases(t *testing.T) {
	redistest.Require(t)
	const grace = 3 * time.Second
	dir := t.TempDir()
	src := fileNode(t, "src", dir, "--lease-grace", grace.String())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	dial := func(n *mnNode, opts *client.Options) *client.Conn {
		t.Helper()
		c, err := client.Dial(ctx, n.WS(), opts)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ann, bob := dial(src, nil), dial(src, nil)
	defer ann.Close()
	defer bob.Close()
	for _, w := range []struct {
		c   *client.Conn
		key string
	}{{ann, "seat/ann"}, {bob, "seat/bob"}} {
		if _, err := w.c.Put(ctx, "lobby", w.key, json.RawMessage(`1`), client.WithLease("session")); err != nil {
			t.Fatal(err)
		}
	}
	annSession := ann.Connected()

	h := &client.HTTP{URL: src.HTTP()}
	const keptTTL, lapsedTTL = 6 * time.Second, 15 * time.Second
	kept, err := h.GrantLease(ctx, keptTTL)
	if err != nil {
		t.Fatal(err)
	}
	lapsedAt := time.Now()
	lapsed, err := h.GrantLease(ctx, lapsedTTL)
	if err != nil {
		t.Fatal(err)
	}
	lapsedDue := lapsedAt.Add(lapsedTTL) // at or before the server's deadline
	for key, id := range map[string]string{"lock/kept": kept, "lock/lapsed": lapsed} {
		if _, err := h.Put(ctx, "locks", key, json.RawMessage(`1`), nil, id); err != nil {
			t.Fatal(err)
		}
	}
	var at atomic.Pointer[mnNode]
	at.Store(src)
	var failed atomic.Int64
	stopKeeping := make(chan struct{})
	defer close(stopKeeping)
	go keepAlive(&at, kept, &failed, stopKeeping)

	src.stop() // a deploy: the sessions' and leases' records stay in the file
	rs := redistest.Start(t, redistest.Options{})
	out := runStatecast(t, false, "migrate", "--from", "file:"+dir, "--to", rs.URL())
	t.Log(strings.TrimSpace(out))
	if !strings.Contains(out, "migrate: 2 sessions (0 past their grace") || !strings.Contains(out, "2 TTL leases (0 past their deadline") {
		t.Errorf("migrate's report: %s", out)
	}

	started := time.Now()
	dst := redisNode(t, "dst", rs.URL(), "--lease-grace", grace.String(), "--node-timeout", "2s")
	at.Store(dst)
	for _, key := range []string{"seat/ann", "seat/bob"} {
		if !has(t, dst, "lobby", key) {
			t.Fatalf("%s is gone at once on the destination", key)
		}
	}
	back := dial(dst, &client.Options{Session: annSession.Session, Resume: annSession.Resume})
	defer back.Close()
	if c := back.Connected(); !c.Resumed || c.Session != annSession.Session {
		t.Fatalf("ann's connect on the destination: %+v, want her session %s resumed", c, annSession.Session)
	}

	// Bob's session ends a grace after the node started, not before.
	waitUntil(t, 20*time.Second, "bob's seat deleted after the grace", func() bool { return !has(t, dst, "lobby", "seat/bob") })
	if gone := time.Since(started); gone < grace {
		t.Errorf("bob's seat was deleted %v after the destination started, before the grace (%v)", gone, grace)
	}

	// The lapsed lease ends at its deadline of the source.
	if time.Now().Before(lapsedDue.Add(-time.Second)) && !has(t, dst, "locks", "lock/lapsed") {
		t.Errorf("lock/lapsed is gone %v before its lease's deadline", time.Until(lapsedDue))
	}
	waitUntil(t, time.Until(lapsedDue)+10*time.Second, "lock/lapsed deleted at its deadline", func() bool { return !has(t, dst, "locks", "lock/lapsed") })
	if early := time.Until(lapsedDue); early > 0 {
		t.Errorf("lock/lapsed was deleted %v before its lease's deadline", early)
	}
	// By now the kept lease is past the deadline it had at the migration:
	// kept alive through the destination, it still holds its key.
	if !has(t, dst, "locks", "lock/kept") || !has(t, dst, "lobby", "seat/ann") {
		t.Errorf("lock/kept or seat/ann deleted: %+v %+v", list(t, dst, "locks"), list(t, dst, "lobby"))
	}
	if n := failed.Load(); n > 0 {
		t.Errorf("%d keep-alives of the kept lease were refused", n)
	}
}
