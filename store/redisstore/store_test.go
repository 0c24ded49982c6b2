package redisstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redistest"
)

// Redis-specific tests: what the conformance suite cannot see (failures
// injected into Redis, epochs, pub/sub recovery). Each test starts its own
// redis-server.

const testCheck = 200 * time.Millisecond // CheckInterval in these tests

// STATECAST_REDIS_DEBUG=1 logs the store's debug messages to the test log.
var debugLogger = func() func(testing.TB) *slog.Logger {
	if os.Getenv("STATECAST_REDIS_DEBUG") == "" {
		return nil
	}
	return func(t testing.TB) *slog.Logger {
		return slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
}()

type testLogWriter struct{ t testing.TB }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func openStore(t testing.TB, url string, mod func(*Config)) *Store {
	t.Helper()
	cfg := Config{URL: url, Prefix: "it", CheckInterval: testCheck, PingInterval: time.Second}
	if debugLogger != nil {
		cfg.Logger = debugLogger(t)
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil && !errors.Is(err, store.ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func rawRedis(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	t.Cleanup(func() { c.Close() })
	return c
}

var bg = context.Background()

func mustApply(t testing.TB, s store.Store, room string, w store.Write) store.Result {
	t.Helper()
	res, err := s.Apply(bg, room, w)
	if err != nil {
		t.Fatalf("Apply(%q): %v", room, err)
	}
	return res
}

func mustSnapshot(t testing.TB, s store.Store, room string) store.Snapshot {
	t.Helper()
	snap, err := s.Snapshot(bg, room, "")
	if err != nil {
		t.Fatalf("Snapshot(%q): %v", room, err)
	}
	return snap
}

func mustHistory(t testing.TB, s store.Store, room string, from uint64) []store.Batch {
	t.Helper()
	bs, err := s.History(bg, room, from, 0)
	if err != nil {
		t.Fatalf("History(%q, %d): %v", room, from, err)
	}
	return bs
}

// batchLog records what a Follow callback receives.
type batchLog struct {
	mu     sync.Mutex
	bs     []store.Batch
	notify chan struct{}
}

func followLog(t testing.TB, s store.Store, room string) *batchLog {
	t.Helper()
	l := &batchLog{notify: make(chan struct{}, 1)}
	stop, err := s.Follow(room, func(b store.Batch) {
		l.mu.Lock()
		l.bs = append(l.bs, b)
		l.mu.Unlock()
		select {
		case l.notify <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatalf("Follow(%q): %v", room, err)
	}
	t.Cleanup(stop)
	return l
}

func (l *batchLog) get() []store.Batch {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.bs)
}

// wait waits until ok holds for the batches received and returns them
// with the time it took.
func (l *batchLog) wait(t testing.TB, what string, within time.Duration, ok func([]store.Batch) bool) ([]store.Batch, time.Duration) {
	t.Helper()
	start := time.Now()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		bs := l.get()
		if ok(bs) {
			return bs, time.Since(start)
		}
		select {
		case <-l.notify:
		case <-time.After(10 * time.Millisecond):
		case <-deadline.C:
			t.Fatalf("%s: not within %v; received %s", what, within, describe(bs))
		}
	}
}

func describe(bs []store.Batch) string {
	var parts []string
	for _, b := range bs {
		parts = append(parts, fmt.Sprintf("%s/%d(%d)", b.Epoch, b.Rev, len(b.Events)))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func lastRev(rev uint64) func([]store.Batch) bool {
	return func(bs []store.Batch) bool {
		return len(bs) > 0 && bs[len(bs)-1].Rev >= rev && len(bs[len(bs)-1].Events) > 0
	}
}

// checkInOrder fails unless bs (all of epoch) are exactly revisions from..to.
func checkInOrder(t testing.TB, bs []store.Batch, epoch string, from, to uint64) {
	t.Helper()
	var got []uint64
	for _, b := range bs {
		if b.Epoch != epoch {
			t.Errorf("batch %d has epoch %q, want %q", b.Rev, b.Epoch, epoch)
		}
		got = append(got, b.Rev)
	}
	var want []uint64
	for r := from; r <= to; r++ {
		want = append(want, r)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("followed revisions %v, want %v (exactly once, in order)", got, want)
	}
}

func putN(t testing.TB, s store.Store, room string, n int) []store.Result {
	t.Helper()
	var out []store.Result
	for i := range n {
		out = append(out, mustApply(t, s, room, store.Put(fmt.Sprintf("k%d", i%4), []byte(fmt.Sprint(i)))))
	}
	return out
}

// TestWriteFailureLeavesNothing: when the script's first write
// (XADD) fails, nothing of the write is visible, the error is not a
// conflict, and the room goes on once the cause is gone.
func TestWriteFailureLeavesNothing(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), nil)
	raw := rawRedis(t, srv.Addr())
	const room = "atomic"
	mustApply(t, s, room, store.Put("a", []byte("1")))
	mustApply(t, s, room, store.Put("b", []byte("2")))
	l := followLog(t, s, room)
	k := s.keys(room)
	// A stream entry ahead of the room's head makes XADD <rev>-0 fail.
	if err := raw.XAdd(bg, &redis.XAddArgs{Stream: k.log, ID: "100-0", Values: []string{"d", "junk"}}).Err(); err != nil {
		t.Fatal(err)
	}
	metaBefore := raw.HGetAll(bg, k.meta).Val()
	kvBefore := raw.HGetAll(bg, k.kv).Val()
	snapBefore := mustSnapshot(t, s, room)

	_, err := s.Apply(bg, room, store.Write{Ops: []store.Op{
		{Type: store.OpPut, Key: "a", Value: []byte("3")},
		{Type: store.OpDelete, Key: "b"},
		{Type: store.OpPut, Key: "c", Value: []byte("4")},
	}})
	if err == nil || errors.Is(err, store.ErrConflict) {
		t.Fatalf("Apply with a failing XADD: got %v, want an error that is not a conflict", err)
	}
	t.Logf("failed write: %v", err)
	if got := raw.HGetAll(bg, k.meta).Val(); !reflect.DeepEqual(got, metaBefore) {
		t.Errorf("meta changed by a failed write: %v, was %v", got, metaBefore)
	}
	if got := raw.HGetAll(bg, k.kv).Val(); !reflect.DeepEqual(got, kvBefore) {
		t.Errorf("kv changed by a failed write: %v, was %v", got, kvBefore)
	}
	if got := mustSnapshot(t, s, room); !reflect.DeepEqual(got, snapBefore) {
		t.Errorf("snapshot changed by a failed write: %+v, was %+v", got, snapBefore)
	}

	// The stream keeps its last ID after XDEL: only dropping the bad
	// stream (its history) lets the room go on.
	raw.Del(bg, k.log)
	res := mustApply(t, s, room, store.Put("c", []byte("5")))
	if res.Rev != 3 {
		t.Fatalf("write after the failure committed at rev %d, want 3", res.Rev)
	}
	if snap := mustSnapshot(t, s, room); snap.Oldest != 3 {
		t.Errorf("Oldest = %d after the history was dropped, want 3", snap.Oldest)
	}
	bs, _ := l.wait(t, "follow after a failed write", 5*time.Second, lastRev(3))
	checkInOrder(t, bs, res.Epoch, 3, 3)
}

// TestWriteTimeoutIsNotRetried: a write whose reply does not come in
// time fails with an error that is neither a conflict nor bad input (the
// server answers outcome_unknown), and it is never sent twice.
func TestWriteTimeoutIsNotRetried(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), func(c *Config) { c.WriteTimeout = 300 * time.Millisecond })
	raw := rawRedis(t, srv.Addr())
	const room = "timeout"
	mustApply(t, s, room, store.Put("k", []byte("1")))
	if err := raw.Do(bg, "CLIENT", "PAUSE", "1500", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := s.Apply(bg, room, store.Put("k", []byte("2")))
	took := time.Since(start)
	if err == nil {
		t.Fatal("Apply during CLIENT PAUSE WRITE succeeded")
	}
	for _, sentinel := range []error{store.ErrConflict, store.ErrInvalidKey, store.ErrInvalidRoom, store.ErrClosed, store.ErrEmptyWrite, store.ErrUnavailable} {
		if errors.Is(err, sentinel) {
			t.Fatalf("timed-out write returned %v, which reads as %v", err, sentinel)
		}
	}
	if took > time.Second {
		t.Errorf("timed-out write took %v, want about WriteTimeout (300ms)", took)
	}
	time.Sleep(1600 * time.Millisecond) // the pause ends
	snap := mustSnapshot(t, s, room)
	if snap.Rev > 2 {
		t.Fatalf("room at rev %d after one timed-out write: it was applied more than once", snap.Rev)
	}
	t.Logf("timed-out write: %v after %v; applied afterwards: %v", err, took, snap.Rev == 2)
	if res := mustApply(t, s, room, store.Put("k", []byte("3"))); res.Rev != snap.Rev+1 {
		t.Fatalf("next write at rev %d, want %d", res.Rev, snap.Rev+1)
	}
}

// TestUnreachableIsUnavailable: with redis-server down, a write that
// could not even connect is ErrUnavailable (nothing was written), not an
// unknown outcome; once it is back, writes go on.
func TestUnreachableIsUnavailable(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{AOF: true})
	s := openStore(t, srv.URL(), nil)
	const room = "down"
	mustApply(t, s, room, store.Put("k", []byte("1")))
	srv.Kill()
	// A pooled connection may carry the first write before it finds the
	// socket dead: that one's outcome is unknown. Later ones cannot dial.
	var err error
	for range 3 {
		if _, err = s.Apply(bg, room, store.Put("k", []byte("2"))); errors.Is(err, store.ErrUnavailable) {
			break
		}
		if err == nil {
			t.Fatal("a write succeeded with redis-server down")
		}
	}
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("writes with redis-server down: %v, want ErrUnavailable", err)
	}
	srv.Restart(t)
	if res := mustApply(t, s, room, store.Put("k", []byte("3"))); res.Rev != 2 {
		t.Fatalf("first write after the restart at rev %d, want 2: nothing of the refused writes was applied", res.Rev)
	}
}

// TestScriptReloaded: after SCRIPT FLUSH (as on a restarted or new
// node) writes go on (EVALSHA falls back to EVAL on NOSCRIPT).
func TestScriptReloaded(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), nil)
	raw := rawRedis(t, srv.Addr())
	mustApply(t, s, "noscript", store.Put("k", []byte("1")))
	raw.ScriptFlush(bg)
	if res := mustApply(t, s, "noscript", store.Put("k", []byte("2"))); res.Rev != 2 {
		t.Fatalf("write after SCRIPT FLUSH at rev %d, want 2", res.Rev)
	}
}

