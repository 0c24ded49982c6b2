package main

// Multi-node tests (issue 5, Tests): real `statecast serve` processes on
// one real redis-server, real WebSockets, the Go client. Each test starts
// its own Redis (store/redistest: skipped without redis-server, failed in
// CI) and its own nodes, and kills them by pid when it ends.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redistest"
)

// historyLines is the room's history in Redis from rev 1, one line per
// event in the followers' log format.
func (c *mnCluster) historyLines(room string) []string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bs, err := c.st.History(ctx, room, 1, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	var out []string
	for _, b := range bs {
		for _, ev := range b.Events {
			typ := "put"
			if ev.Type == store.OpDelete {
				typ = "delete"
			}
			out = append(out, fmt.Sprintf("%d %s %s %s", b.Rev, typ, ev.KV.Key, ev.KV.Value))
		}
	}
	return out
}

func firstDiff(a, b []string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("at %d: %q vs %q", i, a[i], b[i])
		}
	}
	return fmt.Sprintf("lengths %d vs %d", len(a), len(b))
}

// 1. Writes on any node reach watchers on every node in the same revision
// order: every watcher's full sequence of (rev, events) equals the room's
// history in Redis.
func TestMultiNodeOrder(t *testing.T) {
	t.Parallel()
	testOrder(t, mnOptions{})
}

// The same on a 3-master Redis Cluster, the nodes started with
// --redis-cluster.
func TestMultiNodeOrderRedisCluster(t *testing.T) {
	t.Parallel()
	testOrder(t, mnOptions{Cluster: true})
}

func testOrder(t *testing.T, opts mnOptions) {
	c := startCluster(t, 3, opts)
	room := "mn:order"
	fs := startFollowers(t, 6, room, c.wsURLs(), true, nil)
	c.waitFollowers(room, fs, 15*time.Second)
	tr := newTracker()
	stop := startWriters(t, 3, room, c.wsURLs(), 2*time.Millisecond, tr)
	// 2 s of writes, longer (up to 20 s) until 150 are acknowledged: a
	// loaded machine (CI runs the packages side by side) wrote 38 in 2 s.
	time.Sleep(2 * time.Second)
	for end := time.Now().Add(18 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if acked, _, _ := tr.counts(); acked >= 150 {
			break
		}
	}
	stop()
	snap := c.waitFollowers(room, fs, 15*time.Second)
	want := c.historyLines(room)
	if len(want) == 0 || snap.Rev < 100 {
		t.Fatalf("only %d revisions written", snap.Rev)
	}
	var same, cross []time.Duration
	for _, f := range fs {
		f.mu.Lock()
		if strings.Join(f.log, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s's sequence differs from the room's history: %s", f.name, firstDiff(f.log, want))
		}
		if n := f.snapshots["initial"]; n != 1 || len(f.snapshots) != 1 {
			t.Errorf("%s: snapshots %v, want one initial", f.name, f.snapshots)
		}
		for _, s := range f.lat {
			if s.writer%3 == s.node {
				same = append(same, s.d)
			} else {
				cross = append(cross, s.d)
			}
		}
		f.mu.Unlock()
	}
	if bad := tr.check(snap); len(bad) > 0 {
		t.Errorf("acknowledged writes missing: %v", bad)
	}
	acked, _, _ := tr.counts()
	t.Logf("%d revisions (%d acknowledged writes by 3 writers on 3 nodes), %d events, same order on 6 watchers (2 per node)", snap.Rev, acked, len(want))
	t.Logf("publish-to-deliver: same node p50 %v p99 %v (%d), cross node p50 %v p99 %v (%d)",
		percentile(same, .5), percentile(same, .99), len(same), percentile(cross, .5), percentile(cross, .99), len(cross))
}

