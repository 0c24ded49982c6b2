package main

// Backups, restores and migrations over real processes: `statecast serve`
// nodes on the file store and on redis-servers started by store/redistest,
// and the backup, restore and migrate commands run as the binary.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store/redistest"
)

// fileNode starts `statecast serve` on the file store in dir.
func fileNode(t *testing.T, name, dir string, extra ...string) *mnNode {
	t.Helper()
	n := &mnNode{name: name, redisURL: "file", extra: append([]string{"--data", dir}, extra...)}
	n.start(t)
	t.Cleanup(func() {
		n.kill()
		if t.Failed() {
			t.Logf("node %s output (tail):\n%s", n.name, tail(n.output(), 3000))
		}
	})
	return n
}

// redisNode starts `statecast serve` on the Redis at url.
func redisNode(t *testing.T, name, url string, extra ...string) *mnNode {
	t.Helper()
	n := &mnNode{name: name, redisURL: url, extra: extra}
	n.start(t)
	t.Cleanup(func() {
		n.kill()
		if t.Failed() {
			t.Logf("node %s output (tail):\n%s", n.name, tail(n.output(), 3000))
		}
	})
	return n
}

// runStatecast runs the binary with args and returns its stderr; it fails the
// test when the command fails, unless wantFail.
func runStatecast(t *testing.T, wantFail bool, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, statecastBin(t), args...)
	out, err := cmd.CombinedOutput()
	if (err != nil) != wantFail {
		t.Fatalf("statecast %s: %v (want failure: %v)\n%s", strings.Join(args, " "), err, wantFail, out)
	}
	return string(out)
}

// list reads room through node (linearizable).
func list(t *testing.T, n *mnNode, room string) *client.List {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := (&client.HTTP{URL: n.HTTP()}).List(ctx, room, "")
	if err != nil {
		t.Fatalf("list %s on %s: %v", room, n.name, err)
	}
	return l
}