// TestCompaction: retention is exact (whole revisions, the stream
// holds exactly what is retained), and compaction is detected from the
// stream itself: an entry missing at from, or an empty page while the head
// is ahead (a log lost while meta survived), is compacted, never "no
// history".
func TestCompaction(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), func(c *Config) {
		c.Retention = store.RetentionPolicy{Default: store.Retention{MaxEvents: 5}}
	})
	raw := rawRedis(t, srv.Addr())
	const room = "compact"
	putN(t, s, room, 20)
	k := s.keys(room)
	if n := raw.XLen(bg, k.log).Val(); n != 5 {
		t.Errorf("stream holds %d entries with MaxEvents 5, want exactly 5 (MAXLEN ~ would keep ~100)", n)
	}
	if snap := mustSnapshot(t, s, room); snap.Oldest != 16 {
		t.Errorf("Oldest = %d, want 16", snap.Oldest)
	}
	wantCompactedAt := func(from, oldest uint64) {
		t.Helper()
		_, err := s.History(bg, room, from, 0)
		var ce *store.CompactedError
		if !errors.As(err, &ce) || ce.Oldest != oldest {
			t.Errorf("History(%d) = %v, want CompactedError{Oldest: %d}", from, err, oldest)
		}
	}
	wantCompactedAt(15, 16)

	// Someone else trims the stream (MAXLEN, exact here): detected from
	// the first entry, not from XINFO's max-deleted-entry-id.
	raw.XTrimMaxLen(bg, k.log, 2)
	wantCompactedAt(16, 19)
	if bs := mustHistory(t, s, room, 19); len(bs) != 2 {
		t.Errorf("History(19) returned %d batches, want 2", len(bs))
	}

	// The log is lost while meta survives (centrifuge#636): an empty page
	// with the head ahead is compacted.
	raw.Del(bg, k.log)
	wantCompactedAt(20, 21)
	if snap := mustSnapshot(t, s, room); snap.Oldest != 21 || snap.Rev != 20 {
		t.Errorf("Snapshot after losing the log: rev %d oldest %d, want rev 20 oldest 21", snap.Rev, snap.Oldest)
	}
}

