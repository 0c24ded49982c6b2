package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

var bg = context.Background()

// openFile opens a File in dir and closes it when t ends (unless the test
// closed it already).
func openFile(t testing.TB, dir string, cfg FileConfig) *File {
	t.Helper()
	cfg.Path = filepath.Join(dir, "data", "statecast.db")
	f, err := OpenFile(cfg)
	if err != nil {
		t.Fatalf("OpenFile: %v", err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return f
}

func mustApply(t testing.TB, s Store, room string, w Write) Result {
	t.Helper()
	res, err := s.Apply(bg, room, w)
	if err != nil {
		t.Fatalf("Apply(%q): %v", room, err)
	}
	return res
}

func mustSnapshot(t testing.TB, s Store, room string) Snapshot {
	t.Helper()
	snap, err := s.Snapshot(bg, room, "")
	if err != nil {
		t.Fatalf("Snapshot(%q): %v", room, err)
	}
	return snap
}

func mustHistory(t testing.TB, s Store, room string, from uint64) []Batch {
	t.Helper()
	bs, err := s.History(bg, room, from, 0)
	if err != nil {
		t.Fatalf("History(%q, %d): %v", room, from, err)
	}
	return bs
}

// holdCommitter makes the committer wait, once it has taken its next
// group's first write, until release is called: writes sent meanwhile
// queue up and form the next group together.
func holdCommitter(f *File) (taken <-chan struct{}, release func()) {
	tk, rel := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := func() {
		once.Do(func() {
			close(tk)
			<-rel
		})
	}
	f.hookGroup.Store(&h)
	return tk, func() { close(rel) }
}

// waitQueued waits until n writes sit in the committer's queue.
func waitQueued(t *testing.T, f *File, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(f.reqs) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d writes queued after 10s, want %d", len(f.reqs), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestFileReopenKeepsEverything(t *testing.T) {
	dir := t.TempDir()
	cfg := FileConfig{Retention: RetentionPolicy{Default: Retention{MaxEvents: 4}}}
	f := openFile(t, dir, cfg)
	mustApply(t, f, "r", Put("a", []byte("1")))
	mustApply(t, f, "r", Write{Ops: []Op{{Type: OpPut, Key: "b", Value: []byte("2")}, {Type: OpPut, Key: "c"}}})
	mustApply(t, f, "r", Delete("a"))
	mustApply(t, f, "r", Put("b", []byte{})) // empty, not nil
	mustApply(t, f, "r", Put("d", []byte("4")))
	mustApply(t, f, "other", Put("x", []byte("y")))
	if res := mustApply(t, f, "r", Delete("missing")); res.Rev != 5 || res.Events != nil {
		t.Fatalf("deleting a missing key: %+v, want rev 5 and no events", res)
	}

	snap, hist := mustSnapshot(t, f, "r"), mustHistory(t, f, "r", 3)
	if snap.Rev != 5 || snap.Oldest != 3 {
		t.Fatalf("before reopen: rev %d oldest %d, want 5 and 3 (4 events retained)", snap.Rev, snap.Oldest)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	g := openFile(t, dir, cfg)
	if g.Epoch() != f.Epoch() {
		t.Fatalf("epoch changed across reopen: %q then %q", f.Epoch(), g.Epoch())
	}
	if got := mustSnapshot(t, g, "r"); !reflect.DeepEqual(got, snap) {
		t.Errorf("snapshot after reopen:\n got %+v\nwant %+v", got, snap)
	}
	if got := mustHistory(t, g, "r", 3); !reflect.DeepEqual(got, hist) {
		t.Errorf("history after reopen:\n got %+v\nwant %+v", got, hist)
	}
	if _, err := g.History(bg, "r", 2, 0); !errors.Is(err, ErrCompacted) {
		t.Errorf("History(2) after reopen: %v, want compacted", err)
	}
	if res := mustApply(t, g, "r", Put("e", nil)); res.Rev != 6 || res.Epoch != f.Epoch() {
		t.Errorf("first write after reopen: %+v, want rev 6 in the old epoch", res)
	}
	if got := mustSnapshot(t, g, "other"); got.Rev != 1 || len(got.Items) != 1 {
		t.Errorf("other room after reopen: %+v", got)
	}
}

func TestFileCopiesValues(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{})
	buf := []byte("hello")
	res := mustApply(t, f, "r", Put("k", buf))
	copy(buf, "XXXXX")
	if got := string(res.Events[0].KV.Value); got != "hello" {
		t.Errorf("Result value changed with the caller's buffer: %q", got)
	}
	if got := string(mustSnapshot(t, f, "r").Items[0].Value); got != "hello" {
		t.Errorf("stored value changed with the caller's buffer: %q", got)
	}
}

// TestFileGroupCommit checks that concurrent writers share commits and
// that every room's revisions stay gapless and unique.
func TestFileGroupCommit(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{})
	const writers, each, rooms = 64, 8, 4
	var mu sync.Mutex
	seen := map[string]map[uint64]bool{}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				room := fmt.Sprintf("room-%d", (w+i)%rooms)
				res, err := f.Apply(bg, room, Put(fmt.Sprintf("w%d-%d", w, i), []byte("v")))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if seen[room] == nil {
					seen[room] = map[uint64]bool{}
				}
				if seen[room][res.Rev] {
					t.Errorf("room %s: revision %d acknowledged twice", room, res.Rev)
				}
				seen[room][res.Rev] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	commits := f.commits.Load()
	t.Logf("%d writes in %d commits", writers*each, commits)
	if commits >= writers*each {
		t.Errorf("%d commits for %d concurrent writes: no group commit", commits, writers*each)
	}
	for room, revs := range seen {
		if head := mustSnapshot(t, f, room).Rev; head != uint64(len(revs)) {
			t.Errorf("room %s: head %d after %d acknowledged writes", room, head, len(revs))
		}
	}
}

// TestFileGroupIsolation commits one group holding dependent writes, a
// failing condition and a no-op, and checks each gets its own outcome.
func TestFileGroupIsolation(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{})
	var got []uint64
	stop, err := f.Follow("r", func(b Batch) { got = append(got, b.Rev) })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	taken, release := holdCommitter(f)
	type out struct {
		res Result
		err error
	}
	writes := []struct {
		room string
		w    Write
	}{
		{"r", Put("seed", []byte("0"))}, // taken first; the committer waits
		{"r", Write{Conds: []Cond{{Key: "x"}}, Ops: []Op{{Type: OpPut, Key: "x", Value: []byte("1")}}}},
		{"r", Write{Conds: []Cond{{Key: "x"}}, Ops: []Op{{Type: OpPut, Key: "x", Value: []byte("2")}}}}, // sees the write above
		{"r", Write{Conds: []Cond{{Key: "x", ModRev: 2}}, Ops: []Op{{Type: OpPut, Key: "y", Value: []byte("3")}}}},
		{"r", Delete("never")},
		{"s", Put("z", []byte("4"))},
	}
	outs := make([]out, len(writes))
	var wg sync.WaitGroup
	for i, w := range writes {
		wg.Go(func() {
			res, err := f.Apply(bg, w.room, w.w)
			outs[i] = out{res, err}
		})
		if i == 0 {
			<-taken
		} else {
			waitQueued(t, f, i) // keep queue order = slice order
		}
	}
	before := f.commits.Load()
	release()
	wg.Wait()
	if c := f.commits.Load() - before; c != 1 {
		t.Errorf("%d commits, want 1 (the held write and the queued ones form one group)", c)
	}

	wantRev := []uint64{1, 2, 2, 3, 3, 1}
	for i, o := range outs {
		if o.res.Rev != wantRev[i] {
			t.Errorf("write %d: rev %d, want %d (err %v)", i, o.res.Rev, wantRev[i], o.err)
		}
	}
	var ce *ConflictError
	if !errors.As(outs[2].err, &ce) || ce.ModRev != 2 || ce.Rev != 2 {
		t.Errorf("write 2: %v, want a conflict on x at mod_rev 2, rev 2", outs[2].err)
	}
	for _, i := range []int{0, 1, 3, 4, 5} {
		if outs[i].err != nil {
			t.Errorf("write %d: %v", i, outs[i].err)
		}
	}
	if outs[4].res.Events != nil {
		t.Errorf("no-op delete returned events %+v", outs[4].res.Events)
	}
	if !reflect.DeepEqual(got, []uint64{1, 2, 3}) {
		t.Errorf("follower saw revisions %v, want [1 2 3]", got)
	}
}