// TestBackupWhileWriting: a backup taken while a writer runs holds every
// write acknowledged before the backup began, and the room at one
// revision; restored into a file store and into Redis, lists equal the
// writes up to that revision, under a new epoch.
func TestBackupWhileWriting(t *testing.T) {
	redistest.Require(t)
	src := fileNode(t, "src", t.TempDir())
	h := &client.HTTP{URL: src.HTTP()}
	ctx := context.Background()
	for i := range 20 { // rooms beside the written one
		if _, err := h.Put(ctx, fmt.Sprintf("still-%d", i), "k", json.RawMessage(`1`), nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu    sync.Mutex
		acked = map[string]uint64{} // key → revision its put committed at (its value is its number)
		stop  = make(chan struct{})
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		for i := 0; i < 20000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			key := fmt.Sprintf("k%05d", i)
			rev, err := h.Put(ctx, "w", key, json.RawMessage(fmt.Sprint(i)), nil, "")
			if err != nil {
				t.Errorf("put %s: %v", key, err)
				return
			}
			mu.Lock()
			acked[key] = rev
			mu.Unlock()
		}
	}()
	waitUntil(t, 10*time.Second, "writes before the backup", func() bool { mu.Lock(); defer mu.Unlock(); return len(acked) >= 100 })
	mu.Lock()
	before := len(acked)
	mu.Unlock()
	file := filepath.Join(t.TempDir(), "b.jsonl")
	out := runStatecast(t, false, "backup", "--url", src.HTTP(), file)
	waitUntil(t, 10*time.Second, "writes after the backup", func() bool { mu.Lock(); defer mu.Unlock(); return len(acked) >= before+50 })
	close(stop)
	<-done
	t.Logf("backup: %s", strings.TrimSpace(out))

	// The backup's head of w: every write acknowledged before is in it.
	var head uint64
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, `{"room":"w",`) {
			var r struct{ Head uint64 }
			_ = json.Unmarshal([]byte(line), &r)
			head = r.Head
		}
	}
	if head < uint64(before) {
		t.Fatalf("the backup holds w at revision %d, but %d writes were acknowledged before it began", head, before)
	}
	mu.Lock()
	want := map[string]string{}
	for key, rev := range acked {
		if rev <= head {
			var i int
			_, _ = fmt.Sscanf(key, "k%d", &i)
			want[key] = fmt.Sprint(i)
		}
	}
	mu.Unlock()
	if len(want) != int(head) {
		t.Fatalf("the backup's revision %d of w is not the count of acknowledged writes up to it (%d)", head, len(want))
	}
	srcEpoch := list(t, src, "w").Epoch

	check := func(name string, n *mnNode) {
		t.Helper()
		l := list(t, n, "w")
		if l.Rev != head || l.Epoch == srcEpoch {
			t.Errorf("%s: w at %s/%d, want revision %d under a new epoch (the source's is %s)", name, l.Epoch, l.Rev, head, srcEpoch)
		}
		got := map[string]string{}
		for _, it := range l.Items {
			got[it.Key] = string(it.Value)
		}
		if len(got) != len(want) {
			t.Errorf("%s: %d keys, want %d", name, len(got), len(want))
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: key %s = %q, want %q", name, k, got[k], v)
				break
			}
		}
		if l := list(t, n, "still-7"); l.Rev != 1 || len(l.Items) != 1 {
			t.Errorf("%s: still-7 at %d with %d keys, want 1 and 1", name, l.Rev, len(l.Items))
		}
	}

	dir := t.TempDir()
	t.Log(strings.TrimSpace(runStatecast(t, false, "restore", "--store", "file:"+dir, file)))
	runStatecast(t, true, "restore", "--store", "file:"+dir, file) // not empty any more
	check("file", fileNode(t, "restored-file", dir))

	rs := redistest.Start(t, redistest.Options{})
	t.Log(strings.TrimSpace(runStatecast(t, false, "restore", "--store", rs.URL(), file)))
	check("redis", redisNode(t, "restored-redis", rs.URL()))

	// A corrupt backup is refused before anything is written.
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(bad, []byte(strings.Replace(string(b), `"k":"k00001"`, `"k":"k00001x"`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	if out := runStatecast(t, true, "restore", "--store", "file:"+empty, bad); !strings.Contains(out, "checksum") {
		t.Errorf("restore of a changed backup: %s", out)
	}
}

// fillRooms writes revs revisions to each of rooms rooms through n.
func fillRooms(t *testing.T, n *mnNode, rooms, revs int) {
	t.Helper()
	h := &client.HTTP{URL: n.HTTP()}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := w; r < rooms; r += 8 {
				for i := range revs {
					if _, err := h.Put(context.Background(), fmt.Sprintf("room-%04d", r), fmt.Sprintf("k%d", i%3), json.RawMessage(fmt.Sprint(i)), nil, ""); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestMigrateFileToRedis: every room (1,000) with its history moves from the file
// store to Redis under its epoch; a client that watched a room on the file
// node resumes on a Redis node by replay of exactly what it missed.
func TestMigrateFileToRedis(t *testing.T) {
	redistest.Require(t)
	dir := t.TempDir()
	src := fileNode(t, "src", dir)
	const rooms, revs = 1000, 2
	fillRooms(t, src, rooms, revs)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, src.WS(), nil)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, "room-0005", client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := sub.Next(ctx)
	if err != nil || snap.T != wire.TSnapshot || snap.Rev != revs {
		t.Fatalf("first message %+v, %v: want a snapshot at %d", snap, err, revs)
	}
	_ = c.Close()
	h := &client.HTTP{URL: src.HTTP()}
	for i := range 3 { // missed by the client, replayed after the move
		if _, err := h.Put(ctx, "room-0005", "missed", json.RawMessage(fmt.Sprint(i)), nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	before := list(t, src, "room-0123")
	src.stop()

	rs := redistest.Start(t, redistest.Options{})
	out := runStatecast(t, false, "migrate", "--from", "file:"+dir, "--to", rs.URL())
	t.Log(strings.TrimSpace(out))
	if !strings.Contains(out, fmt.Sprintf("migrate: %d rooms (0 already there)", rooms)) {
		t.Errorf("migrate's report: %s", out)
	}

	dst := redisNode(t, "dst", rs.URL())
	if after := list(t, dst, "room-0123"); after.Epoch != before.Epoch || after.Rev != before.Rev || !itemsEqual(after.Items, before.Items) {
		t.Errorf("room-0123 on Redis: %+v, on the file store: %+v", after, before)
	}
	c, err = client.Dial(ctx, dst.WS(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sub, err = c.Subscribe(ctx, "room-0005", client.SubscribeOptions{From: &wire.Position{Epoch: snap.Epoch, Rev: snap.Rev + 1}})
	if err != nil {
		t.Fatal(err)
	}
	next := snap.Rev + 1
	for next <= revs+3 {
		m, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		switch m.T {
		case wire.TEvents:
			if m.Rev != next {
				t.Fatalf("replayed revision %d, want %d", m.Rev, next)
			}
			next++
		case wire.TSynced:
		default:
			t.Fatalf("resume on the Redis node: %s (reason %q), want a replay of revisions %d..%d", m.T, m.Reason, snap.Rev+1, revs+3)
		}
	}
}

func itemsEqual(a, b []wire.Item) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || string(a[i].Value) != string(b[i].Value) || a[i].ModRev != b[i].ModRev || a[i].Version != b[i].Version {
			return false
		}
	}
	return true
}

// TestMigrateKilledAndResumed: a migration killed halfway is run again:
// it skips the rooms already complete and finishes the others, and a
// destination holding rooms of another store is refused without --force.
func TestMigrateKilledAndResumed(t *testing.T) {
	redistest.Require(t)
	dir := t.TempDir()
	src := fileNode(t, "src", dir)
	const rooms = 120
	fillRooms(t, src, rooms, 2)
	before := list(t, src, "room-0100")
	src.stop()

	rs := redistest.Start(t, redistest.Options{})
	cmd := exec.Command(statecastBin(t), "migrate", "--from", "file:"+dir, "--to", rs.URL())
	cmd.Env = append(os.Environ(), "STATECAST_TEST_MIGRATE_ROOM_PAUSE=20ms")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	metas := func() int {
		v, err := redistest.Do(rs.Addr(), "EVAL", "return #redis.call('KEYS', 'sc:*:meta')", "0")
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(v)
		return n
	}
	waitUntil(t, 30*time.Second, "part of the rooms copied", func() bool { return metas() >= rooms/4 })
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	copied := metas()
	if copied >= rooms {
		t.Fatalf("the migration was not cut: %d of %d rooms copied", copied, rooms)
	}
	out := runStatecast(t, false, "migrate", "--from", "file:"+dir, "--to", rs.URL())
	t.Log(strings.TrimSpace(out))
	if !strings.Contains(out, fmt.Sprintf("migrate: %d rooms (%d already there)", rooms, copied)) {
		t.Errorf("the resumed migration did not skip the %d rooms copied: %s", copied, out)
	}
	dst := redisNode(t, "dst", rs.URL())
	if after := list(t, dst, "room-0100"); after.Epoch != before.Epoch || after.Rev != before.Rev || !itemsEqual(after.Items, before.Items) {
		t.Errorf("room-0100 on Redis: %+v, on the file store: %+v", after, before)
	}

	// Another source's rooms at the destination: refused, unless --force.
	other := t.TempDir()
	o := fileNode(t, "other", other)
	fillRooms(t, o, 2, 1)
	o.stop()
	if out := runStatecast(t, true, "migrate", "--from", "file:"+other, "--to", rs.URL()); !strings.Contains(out, "not from this source") {
		t.Errorf("migrate into a foreign destination: %s", out)
	}
	runStatecast(t, false, "migrate", "--from", "file:"+other, "--to", rs.URL(), "--force")
}