// TestFollowAcrossCompaction: a follower that missed revisions the
// stream no longer holds gets the next retained batch, so it sees the gap
// (and resyncs) instead of missing it.
func TestFollowAcrossCompaction(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), func(c *Config) {
		c.Retention = store.RetentionPolicy{Default: store.Retention{MaxEvents: 3}}
		c.CheckInterval = time.Hour // checked by hand below
	})
	raw := rawRedis(t, srv.Addr())
	const room = "behind"
	l := followLog(t, s, room)
	eventually(t, "subscribed", 5*time.Second, func() bool { return shardSubs(t, raw, s.keys(room).ch) == 1 })
	time.Sleep(100 * time.Millisecond) // the check the subscription triggers
	s.noPublish.Store(true)            // every push is lost
	res := putN(t, s, room, 10)
	s.fol.markDirty(room)
	bs, _ := l.wait(t, "batches after lost pushes", 5*time.Second, lastRev(10))
	checkInOrder(t, bs, res[0].Epoch, 8, 10) // 1..7 are gone: the follower sees 8 after 0
	if got := bs[len(bs)-1]; !reflect.DeepEqual(got.Events, res[9].Events) {
		t.Errorf("last followed batch %+v, want the events of rev 10", got)
	}
}

// TestFollowRecoversLostPushes: with every push lost, the periodic
// check delivers each batch within CheckInterval, in order, exactly once.
func TestFollowRecoversLostPushes(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), nil)
	const room = "lost"
	l := followLog(t, s, room)
	first := putN(t, s, room, 3)
	l.wait(t, "live batches", 5*time.Second, lastRev(3))
	s.noPublish.Store(true)
	start := time.Now()
	putN(t, s, room, 4)
	bs, _ := l.wait(t, "batches whose pushes were lost", 5*time.Second, lastRev(7))
	took := time.Since(start)
	checkInOrder(t, bs, first[0].Epoch, 1, 7)
	t.Logf("lost pushes delivered by the check after %v (CheckInterval %v)", took, testCheck)
	if took > 2*testCheck+time.Second {
		t.Errorf("lost pushes took %v, want within about CheckInterval (%v)", took, testCheck)
	}
	s.noPublish.Store(false)
	putN(t, s, room, 2)
	bs, _ = l.wait(t, "live again", 5*time.Second, lastRev(9))
	checkInOrder(t, bs, first[0].Epoch, 1, 9)
}

// shardSubs is the number of subscribers of a room's channel.
func shardSubs(t testing.TB, raw *redis.Client, ch string) int64 {
	t.Helper()
	m, err := raw.PubSubShardNumSub(bg, ch).Result()
	if err != nil {
		t.Fatal(err)
	}
	return m[ch]
}