func TestFileCommitFailureLeavesNothing(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{})
	calls := 0
	stop, err := f.Follow("r", func(Batch) { calls++ })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	boom := errors.New("disk on fire")
	taken, release := holdCommitter(f)
	fail := func() error { return boom }
	f.hookCommit.Store(&fail)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = f.Apply(bg, "r", Put(fmt.Sprintf("k%d", i), []byte("v")))
		})
		if i == 0 {
			<-taken
		}
	}
	waitQueued(t, f, len(errs)-1)
	release()
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, boom) {
			t.Errorf("write %d: %v, want the commit error", i, err)
		}
	}
	if snap := mustSnapshot(t, f, "r"); snap.Rev != 0 || len(snap.Items) != 0 {
		t.Errorf("failed group is visible: %+v", snap)
	}
	f.hookCommit.Store(nil)
	if res := mustApply(t, f, "r", Put("k", []byte("v"))); res.Rev != 1 {
		t.Errorf("first write after a failed group: rev %d, want 1", res.Rev)
	}
	if calls != 1 {
		t.Errorf("follower called %d times, want 1 (only the later write)", calls)
	}
}

// TestFileAbandonedWrite: a write whose context ends while it is queued
// returns the context error and is never committed.
func TestFileAbandonedWrite(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{})
	taken, release := holdCommitter(f)
	done := make(chan error, 1)
	go func() { _, err := f.Apply(bg, "r", Put("held", nil)); done <- err }()
	<-taken
	ctx, cancel := context.WithCancel(bg)
	abandoned := make(chan error, 1)
	go func() { _, err := f.Apply(ctx, "r", Put("abandoned", nil)); abandoned <- err }()
	waitQueued(t, f, 1)
	cancel()
	if err := <-abandoned; !errors.Is(err, context.Canceled) {
		t.Errorf("abandoned write: %v, want context.Canceled", err)
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mustApply(t, f, "r", Put("after", nil))
	snap := mustSnapshot(t, f, "r")
	if snap.Rev != 2 || len(snap.Items) != 2 || snap.Items[0].Key != "after" || snap.Items[1].Key != "held" {
		t.Errorf("snapshot %+v, want rev 2 with keys after and held only", snap)
	}
}