// 2. A client that moves between nodes (closes on one, resumes on the
// next with its position) gets every revision exactly once, by replay.
func TestMultiNodeMove(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 3, mnOptions{})
	room := "mn:move"
	fs := startFollowers(t, 1, room, c.wsURLs(), true, nil)
	f := fs[0]
	c.waitFollowers(room, fs, 15*time.Second)
	tr := newTracker()
	stop := startWriters(t, 2, room, c.wsURLs()[1:], 2*time.Millisecond, tr)
	const moves = 6
	for i := 1; i <= moves; i++ {
		time.Sleep(250 * time.Millisecond) // writes go on meanwhile
		f.moveTo(i % 3)
		// The next move only once this one has resumed: two moves in
		// one reconnect would be one (a busy machine reconnects slowly).
		waitUntil(t, 15*time.Second, fmt.Sprintf("move %d to resume", i), func() bool {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.connects == i+1 && f.replays == i
		})
	}
	time.Sleep(250 * time.Millisecond)
	stop()
	snap := c.waitFollowers(room, fs, 15*time.Second)
	want := c.historyLines(room)
	f.mu.Lock()
	defer f.mu.Unlock()
	if strings.Join(f.log, "\n") != strings.Join(want, "\n") {
		t.Errorf("the moving client's sequence differs from the room's history: %s", firstDiff(f.log, want))
	}
	if f.connects != moves+1 || f.resumes != moves || f.replays != moves {
		t.Errorf("connects %d, resumes %d, by replay %d; want %d, %d, %d", f.connects, f.resumes, f.replays, moves+1, moves, moves)
	}
	if n := f.snapshots["initial"]; n != 1 || len(f.snapshots) != 1 {
		t.Errorf("snapshots %v, want only the initial one", f.snapshots)
	}
	if bad := tr.check(snap); len(bad) > 0 {
		t.Errorf("acknowledged writes missing: %v", bad)
	}
	t.Logf("%d revisions, %d moves, every one resumed by replay with no gap and no duplicate", snap.Rev, moves)
}