func pubsubClients(t testing.TB, raw *redis.Client) int {
	t.Helper()
	out, err := raw.ClientList(bg).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "flags=P") {
			n++
		}
	}
	return n
}

func eventually(t testing.TB, what string, within time.Duration, ok func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !ok() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// TestFollowRecoversAfterClientKill: killing the push connection
// loses nothing and duplicates nothing; the node resubscribes by itself.
func TestFollowRecoversAfterClientKill(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), nil)
	raw := rawRedis(t, srv.Addr())
	const room = "killed"
	l := followLog(t, s, room)
	epoch := putN(t, s, room, 5)[0].Epoch
	l.wait(t, "before the kill", 5*time.Second, lastRev(5))
	rev := uint64(5)
	for round := range 2 {
		if err := raw.Do(bg, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
			t.Fatal(err)
		}
		putN(t, s, room, 5) // written while the node has no subscription
		rev += 5
		_, took := l.wait(t, fmt.Sprintf("round %d", round), 5*time.Second, lastRev(rev))
		t.Logf("round %d: caught up %v after the kill", round, took)
		resub := eventually(t, "resubscribed", 5*time.Second, func() bool { return shardSubs(t, raw, s.keys(room).ch) == 1 })
		t.Logf("round %d: resubscribed after %v", round, resub)
	}
	putN(t, s, room, 2) // live again
	rev += 2
	bs, _ := l.wait(t, "after the kills", 5*time.Second, lastRev(rev))
	checkInOrder(t, bs, epoch, 1, rev)
}

// TestFollowCostsNothingUnfollowed: one push connection per node
// whatever the number of followed rooms, channels only for followed rooms,
// and nothing at all once nothing is followed.
func TestFollowCostsNothingUnfollowed(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), nil)
	raw := rawRedis(t, srv.Addr())
	var stops []func()
	for i := range 20 {
		stop, err := s.Follow(fmt.Sprint("room", i), func(store.Batch) {})
		if err != nil {
			t.Fatal(err)
		}
		stops = append(stops, stop)
	}
	eventually(t, "all rooms subscribed", 5*time.Second, func() bool {
		for i := range 20 {
			if shardSubs(t, raw, s.keys(fmt.Sprint("room", i)).ch) != 1 {
				return false
			}
		}
		return true
	})
	if n := pubsubClients(t, raw); n != 1 {
		t.Errorf("%d pub/sub connections for 20 followed rooms, want 1", n)
	}
	if n := shardSubs(t, raw, s.keys("never-followed").ch); n != 0 {
		t.Errorf("unfollowed room has %d subscribers", n)
	}
	for _, stop := range stops {
		stop()
	}
	eventually(t, "no subscription left", 5*time.Second, func() bool {
		return pubsubClients(t, raw) == 0 && shardSubs(t, raw, s.keys("room0").ch) == 0
	})
}

// isNotice reports whether b is an epoch notice of another epoch than old.
func isNotice(b store.Batch, old string) bool {
	return len(b.Events) == 0 && b.Epoch != old && b.Epoch != ""
}

// TestEpochAfterFlushAll: FLUSHALL while followed turns into an epoch
// notice within CheckInterval, and the room goes on in the new epoch.
func TestEpochAfterFlushAll(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), nil)
	raw := rawRedis(t, srv.Addr())
	const room = "flushed"
	l := followLog(t, s, room)
	old := putN(t, s, room, 3)[0].Epoch
	l.wait(t, "before the flush", 5*time.Second, lastRev(3))
	raw.FlushAll(bg)
	start := time.Now()
	bs, _ := l.wait(t, "epoch notice", 5*time.Second, func(bs []store.Batch) bool { return isNotice(bs[len(bs)-1], old) })
	took := time.Since(start)
	t.Logf("epoch notice %v after FLUSHALL (CheckInterval %v)", took, testCheck)
	if took > 2*testCheck+time.Second {
		t.Errorf("epoch notice took %v", took)
	}
	notice := bs[len(bs)-1]
	snap := mustSnapshot(t, s, room)
	if snap.Epoch != notice.Epoch || snap.Rev != 0 || len(snap.Items) != 0 {
		t.Errorf("snapshot after FLUSHALL %+v, want the notice's epoch %q at rev 0, empty", snap, notice.Epoch)
	}
	res := mustApply(t, s, room, store.Put("k", []byte("new")))
	if res.Epoch != notice.Epoch || res.Rev != 1 {
		t.Errorf("first write after FLUSHALL: epoch %q rev %d, want %q rev 1", res.Epoch, res.Rev, notice.Epoch)
	}
	bs, _ = l.wait(t, "first batch of the new epoch", 5*time.Second, lastRev(1))
	if last := bs[len(bs)-1]; last.Epoch != notice.Epoch {
		t.Errorf("batch after the notice has epoch %q, want %q", last.Epoch, notice.Epoch)
	}
}