// TestFileCloseWithWritersInFlight: Close never hangs, every write either
// commits or gets ErrClosed, and what was acknowledged survives reopen.
func TestFileCloseWithWritersInFlight(t *testing.T) {
	dir := t.TempDir()
	f := openFile(t, dir, FileConfig{})
	var acked sync.Map // key -> rev
	var wg sync.WaitGroup
	var started atomic.Int64
	for w := range 32 {
		wg.Go(func() {
			for i := 0; ; i++ {
				key := fmt.Sprintf("w%d-%d", w, i)
				res, err := f.Apply(bg, "r", Put(key, []byte(key)))
				started.Add(1)
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				acked.Store(key, res.Rev)
			}
		})
	}
	for started.Load() < 100 {
		time.Sleep(time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- f.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close hangs with writers in flight")
	}
	wg.Wait()

	g := openFile(t, dir, FileConfig{})
	snap := mustSnapshot(t, g, "r")
	stored := map[string]KV{}
	for _, kv := range snap.Items {
		stored[kv.Key] = kv
	}
	n := 0
	acked.Range(func(k, rev any) bool {
		n++
		if kv, ok := stored[k.(string)]; !ok || kv.ModRev != rev.(uint64) {
			t.Errorf("acknowledged write %s at rev %d lost after reopen", k, rev)
		}
		return true
	})
	if uint64(len(stored)) != snap.Rev || len(stored) != n {
		t.Errorf("after reopen: %d keys at rev %d, %d acknowledged", len(stored), snap.Rev, n)
	}
}

func TestFileAgeRetentionOnRead(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	f := openFile(t, t.TempDir(), FileConfig{Clock: clock, Retention: RetentionPolicy{Default: Retention{MaxAge: time.Minute}}})
	mustApply(t, f, "r", Put("a", nil))
	advance(40 * time.Second)
	mustApply(t, f, "r", Put("b", nil))
	advance(40 * time.Second) // rev 1 is now 80s old, rev 2 40s

	if snap := mustSnapshot(t, f, "r"); snap.Oldest != 2 {
		t.Errorf("Oldest %d, want 2 once rev 1 expired", snap.Oldest)
	}
	if _, err := f.History(bg, "r", 1, 0); !errors.Is(err, ErrCompacted) {
		t.Errorf("History(1): %v, want compacted", err)
	}
	if n := logRecords(t, f, "r"); n != 2 {
		t.Errorf("%d log records, want 2: reads must not write", n)
	}
	advance(time.Hour)
	mustApply(t, f, "r", Put("c", nil))
	if n := logRecords(t, f, "r"); n != 1 {
		t.Errorf("%d log records after a write, want 1: the write trims expired batches", n)
	}
	if snap := mustSnapshot(t, f, "r"); snap.Oldest != 3 || snap.Rev != 3 {
		t.Errorf("rev %d oldest %d, want 3 and 3", snap.Rev, snap.Oldest)
	}
}

func logRecords(t *testing.T, f *File, room string) (n int) {
	t.Helper()
	err := viewDB(f, func(tx *bolt.Tx) error {
		n = roomBucket(tx, room).Bucket(bucketLog).Stats().KeyN
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFileCorruptRecord: a damaged record is reported as ErrCorrupt by
// reads and by writes that touch it, without disturbing other writes.
func TestFileCorruptRecord(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{})
	mustApply(t, f, "r", Put("bad", []byte("v")))
	mustApply(t, f, "r", Put("good", []byte("v")))
	err := updateDB(f, func(tx *bolt.Tx) error {
		rb := roomBucket(tx, "r")
		if err := rb.Bucket(bucketKV).Put([]byte("bad"), []byte{tagKV, 0xff}); err != nil {
			return err
		}
		return rb.Bucket(bucketLog).Put(revKey(2), []byte{tagBatch, 1, 2})
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Snapshot(bg, "r", ""); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Snapshot: %v, want ErrCorrupt", err)
	}
	if _, err := f.History(bg, "r", 1, 0); !errors.Is(err, ErrCorrupt) {
		t.Errorf("History: %v, want ErrCorrupt", err)
	}
	if _, err := f.Apply(bg, "r", Put("bad", []byte("w"))); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Apply over a corrupt key: %v, want ErrCorrupt", err)
	}
	if res := mustApply(t, f, "r", Put("good", []byte("w"))); res.Rev != 3 {
		t.Errorf("write beside the corrupt key: rev %d, want 3", res.Rev)
	}
}

func TestFileDecodeRejectsDamage(t *testing.T) {
	b := Batch{Rev: 7, Time: time.Unix(1_700_000_000, 123), Events: []Event{
		{Type: OpPut, KV: KV{Key: "k", Value: []byte("value"), CreateRev: 3, ModRev: 7, Version: 2},
			Prev: &KV{Key: "k", Value: []byte("old"), CreateRev: 3, ModRev: 5, Version: 1}},
		{Type: OpDelete, KV: KV{Key: "gone", ModRev: 7}, Prev: &KV{Key: "gone", Value: []byte{}, CreateRev: 1, ModRev: 1, Version: 1}},
	}}
	rec := encodeBatch(&b)
	got, err := decodeBatch("", 7, rec)
	if err != nil || !reflect.DeepEqual(got, b) {
		t.Fatalf("round trip: %v\n got %+v\nwant %+v", err, got, b)
	}
	for n := range len(rec) {
		if _, err := decodeBatch("", 7, rec[:n]); !errors.Is(err, ErrCorrupt) {
			t.Errorf("batch truncated to %d bytes: %v, want ErrCorrupt", n, err)
		}
	}
	for _, bad := range [][]byte{
		append(bytes.Clone(rec), 0), // trailing byte
		{tagKV},                     // wrong kind
		{tagBatch, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}, // claims 4G events
		binary.AppendUvarint([]byte{tagBatch, 0}, 1e9), // nanoseconds out of range
	} {
		if _, err := decodeBatch("", 1, bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("decodeBatch(%x): %v, want ErrCorrupt", bad, err)
		}
	}
	kvRec := encodeKV(&KV{Value: []byte("v"), CreateRev: 1, ModRev: 2, Version: 2})
	for n := range len(kvRec) {
		if _, err := decodeKV("k", kvRec[:n]); !errors.Is(err, ErrCorrupt) {
			t.Errorf("kv truncated to %d bytes: %v, want ErrCorrupt", n, err)
		}
	}
	if _, err := decodeMeta(encodeMeta(roomMeta{head: 3, oldest: 5})); !errors.Is(err, ErrCorrupt) {
		t.Errorf("meta with oldest > head+1: %v, want ErrCorrupt", err)
	}
}

// FuzzDecode feeds arbitrary bytes to every decoder: none may panic, and
// whatever decodes must re-encode to a record that decodes the same.
func FuzzDecode(f *testing.F) {
	f.Add(encodeBatch(&Batch{Time: time.Unix(1, 2), Events: []Event{{Type: OpPut, KV: KV{Key: "k", Value: []byte("v"), CreateRev: 1, ModRev: 1, Version: 1}}}}))
	f.Add(encodeBatch(&Batch{Time: time.Unix(-5, 0), Events: []Event{{Type: OpDelete, KV: KV{Key: "k", ModRev: 2}, Prev: &KV{Key: "k", CreateRev: 1, ModRev: 1, Version: 1}}}}))
	f.Add(encodeKV(&KV{Value: []byte{}, CreateRev: 1, ModRev: 9, Version: 4}))
	f.Add(encodeMeta(roomMeta{head: 9, oldest: 3, events: 12}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		if b, err := decodeBatch("e", 1, data); err == nil {
			again, err := decodeBatch("e", 1, encodeBatch(&b))
			if err != nil || !reflect.DeepEqual(again, b) {
				t.Fatalf("batch re-encode: %v\n got %+v\nwant %+v", err, again, b)
			}
		}
		if t0, n, err := decodeBatchHeader(data); err == nil && n > uint64(len(data)) {
			t.Fatalf("header claims %d events (time %v) in %d bytes", n, t0, len(data))
		}
		if kv, err := decodeKV("k", data); err == nil {
			again, err := decodeKV("k", encodeKV(&kv))
			if err != nil || !reflect.DeepEqual(again, kv) {
				t.Fatalf("kv re-encode: %v\n got %+v\nwant %+v", err, again, kv)
			}
		}
		if m, err := decodeMeta(data); err == nil {
			if again, err := decodeMeta(encodeMeta(m)); err != nil || again != m {
				t.Fatalf("meta re-encode: %v: %+v then %+v", err, m, again)
			}
		}
	})
}

func TestFileSecondOpenFailsFast(t *testing.T) {
	dir := t.TempDir()
	openFile(t, dir, FileConfig{})
	start := time.Now()
	if g, err := OpenFile(FileConfig{Path: filepath.Join(dir, "data", "statecast.db")}); err == nil {
		g.Close()
		t.Fatal("second OpenFile of a file in use succeeded")
	} else {
		t.Logf("%v (after %v)", err, time.Since(start).Round(time.Millisecond))
	}
}

func TestFileClosed(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{})
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Apply(bg, "r", Put("k", nil)); !errors.Is(err, ErrClosed) {
		t.Errorf("Apply after Close: %v", err)
	}
	if _, err := f.Snapshot(bg, "r", ""); !errors.Is(err, ErrClosed) {
		t.Errorf("Snapshot after Close: %v", err)
	}
	if _, err := f.History(bg, "r", 1, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("History after Close: %v", err)
	}
	if _, err := f.Follow("r", func(Batch) {}); !errors.Is(err, ErrClosed) {
		t.Errorf("Follow after Close: %v", err)
	}
	if err := f.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
}

// TestFileFailedWriteRetriesGroup: a write that fails halfway through the
// transaction (here bbolt refuses to overwrite a bucket planted where a
// key goes) fails alone; the rest of its group is retried and commits.
func TestFileFailedWriteRetriesGroup(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{})
	mustApply(t, f, "r", Put("seed", nil))
	err := updateDB(f, func(tx *bolt.Tx) error {
		_, err := roomBucket(tx, "r").Bucket(bucketKV).CreateBucket([]byte("trap"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	taken, release := holdCommitter(f)
	keys := []string{"a", "trap", "b"}
	res := make([]Result, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() { res[i], errs[i] = f.Apply(bg, "r", Put(k, []byte(k))) })
		if i == 0 {
			<-taken
		} else {
			waitQueued(t, f, i)
		}
	}
	before := f.commits.Load()
	release()
	wg.Wait()
	if !errors.Is(errs[1], berrors.ErrIncompatibleValue) {
		t.Errorf("write to the trap: %v, want bbolt's incompatible value error", errs[1])
	}
	if errs[0] != nil || errs[2] != nil || res[0].Rev != 2 || res[2].Rev != 3 {
		t.Errorf("other writes: %v rev %d, %v rev %d; want revs 2 and 3", errs[0], res[0].Rev, errs[2], res[2].Rev)
	}
	if c := f.commits.Load() - before; c != 1 {
		t.Errorf("%d commits, want 1", c)
	}
	err = updateDB(f, func(tx *bolt.Tx) error {
		return roomBucket(tx, "r").Bucket(bucketKV).DeleteBucket([]byte("trap"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if snap := mustSnapshot(t, f, "r"); snap.Rev != 3 || len(snap.Items) != 3 {
		t.Errorf("snapshot %+v, want rev 3 with a, b and seed", snap)
	}
}

// TestFileByteRetention: the log keeps at most MaxBytes of records, in
// whole revisions from the oldest; this is what bounds the file (and the
// mmap of it) when values are large. Before the fix, 40 revisions of
// 100 KB all stayed in the log.
func TestFileByteRetention(t *testing.T) {
	const maxBytes = 1 << 20
	f := openFile(t, t.TempDir(), FileConfig{Retention: RetentionPolicy{Default: Retention{MaxBytes: maxBytes}}})
	value := bytes.Repeat([]byte("v"), 100_000)
	for i := range 40 {
		mustApply(t, f, "r", Put(fmt.Sprintf("k%02d", i), value)) // distinct keys: no previous values
	}
	// A record is the value plus a few dozen bytes: 10 fit in 1 MiB, 11 do not.
	if snap := mustSnapshot(t, f, "r"); snap.Rev != 40 || snap.Oldest != 31 || len(snap.Items) != 40 {
		t.Errorf("rev %d oldest %d with %d items, want rev 40 oldest 31 (10 revisions kept) and 40 items", snap.Rev, snap.Oldest, len(snap.Items))
	}
	if n := logRecords(t, f, "r"); n != 10 {
		t.Errorf("%d log records, want 10", n)
	}
	sum, stored := logSizes(t, f, "r")
	if sum > maxBytes || stored == nil || stored.bytes != sum {
		t.Errorf("log holds %d bytes, stored total %+v: want at most %d, and the total to match", sum, stored, maxBytes)
	}
}

// logSizes returns the bytes of a room's log records and its decoded
// logBytes record (nil when it has none).
func logSizes(t *testing.T, f *File, room string) (sum uint64, stored *roomMeta) {
	t.Helper()
	err := viewDB(f, func(tx *bolt.Tx) error {
		rb := roomBucket(tx, room)
		if err := rb.Bucket(bucketLog).ForEach(func(_, v []byte) error {
			sum += uint64(len(v))
			return nil
		}); err != nil {
			return err
		}
		if v := rb.Get(keyLogBytes); v != nil {
			m, err := decodeLogBytes(v)
			stored = &m
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sum, stored
}

// TestFileLogBytesMissingOrStale: a room written by a version that kept no
// byte total (or whose last write was made by one, after a downgrade) gets
// its total counted from the log: reads narrow by it without writing, and
// the next write stores it in step with the log.
func TestFileLogBytesMissingOrStale(t *testing.T) {
	value := bytes.Repeat([]byte("v"), 1000)
	for _, tc := range []struct {
		name  string
		plant func(rb *bolt.Bucket) error
	}{
		{"missing", func(rb *bolt.Bucket) error { return rb.Delete(keyLogBytes) }},
		// A total an older binary left behind when it wrote revision 10.
		{"stale", func(rb *bolt.Bucket) error {
			return rb.Put(keyLogBytes, encodeLogBytes(roomMeta{head: 9, oldest: 1, bytes: 1}))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			f := openFile(t, dir, FileConfig{}) // the default budget keeps everything
			for i := range 10 {
				mustApply(t, f, "r", Put(fmt.Sprintf("k%02d", i), value))
			}
			full, _ := logSizes(t, f, "r")
			one := full / 10 // the records are about the same size (times vary by a byte or two)
			if err := updateDB(f, func(tx *bolt.Tx) error { return tc.plant(roomBucket(tx, "r")) }); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			// Reopen with room for 4 records: reads narrow to them at once.
			f = openFile(t, dir, FileConfig{Retention: RetentionPolicy{Default: Retention{MaxBytes: int64(4*one + one/2)}}})
			if snap := mustSnapshot(t, f, "r"); snap.Rev != 10 || snap.Oldest != 7 {
				t.Errorf("rev %d oldest %d, want 10 and 7: reads must narrow by bytes", snap.Rev, snap.Oldest)
			}
			if _, err := f.History(bg, "r", 6, 0); !errors.Is(err, ErrCompacted) {
				t.Errorf("History(6): %v, want compacted", err)
			}
			if n := logRecords(t, f, "r"); n != 10 {
				t.Errorf("%d log records, want 10: reads must not write", n)
			}
			mustApply(t, f, "r", Put("k10", value))
			sum, stored := logSizes(t, f, "r")
			if want := (roomMeta{head: 11, oldest: 8, bytes: sum}); stored == nil || *stored != want || logRecords(t, f, "r") != 4 {
				t.Errorf("after a write: log of %d bytes in %d records, stored total %+v, want %+v", sum, logRecords(t, f, "r"), stored, want)
			}
		})
	}
}

// TestFileLogBytesRollBackWithTheLog: the byte total is written in the
// transaction of the log it measures, so a failed commit leaves both as
// they were.
func TestFileLogBytesRollBackWithTheLog(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{Retention: RetentionPolicy{Default: Retention{MaxBytes: 3000}}})
	value := bytes.Repeat([]byte("v"), 1000)
	for i := range 3 {
		mustApply(t, f, "r", Put(fmt.Sprintf("k%d", i), value))
	}
	_, before := logSizes(t, f, "r")
	boom := errors.New("disk on fire")
	fail := func() error { return boom }
	f.hookCommit.Store(&fail)
	if _, err := f.Apply(bg, "r", Put("k3", value)); !errors.Is(err, boom) {
		t.Fatalf("write with a failing commit: %v, want the commit error", err)
	}
	f.hookCommit.Store(nil)
	sum, after := logSizes(t, f, "r")
	if before == nil || after == nil || *after != *before || sum != after.bytes {
		t.Errorf("after a failed commit: log of %d bytes, total %+v, want the total of before %+v", sum, after, before)
	}
	mustApply(t, f, "r", Put("k3", value))
	if sum, after := logSizes(t, f, "r"); after == nil || after.head != 4 || sum != after.bytes || sum > 3000 {
		t.Errorf("after the next write: log of %d bytes, total %+v", sum, after)
	}
}

// BenchmarkFileLargeValueLog overwrites one key of one room with a 250 KB
// value per iteration under the default retention, and reports what the
// log and the file hold at the end (each record carries the value and the
// previous one). Run with -benchtime 2645x for the workload of issue 11.
func BenchmarkFileLargeValueLog(b *testing.B) {
	f := openFile(b, b.TempDir(), FileConfig{})
	value := bytes.Repeat([]byte("v"), 250_000)
	b.SetBytes(int64(len(value)))
	for i := 0; b.Loop(); i++ {
		value[0] = byte(i) // a new value each time, not a no-op
		mustApply(b, f, "r", Put("k", value))
	}
	b.StopTimer()
	var logBytes uint64
	var records int
	err := viewDB(f, func(tx *bolt.Tx) error {
		return roomBucket(tx, "r").Bucket(bucketLog).ForEach(func(_, v []byte) error {
			logBytes += uint64(len(v))
			records++
			return nil
		})
	})
	if err != nil {
		b.Fatal(err)
	}
	st, err := os.Stat(f.cfg.Path)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(logBytes)/(1<<20), "log-MiB")
	b.ReportMetric(float64(records), "log-records")
	b.ReportMetric(float64(st.Size())/(1<<20), "file-MiB")
}

// TestFileSessionsGroupCommit: session records go through the committer,
// so saves queued together (a thousand clients resuming after a restart)
// share one transaction and one fsync, with room writes too.
func TestFileSessionsGroupCommit(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{})
	taken, release := holdCommitter(f)
	const n = 50
	var wg sync.WaitGroup
	errs := make([]error, n+1)
	wg.Go(func() { _, errs[n] = f.Apply(bg, "r", Put("k", []byte("v"))) })
	<-taken
	for i := range n {
		wg.Go(func() {
			errs[i] = f.SaveSession(bg, SessionRecord{ID: fmt.Sprint("s_", i), Subject: "sub", ResumeHash: []byte{byte(i)}})
		})
	}
	waitQueued(t, f, n)
	before := f.commits.Load()
	release()
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// The committer fills the room write's group with what queued behind it.
	if c := f.commits.Load() - before; c != 1 {
		t.Errorf("%d commits for 1 write and %d session records queued with it, want 1", c, n)
	}
	if recs, err := f.ListSessions(bg); err != nil || len(recs) != n {
		t.Fatalf("ListSessions: %d records, %v; want %d", len(recs), err, n)
	}
}

// storedUsage returns a room's usage record: the revision it was counted
// at and the count (ok false when the room has none).
func storedUsage(t *testing.T, f *File, room string) (head uint64, u Usage, ok bool) {
	t.Helper()
	err := viewDB(f, func(tx *bolt.Tx) error {
		v := roomBucket(tx, room).Get(keyUsage)
		if v == nil {
			return nil
		}
		var err error
		head, u, err = decodeUsage(v)
		ok = true
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return head, u, ok
}

// TestFileUsageMissingOrStale: a room written by a version that kept no
// usage record (or whose last write was made by one, in a rolling
// upgrade or after a downgrade) has its keys and bytes counted on its
// next write, which is held to the quota and stores the count.
func TestFileUsageMissingOrStale(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(rb *bolt.Bucket) error
	}{
		{"missing", func(rb *bolt.Bucket) error { return rb.Delete(keyUsage) }},
		// The count an older binary left behind when it wrote revision 5.
		{"stale", func(rb *bolt.Bucket) error { return rb.Put(keyUsage, encodeUsage(4, Usage{Keys: 1, Bytes: 1})) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			f := openFile(t, dir, FileConfig{})
			for i := range 5 {
				mustApply(t, f, "r", Put(fmt.Sprintf("k%d", i), []byte("12345678"))) // 10 bytes each
			}
			if err := updateDB(f, func(tx *bolt.Tx) error { return tc.plant(roomBucket(tx, "r")) }); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			f = openFile(t, dir, FileConfig{Limits: Limits{MaxRoomKeys: 5}})
			var qe *QuotaError
			if _, err := f.Apply(bg, "r", Put("k5", nil)); !errors.As(err, &qe) || qe.Keys != 6 || qe.Bytes != 52 {
				t.Fatalf("a sixth key: %v, want a quota error counting 6 keys and 52 bytes", err)
			}
			mustApply(t, f, "r", Delete("k0"))
			if head, u, ok := storedUsage(t, f, "r"); !ok || head != 6 || u != (Usage{Keys: 4, Bytes: 40}) {
				t.Errorf("stored usage %+v at %d (present %v), want 4 keys, 40 bytes at 6", u, head, ok)
			}
			mustApply(t, f, "r", Put("k5", nil))
		})
	}
}

// TestFileUsageInAGroup: a write refused over the quota in a
// group leaves the count as it was, and the group's other writes count.
func TestFileUsageInAGroup(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{Limits: Limits{MaxRoomKeys: 3}})
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = f.Apply(bg, "r", Put(fmt.Sprintf("k%d", i), []byte("v")))
		}()
	}
	wg.Wait()
	over := 0
	for _, err := range errs {
		if errors.Is(err, ErrQuotaExceeded) {
			over++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if _, u, _ := storedUsage(t, f, "r"); over != 3 || u != (Usage{Keys: 3, Bytes: 9}) {
		t.Errorf("%d refused, stored usage %+v; want 3 and 3 keys of 9 bytes", over, u)
	}
}

// viewDB reads the bbolt file as a reader of the store would: once every
// answered write is checkpointed into it.
func viewDB(f *File, fn func(*bolt.Tx) error) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.view(fn)
}

// updateDB changes the bbolt file behind the store's back (to plant what
// an older binary or a damaged disk left), after a checkpoint.
func updateDB(f *File, fn func(*bolt.Tx) error) error {
	if err := viewDB(f, func(*bolt.Tx) error { return nil }); err != nil {
		return err
	}
	return f.db.Update(fn)
}