// 3. 1,000 clients of one room connecting at once, spread over 3 nodes,
// cost Redis one snapshot read (MULTI{HMGET meta; HGETALL kv; XRANGE})
// per node, not one per client: each node loads the room once
// (statecast_room_loads_total); INFO commandstats is logged (its HGETALL
// count also holds those run by the session scripts, which a restart
// sets off at times of its own). Measured twice: the first subscriptions, then after every node
// restarted (a deploy) while the room moved past its history, so that
// each of the 1,000 reconnects needs a snapshot (reason compacted) and
// each node loads the room afresh.
func TestMultiNodeReconnectStorm(t *testing.T) {
	t.Parallel()
	const clients = 1000
	c := startCluster(t, 3, mnOptions{Args: []string{"--history", "50"}})
	room := "mn:storm"
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	write := func(n int) {
		conn, err := client.Dial(ctx, c.nodes[0].WS(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.CloseNow()
		for i := range n {
			if _, err := conn.Put(ctx, room, fmt.Sprintf("k%d", i%20), json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(100) // writes do not load the room on a node
	g := &gate{}
	before, own := c.commandCalls(), c.ownReads.Load()
	start := time.Now()
	fs := startFollowers(t, clients, room, c.wsURLs(), false, g)
	c.waitFollowers(room, fs, 60*time.Second)
	first := time.Since(start)
	after, own := c.commandCalls(), c.ownReads.Load()-own
	hgetall := after["hgetall"] - before["hgetall"] - int(own)
	c.wantLoads("first subscriptions", room, 1)
	t.Logf("first subscriptions: %d clients in sync in %v; Redis calls by the nodes: hgetall +%d, exec +%d, xrange +%d (the test's own %d snapshot reads subtracted)",
		clients, first.Round(time.Millisecond), hgetall, after["exec"]-before["exec"]-int(own), after["xrange"]-before["xrange"]-int(own), own)

	// A deploy: every node restarts; the clients wait until all are back.
	g.close()
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Add(1)
		go func() { defer wg.Done(); n.stop(); n.start(t) }()
	}
	wg.Wait()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		parked := 0
		for _, f := range fs {
			f.mu.Lock()
			if f.conn == nil {
				parked++
			}
			f.mu.Unlock()
		}
		if parked == clients {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d clients still connected after every node restarted", clients-parked, clients)
		}
	}
	write(60) // past the 50 retained events: every client's position is compacted
	before, own = c.commandCalls(), c.ownReads.Load()
	start = time.Now()
	g.open()
	c.waitFollowers(room, fs, 60*time.Second)
	storm := time.Since(start)
	after, own = c.commandCalls(), c.ownReads.Load()-own
	hgetall = after["hgetall"] - before["hgetall"] - int(own)
	c.wantLoads("reconnect storm", room, 1) // restarted: counted from 0
	compacted := 0
	for _, f := range fs {
		f.mu.Lock()
		compacted += f.snapshots["compacted"]
		f.mu.Unlock()
	}
	if compacted != clients {
		t.Errorf("%d of %d clients resynced by a compacted snapshot", compacted, clients)
	}
	t.Logf("reconnect storm after a restart of every node: %d clients in sync in %v, %d by snapshot; Redis calls by the nodes: hgetall +%d, exec +%d, xrange +%d",
		clients, storm.Round(time.Millisecond), compacted, hgetall, after["exec"]-before["exec"]-int(own), after["xrange"]-before["xrange"]-int(own))
}

// chaos is the common shape of the failure tests: 3 nodes, 6 followers
// (two per node), 3 writers (one per node), load, then inject, then the
// views must equal the room in Redis with no acknowledged write missing.
type chaos struct {
	t    *testing.T
	c    *mnCluster
	room string
	fs   []*follower
	tr   *tracker
	stop func()
}

func startChaos(t *testing.T, room string, opts mnOptions) *chaos {
	c := startCluster(t, 3, opts)
	fs := startFollowers(t, 6, room, c.wsURLs(), false, nil)
	c.waitFollowers(room, fs, 15*time.Second)
	tr := newTracker()
	stop := startWriters(t, 3, room, c.wsURLs(), 5*time.Millisecond, tr)
	time.Sleep(time.Second)
	return &chaos{t: t, c: c, room: room, fs: fs, tr: tr, stop: stop}
}

// finish stops the writers and checks the end state; it returns the
// snapshot and how long the followers took to converge.
func (ch *chaos) finish(within time.Duration) (store.Snapshot, time.Duration) {
	ch.t.Helper()
	ch.stop()
	start := time.Now()
	snap := ch.c.waitFollowers(ch.room, ch.fs, within)
	took := time.Since(start)
	if bad := ch.tr.check(snap); len(bad) > 0 {
		ch.t.Errorf("%d acknowledged writes missing, e.g. %v", len(bad), bad[:min(5, len(bad))])
	}
	acked, failed, unknown := ch.tr.counts()
	deliveries, resyncs := 0, 0
	for _, f := range ch.fs {
		f.mu.Lock()
		deliveries += f.deliveries
		for reason, n := range f.snapshots {
			if reason != "initial" {
				resyncs += n
			}
		}
		f.mu.Unlock()
	}
	ch.t.Logf("rev %d, writes acked %d / failed %d / unknown %d, deliveries %d, resyncs %d, converged %v after the writers stopped",
		snap.Rev, acked, failed, unknown, deliveries, resyncs, took.Round(time.Millisecond))
	return snap, took
}

func (ch *chaos) resyncs(f *follower) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for reason, k := range f.snapshots {
		if reason != "initial" {
			n += k
		}
	}
	return n
}

// 4a. A node killed with SIGKILL mid-load: its clients resume on another
// node by replay; the session-leased keys written through it are deleted,
// once, by a survivor within the node timeout + 2 s; the others stay.
func TestMultiNodeKillNode(t *testing.T) {
	t.Parallel()
	testKillNode(t, mnOptions{})
}

// The same on a 3-master Redis Cluster.
func TestMultiNodeKillNodeRedisCluster(t *testing.T) {
	t.Parallel()
	testKillNode(t, mnOptions{Cluster: true})
}

func testKillNode(t *testing.T, opts mnOptions) {
	ch := startChaos(t, "mn:kill", opts)
	c := ch.c
	if c.nodeTO == 0 {
		t.Fatal("statecast serve has no --node-timeout")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Two clients per node hold a session-leased presence key.
	for i := range 6 {
		conn, err := client.Dial(ctx, c.nodes[i%3].WS(), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(conn.CloseNow)
		if _, err := conn.Put(ctx, ch.room, fmt.Sprintf("presence/n%d-%d", i%3, i), json.RawMessage(`true`), client.WithLease("session")); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	killed := time.Now()
	c.nodes[2].kill()
	var gone time.Duration
	for {
		snap := c.snapshot(ch.room)
		dead, live := 0, 0
		for _, kv := range snap.Items {
			switch {
			case strings.HasPrefix(kv.Key, "presence/n2-"):
				dead++
			case strings.HasPrefix(kv.Key, "presence/"):
				live++
			}
		}
		if live != 4 {
			t.Fatalf("%d presence keys of live nodes left, want 4", live)
		}
		if dead == 0 {
			gone = time.Since(killed)
			break
		}
		if time.Since(killed) > c.nodeTO+5*time.Second {
			t.Fatalf("the killed node's leased keys still exist %v after the kill (node timeout %v)", time.Since(killed), c.nodeTO)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The promise (DESIGN.md, Leases) is node timeout + a beat + one scan;
	// the loop above fails past node timeout + 5 s. A tighter bound is a
	// performance target, not this test's: under -race on a loaded CI
	// machine the scan alone took 1.9 to 3.3 s.
	time.Sleep(500 * time.Millisecond)
	ch.finish(15 * time.Second)
	for i, f := range ch.fs {
		f.mu.Lock()
		for _, k := range []string{"presence/n2-2", "presence/n2-5"} {
			if n := f.deletes[k]; n != 1 {
				t.Errorf("%s saw %d deletes of %s, want 1", f.name, n, k)
			}
		}
		if i%3 == 2 && (f.resumes < 1 || f.replays != f.resumes) {
			t.Errorf("%s (on the killed node): resumes %d, by replay %d", f.name, f.resumes, f.replays)
		}
		f.mu.Unlock()
		if n := ch.resyncs(f); n != 0 {
			t.Errorf("%s resynced %d times", f.name, n)
		}
	}
	t.Logf("the killed node's session-leased keys were deleted %v after SIGKILL (node timeout %v)", gone.Round(time.Millisecond), c.nodeTO)
}

// 4b. One node's connections to Redis cut for 2 s, then restored: its
// watchers catch up from the stream; nothing is lost or repeated.
func TestMultiNodeRedisCut(t *testing.T) {
	t.Parallel()
	ch := startChaos(t, "mn:cut", mnOptions{Proxied: true})
	ch.c.proxies[1].Cut()
	time.Sleep(2 * time.Second)
	ch.c.proxies[1].Restore()
	restored := time.Now()
	time.Sleep(time.Second)
	ch.finish(15 * time.Second)
	for _, f := range ch.fs {
		if n := ch.resyncs(f); n != 0 {
			t.Errorf("%s resynced %d times", f.name, n)
		}
	}
	t.Logf("cut 2 s; checked %v after the restore", time.Since(restored).Round(time.Millisecond))
}

// 4c. redis-server killed and restarted with AOF (appendfsync always):
// no acknowledged write lost, same epoch, clients continue without a
// resync.
func TestMultiNodeRedisRestartAOF(t *testing.T) {
	t.Parallel()
	ch := startChaos(t, "mn:aof", mnOptions{AOF: true})
	epoch := ch.c.snapshot(ch.room).Epoch
	ch.c.redis.Restart(t)
	time.Sleep(1500 * time.Millisecond)
	snap, _ := ch.finish(20 * time.Second)
	if snap.Epoch != epoch {
		t.Errorf("epoch changed across an AOF restart: %s → %s", epoch, snap.Epoch)
	}
	for _, f := range ch.fs {
		if n := ch.resyncs(f); n != 0 {
			t.Errorf("%s resynced %d times", f.name, n)
		}
	}
}

// 4d. redis-server restarted without persistence: the room's state is
// gone, so a new epoch; every client resyncs from a snapshot and ends
// equal to the rewritten room.
func TestMultiNodeRedisRestartEmpty(t *testing.T) {
	t.Parallel()
	testStateLost(t, "mn:empty", "Redis lost the room", func(ch *chaos) { ch.c.redis.Restart(t) })
}

// 4e. FLUSHALL while the nodes are connected: the epoch change is
// detected without any reconnect, clients resync.
func TestMultiNodeFlushAll(t *testing.T) {
	t.Parallel()
	testStateLost(t, "mn:flush", "FLUSHALL", func(ch *chaos) {
		if _, err := redistest.Do(ch.c.redis.Addr(), "FLUSHALL"); err != nil {
			t.Fatal(err)
		}
	})
}

// testStateLost makes Redis lose the room's state under load (lose) and
// checks that the epoch changed and that every client resynced.
func testStateLost(t *testing.T, room, what string, lose func(*chaos)) {
	ch := startChaos(t, room, mnOptions{})
	epoch := ch.c.snapshot(ch.room).Epoch
	lose(ch)
	ch.tr.lost()
	time.Sleep(1500 * time.Millisecond)
	snap, _ := ch.finish(20 * time.Second)
	if snap.Epoch == epoch {
		t.Fatalf("same epoch %s after %s", epoch, what)
	}
	for _, f := range ch.fs {
		if n := ch.resyncs(f); n < 1 {
			t.Errorf("%s did not resync", f.name)
		}
	}
}

// 4f. Pub/sub pushes lost: first silently (the proxy drops every smessage
// to every node while writes go on, so only the periodic check and the
// stream can deliver), then by killing the push connections (CLIENT KILL
// TYPE pubsub) twice under load.
func TestMultiNodeLostPushes(t *testing.T) {
	t.Parallel()
	ch := startChaos(t, "mn:push", mnOptions{Proxied: true})
	for _, p := range ch.c.proxies {
		p.drop.Store(true)
	}
	time.Sleep(1500 * time.Millisecond)
	ch.stop()
	start := time.Now()
	ch.c.waitFollowers(ch.room, ch.fs, 10*time.Second)
	silent := time.Since(start)
	var dropped int64
	for _, p := range ch.c.proxies {
		p.drop.Store(false)
		dropped += p.dropped.Load()
	}
	if dropped == 0 {
		t.Fatal("the proxies dropped no push")
	}
	t.Logf("%d pushes dropped; the last write reached every follower %v after the writers stopped (check interval 1 s)", dropped, silent.Round(time.Millisecond))

	ch.stop = startWriters(t, 3, ch.room, ch.c.wsURLs(), 5*time.Millisecond, ch.tr)
	for range 2 {
		time.Sleep(500 * time.Millisecond)
		if _, err := redistest.Do(ch.c.redis.Addr(), "CLIENT", "KILL", "TYPE", "pubsub"); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	_, took := ch.finish(10 * time.Second)
	for _, f := range ch.fs {
		if n := ch.resyncs(f); n != 0 {
			t.Errorf("%s resynced %d times", f.name, n)
		}
	}
	t.Logf("after CLIENT KILL TYPE pubsub ×2: converged %v after the writers stopped", took.Round(time.Millisecond))
}

// ---------------------------------------------------------------- soak

var soakFor = flag.Duration("soak", 0, "run TestSoak (multi-node chaos) for this long; also SOAK=3m")

// soakDuration is -soak or $SOAK; without either the soak tests skip
// (they are not part of make test).
func soakDuration(t *testing.T) time.Duration {
	d := *soakFor
	if v := os.Getenv("SOAK"); d == 0 && v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	if d == 0 {
		t.Skip("the soak runs with -soak DURATION or SOAK=DURATION (make soak)")
	}
	return d
}

// 5. The chaos above in a loop for a bounded time (`make soak`): each round
// injects one failure under load, then stops the writers and checks every
// view against the room and every acknowledged write. It reports writes,
// deliveries, resyncs and divergences (which must be 0).
func TestSoak(t *testing.T) {
	d := soakDuration(t)
	c := startCluster(t, 3, mnOptions{AOF: true, Proxied: true, Args: []string{"--history", "500"}})
	room := "mn:soak"
	fs := startFollowers(t, 9, room, c.wsURLs(), false, nil)
	c.waitFollowers(room, fs, 15*time.Second)
	tr := newTracker()
	actions := map[string]func(){
		"kill a node": func() {
			n := c.nodes[rand.IntN(3)]
			n.kill()
			time.Sleep(time.Duration(rand.IntN(1500)) * time.Millisecond)
			n.start(t)
		},
		"restart a node": func() { n := c.nodes[rand.IntN(3)]; n.stop(); n.start(t) },
		"cut a node's Redis": func() {
			p := c.proxies[rand.IntN(3)]
			p.Cut()
			time.Sleep(time.Duration(500+rand.IntN(2000)) * time.Millisecond)
			p.Restore()
		},
		"drop pushes": func() {
			p := c.proxies[rand.IntN(3)]
			p.drop.Store(true)
			time.Sleep(time.Duration(500+rand.IntN(1500)) * time.Millisecond)
			p.drop.Store(false)
		},
		"kill pub/sub connections": func() { _, _ = redistest.Do(c.redis.Addr(), "CLIENT", "KILL", "TYPE", "pubsub") },
		"restart Redis (AOF)":      func() { c.redis.Restart(t) },
		"FLUSHALL": func() {
			_, _ = redistest.Do(c.redis.Addr(), "FLUSHALL")
			tr.lost()
		},
	}
	names := make([]string, 0, len(actions))
	for n := range actions {
		names = append(names, n)
	}
	counts := map[string]int{}
	rounds, divergences, stuck := 0, 0, 0
	end := time.Now().Add(d)
	for writer := 0; time.Now().Before(end); rounds++ {
		writer += 3
		stop := startWritersFrom(t, writer-3, 3, room, c.wsURLs(), 5*time.Millisecond, tr)
		time.Sleep(time.Duration(300+rand.IntN(700)) * time.Millisecond)
		name := names[rand.IntN(len(names))]
		counts[name]++
		actions[name]()
		time.Sleep(time.Duration(300+rand.IntN(700)) * time.Millisecond)
		stop()
		snap, behind, diffs := c.converge(room, fs, 20*time.Second)
		if behind != "" {
			stuck++
			t.Errorf("round %d (%s): %s", rounds, name, behind)
		}
		if bad := tr.check(snap); len(bad) > 0 {
			diffs = append(diffs, fmt.Sprintf("%d acknowledged writes missing, e.g. %v", len(bad), bad[:min(3, len(bad))]))
		}
		if len(diffs) > 0 {
			divergences++
			t.Errorf("round %d (%s): %s", rounds, name, strings.Join(diffs, "; "))
		}
	}
	acked, failed, unknown := tr.counts()
	deliveries, resyncs := 0, 0
	for _, f := range fs {
		f.mu.Lock()
		deliveries += f.deliveries
		for reason, n := range f.snapshots {
			if reason != "initial" {
				resyncs += n
			}
		}
		f.mu.Unlock()
	}
	t.Logf("soak %v: %d rounds %v; writes acked %d, failed %d, unknown %d; deliveries %d to %d clients; resyncs %d; rounds not converged %d; divergences %d",
		d, rounds, counts, acked, failed, unknown, deliveries, len(fs), resyncs, stuck, divergences)
}