// TestEpochAfterRestartWithoutPersistence: redis-server killed and
// restarted empty on the same port: Snapshot shows a new epoch, Follow
// delivers an epoch notice, and pushes flow again.
func TestEpochAfterRestartWithoutPersistence(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), nil)
	const room = "restarted"
	l := followLog(t, s, room)
	old := putN(t, s, room, 3)[0].Epoch
	l.wait(t, "before the restart", 5*time.Second, lastRev(3))
	srv.Restart(t)
	start := time.Now()
	bs, _ := l.wait(t, "epoch notice after restart", 10*time.Second, func(bs []store.Batch) bool { return isNotice(bs[len(bs)-1], old) })
	t.Logf("epoch notice %v after the server came back", time.Since(start))
	notice := bs[len(bs)-1]
	snap := mustSnapshot(t, s, room)
	if snap.Epoch == old || snap.Epoch != notice.Epoch || snap.Rev != 0 {
		t.Errorf("snapshot after restart %+v, want the notice's epoch %q at rev 0", snap, notice.Epoch)
	}
	raw := rawRedis(t, srv.Addr())
	eventually(t, "resubscribed after restart", 5*time.Second, func() bool { return shardSubs(t, raw, s.keys(room).ch) == 1 })
	res := mustApply(t, s, room, store.Put("k", []byte("after")))
	bs, _ = l.wait(t, "batch after restart", 5*time.Second, lastRev(1))
	if last := bs[len(bs)-1]; last.Epoch != notice.Epoch || !reflect.DeepEqual(last.Events, res.Events) {
		t.Errorf("batch after restart %+v, want %+v", last, res)
	}
}

// TestAOFRestartKeepsAcknowledgedWrites: with appendfsync always,
// every write acknowledged before a SIGKILL is there after the restart, in
// the same epoch, and followers go on without a notice.
func TestAOFRestartKeepsAcknowledgedWrites(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{AOF: true})
	s := openStore(t, srv.URL(), func(c *Config) { c.WriteTimeout = time.Second })
	rooms := []string{"aof-a", "aof-b"}
	logs := map[string]*batchLog{}
	epochs := map[string]string{}
	for _, room := range rooms {
		logs[room] = followLog(t, s, room)
		epochs[room] = mustApply(t, s, room, store.Put("init", []byte("x"))).Epoch
	}
	var (
		mu    sync.Mutex
		acked = map[string][]store.Result{}
		wg    sync.WaitGroup
		ready = make(chan struct{}, 4)
	)
	for w := range 4 {
		room := rooms[w%2]
		wg.Go(func() {
			for i := 0; ; i++ {
				res, err := s.Apply(bg, room, store.Write{Ops: []store.Op{
					{Type: store.OpPut, Key: fmt.Sprint("w", w), Value: []byte(fmt.Sprint(i))},
					{Type: store.OpPut, Key: fmt.Sprint("w", w, "/n"), Value: []byte(fmt.Sprint(i))},
				}})
				if err != nil {
					if i < 20 {
						ready <- struct{}{}
					}
					return
				}
				mu.Lock()
				acked[room] = append(acked[room], res)
				mu.Unlock()
				if i == 20 {
					ready <- struct{}{}
				}
			}
		})
	}
	for range 4 {
		<-ready
	}
	srv.Kill()
	wg.Wait()
	srv.Restart(t)
	for _, room := range rooms {
		snap := mustSnapshot(t, s, room)
		if snap.Epoch != epochs[room] {
			t.Errorf("room %q: epoch %q after an AOF restart, want %q", room, snap.Epoch, epochs[room])
		}
		hist := mustHistory(t, s, room, 1)
		for _, res := range acked[room] {
			if res.Rev > uint64(len(hist)) {
				t.Errorf("room %q: acknowledged rev %d missing after restart (head %d)", room, res.Rev, snap.Rev)
				continue
			}
			if got := hist[res.Rev-1]; got.Rev != res.Rev || !reflect.DeepEqual(got.Events, res.Events) {
				t.Errorf("room %q: rev %d after restart differs from its acknowledgement", room, res.Rev)
			}
		}
		t.Logf("room %q: %d acknowledged writes, head %d after restart", room, len(acked[room]), snap.Rev)
		res := mustApply(t, s, room, store.Put("after", []byte("restart")))
		bs, _ := logs[room].wait(t, "follow after the AOF restart", 10*time.Second, lastRev(res.Rev))
		checkInOrder(t, bs, epochs[room], 1, res.Rev)
	}
}

