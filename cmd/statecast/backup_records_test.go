package main

// Sessions and TTL leases carried by migrate and restore, over real
// processes (docs/BACKUP.md).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redisstore"
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
	const keptTTL, lapsedTTL = 8 * time.Second, 12 * time.Second // kept: more than the move takes on a loaded machine
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

	t0 := time.Now()
	src.stop() // a deploy: the sessions' and leases' records stay in the file
	t.Logf("stop took %v", time.Since(t0))
	rs := redistest.Start(t, redistest.Options{})
	out := runStatecast(t, false, "migrate", "--from", "file:"+dir, "--to", rs.URL())
	t.Log(strings.TrimSpace(out))
	if !strings.Contains(out, "migrate: 2 sessions (0 past their grace") || !strings.Contains(out, "2 TTL leases (0 past their deadline") {
		t.Errorf("migrate's report: %s", out)
	}

	started := time.Now()
	dst := redisNode(t, "dst", rs.URL(), "--lease-grace", grace.String(), "--node-timeout", "2s")
	at.Store(dst)
	t.Logf("the destination started %v after the stop", time.Since(t0))
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

// TestMigrateFileToRedisCluster: 1,000 rooms with their history move from
// the file store to a 3-master Redis Cluster, every room at its head and
// epoch; clients that watched rooms on the file node resume on either of
// two nodes serving the cluster by replay of exactly what they missed,
// and a session resumes there with its key.
func TestMigrateFileToRedisCluster(t *testing.T) {
	redistest.Require(t)
	dir := t.TempDir()
	src := fileNode(t, "src", dir)
	const rooms, revs, watched, missed = 1000, 3, 10, 2
	fillRooms(t, src, rooms, revs)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Clients watch some rooms, then drop off; writes they miss follow.
	room := func(i int) string { return fmt.Sprintf("room-%04d", i*(rooms/watched)+7) }
	var seen []*wire.Message
	for i := range watched {
		c, err := client.Dial(ctx, src.WS(), nil)
		if err != nil {
			t.Fatal(err)
		}
		sub, err := c.Subscribe(ctx, room(i), client.SubscribeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		snap, err := sub.Next(ctx)
		if err != nil || snap.T != wire.TSnapshot || snap.Rev != revs {
			t.Fatalf("first message on %s: %+v, %v", room(i), snap, err)
		}
		seen = append(seen, &snap)
		_ = c.Close()
	}
	h := &client.HTTP{URL: src.HTTP()}
	for i := range watched {
		for j := range missed {
			if _, err := h.Put(ctx, room(i), "missed", json.RawMessage(fmt.Sprint(j)), nil, ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	annSession := seatAnn(ctx, t, src)
	src.stop()

	cl := redistest.StartCluster(t, 3)
	url := "redis://" + strings.Join(cl.Addrs(), ",")
	out := runStatecast(t, false, "migrate", "--from", "file:"+dir, "--to", url, "--to-redis-cluster")
	t.Log(strings.TrimSpace(out))
	if !strings.Contains(out, fmt.Sprintf("migrate: %d rooms (0 already there)", rooms+1)) ||
		!strings.Contains(out, fmt.Sprintf("migrate: %d sessions", watched+1)) { // the watchers' too: a graceful shutdown keeps every session
		t.Errorf("migrate's report: %s", out)
	}

	// Every room is at the destination at its head and epoch.
	fst, err := store.OpenFile(store.FileConfig{Path: filepath.Join(dir, "statecast.db")})
	if err != nil {
		t.Fatal(err)
	}
	want, err := heads(ctx, fst)
	_ = fst.Close()
	if err != nil {
		t.Fatal(err)
	}
	rst, err := redisstore.New(ctx, redisstore.Config{URL: url, Cluster: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rst.Close()
	got, err := heads(ctx, rst)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != rooms+1 || !reflect.DeepEqual(got, want) {
		t.Errorf("rooms on the cluster: %d, on the file store: %d (or their heads or epochs differ)", len(got), len(want))
	}

	nodes := []*mnNode{
		redisNode(t, "d0", url, "--redis-cluster"),
		redisNode(t, "d1", url, "--redis-cluster"),
	}
	for i, snap := range seen {
		n := nodes[i%len(nodes)]
		c, err := client.Dial(ctx, n.WS(), nil)
		if err != nil {
			t.Fatal(err)
		}
		sub, err := c.Subscribe(ctx, room(i), client.SubscribeOptions{From: &wire.Position{Epoch: snap.Epoch, Rev: snap.Rev + 1}})
		if err != nil {
			t.Fatal(err)
		}
		for next := snap.Rev + 1; next <= revs+missed; {
			m, err := sub.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case m.T == wire.TEvents && m.Rev == next:
				next++
			case m.T == wire.TSynced:
			default:
				t.Fatalf("resume of %s on %s: %s at %d (reason %q), want a replay of revision %d", room(i), n.name, m.T, m.Rev, m.Reason, next)
			}
		}
		_ = c.Close()
	}
	back, err := client.Dial(ctx, nodes[1].WS(), &client.Options{Session: annSession.Session, Resume: annSession.Resume})
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	if c := back.Connected(); !c.Resumed || !has(t, nodes[0], "lobby", "seat/ann") {
		t.Errorf("ann's session on the cluster: %+v (seat kept: %v)", c, has(t, nodes[0], "lobby", "seat/ann"))
	}
}

// TestRestoreOfAnOldBackup: a backup holds the sessions and TTL leases of
// the server (its file is 0600). Restored later than a grace after the
// backup, into the file store or Redis, its sessions end at the first
// start (their keys go at once, not a grace later, and the client gets a
// new session); its TTL leases keep their deadlines: one still ahead is
// kept alive through the restored node, one past ends at the start.
func TestRestoreOfAnOldBackup(t *testing.T) {
	redistest.Require(t)
	const grace = 2 * time.Second
	src := fileNode(t, "src", t.TempDir(), "--lease-grace", grace.String())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	annSession := seatAnn(ctx, t, src)
	h := &client.HTTP{URL: src.HTTP()}
	leases := map[string]string{}
	for key, ttl := range map[string]time.Duration{"lock/kept": time.Minute, "lock/lapsed": grace} {
		id, err := h.GrantLease(ctx, ttl)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.Put(ctx, "locks", key, json.RawMessage(`1`), nil, id); err != nil {
			t.Fatal(err)
		}
		leases[key] = id
	}
	file := filepath.Join(t.TempDir(), "backup.jsonl")
	out := runStatecast(t, false, "backup", "--url", src.HTTP(), file)
	if !strings.Contains(out, "1 sessions, 2 TTL leases") {
		t.Errorf("backup's report: %s", out)
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the backup file: %v, %v; want mode 0600", fi.Mode(), err)
	}
	time.Sleep(grace + 500*time.Millisecond) // the backup's sessions are past their grace

	for _, dst := range []string{"file", "redis"} {
		t.Run(dst, func(t *testing.T) {
			var n *mnNode
			const dstGrace = "30s" // a session ended a grace after the start would still be there
			if dst == "file" {
				dir := t.TempDir()
				t.Log(strings.TrimSpace(runStatecast(t, false, "restore", "--store", "file:"+dir, file)))
				n = fileNode(t, "restored", dir, "--lease-grace", dstGrace)
			} else {
				rs := redistest.Start(t, redistest.Options{})
				t.Log(strings.TrimSpace(runStatecast(t, false, "restore", "--store", rs.URL(), file)))
				n = redisNode(t, "restored", rs.URL(), "--lease-grace", dstGrace, "--node-timeout", "2s")
			}
			waitUntil(t, 10*time.Second, "seat/ann and lock/lapsed deleted at the start", func() bool {
				return !has(t, n, "lobby", "seat/ann") && !has(t, n, "locks", "lock/lapsed")
			})
			c, err := client.Dial(ctx, n.WS(), &client.Options{Session: annSession.Session, Resume: annSession.Resume})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if c.Connected().Resumed {
				t.Error("a session of the backup, past its grace, was resumed")
			}
			hn := &client.HTTP{URL: n.HTTP()}
			if err := hn.KeepAlive(ctx, leases["lock/kept"]); err != nil || !has(t, n, "locks", "lock/kept") {
				t.Errorf("the lease whose deadline is ahead: keep-alive %v, key kept %v", err, has(t, n, "locks", "lock/kept"))
			}
		})
	}
}

// seatAnn connects ann to n and binds lobby/seat/ann to her session; it
// returns her connected message (the socket closes when the test ends).
func seatAnn(ctx context.Context, t *testing.T, n *mnNode) wire.Message {
	t.Helper()
	ann, err := client.Dial(ctx, n.WS(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ann.Close() })
	if _, err := ann.Put(ctx, "lobby", "seat/ann", json.RawMessage(`1`), client.WithLease("session")); err != nil {
		t.Fatal(err)
	}
	return ann.Connected()
}