// restoreKeys puts a room's keys back as dumped (a failover to a replica
// that had not received the last writes).
func restoreKeys(t testing.TB, raw *redis.Client, dumps map[string]string) {
	t.Helper()
	for key, d := range dumps {
		if err := raw.RestoreReplace(bg, key, 0, d).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

func dumpKeys(t testing.TB, raw *redis.Client, k roomKeys) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, key := range []string{k.meta, k.kv, k.log} {
		d, err := raw.Dump(bg, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		out[key] = d
	}
	return out
}

// TestFailoverLostWrites: Redis goes back to an earlier revision of a
// room without changing its epoch (async replication lost the tail). The
// node that delivered the lost revisions starts a new epoch, so nobody
// mixes the two histories.
func TestFailoverLostWrites(t *testing.T) {
	for _, rewrite := range []bool{false, true} {
		t.Run(fmt.Sprint("RewrittenAfterLoss=", rewrite), func(t *testing.T) {
			srv := redistest.Start(t, redistest.Options{})
			s := openStore(t, srv.URL(), nil)
			raw := rawRedis(t, srv.Addr())
			const room = "failover"
			l := followLog(t, s, room)
			old := putN(t, s, room, 3)[0].Epoch
			at3 := dumpKeys(t, raw, s.keys(room))
			snap3 := mustSnapshot(t, s, room)
			putN(t, s, room, 2)
			l.wait(t, "before the loss", 5*time.Second, lastRev(5))
			if rewrite {
				// Another writer, unaware, reaches rev 5 again with other
				// content; this node's pushes for 4 and 5 look like duplicates.
				other := openStore(t, srv.URL(), func(c *Config) { c.CheckInterval = time.Hour })
				s.noPublish.Store(true)
				restoreKeys(t, raw, at3)
				mustApply(t, other, room, store.Put("x", []byte("other 4")))
				mustApply(t, other, room, store.Put("x", []byte("other 5")))
			} else {
				restoreKeys(t, raw, at3)
			}
			bs, took := l.wait(t, "epoch notice after lost writes", 5*time.Second, func(bs []store.Batch) bool { return isNotice(bs[len(bs)-1], old) })
			t.Logf("notice after %v: %s", took, describe(bs))
			notice := bs[len(bs)-1]
			snap := mustSnapshot(t, s, room)
			if snap.Epoch != notice.Epoch || snap.Epoch == old {
				t.Errorf("snapshot epoch %q, want the notice's new epoch %q", snap.Epoch, notice.Epoch)
			}
			if !rewrite && (snap.Rev != 3 || !reflect.DeepEqual(snap.Items, snap3.Items)) {
				t.Errorf("snapshot after the loss %+v, want the state at rev 3 %+v", snap, snap3)
			}
			s.noPublish.Store(false)
			res := mustApply(t, s, room, store.Put("next", []byte("1")))
			if res.Epoch != notice.Epoch {
				t.Errorf("next write in epoch %q, want %q", res.Epoch, notice.Epoch)
			}
			bs, _ = l.wait(t, "next batch", 5*time.Second, lastRev(res.Rev))
			if last := bs[len(bs)-1]; last.Epoch != notice.Epoch || last.Rev != res.Rev {
				t.Errorf("last batch %s/%d, want %s/%d", last.Epoch, last.Rev, notice.Epoch, res.Rev)
			}
		})
	}
}

// TestReadOnlyRoomEpoch: reading a never-written room creates its
// epoch (the one its first write then carries) with a TTL; the first
// write makes it permanent.
func TestReadOnlyRoomEpoch(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), nil)
	raw := rawRedis(t, srv.Addr())
	k := s.keys("ro")
	snap := mustSnapshot(t, s, "ro")
	if ttl := raw.PTTL(bg, k.meta).Val(); ttl <= 0 || ttl > metaTTL {
		t.Errorf("meta of a read-only room has TTL %v, want (0, %v]", ttl, metaTTL)
	}
	res := mustApply(t, s, "ro", store.Put("k", []byte("v")))
	if res.Epoch != snap.Epoch {
		t.Errorf("first write epoch %q, want the snapshot's %q", res.Epoch, snap.Epoch)
	}
	if ttl := raw.PTTL(bg, k.meta).Val(); ttl != -1 {
		t.Errorf("meta of a written room has TTL %v, want none", ttl)
	}
}

// TestClusterFollow: on a 3-master cluster, rooms spread over the
// masters; a node keeps one push connection per master (not per room or
// slot); after the push connections are killed on every master they are
// rebuilt with one SSUBSCRIBE per slot (one over several slots is refused)
// and every room catches up, in order, exactly once.
func TestClusterFollow(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	s := openStore(t, strings.Join(c.Addrs(), ","), func(cfg *Config) { cfg.Cluster = true })
	var raws []*redis.Client
	for _, a := range c.Addrs() {
		raws = append(raws, rawRedis(t, a))
	}
	const rooms = 30
	logs := make([]*batchLog, rooms)
	epochs := make([]string, rooms)
	for i := range rooms {
		logs[i] = followLog(t, s, fmt.Sprint("cl-", i))
		epochs[i] = mustApply(t, s, fmt.Sprint("cl-", i), store.Put("k", []byte("0"))).Epoch
	}
	perMaster := map[int]int{}
	for i := range rooms {
		k := s.keys(fmt.Sprint("cl-", i))
		for m, raw := range raws {
			if raw.Exists(bg, k.meta).Val() == 1 {
				perMaster[m]++
			}
		}
	}
	if len(perMaster) != 3 {
		t.Errorf("rooms per master %v, want rooms on all 3 masters", perMaster)
	}
	eventually(t, "one push connection per master", 5*time.Second, func() bool {
		for _, raw := range raws {
			if pubsubClients(t, raw) != 1 {
				return false
			}
		}
		return true
	})
	for round := range 2 {
		for _, raw := range raws {
			raw.Do(bg, "CLIENT", "KILL", "TYPE", "pubsub")
		}
		for i := range rooms {
			mustApply(t, s, fmt.Sprint("cl-", i), store.Put("k", []byte(fmt.Sprint(round+1))))
		}
	}
	for i := range rooms {
		bs, _ := logs[i].wait(t, fmt.Sprint("room cl-", i), 10*time.Second, lastRev(3))
		checkInOrder(t, bs, epochs[i], 1, 3)
	}
	eventually(t, "resubscribed on every master", 10*time.Second, func() bool {
		for i := range rooms {
			ch := s.keys(fmt.Sprint("cl-", i)).ch
			n := int64(0)
			for _, raw := range raws {
				n += shardSubs(t, raw, ch)
			}
			if n != 1 {
				return false
			}
		}
		return true
	})
	// Live pushes flow again (not only the check).
	for i := range rooms {
		mustApply(t, s, fmt.Sprint("cl-", i), store.Put("k", []byte("live")))
	}
	for i := range rooms {
		bs, _ := logs[i].wait(t, fmt.Sprint("room cl-", i, " live"), 5*time.Second, lastRev(4))
		checkInOrder(t, bs, epochs[i], 1, 4)
	}
	if err := store.ValidRoom("{cl-1}"); !errors.Is(err, store.ErrInvalidRoom) {
		t.Errorf("ValidRoom accepts a name with hash-tag braces: %v", err)
	}
	if _, err := s.Apply(bg, "a{b}c", store.Put("k", nil)); !errors.Is(err, store.ErrInvalidRoom) {
		t.Errorf("Apply to a room named with braces: %v, want ErrInvalidRoom", err)
	}
}

// proxy forwards TCP to a Redis server, the server's replies one whole
// RESP value at a time. freeze makes every connection open at that moment
// go silent (nothing forwarded either way, nothing closed), as a half-dead
// network path or a wedged failover does; new connections work. cutAfter
// closes every connection once n more replies went through; refuse
// stops listening (a dial is refused) until it is called again with false.
type proxy struct {
	t      testing.TB
	addr   string
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	ln    net.Listener
	conns []*proxyPair
	left  int // replies still to forward before the cut; -1: none armed
}

type proxyPair struct {
	a, b   net.Conn
	frozen atomic.Bool
}

func startProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, addr: ln.Addr().String(), target: target, left: -1}
	p.serve(ln)
	t.Cleanup(func() {
		p.refuse(true)
		p.wg.Wait()
	})
	return p
}

func (p *proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			a, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", p.target)
			if err != nil {
				a.Close()
				continue
			}
			pair := &proxyPair{a: a, b: b}
			p.mu.Lock()
			p.conns = append(p.conns, pair)
			p.mu.Unlock()
			p.wg.Add(2)
			go p.requests(pair)
			go p.replies(pair)
		}
	}()
}

func (p *proxy) requests(pair *proxyPair) {
	defer p.wg.Done()
	defer pair.b.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := pair.a.Read(buf)
		if err != nil {
			return
		}
		if pair.frozen.Load() {
			continue // swallowed
		}
		if _, err := pair.b.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (p *proxy) replies(pair *proxyPair) {
	defer p.wg.Done()
	defer pair.a.Close()
	r := bufio.NewReader(pair.b)
	var buf []byte
	for {
		var err error
		if buf, err = redistest.ReadRESP(r, buf[:0]); err != nil {
			return
		}
		if pair.frozen.Load() {
			continue // swallowed
		}
		if _, err := pair.a.Write(buf); err != nil {
			return
		}
		p.mu.Lock()
		cut := p.left > 0
		if cut {
			p.left--
			cut = p.left == 0
		}
		p.mu.Unlock()
		if cut {
			p.closeAll()
			return
		}
	}
}

func (p *proxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.frozen.Store(true)
	}
}

// cutAfter arms the proxy: after n more replies every connection closes.
func (p *proxy) cutAfter(n int) {
	p.mu.Lock()
	p.left = n
	p.mu.Unlock()
}

func (p *proxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.a.Close()
		c.b.Close()
	}
	p.conns = nil
	p.left = -1
}

// refuse closes the listener and every connection (on), or listens on the
// same address again (off).
func (p *proxy) refuse(on bool) {
	if !on {
		ln, err := net.Listen("tcp", p.addr)
		if err != nil {
			p.t.Fatal(err)
		}
		p.serve(ln)
		return
	}
	p.mu.Lock()
	ln := p.ln
	p.ln = nil
	p.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	p.closeAll()
}

// TestFollowRecoversSilentConnection: the push connection (and every
// pooled one) goes silent without being closed. The node notices the
// unanswered PING within 2 x PingInterval, rebuilds, and delivers what
// was written meanwhile; the periodic check recovers too once its read
// times out.
func TestFollowRecoversSilentConnection(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	proxy := startProxy(t, srv.Addr())
	const ping = 300 * time.Millisecond
	s := openStore(t, "redis://"+proxy.addr, func(c *Config) {
		c.PingInterval = ping
		c.WriteTimeout = 500 * time.Millisecond
	})
	writer := openStore(t, srv.URL(), nil) // another node, not behind the proxy
	const room = "silent"
	l := followLog(t, s, room)
	epoch := putN(t, writer, room, 3)[0].Epoch
	l.wait(t, "before the freeze", 5*time.Second, lastRev(3))
	proxy.freeze()
	start := time.Now()
	putN(t, writer, room, 3)
	l.wait(t, "after the freeze", 10*time.Second, lastRev(6))
	took := time.Since(start)
	t.Logf("recovered %v after the connections went silent (PingInterval %v)", took, ping)
	if bound := 2*ping + testCheck + time.Second; took > bound {
		t.Errorf("recovery took %v, want within %v", took, bound)
	}
	putN(t, writer, room, 2)
	bs, _ := l.wait(t, "live again", 5*time.Second, lastRev(8))
	checkInOrder(t, bs, epoch, 1, 8)
}

// TestEpochChangeSeenInPush: the first sign of a new epoch is a push
// (here rev 3 of it, the pushes of 1 and 2 lost): followers of the old
// epoch get the notice, then every batch of the new epoch in order, so a
// consumer that already re-read the room in the new epoch misses nothing.
func TestEpochChangeSeenInPush(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), func(c *Config) { c.CheckInterval = time.Hour })
	writer := openStore(t, srv.URL(), func(c *Config) { c.CheckInterval = time.Hour })
	raw := rawRedis(t, srv.Addr())
	const room = "pushed"
	l := followLog(t, s, room)
	old := putN(t, writer, room, 2)[0].Epoch
	l.wait(t, "old epoch", 5*time.Second, lastRev(2))
	raw.FlushAll(bg)
	writer.noPublish.Store(true)
	res := putN(t, writer, room, 2)
	writer.noPublish.Store(false)
	res = append(res, putN(t, writer, room, 1)...)
	bs, _ := l.wait(t, "new epoch", 5*time.Second, func(bs []store.Batch) bool {
		last := bs[len(bs)-1]
		return last.Epoch == res[0].Epoch && last.Rev == 3
	})
	if len(bs) != 6 || !isNotice(bs[2], old) || bs[2].Epoch != res[0].Epoch || bs[2].Rev != 0 {
		t.Fatalf("followed %s, want 2 batches of the old epoch, a notice of the new one at rev 0, then its revisions 1..3", describe(bs))
	}
	checkInOrder(t, bs[3:], res[0].Epoch, 1, 3)
	for i, b := range bs[3:] {
		if !reflect.DeepEqual(b.Events, res[i].Events) {
			t.Errorf("batch %d of the new epoch differs from its Apply result", b.Rev)
		}
	}
}

// TestPagedSnapshotUnderWrites: a room big enough to take several
// HSCAN pages is snapshotted while a writer changes, deletes and recreates
// keys; every snapshot must be the state at exactly its revision (the
// history replayed from revision 1 up to it).
func TestPagedSnapshotUnderWrites(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), func(c *Config) {
		c.SnapshotPageAbove = 1
		c.Retention = store.RetentionPolicy{Default: store.Retention{MaxEvents: 100_000}}
	})
	const room, keys = "big", 3000
	for i := 0; i < keys; i += 100 {
		var w store.Write
		for j := i; j < i+100; j++ {
			w.Ops = append(w.Ops, store.Op{Type: store.OpPut, Key: fmt.Sprintf("k%04d", j), Value: []byte(`"v0"`)})
		}
		mustApply(t, s, room, w)
	}
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() { // changes, deletes and recreates the first 200 keys
		rng := rand.New(rand.NewPCG(1, 2))
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			key := fmt.Sprintf("k%04d", rng.IntN(200))
			w := store.Put(key, []byte(fmt.Sprintf(`"v%d"`, i)))
			if rng.IntN(3) == 0 {
				w = store.Delete(key)
			}
			if _, err := s.Apply(bg, room, w); err != nil {
				done <- err
				return
			}
		}
	}()
	var snaps []store.Snapshot
	for range 15 {
		snaps = append(snaps, mustSnapshot(t, s, room))
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	batches, err := s.History(bg, room, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	moved := 0
	for _, snap := range snaps {
		state := map[string]store.KV{}
		for _, b := range batches {
			if b.Rev > snap.Rev {
				break
			}
			for _, ev := range b.Events {
				if ev.Type == store.OpDelete {
					delete(state, ev.KV.Key)
				} else {
					state[ev.KV.Key] = ev.KV
				}
			}
		}
		if len(snap.Items) != len(state) {
			t.Fatalf("snapshot at %d has %d keys, the state then had %d", snap.Rev, len(snap.Items), len(state))
		}
		for _, kv := range snap.Items {
			want, ok := state[kv.Key]
			if !ok || want.ModRev != kv.ModRev || string(want.Value) != string(kv.Value) || want.Version != kv.Version || want.CreateRev != kv.CreateRev {
				t.Fatalf("snapshot at %d: %s = %s (mod %d), the state then: %s (mod %d, present %v)", snap.Rev, kv.Key, kv.Value, kv.ModRev, want.Value, want.ModRev, ok)
			}
		}
		if snap.Rev > uint64(keys/100) {
			moved++
		}
	}
	if moved < 2 || snaps[len(snaps)-1].Rev == snaps[0].Rev {
		t.Fatalf("the writer did not move the room between snapshots (%d of %d after the fill): the test proves nothing", moved, len(snaps))
	}
}
